package integration

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpib/mpib/integration/kv"
	"github.com/mpib/mpib/integration/scalestat"
)

// Scale: many connections between two nodes through mpib-nettest's connect and resources
// modes (plugin/nettest/scale.c, docs/nettest.md "Scale modes"). Each side listens N times,
// the handles cross the side channel, and one thread polls N connects and N accepts until
// all are up (NCCL's proxy); then a verified message on every comm in both directions, and
// everything is closed. TestScaleConnect (8 comms per process) is part of the normal suite;
// the 512-connection run is slow under TCG and runs with the benchmarks (TestBenchScale512,
// MPIB_BENCH=1) or with MPIB_SCALE=1.

// scaleResult is both sides' lines of one connect/resources run.
type scaleResult struct {
	res                pairResult
	connect, resources [2]kv.Record   // [server, client], first round
	rounds             [2][]kv.Record // [server, client], resources line of every round
	wall               time.Duration
}

// runScale runs nettest --mode mode --comms n between two nodes with a generous bound.
func runScale(t *testing.T, server, client *Node, mode string, n, rounds int, timeout time.Duration, extra ...string) scaleResult {
	t.Helper()
	return runScaleOf(t, mpibUnderTest, server, client, mode, n, rounds, timeout, extra...)
}

// runScaleOf is runScale with plugin u on both sides.
func runScaleOf(t *testing.T, u underTest, server, client *Node, mode string, n, rounds int, timeout time.Duration, extra ...string) scaleResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	args := append([]string{"--timeout-s", strconv.Itoa(int(timeout.Seconds()) - 30), "--mode", mode, "--comms", strconv.Itoa(n),
		"--rounds", strconv.Itoa(rounds)}, extra...)
	start := time.Now()
	srv, cli := startPair(ctx, t, nettestPair{server: server, client: client, serverEnv: u.env(server), clientEnv: u.env(client),
		serverLib: u.lib, clientLib: u.lib, args: args})
	var r scaleResult
	var cerr, serr error
	r.res.clientOut, r.res.clientErr, r.res.clientCode, cerr = cli.Wait(ctx)
	r.res.serverOut, r.res.serverErr, r.res.serverCode, serr = srv.Wait(ctx)
	r.wall = time.Since(start)
	if cerr != nil || serr != nil {
		srv.Kill(context.Background())
		cli.Kill(context.Background())
		t.Fatalf("nettest --mode %s --comms %d did not finish in %v: client %v, server %v", mode, n, timeout, cerr, serr)
	}
	for i, out := range []string{r.res.serverOut, r.res.clientOut} {
		if c := kv.Lines(out, "nettest-connect:"); len(c) > 0 {
			r.connect[i] = c[0]
		}
		r.rounds[i] = kv.Lines(out, "nettest-resources:")
		if len(r.rounds[i]) > 0 {
			r.resources[i] = r.rounds[i][0]
		}
	}
	return r
}

// ok reports whether both sides exited 0 and printed verified=true (first round; a later
// round that fails makes the process exit 1).
func (r scaleResult) ok() bool {
	if r.res.serverCode != 0 || r.res.clientCode != 0 {
		return false
	}
	for i := range 2 {
		if r.connect[i] == nil || r.connect[i]["verified"] != "true" || r.resources[i] == nil {
			return false
		}
	}
	return true
}

// diag returns the driver's own messages and the plugin's warnings from both sides' stderr
// (the plugin's INFO lines for 2 x 512 comms would bury them).
func (r scaleResult) diag() string {
	var b strings.Builder
	for i, errOut := range []string{r.res.serverErr, r.res.clientErr} {
		fmt.Fprintf(&b, "%s (exit %d):\n", []string{"server", "client"}[i], []int{r.res.serverCode, r.res.clientCode}[i])
		n := 0
		for _, l := range strings.Split(errOut, "\n") {
			low := strings.ToLower(l)
			if strings.HasPrefix(l, "mpib-nettest:") || strings.HasPrefix(l, "NCCL WARN") || strings.Contains(l, "reclaimed") ||
				strings.Contains(low, "dropped") || strings.Contains(low, "fail") || strings.Contains(low, "timeout") ||
				strings.Contains(low, "timed out") || strings.Contains(low, "refused") || strings.Contains(low, "reset") {
				if n++; n <= 40 {
					fmt.Fprintf(&b, "  %s\n", l)
				}
			}
		}
	}
	return b.String()
}

// worst returns the larger of the two sides' values of key in the connect line.
func (r scaleResult) worst(key string) float64 {
	return math.Max(r.connect[0].Float(key), r.connect[1].Float(key))
}

// worstOfRound is worst over round n's nettest-connect lines (worst reads round 1's); NaN
// when a side printed no line for round n.
func (r scaleResult) worstOfRound(n int, key string) float64 {
	v := math.Inf(-1)
	for _, out := range []string{r.res.serverOut, r.res.clientOut} {
		lines := kv.Lines(out, "nettest-connect:")
		if len(lines) < n {
			return math.NaN()
		}
		v = math.Max(v, lines[n-1].Float(key))
	}
	return v
}

// nodeLimits reports what a node allows a process: fds, locked memory, and the rxe device's
// object limits (which bound how many connections a device can carry).
func nodeLimits(t *testing.T, n *Node) string {
	t.Helper()
	script := `printf 'nofile=%s/%s memlock=%s/%s ' "$(ulimit -Sn)" "$(ulimit -Hn)" "$(ulimit -Sl)" "$(ulimit -Hl)";` +
		`ibv_devinfo -v -d "$0" 2>/dev/null | awk '$1=="max_qp:"||$1=="max_cq:"||$1=="max_srq:"||$1=="max_mr:"||$1=="max_qp_wr:"{printf "%s=%s ", substr($1,1,length($1)-1), $2}';` +
		`awk '/MemTotal|MemAvailable/{printf "%s=%dMiB ", substr($1,1,length($1)-1), $2/1024}' /proc/meminfo`
	out, errOut, code, err := n.Exec(context.Background(), nil, "sh", "-c", script, n.Dev(SUP))
	if err != nil || code != 0 {
		return fmt.Sprintf("unknown (%v exit %d %s)", err, code, errOut)
	}
	return strings.TrimSpace(out)
}

// TestScaleConnect: 4 send + 4 receive comms per process (comms=8), both directions set up at
// once, inside island A (a1 <-> a2: SOUT and SUP QPs) and across islands (a1 <-> b1: SOUT
// only, through the router). Every comm carries one verified 4 KiB message each way. The
// cycle runs twice in each process: the times are the first round's (what a job's start
// sees); no fd may stay open after either round, and the second round must end, at rest,
// with the first round's fds and fewer than 4 threads more than it (the Go runtime keeps the
// threads it made and now and then makes one more; a thread per connection would add 4).
func TestScaleConnect(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2, b1 := lab.Node("a1"), lab.Node("a2"), lab.Node("b1")
	times := map[string]float64{}
	for _, c := range []struct {
		name   string
		server *Node
	}{{"intra", a2}, {"inter", b1}} {
		// --report-every 1: each round's close is read at rest (0.5 s after it: the plugin ends
		// its idle threads 200 ms after its last call), not while its last calls wind down.
		r := runScale(t, c.server, a1, "connect", 4, 2, 3*time.Minute, "--report-every", "1")
		if !r.ok() {
			t.Fatalf("connect %s (a1 <-> %s) failed:\n%s\n%s", c.name, c.server.Name(), r.diag(), r.res)
		}
		for i := range 2 {
			if len(r.rounds[i]) != 2 {
				t.Fatalf("%s: expected 2 rounds:\n%s", c.name, r.res)
			}
			r1, r2 := r.rounds[i][0], r.rounds[i][1]
			if r1["leaked_fds"] != "0" || r2["leaked_fds"] != "0" {
				t.Errorf("%s: fds open after close: %v / %v", c.name, r1, r2)
			}
			if r2.Float("threads_closed")-r1.Float("threads_closed") >= 4 || r2.Float("fds_closed") != r1.Float("fds_closed") {
				t.Errorf("%s: round 2 ended with more threads or fds than round 1: %v / %v", c.name, r1, r2)
			}
			cl := r.connect[i]
			evidence("scale:", "pair=a1-%s side=%s total_s=%s longest_connect_ms=%s longest_accept_ms=%s connect_calls=%s accept_calls=%s threads=%s->%s->%s,%s fds=%s->%s->%s,%s rss_kib=%s->%s->%s",
				c.server.Name(), []string{"server", "client"}[i], cl["total_s"], cl["longest_connect_ms"], cl["longest_accept_ms"],
				cl["connect_calls"], cl["accept_calls"], r1["threads_before"], r1["threads_connected"], r1["threads_closed"], r2["threads_closed"],
				r1["fds_before"], r1["fds_connected"], r1["fds_closed"], r2["fds_closed"], r1["rss_before_kib"], r1["rss_connected_kib"], r2["rss_closed_kib"])
		}
		for i, errOut := range []string{r.res.serverErr, r.res.clientErr} {
			evidence("connect-steps:", "pair=a1-%s side=%s %s", c.server.Name(), []string{"server", "client"}[i], scalestat.SetupSteps(errOut))
		}
		for i, out := range []string{r.res.serverOut, r.res.clientOut} { // the driver's own line per round: the first
			if ls := kv.Containing(out, "connect-phases:"); len(ls) > 0 {
				evidence("connect-phases:", "pair=a1-%s side=%s %s", c.server.Name(), []string{"server", "client"}[i],
					strings.TrimSpace(strings.TrimPrefix(ls[0], "connect-phases:")))
			}
		}
		times[c.name] = r.worst("total_s")
		evidence("scale:", "pair=a1-%s comms=4+4 total_s=%.3f longest_call_ms=%.1f wall_s=%.1f", c.server.Name(),
			times[c.name], r.worst("longest_call_ms"), r.wall.Seconds())
	}
	evidence("connect:", "comms=8 intra_s=%.3f inter_s=%.3f", times["intra"], times["inter"])
}

// TestBenchConnect8: TestScaleConnect's setup of 4 + 4 comms (the first of two rounds, the
// worst side; the second round beside it: the setups after a process's first), inside island
// A (a1 <-> a2) and across islands (a1 <-> b1), benchPairs() times, each beside the net_ib
// reference when it is built (harness_netib_test.go; which of the two goes first alternates).
// Prints the medians in CI's connect: line (with the second round's and the reference's
// fields added) and, per case and round, the ratio to the reference with its interval and both
// plugins' CPU time and context switches (both processes of the pair, from the driver's
// connect-phases: line): the VM's two CPUs are shared by both processes, so a setup's CPU
// is what sets its time there.
func TestBenchConnect8(t *testing.T) {
	lab := benchOrSkip(t)
	defer benchClock(t)()
	a1 := lab.Node("a1")
	unders := []underTest{mpibUnderTest}
	if netibRef(t) {
		unders = append(unders, netibUnderTest)
	}
	cases := []struct {
		name   string
		server *Node
	}{{"intra", lab.Node("a2")}, {"inter", lab.Node("b1")}}
	type sample struct{ s, second, cpuMS, sysMS, ctxsw, caller, busiest []float64 }
	got := map[string]*sample{}
	for pair := 0; pair < benchPairs(); pair++ {
		for _, c := range cases {
			for i := range unders {
				u := unders[(pair+i)%len(unders)]
				r := runScaleOf(t, u, c.server, a1, "connect", 4, 2, 3*time.Minute, "--report-every", "1")
				if !r.ok() {
					t.Fatalf("%s connect %s (a1 <-> %s) failed:\n%s\n%s", u.name, c.name, c.server.Name(), r.diag(), r.res)
				}
				k := u.name + " " + c.name
				if got[k] == nil {
					got[k] = &sample{}
				}
				var cpu, sys, sw, caller, busiest float64
				for _, out := range []string{r.res.serverOut, r.res.clientOut} {
					ph := kv.First(out, "connect-phases:")
					cpu, sys, sw = cpu+ph.Float("setup_cpu_ms"), sys+ph.Float("setup_sys_ms"), sw+ph.Float("setup_ctxsw")
					caller, busiest = caller+ph.Float("setup_ctxsw_caller"), busiest+ph.Float("setup_ctxsw_busiest")
				}
				g := got[k]
				g.s, g.cpuMS, g.sysMS, g.ctxsw = append(g.s, r.worst("total_s")), append(g.cpuMS, cpu), append(g.sysMS, sys), append(g.ctxsw, sw)
				g.second = append(g.second, r.worstOfRound(2, "total_s"))
				g.caller, g.busiest = append(g.caller, caller), append(g.busiest, busiest)
			}
		}
	}
	line := fmt.Sprintf("comms=8 intra_s=%.3f inter_s=%.3f pairs=%d intra_round2_s=%.3f inter_round2_s=%.3f", median(got["mpib intra"].s),
		median(got["mpib inter"].s), benchPairs(), median(got["mpib intra"].second), median(got["mpib inter"].second))
	var figs, seconds []figure
	for _, c := range cases {
		m := got["mpib "+c.name]
		note := fmt.Sprintf("a1 <-> %s, first round; CPU of both processes %.0f ms (%.0f in the kernel), %.0f context switches (%.0f of the calling threads, %.0f of each process's busiest other thread, summed)",
			c.server.Name(), median(m.cpuMS), median(m.sysMS), median(m.ctxsw), median(m.caller), median(m.busiest))
		f := figure{Name: "connect", Key: "comms=8 case=" + c.name, Plugin: median(m.s), Unit: "s", Note: note}
		if n := got["netib "+c.name]; n != nil {
			f = ratioFigure("connect", f.Key, "s", m.s, n.s)
			f.Note = note + fmt.Sprintf("; reference: net_ib's port (nccl-rdma-sharp-plugins, one rail) %.0f ms of CPU (%.0f), %.0f context switches (%.0f, %.0f)",
				median(n.cpuMS), median(n.sysMS), median(n.ctxsw), median(n.caller), median(n.busiest))
			line += fmt.Sprintf(" netib_%s_s=%.3f", c.name, median(n.s))
			evidence("connect-netib:", "case=%s mpib_s=%.3f netib_s=%.3f ratio=%.3f ci_low=%.3f ci_high=%.3f mpib_cpu_ms=%.0f netib_cpu_ms=%.0f mpib_ctxsw=%.0f netib_ctxsw=%.0f pairs=%d mpib_sys_ms=%.0f netib_sys_ms=%.0f mpib_ctxsw_caller=%.0f netib_ctxsw_caller=%.0f mpib_ctxsw_busiest=%.0f netib_ctxsw_busiest=%.0f",
				c.name, f.Plugin, f.Ref, f.Ratio, f.CILow, f.CIHigh, median(m.cpuMS), median(n.cpuMS), median(m.ctxsw), median(n.ctxsw), f.Pairs,
				median(m.sysMS), median(n.sysMS), median(m.caller), median(n.caller), median(m.busiest), median(n.busiest))
			second := ratioFigure("connect", f.Key+" round=2", "s", m.second, n.second)
			second.Note = fmt.Sprintf("a1 <-> %s, the second round of the same processes, after the first closed and they came to rest: the setups after a process's first", c.server.Name())
			seconds = append(seconds, second)
			evidence("connect-netib:", "case=%s round=2 mpib_s=%.3f netib_s=%.3f ratio=%.3f ci_low=%.3f ci_high=%.3f pairs=%d",
				c.name, second.Plugin, second.Ref, second.Ratio, second.CILow, second.CIHigh, second.Pairs)
		}
		figs = append(figs, f)
	}
	evidence("connect:", "%s", line)
	saveFigures(t, "connect8", append(figs, seconds...))
}

// TestAddressChange: addresses change while jobs run (an operator renumbering a rail, a DHCP
// renewal). Between two connect rounds of one process pair, a1's SUP rail gains a second
// address in its subnet and then loses the first, so the first address's GID entry goes empty.
// The second round must connect on the new address: the plugin reads the GID table again when
// the device reports IBV_EVENT_GID_CHANGE (a cache that only aged would hand out the emptied
// entry for up to 30 s, and the SUP QPs would not come up). Afterwards the first address comes
// back and the second goes, and a1's GID index is read again for the tests after this one.
func TestAddressChange(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	netdev, oldIP := a1.Netdev(SUP), a1.IP(SUP)
	out, err := a1.output(ctx, "sh", "-c", `ip -o -4 addr show dev "$0" | awk '{print $4; exit}'`, netdev)
	if err != nil {
		t.Fatal(err)
	}
	pfx, err := netip.ParsePrefix(strings.TrimSpace(out))
	if err != nil || pfx.Addr().String() != oldIP {
		t.Fatalf("a1 %s: address %q, expected %s/N (%v)", netdev, out, oldIP, err)
	}
	newIP := pfx.Masked().Addr().As4()
	newIP[3] = 200
	oldAddr, newAddr := pfx.String(), fmt.Sprintf("%s/%d", netip.AddrFrom4(newIP), pfx.Bits())
	promote, err := a1.output(ctx, "sysctl", "-n", "net.ipv4.conf."+netdev+".promote_secondaries")
	if err != nil {
		t.Fatal(err)
	}
	restore := func() {
		script := `ip addr add "$1" dev "$0" 2>/dev/null; ip addr del "$2" dev "$0" 2>/dev/null; true`
		if _, err := a1.output(context.Background(), "sh", "-c", script, netdev, oldAddr, newAddr); err != nil {
			t.Errorf("restoring a1's SUP address: %v", err)
		}
		// The tests after this one use a1's SUP GID index: record where the old address is now.
		idx, err := waitSwappedGID(a1, a1.Dev(SUP), pfx.Addr().String(), netip.AddrFrom4(newIP).String())
		if err != nil {
			t.Errorf("a1's SUP GID after the address came back: %v", err)
		} else {
			a1.gid[SUP] = idx
		}
		a1.run(context.Background(), "sysctl", "-qw", "net.ipv4.conf."+netdev+".promote_secondaries="+strings.TrimSpace(promote))
	}
	defer restore()
	gate := fmt.Sprintf("/tmp/mpib-gate-%d", time.Now().UnixNano())
	srv, cli := startPair(ctx, t, nettestPair{server: a2, client: a1, serverEnv: pluginEnv(a2), clientEnv: pluginEnv(a1),
		args: []string{"--timeout-s", "150", "--mode", "connect", "--comms", "2", "--rounds", "2", "--round-gate", gate}})
	defer srv.Kill(context.Background())
	defer cli.Kill(context.Background())
	for _, n := range []*Node{a1, a2} {
		if _, err := n.output(ctx, "sh", "-c", `i=0; until [ -e "$0.ready" ]; do i=$((i+1)); [ $i -lt 600 ] || exit 1; sleep 0.2; done`, gate); err != nil {
			t.Fatalf("%s never finished the first round: %v", n.Name(), err)
		}
	}
	// promote_secondaries keeps the subnet's other address when the primary one goes.
	change := `sysctl -qw "net.ipv4.conf.$0.promote_secondaries=1" && ip addr add "$2" dev "$0" && ip addr del "$1" dev "$0"`
	if _, err := a1.output(ctx, "sh", "-c", change, netdev, oldAddr, newAddr); err != nil {
		t.Fatal(err)
	}
	// The kernel updates the GID table after ip returns: the round starts once it has.
	if _, err := waitSwappedGID(a1, a1.Dev(SUP), netip.AddrFrom4(newIP).String(), pfx.Addr().String()); err != nil {
		t.Fatalf("the GID table did not follow the address change: %v", err)
	}
	for _, n := range []*Node{a1, a2} {
		if _, err := n.output(ctx, "touch", gate); err != nil {
			t.Fatal(err)
		}
	}
	cOut, cErr, cCode, err := cli.Wait(ctx)
	sOut, _, sCode, err2 := srv.Wait(ctx)
	if err != nil || err2 != nil {
		t.Fatalf("nettest did not finish: %v %v", err, err2)
	}
	rounds := kv.Lines(cOut, "nettest-connect:")
	events := strings.Count(cErr, "GID table changed")
	comms := linesContaining(cErr, "intra-island, SOUT QPs")
	onSup := len(linesContaining(strings.Join(comms, "\n"), "SUP QPs 1,"))
	evidence("addr-change:", "rail=SUP old=%s new=%s gid_change_events=%d rounds_connected=%d comms=%d comms_with_sup=%d exit=%d/%d",
		oldAddr, newAddr, events, len(rounds), len(comms), onSup, cCode, sCode)
	if cCode != 0 || sCode != 0 || len(rounds) != 2 || len(kv.Lines(sOut, "nettest-connect:")) != 2 {
		t.Fatalf("the second round failed after the address change (client exit %d, server exit %d):\n%s", cCode, sCode,
			strings.Join(linesContaining(cErr, "WARN", "mpib-nettest:"), "\n"))
	}
	for _, r := range rounds {
		if r["verified"] != "true" {
			t.Errorf("a round's data did not verify: %v", r)
		}
	}
	if events == 0 {
		t.Errorf("the plugin logged no GID table change")
	}
	// A stale GID entry does not fail the connect: the SUP address it names is empty, the
	// subnet check drops SUP, and the comm runs on SOUT only. So SUP must be there in both rounds.
	if len(comms) != 8 || onSup != len(comms) {
		t.Errorf("%d of %d comms (2 rounds x 2 send + 2 recv) have SUP QPs:\n%s", onSup, len(comms),
			strings.Join(linesContaining(cErr, "intra-island, SOUT QPs", "share no subnet"), "\n"))
	}
}

// waitSwappedGID waits (up to 20 s) until dev's GID table holds the RoCE v2 GID of the IPv4
// address want and none of gone, and returns want's index.
func waitSwappedGID(n *Node, dev, want, gone string) (int, error) {
	script := `d=/sys/class/infiniband/$0/ports/1; w=$1; g=$2; tries=100
	while :; do # one grep over the table (1024 entries on rxe: a process per entry is minutes under TCG)
		found=; stale=
		for f in $(grep -lx -e "$w" -e "$g" $d/gids/* 2>/dev/null); do
			i=${f##*/}
			[ "$(cat $d/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] || continue
			[ "$(cat $f)" = "$w" ] && found=$i || stale=$i
		done
		[ -n "$found" ] && [ -z "$stale" ] && { echo $found; exit 0; }
		tries=$((tries - 1)); [ $tries -gt 0 ] || { echo "GIDs of $0: want $w at ${found:-none}, $g still at ${stale:-none}" >&2; exit 1; }
		sleep 0.2
	done`
	out, err := n.output(context.Background(), "sh", "-c", script, dev, sysfsGID(want), sysfsGID(gone))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(out))
}

// sysfsGID is how /sys/class/infiniband shows the IPv4-mapped GID of addr.
func sysfsGID(addr string) string {
	a := netip.MustParseAddr(addr).As4()
	return fmt.Sprintf("0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", a[0], a[1], a[2], a[3])
}

// scaleBenchNodes skips a run of n connections each way unless MPIB_SCALE=1 or MPIB_BENCH=1
// (slow under TCG), and returns a1, a2 and what ends the bench clock.
func scaleBenchNodes(t *testing.T, n int) (a1, a2 *Node, done func()) {
	t.Helper()
	if os.Getenv("MPIB_SCALE") != "1" && os.Getenv("MPIB_BENCH") != "1" {
		t.Skipf("the %d-connection run is slow under TCG: MPIB_SCALE=1 or MPIB_BENCH=1", n)
	}
	lab := labOrSkip(t)
	return lab.Node("a1"), lab.Node("a2"), benchClockPairs(t, 1)
}

// TestBenchScale512 (also with MPIB_SCALE=1): 512 connections per direction between a1 and
// a2, i.e. per process 512 listen, 512 send and 512 recv comms; one 64 KiB verified message
// on each comm each way; then everything closed. Prints the resources and connect lines.
// The plugin may fail at this scale: the test then reports how (which call, after how many
// comms, with what the nodes allow) and fails.
func TestBenchScale512(t *testing.T) {
	const n = 512
	a1, a2, done := scaleBenchNodes(t, n)
	defer done()
	evidence("scale:", "limits a1: %s", nodeLimits(t, a1))
	// --report-every 1: the leak line too, read at rest after the close (the threads line);
	// --call-stats: what the calling thread went through in each call (blocked, descheduled).
	r := runScale(t, a2, a1, "resources", n, 1, 15*time.Minute, "--report-every", "1", "--call-stats")
	for i, side := range []string{"server a2", "client a1"} {
		evidence("scale:", "%s %v", side, hasLine([]string{r.res.serverOut, r.res.clientOut}[i], "nettest-resources:"))
		evidence("scale:", "%s %v", side, hasLine([]string{r.res.serverOut, r.res.clientOut}[i], "nettest-connect:"))
	}
	if !r.ok() {
		t.Fatalf("%d connections failed after %.0f s:\n%s", n, r.wall.Seconds(), r.diag())
	}
	perConn := math.Max(r.resources[0].Float("per_conn_kib"), r.resources[1].Float("per_conn_kib"))
	evidence("resources:", "conns=%d per_conn_kib=%.0f verified=true", n, perConn)
	evidence("connect:", "comms=%d total_s=%.3f longest_call_ms=%.1f calls_blocked=%.0f longest_own_ms=%.1f", n, r.worst("total_s"),
		r.worst("longest_call_ms"), r.worst("calls_blocked"), r.worst("longest_own_ms"))
	// The threads MPIB added (the driver's own subtracted): at rest after every comm closed,
	// the most while they were set up, and at rest after minus before the first listen.
	var atRest, burst, growth float64
	for i, out := range []string{r.res.serverOut, r.res.clientOut} {
		leak := kv.Lines(out, "nettest-leak:")
		if len(leak) == 0 {
			t.Fatalf("no nettest-leak line from the %s:\n%s", []string{"server", "client"}[i], out)
		}
		driver := leak[0].Float("threads_driver")
		atRest = math.Max(atRest, leak[0].Float("threads")-driver)
		burst = math.Max(burst, leak[0].Float("threads_peak")-driver)
		growth = math.Max(growth, leak[0].Float("threads")-r.resources[i].Float("threads_before"))
	}
	evidence("threads:", "at_rest=%.0f burst_max=%.0f growth=%.0f comms=%d", atRest, burst, growth, n)
	for i := range 2 {
		if r.resources[i]["leaked_fds"] != "0" {
			t.Errorf("fds leaked after close: %v", r.resources[i])
		}
	}
	saveFigures(t, "scale", []figure{
		{Name: "resources", Key: fmt.Sprintf("conns=%d", n), Plugin: perConn, Unit: "KiB per connection",
			Note: fmt.Sprintf("RSS a1 %s -> %s KiB connected (verbs rings %s, anonymous %s), a2 %s -> %s KiB; threads a1 %s -> %s -> %s; fds a1 %s -> %s -> %s",
				r.resources[1]["rss_before_kib"], r.resources[1]["rss_connected_kib"], r.resources[1]["rss_verbs_connected_kib"],
				r.resources[1]["rss_anon_connected_kib"], r.resources[0]["rss_before_kib"],
				r.resources[0]["rss_connected_kib"], r.resources[1]["threads_before"], r.resources[1]["threads_connected"],
				r.resources[1]["threads_closed"], r.resources[1]["fds_before"], r.resources[1]["fds_connected"], r.resources[1]["fds_closed"])},
		{Name: "connect", Key: fmt.Sprintf("comms=%d", n), Plugin: r.worst("total_s"), Unit: "s",
			Note: fmt.Sprintf("longest single call %.1f ms; by kind: first connect %.1f, connect poll %.1f, connect returning the comm %.1f, accept poll %.1f, accept returning the comm %.1f; "+
				"calls that blocked %.0f (longest %.1f ms), descheduled %.0f; the most a call took less its run delay %.1f ms (the longest never descheduled: %.1f ms; the most CPU time: %.1f ms)",
				r.worst("longest_call_ms"), r.worst("connect_first_ms"), r.worst("connect_poll_ms"), r.worst("connect_done_ms"),
				r.worst("accept_poll_ms"), r.worst("accept_done_ms"), r.worst("calls_blocked"), r.worst("longest_blocked_ms"),
				r.worst("calls_descheduled"), r.worst("longest_own_ms"), r.worst("longest_unswitched_ms"), r.worst("longest_call_cpu_ms"))},
	})
}

// TestBenchMemory256 (MPIB_BENCH=1 or MPIB_SCALE=1): 256 connections per direction between a1
// and a2 (per process 256 send and 256 recv comms, one verified 64 KiB message each way), read
// as memory: the RSS each process grew by per send+receive pair, split into the verbs rings the
// provider mapped and the rest, and the verbs objects the node gained (rdma res).
func TestBenchMemory256(t *testing.T) {
	const n = 256
	a1, a2, done := scaleBenchNodes(t, n)
	defer done()
	r := runScale(t, a2, a1, "resources", n, 1, 10*time.Minute, "--rdma-res")
	if !r.ok() {
		t.Fatalf("%d connections failed after %.0f s:\n%s", n, r.wall.Seconds(), r.diag())
	}
	worst := 0 // the side that grew more
	if r.resources[1].Float("per_conn_kib") > r.resources[0].Float("per_conn_kib") {
		worst = 1
	}
	res := r.resources[worst]
	perPair := res.Float("per_conn_kib")
	qps, cqs, srqs := res.Float("qps_grown"), res.Float("cqs_grown"), res.Float("srqs_grown")
	if qps <= 0 || cqs <= 0 {
		t.Fatalf("rdma res did not count this node's verbs objects: %v", res)
	}
	fig := figure{Name: "memory", Key: fmt.Sprintf("comms=%d", n), Plugin: perPair, Unit: "KiB per send+recv pair",
		Note: fmt.Sprintf("verbs rings %.0f KiB per pair; %.1f QPs and %.1f CQs per pair; %.0f SRQs in the process",
			res.Float("rss_verbs_connected_kib")/n, qps/n, cqs/n, srqs)}
	vsNetib := ""
	if netibRef(t) { // the same run of the reference, right after
		nr := runScaleOf(t, netibUnderTest, a2, a1, "resources", n, 1, 10*time.Minute, "--rdma-res")
		if !nr.ok() {
			t.Fatalf("the net_ib reference's %d connections failed after %.0f s:\n%s", n, nr.wall.Seconds(), nr.diag())
		}
		ref := math.Max(nr.resources[0].Float("per_conn_kib"), nr.resources[1].Float("per_conn_kib"))
		note := fig.Note
		fig = ratioFigure("memory", fig.Key, fig.Unit, []float64{perPair}, []float64{ref})
		fig.Note = note + fmt.Sprintf("; reference: net_ib's port (nccl-rdma-sharp-plugins, one rail), the same run right after: %.1f QPs per pair",
			math.Max(nr.resources[0].Float("qps_grown"), nr.resources[1].Float("qps_grown"))/n)
		vsNetib = fmt.Sprintf(" netib_kib_per_pair=%.0f vs_netib=%.2f", ref, perPair/ref)
	}
	evidence("memory:", "comms=%d rss_kib_per_pair=%.0f qps_per_pair=%.1f cqs=%.0f srqs=%.0f cqs_per_pair=%.1f verbs_kib_per_pair=%.0f other_kib_per_pair=%.0f side=%s target_kib=360 ratio=%.2f%s",
		n, perPair, qps/n, cqs, srqs, cqs/n, res.Float("rss_verbs_connected_kib")/n,
		perPair-res.Float("rss_verbs_connected_kib")/n, []string{"server", "client"}[worst], perPair/360, vsNetib)
	saveFigures(t, "memory", []figure{fig})
}
