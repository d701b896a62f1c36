package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBenchMesh measures the plugin on the lab's SUP mesh (mesh.go) against ib_write_bw on the
// same cable or route, every cable end shaped to meshLinkMbit (netem, a queue long enough that
// nothing is dropped: soft-RoCE resends from a lost packet on, and a short queue would measure
// that instead of the plugin). 4 MiB messages, meshBWReps interleaved (plugin, ib_write_bw)
// pairs per figure, the median ratio. Lines:
//
//	mesh-bw: pair=a1-a3 path=direct link_mbit=25 plugin_mbps=X perftest_mbps=X ratio=X sup_port=a1_sup_a3 reps=3 ratios=X,X,X ci_low=X ci_high=X target=0.95
//	mesh-bw: pair=b1-b3 path=routed via=b2 link_mbit=25 plugin_mbps=X perftest_mbps=X ratio=X ...
//	mesh-bw: case=all-pairs island=A link_mbit=25 plugin_mbps=X one_link_mbps=X ratio=X directions=6 ...
//	mesh-bw: case=parallel pair=a2-a3 link_mbit=25 plugin_mbps=X one_link_mbps=X ratio=X striped=true link_share=X,X ...
//
// Targets: direct >= 0.95, routed >= 0.90, all-pairs >= 2.7 (6 directions at once over one
// link), parallel >= 1.8 with each cable 40-60 %. A benchmark reports; it does not fail on a
// target (the lab's two emulated vCPUs cap what all links at once can move: the line's
// vm_busy says how close the VM was to that cap). It fails when a run moved its bytes on
// another cable than the one measured, which would make the ratio meaningless.
func TestBenchMesh(t *testing.T) {
	lab := benchOrSkip(t)
	defer benchClockPairs(t, meshBWReps)()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	m, err := lab.StartMesh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	defer shapeMesh(context.Background(), t, m, 0)
	shapeMesh(ctx, t, m, meshLinkMbit)
	var figs []figure
	oneLink := map[string]float64{} // island A's one-cable direct pairs' plugin medians
	pairs := [][2]string{{"a1", "a2"}, {"a1", "a3"}, {"a2", "a3"}, {"b1", "b2"}, {"b2", "b3"}, {"b3", "b4"}, {"b4", "b1"}}
	// MPIB_BENCH_MESH=parallel: only the parallel cables against island A's one-cable pairs
	// (about 5 minutes instead of 13).
	parallelOnly := os.Getenv("MPIB_BENCH_MESH") == "parallel"
	if parallelOnly {
		pairs = pairs[:2]
	}
	for _, p := range pairs {
		from, to := m.Node(p[0]), m.Node(p[1])
		if n := len(cablesBetween(from, to)); n > 1 { // one cable's ib_write_bw is no reference for a stripe
			evidence("bench:", "%s-%s: %d cables, the plugin stripes over them: measured by case=parallel", p[0], p[1], n)
			continue
		}
		f := meshBWPair(ctx, t, from, to, nil)
		if from.Name()[0] == 'a' {
			oneLink[from.Name()+"-"+to.Name()] = f.Plugin
		}
		figs = append(figs, f)
	}
	var links []float64
	for _, v := range oneLink {
		links = append(links, v)
	}
	one := median(links)
	if parallelOnly {
		saveFigures(t, "mesh", append(figs, meshBWParallel(ctx, t, m, one)))
		return
	}
	figs = append(figs, meshBWPair(ctx, t, m.Node("b1"), m.Node("b3"), []*Node{m.Node("b2")}),
		meshBWPair(ctx, t, m.Node("b2"), m.Node("b4"), []*Node{m.Node("b3")}))
	figs = append(figs, meshBWAllPairs(ctx, t, m, one), meshBWParallel(ctx, t, m, one))
	saveFigures(t, "mesh", figs)
}

const (
	meshLinkMbit = 25
	meshBWReps   = 3
	meshBWSize   = 4 << 20
	// meshBWSeconds is how long each plugin repetition posts: 4 MiB messages at 25 Mbit/s take
	// 1.34 s each, and the window's messages still in flight then complete within the
	// measurement (ib_write_bw's runs move 5 messages).
	meshBWSeconds = 3
)

// shapeMesh sets every cable end's egress to mbit (netem, a 10000-packet queue), or clears
// it (0). a1's and a2's SUP rail is their cable to each other.
func shapeMesh(ctx context.Context, t *testing.T, m *Mesh, mbit int) {
	t.Helper()
	for _, name := range []string{"a1", "a2", "a3", "b1", "b2", "b3", "b4"} {
		n := m.Node(name)
		var s strings.Builder
		for _, r := range meshPorts(n) {
			if mbit == 0 {
				fmt.Fprintf(&s, "tc qdisc del dev %s root 2>/dev/null; ", n.Netdev(r))
			} else {
				fmt.Fprintf(&s, "tc qdisc replace dev %s root netem rate %dmbit limit 10000 && ", n.Netdev(r), mbit)
			}
		}
		s.WriteString("true")
		if _, errOut, code, err := n.Exec(ctx, nil, "sh", "-c", s.String()); (err != nil || code != 0) && mbit != 0 {
			t.Fatalf("%s: shaping its cables: %v exit %d %s", name, err, code, errOut)
		}
	}
}

// meshBWPair measures from -> to: direct (no relays) or routed through relays (MPIB_SUP_RELAY=1
// on both sides), the plugin against ib_write_bw on the cable or route the plugin chose.
func meshBWPair(ctx context.Context, t *testing.T, from, to *Node, relays []*Node) figure {
	t.Helper()
	pair := from.Name() + "-" + to.Name()
	relayOn := len(relays) > 0
	plugin, port := meshPluginBW(ctx, t, to, from, relayOn)
	clientRail, ok := railOfDev(from, port)
	if !ok {
		t.Fatalf("%s: the plugin's SUP QPs are on %q, not on one of %s's SUP ports", pair, port, from.Name())
	}
	peerRail := meshFarEnd(from, to, clientRail, relays)
	var ref, ratios []float64
	for rep := range meshBWReps {
		res, err := WriteBW{Server: to, Client: from, Rail: clientRail, PeerRail: peerRail, Size: meshBWSize, Iters: 5,
			NoCounters: true, Timeout: 3 * time.Minute}.Run(ctx)
		if err != nil || res.ClientCode != 0 {
			t.Fatalf("%s: ib_write_bw %s -> %s: %v\n%v", pair, from.Dev(clientRail), to.Dev(peerRail), err, res)
		}
		ref = append(ref, res.Gbps*1000)
		ratios = append(ratios, plugin[rep]/ref[rep])
	}
	path, via := "direct", ""
	if relayOn {
		names := make([]string, len(relays))
		for i, n := range relays {
			names[i] = n.Name()
		}
		path, via = "routed", " via="+strings.Join(names, ",")
	}
	f := ratioFigure("mesh-bw", fmt.Sprintf("pair=%s path=%s%s", pair, path, via), "mbps", plugin, ref)
	f.Note = fmt.Sprintf("4 MiB, cables shaped to %d Mbit/s; plugin on %s, ib_write_bw on the same", meshLinkMbit, port)
	evidence("mesh-bw:", "pair=%s path=%s%s link_mbit=%d plugin_mbps=%.1f perftest_mbps=%.1f ratio=%.3f sup_port=%s reps=%d ratios=%s ci_low=%.3f ci_high=%.3f target=%.2f",
		pair, path, via, meshLinkMbit, f.Plugin, f.Ref, f.Ratio, port, meshBWReps, joinFloats(ratios, 3), f.CILow, f.CIHigh, map[bool]float64{false: 0.95, true: 0.90}[relayOn])
	return f
}

// meshFarEnd is to's rail that from's cable rail reaches: the cable's other end, or for a
// routed pair the last relay's cable to to.
func meshFarEnd(from, to *Node, clientRail Rail, relays []*Node) Rail {
	if len(relays) > 0 {
		return LinkRail(relays[len(relays)-1].Name(), false)
	}
	if clientRail == SUP {
		return SUP
	}
	return LinkRail(from.Name(), strings.HasSuffix(string(clientRail), "P"))
}

// meshPluginBW runs one nettest bw run client -> server with every node's whole mesh
// configuration, its meshBWReps repetitions as one size repeated (a process pair under the
// lab's emulated CPUs takes seconds to start), and returns the receiver's Mbit/s per
// repetition and the device the sender's SUP QPs were on.
func meshPluginBW(ctx context.Context, t *testing.T, server, client *Node, relayOn bool) ([]float64, string) {
	t.Helper()
	srv, cli := meshBWStart(ctx, t, server, client, relayOn)
	res := waitPair(ctx, t, srv, cli, "the mesh bw run "+client.Name()+" -> "+server.Name())
	return meshBWResult(t, client, server, res)
}

// meshBWStart starts a bw run. Both drivers sleep 200 µs after a polling turn that completed
// nothing (--idle-us): a 4 MiB message takes over a second here, and two spinning drivers
// would take the two vCPUs that soft-RoCE needs to move the packets (ib_write_bw's server
// does not poll at all), which measures the lab's CPU instead of the plugin.
func meshBWStart(ctx context.Context, t *testing.T, server, client *Node, relayOn bool) (*Process, *Process) {
	sizes := strings.TrimSuffix(strings.Repeat(strconv.Itoa(meshBWSize)+",", meshBWReps), ",")
	return startPair(ctx, t, nettestPair{server: server, client: client, serverEnv: meshFabricEnv(server, relayOn), clientEnv: meshFabricEnv(client, relayOn),
		args: []string{"--timeout-s", "120", "--mode", "bw", "--sizes", sizes, "--seconds", strconv.Itoa(meshBWSeconds),
			"--window", "4", "--warmup", "1", "--mem-limit", "128M", "--idle-us", "200"}})
}

func meshBWResult(t *testing.T, client, server *Node, res pairResult) ([]float64, string) {
	t.Helper()
	pair := client.Name() + "-" + server.Name()
	if res.serverCode != 0 || res.clientCode != 0 {
		t.Fatalf("%s: nettest bw failed:\n%s", pair, res)
	}
	mt := sendCommRe.FindStringSubmatch(res.clientErr)
	var mbps []float64
	for _, bw := range bwLineRe.FindAllStringSubmatch(res.serverOut, -1) {
		v, _ := strconv.ParseFloat(bw[4], 64)
		mbps = append(mbps, v)
	}
	if len(mbps) != meshBWReps || mt == nil {
		t.Fatalf("%s: %d bw figures of %d, or no send comm INFO line:\n%s", pair, len(mbps), meshBWReps, res)
	}
	return mbps, mt[3]
}

// meshBWAllPairs runs island A's 6 directions at once (each node sends to and receives from
// both others) and compares their sum, per repetition, with one link's plugin figure.
func meshBWAllPairs(ctx context.Context, t *testing.T, m *Mesh, oneLink float64) figure {
	t.Helper()
	dirs := [][2]string{{"a1", "a2"}, {"a2", "a1"}, {"a1", "a3"}, {"a3", "a1"}, {"a2", "a3"}, {"a3", "a2"}}
	c0 := readVMCPU(t, m.Node("a1"))
	procs := make([][2]*Process, len(dirs))
	for i, d := range dirs {
		procs[i][0], procs[i][1] = meshBWStart(ctx, t, m.Node(d[1]), m.Node(d[0]), false)
	}
	sums := make([]float64, meshBWReps)
	var per []string
	for i, d := range dirs {
		res := waitPair(ctx, t, procs[i][0], procs[i][1], "all-pairs "+d[0]+" -> "+d[1])
		mbps, _ := meshBWResult(t, m.Node(d[0]), m.Node(d[1]), res)
		for rep, v := range mbps {
			sums[rep] += v
		}
		per = append(per, fmt.Sprintf("%s-%s:%.1f", d[0], d[1], median(mbps)))
	}
	var split cpuSplit
	split.add(c0, readVMCPU(t, m.Node("a1")))
	ratios := make([]float64, len(sums))
	for i, v := range sums {
		ratios[i] = v / oneLink
	}
	// The six runs start one after another: their repetitions overlap in time but do not line
	// up exactly, so a repetition's sum is approximate; the median evens that out.
	evidence("mesh-bw:", "case=all-pairs island=A link_mbit=%d plugin_mbps=%.1f one_link_mbps=%.1f ratio=%.3f directions=%d reps=%d ratios=%s per_direction=%s vm_busy=%.2f target=2.70",
		meshLinkMbit, median(sums), oneLink, median(ratios), len(dirs), meshBWReps, joinFloats(ratios, 3), strings.Join(per, ","), 1-split.idle/split.total)
	f := ratioFigure("mesh-bw", "case=all-pairs island=A", "mbps", sums, repeat(oneLink, len(sums)))
	f.Note = fmt.Sprintf("6 directions at once over one link's median; VM busy %.2f", 1-split.idle/split.total)
	return f
}

// meshBWParallel sends a2 -> a3, where two cables join them, and reports how the bytes split
// between the cables: the SUP rail stripes over both (striped=true when each carried at least
// 10 % of the bytes).
func meshBWParallel(ctx context.Context, t *testing.T, m *Mesh, oneLink float64) figure {
	t.Helper()
	a2, a3 := m.Node("a2"), m.Node("a3")
	cables := cablesBetween(a2, a3)
	before := meshCounters(ctx, t, a2, cables...)
	mbps, _ := meshPluginBW(ctx, t, a3, a2, false)
	after := meshCounters(ctx, t, a2, cables...)
	var total uint64
	tx := make([]uint64, len(cables))
	for i, r := range cables {
		tx[i] = after[r].TxBytes - before[r].TxBytes
		total += tx[i]
	}
	names, shares := make([]string, len(cables)), make([]string, len(cables))
	for i, r := range cables {
		names[i] = a2.Dev(r)
		shares[i] = fmt.Sprintf("%.2f", float64(tx[i])/float64(max(total, 1)))
	}
	ratios := make([]float64, len(mbps))
	for i, v := range mbps {
		ratios[i] = v / oneLink
	}
	striped := len(cables) > 1
	for _, x := range tx {
		striped = striped && x*10 >= total
	}
	evidence("mesh-bw:", "case=parallel pair=a2-a3 link_mbit=%d plugin_mbps=%.1f one_link_mbps=%.1f ratio=%.3f striped=%t cables=%s link_share=%s reps=%d ratios=%s target=1.80",
		meshLinkMbit, median(mbps), oneLink, median(ratios), striped, strings.Join(names, ","), strings.Join(shares, ","), meshBWReps, joinFloats(ratios, 3))
	f := ratioFigure("mesh-bw", "case=parallel pair=a2-a3", "mbps", mbps, repeat(oneLink, len(mbps)))
	f.Note = "cable shares " + strings.Join(shares, ",")
	return f
}

func repeat(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func joinFloats(xs []float64, prec int) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = strconv.FormatFloat(x, 'f', prec, 64)
	}
	return strings.Join(out, ",")
}
