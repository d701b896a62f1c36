package integration

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Benchmarks (go run mage.go bench): the plugin against perftest on the same soft-RoCE rails,
// back to back in one run, reported as ratios. They run only with MPIB_BENCH=1; results go
// to $MPIB_BENCH_OUT (JSON) for docs/benchmarks.md and the plot.

func benchOrSkip(t *testing.T) *Topology {
	t.Helper()
	if os.Getenv("MPIB_BENCH") != "1" {
		t.Skip("benchmarks run with MPIB_BENCH=1 (go run mage.go bench)")
	}
	return labOrSkip(t)
}

func benchReps() int {
	if n, err := strconv.Atoi(os.Getenv("MPIB_BENCH_REPS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// figure is one measured line of the benchmark report.
type figure struct {
	Name     string    `json:"name"` // P1, P2, P3, P4
	Key      string    `json:"key"`  // size=N or split=...
	Ratio    float64   `json:"ratio"`
	Plugin   float64   `json:"plugin"`
	Ref      float64   `json:"ref"`
	Unit     string    `json:"unit"`
	Ratios   []float64 `json:"ratios"` // every repetition, for the spread
	SupShare float64   `json:"sup_share,omitempty"`
	// P2 only: the sum of both rails' ib_write_bw run at the same time.
	ConcurrentRef float64 `json:"concurrent_ref,omitempty"`
	Note          string  `json:"note,omitempty"` // what else the run measured, for the table
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func spread(xs []float64) float64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range xs {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return hi - lo
}

func saveFigures(t *testing.T, name string, figs []figure) {
	dir := os.Getenv("MPIB_BENCH_OUT")
	if dir == "" {
		return
	}
	b, _ := json.MarshalIndent(figs, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o644); err != nil {
		t.Error(err)
	}
}

var bwLineRe = regexp.MustCompile(`nettest-bw: size=(\d+) iters=\d+ seconds=[\d.]+ mbps=([\d.]+) role=server`)

// pluginBW runs mpib-nettest in bw mode and returns receiver-side Mbit/s per size.
func pluginBW(t *testing.T, server, client *Node, env []string, sizes []int, seconds float64) map[int]float64 {
	return pluginBWArgs(t, server, client, sizes, seconds, env)
}

func pluginBWArgs(t *testing.T, server, client *Node, sizes []int, seconds float64, env []string, extra ...string) map[int]float64 {
	t.Helper()
	var list []string
	for _, s := range sizes {
		list = append(list, strconv.Itoa(s))
	}
	// One warm-up round, and at most 128 MiB in flight so 64 MiB messages do not queue a
	// minute of data (the window shrinks only for sizes above 16 MiB).
	args := append([]string{"--mode", "bw", "--sizes", strings.Join(list, ","), "--seconds", fmt.Sprint(seconds),
		"--window", "8", "--warmup", "1", "--mem-limit", "128M"}, extra...)
	res := runPair(context.Background(), t, server, client, pluginEnv(server, env...), pluginEnv(client, env...), args...)
	if res.serverCode != 0 || res.clientCode != 0 {
		t.Fatalf("nettest bw failed:\n%s", res)
	}
	out := map[int]float64{}
	for _, m := range bwLineRe.FindAllStringSubmatch(res.serverOut, -1) {
		size, _ := strconv.Atoi(m[1])
		out[size], _ = strconv.ParseFloat(m[2], 64)
	}
	if len(out) != len(sizes) {
		t.Fatalf("nettest bw reported %d of %d sizes:\n%s", len(out), len(sizes), res)
	}
	return out
}

// perftestBW returns ib_write_bw's Mbit/s for one rail and size, moving about `bytes`.
func perftestBW(t *testing.T, server, client *Node, rail Rail, size int, bytes int) float64 {
	t.Helper()
	iters := bytes / size
	if iters < 5 {
		iters = 5 // perftest's minimum
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := WriteBW{Server: server, Client: client, Rail: rail, Size: size, Iters: iters, Timeout: 3 * time.Minute}.Run(ctx)
	if err != nil {
		t.Fatalf("ib_write_bw %s size %d: %v", rail, size, err)
	}
	if res.ClientCode != 0 {
		t.Fatalf("ib_write_bw %s size %d: client exit %d\n%s", rail, size, res.ClientCode, res.Output)
	}
	return res.Gbps * 1000
}

func TestBenchP1SingleRail(t *testing.T) {
	lab := benchOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	sizes := []int{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20}
	ratios := map[int][]float64{}
	plugin, ref := map[int][]float64{}, map[int][]float64{}
	for rep := 0; rep < benchReps(); rep++ {
		for _, s := range sizes {
			// Vanilla intra-island: every byte and the CTS on SUP, the same rail perftest
			// uses; the two run back to back per size, so that the lab's drift (TCG speed
			// moves by 10-20 % within minutes) falls on both sides of a ratio alike.
			got := pluginBW(t, a2, a1, nil, []int{s}, 3)[s]
			r := perftestBW(t, a2, a1, SUP, s, 32<<20)
			plugin[s] = append(plugin[s], got)
			ref[s] = append(ref[s], r)
			ratios[s] = append(ratios[s], got/r)
		}
	}
	var figs []figure
	for _, s := range sizes {
		f := figure{Name: "P1", Key: fmt.Sprintf("size=%d", s), Ratio: median(ratios[s]), Plugin: median(plugin[s]),
			Ref: median(ref[s]), Unit: "mbps", Ratios: ratios[s]}
		figs = append(figs, f)
		fmt.Printf("P1 size=%d ratio=%.3f plugin_mbps=%.1f ref_mbps=%.1f reps=%d spread=%.3f\n",
			s, f.Ratio, f.Plugin, f.Ref, len(ratios[s]), spread(ratios[s]))
		if s >= 1<<20 && f.Ratio < 0.95 {
			t.Logf("P1 size=%d below the 0.95 target", s)
		}
	}
	saveFigures(t, "p1", figs)
}

func TestBenchP2UnequalRails(t *testing.T) {
	lab := benchOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx := context.Background()
	// 25 + 50 Mbit/s stays under what the 2-vCPU lab VM pushes on both rails at once
	// (ib_write_bw on both at 40 + 80 Mbit/s made only ~84 Mbit/s together); the run checks
	// that ceiling again each repetition (concurrent_ref_mbps).
	shape := map[Rail]string{SOUT: "netem rate 25mbit limit 10000", SUP: "netem rate 50mbit limit 10000"}
	for r, q := range shape {
		if err := lab.Shape(ctx, a1, r, q); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for r := range shape {
			lab.Shape(ctx, a1, r, "")
		}
	}()
	const size = 4 << 20
	type split struct {
		name  string
		supBW int
	}
	ratios, plugin, ref, shares := map[string][]float64{}, map[string][]float64{}, map[string][]float64{}, map[string][]float64{}
	var order []string
	var concurrent []float64
	for rep := 0; rep < benchReps(); rep++ {
		sout := perftestBW(t, a2, a1, SOUT, size, 24<<20)
		sup := perftestBW(t, a2, a1, SUP, size, 24<<20)
		concurrent = append(concurrent, perftestBWBothRails(t, a2, a1, size, 24<<20))
		prop := int(math.Round(1024 * sup / (sup + sout)))
		splits := []split{{"proportional", prop}, {"equal", 512}, {"sout-only", 0}}
		order = nil
		for _, sp := range splits {
			order = append(order, sp.name)
			got := pluginBW(t, a2, a1, []string{fmt.Sprintf("MPIB_FORCE_SUP_BW=%d", sp.supBW)}, []int{size}, 5)[size]
			ratios[sp.name] = append(ratios[sp.name], got/(sout+sup))
			plugin[sp.name] = append(plugin[sp.name], got)
			ref[sp.name] = append(ref[sp.name], sout+sup)
			shares[sp.name] = append(shares[sp.name], float64(sp.supBW)/1024)
		}
	}
	var figs []figure
	for _, name := range order {
		f := figure{Name: "P2", Key: "split=" + name, Ratio: median(ratios[name]), Plugin: median(plugin[name]),
			Ref: median(ref[name]), Unit: "mbps", Ratios: ratios[name], SupShare: median(shares[name]),
			ConcurrentRef: median(concurrent), Note: fmt.Sprintf("ib_write_bw on both rails at once: %.1f Mbit/s", median(concurrent))}
		figs = append(figs, f)
		fmt.Printf("P2 split=%s ratio=%.3f plugin_mbps=%.1f ref_mbps=%.1f sup_share=%.3f reps=%d spread=%.3f concurrent_ref_mbps=%.1f\n",
			name, f.Ratio, f.Plugin, f.Ref, f.SupShare, len(ratios[name]), spread(ratios[name]), median(concurrent))
	}
	saveFigures(t, "p2", figs)
}

// perftestBWBothRails runs ib_write_bw on SOUT and SUP at the same time and returns the sum
// of their Mbit/s: what the lab VM can push on both rails at once, the ceiling for any split.
func perftestBWBothRails(t *testing.T, server, client *Node, size int, bytes int) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	type result struct {
		res *WriteBWResult
		err error
	}
	results := make(chan result, 2)
	for i, rail := range []Rail{SOUT, SUP} {
		w := WriteBW{Server: server, Client: client, Rail: rail, Size: size, Iters: max(bytes/size, 5),
			Port: 18540 + i, Timeout: 3 * time.Minute}
		go func() {
			res, err := w.Run(ctx)
			results <- result{res, err}
		}()
	}
	total := 0.0
	var firstErr error
	for range 2 {
		r := <-results
		switch {
		case r.err != nil:
			firstErr = cmp.Or(firstErr, r.err)
		case r.res.ClientCode != 0:
			firstErr = cmp.Or(firstErr, fmt.Errorf("client exit %d\n%s", r.res.ClientCode, r.res.Output))
		default:
			total += r.res.Gbps * 1000
		}
	}
	if firstErr != nil {
		t.Fatalf("concurrent ib_write_bw: %v", firstErr)
	}
	return total
}

var (
	latRe     = regexp.MustCompile(`nettest-lat: size=8 iters=\d+ avg_us=([\d.]+) p50_us=([\d.]+)`)
	perfLatRe = regexp.MustCompile(`(?m)^\s*8\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)`)
)

func TestBenchP3Latency(t *testing.T) {
	lab := benchOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx := context.Background()
	const iters, warmup = 1000, 100
	var ratios, plugin, ref, pluginPkts, refPkts []float64
	for rep := 0; rep < benchReps(); rep++ {
		// Packets per round trip on the client's SUP device (sent + received, ACKs included)
		// say what a round trip costs in rxe's per-packet work, which dominates under TCG.
		before := counters(t, a1, SUP)
		res := runPair(ctx, t, a2, a1, pluginEnv(a2), pluginEnv(a1), "--mode", "lat", "--sizes", "8",
			"--iters", strconv.Itoa(iters), "--warmup", strconv.Itoa(warmup))
		m := latRe.FindStringSubmatch(res.clientOut)
		if res.clientCode != 0 || m == nil {
			t.Fatalf("nettest lat failed:\n%s", res)
		}
		pp := packetsPer(t, a1, SUP, before, iters+warmup)
		p, _ := strconv.ParseFloat(m[2], 64)
		before = counters(t, a1, SUP)
		r := perftestLat(t, a2, a1, iters)
		rp := packetsPer(t, a1, SUP, before, iters)
		plugin, ref, ratios = append(plugin, p), append(ref, r), append(ratios, p/r)
		pluginPkts, refPkts = append(pluginPkts, pp), append(refPkts, rp)
	}
	f := figure{Name: "P3", Key: "size=8", Ratio: median(ratios), Plugin: median(plugin), Ref: median(ref), Unit: "us", Ratios: ratios,
		Note: fmt.Sprintf("RDMA packets per round trip (client, sent+received): plugin %.2f, ib_write_lat %.2f", median(pluginPkts), median(refPkts))}
	fmt.Printf("P3 size=8 ratio=%.3f plugin_us=%.1f ref_us=%.1f reps=%d spread=%.3f plugin_pkts_per_rtt=%.2f ref_pkts_per_rtt=%.2f\n",
		f.Ratio, f.Plugin, f.Ref, len(ratios), spread(ratios), median(pluginPkts), median(refPkts))
	saveFigures(t, "p3", []figure{f})
}

func counters(t *testing.T, n *Node, r Rail) Counters {
	t.Helper()
	c, err := n.Counters(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// packetsPer returns the RDMA packets the node sent and received on rail r since `before`,
// per round trip.
func packetsPer(t *testing.T, n *Node, r Rail, before Counters, roundTrips int) float64 {
	d := counters(t, n, r).Sub(before)
	return float64(d.RdmaTxPkts+d.RdmaRxPkts) / float64(roundTrips)
}

// perftestLat returns ib_write_lat's typical one-way latency (microseconds) on SUP.
func perftestLat(t *testing.T, server, client *Node, iters int) float64 {
	t.Helper()
	// perftest sometimes prints inf for every column: its CPU-frequency estimate came out
	// as zero under TCG. That run measured nothing; run it again.
	for attempt := 1; ; attempt++ {
		out := perftestLatOnce(t, server, client, iters)
		// Columns: #bytes #iterations t_min t_max t_typical t_avg ...
		if m := perfLatRe.FindStringSubmatch(out); m != nil {
			typical, _ := strconv.ParseFloat(m[3], 64)
			return typical
		}
		if attempt == 3 {
			t.Fatalf("no latency line in ib_write_lat output after %d attempts:\n%s", attempt, out)
		}
		t.Logf("ib_write_lat reported no figure (attempt %d), running it again:\n%s", attempt, tail(out, 400))
	}
}

func perftestLatOnce(t *testing.T, server, client *Node, iters int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args := func(n *Node) []string {
		return []string{"ib_write_lat", "-d", n.Dev(SUP), "-x", strconv.Itoa(n.GIDIndex(SUP)), "-F", "-s", "8", "-n", strconv.Itoa(iters), "-p", "18530"}
	}
	srv, err := server.Start(ctx, nil, args(server)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := server.waitListen(ctx, 18530, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	out, errOut, code, err := client.Exec(ctx, nil, append(args(client), server.IP(SOUT))...)
	srv.Wait(ctx)
	if err != nil || code != 0 {
		t.Fatalf("ib_write_lat: %v exit %d\n%s\n%s", err, code, out, errOut)
	}
	return out
}

// P4 counts the instructions the plugin executes per message on the sender, under
// callgrind: every call nettest makes to isend and test (polls that find nothing included),
// inclusive of what they call, divided by the messages sent. Go's asynchronous preemption
// signals trip a callgrind assertion, so the run turns them off (the data path is C and
// never meets the Go scheduler).
func TestBenchP4InstructionsPerMessage(t *testing.T) {
	lab := benchOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const iters = 2000
	const out = "/tmp/mpib.callgrind"
	srv, cli := startPair(ctx, t, nettestPair{server: a2, client: a1, serverEnv: pluginEnv(a2), clientEnv: pluginEnv(a1, "GODEBUG=asyncpreemptoff=1"),
		clientWrap: []string{"valgrind", "--tool=callgrind", "--callgrind-out-file=" + out},
		args:       []string{"--abi", "11", "--timeout-s", "300", "--mode", "bw", "--sizes", "4096", "--iters", strconv.Itoa(iters), "--warmup", "0", "--verify", "off"}})
	stdout, errOut, code, err := cli.Wait(ctx)
	srv.Wait(ctx)
	if err != nil || code != 0 {
		t.Fatalf("callgrind run: %v exit %d\n%s\n%s", err, code, stdout, tail(errOut, 3000))
	}
	raw, catErr, code, err := a1.Exec(ctx, nil, "cat", out)
	if err != nil || code != 0 {
		t.Fatalf("reading %s: %v exit %d %s", out, err, code, catErr)
	}
	calls, err := parseCallgrindCalls(strings.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	// abi 11 routes isend through its size_t/phandle wrapper; test is mpib_test itself.
	isend, test := calls["isend_v10"], calls["mpib_test"]
	if isend.Calls < iters || test.Calls < iters {
		var seen []string
		for name, c := range calls {
			if strings.Contains(name, "isend") || strings.Contains(name, "test") {
				seen = append(seen, fmt.Sprintf("%s calls=%d", name, c.Calls))
			}
		}
		t.Fatalf("expected at least %d calls to isend_v10 and mpib_test, found %d and %d (%v)", iters, isend.Calls, test.Calls, seen)
	}
	perMsg := float64(isend.Ir+test.Ir) / iters
	fmt.Printf("P4 size=4096 instructions_per_message=%.0f isend_ir_per_call=%.0f test_ir_per_call=%.0f isend_calls_per_message=%.2f test_calls_per_message=%.2f messages=%d\n",
		perMsg, float64(isend.Ir)/float64(isend.Calls), float64(test.Ir)/float64(test.Calls),
		float64(isend.Calls)/iters, float64(test.Calls)/iters, iters)
	saveFigures(t, "p4", []figure{{Name: "P4", Key: "size=4096", Plugin: perMsg, Unit: "instructions",
		Note: fmt.Sprintf("per call: isend %.0f, test %.0f; calls per message: isend %.2f, test %.2f",
			float64(isend.Ir)/float64(isend.Calls), float64(test.Ir)/float64(test.Calls),
			float64(isend.Calls)/iters, float64(test.Calls)/iters)}})
}
