package integration

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The closed-loop policy in the lab (issue 10): one long verified a1->a2 transfer in advanced
// mode per agent, a1's rails shaped SOUT 25 / SUP 50 Mbit/s (phase 1), SUP cut to 12.5
// (phase 2), SUP back to 50 (phase 3). The loop is never told the capacities; it must reach
// 95 % of the best static split, measured by a sweep in the same transfer, within 10 s of
// each change.
//
// One transfer per agent:
//  1. sweep: static hints (the Go CLI's `set` and `heartbeat`, the reference, not the agent
//     under test) at the theoretical optimum 1024*sup/(sup+sout) and +-clSweepOffset, under
//     phase 1's and phase 2's shaping; best_static_mbps of a phase is the best point's rate
//     (phase 3 has phase 1's shaping and reuses its sweep);
//  2. hand-over: the heartbeat stops, shaping returns to phase 1, the agent under test starts
//     `run --policy closed-loop --interval 0.5`; phase 1 starts when the loop's first hint
//     (512, ClosedLoopStart) is in the segment (the Python CLI takes seconds to start under
//     TCG, which is start-up, not the loop);
//  3. phases 2 and 3 start at the shaping change, the loop running throughout.
//
// Rates are a1's rail tx byte counters (headers included, the same for static and loop),
// sampled continuously. A phase's rate "stays within 5 %" from the start t of the first
// clWindow-long window after which every window starting later in the phase is >= 0.95 of
// best static; settled_s = t - change, mbps = the average rate from t to the phase's end.

const (
	clWindow      = 3 * time.Second // rate window
	clSweepSettle = 1 * time.Second // a static hint's in-flight requests drain
	clPhase       = 16 * time.Second
	clSweepOffset = 43 // sweep points: optimum and +-43 (+-4 % of the share)
	clSettleMax   = 10.0
	clMinRatio    = 0.95
	clSoutKbit    = 25000
	clSupKbit     = 50000
	clSupCutKbit  = 12500
	// The transfer: sweep (6 points of >= 4 s) + hand-over + 3 phases x 16 s move about 600 MB
	// at the shaped rates when a docker exec takes well under a second; on a loaded machine
	// (execs of 10-30 s, two lab VMs on 2 cores) the sweep alone takes ~3 minutes, hence the
	// margin. What is left after phase 3 goes unshaped.
	clTransfer = "1600M"
)

type railPoint struct {
	t        float64 // the node's /proc/uptime, seconds
	sout, sp uint64
}

// railSampler reads a1's rail tx counters every 0.2 s inside the node (shell built-ins, no
// exec per sample: a docker exec under the lab's emulated CPU takes up to seconds); the
// samples are read when it stops, and events are placed on the same clock by nodeNow.
type railSampler struct {
	p   *Process
	pts []railPoint
}

func startSampler(ctx context.Context, t *testing.T, n *Node) *railSampler {
	t.Helper()
	script := `while :; do read u x </proc/uptime; read a <"$0"; read b <"$1"; echo "$u $a $b"; sleep 0.2; done`
	p, err := n.Start(ctx, nil, "sh", "-c", script, "/sys/class/net/"+n.Netdev(SOUT)+"/statistics/tx_bytes",
		"/sys/class/net/"+n.Netdev(SUP)+"/statistics/tx_bytes")
	if err != nil {
		t.Fatal(err)
	}
	return &railSampler{p: p}
}

// stop ends the sampler and parses its samples.
func (s *railSampler) stop(ctx context.Context, t *testing.T) {
	t.Helper()
	s.p.Kill(ctx)
	out, _, _, _ := s.p.Wait(ctx)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		u, err1 := strconv.ParseFloat(f[0], 64)
		a, err2 := strconv.ParseUint(f[1], 10, 64)
		b, err3 := strconv.ParseUint(f[2], 10, 64)
		if err1 == nil && err2 == nil && err3 == nil {
			s.pts = append(s.pts, railPoint{u, a, b})
		}
	}
	if n := len(s.pts); n >= 2 {
		t.Logf("rail sampler: %d samples over %.1f s", n, s.pts[n-1].t-s.pts[0].t)
	}
	if len(s.pts) < 10 {
		t.Fatalf("rail sampler: %d samples\n%s", len(s.pts), tail(out, 2000))
	}
}

// nodeSh runs a shell script in n that ends by printing /proc/uptime (the sampler's clock)
// right after its action (when it succeeded), and returns that time. args are $0, $1...
func nodeSh(ctx context.Context, t *testing.T, n *Node, script string, args ...string) float64 {
	t.Helper()
	out, errOut, code, err := n.Exec(ctx, nil, append([]string{"sh", "-c", script + " && cat /proc/uptime"}, args...)...)
	f := strings.Fields(out)
	if err != nil || code != 0 || len(f) < 2 {
		t.Fatalf("%s: %s: %v exit %d %q %q", n.Name(), script, err, code, out, errOut)
	}
	u, err := strconv.ParseFloat(f[len(f)-2], 64)
	if err != nil {
		t.Fatalf("%s: %s: %q: %v", n.Name(), script, out, err)
	}
	return u
}

func (s *railSampler) between(from, to float64) []railPoint {
	var out []railPoint
	for _, p := range s.pts {
		if p.t >= from && p.t <= to {
			out = append(out, p)
		}
	}
	return out
}

func mbps(a, b railPoint) float64 {
	return float64((b.sout-a.sout)+(b.sp-a.sp)) * 8 / 1e6 / (b.t - a.t)
}

// rateOver is the rate between the last sample at or before from and the first at or after
// to (the sampler's shell loop can itself be slowed down by a loaded lab).
func (s *railSampler) rateOver(t *testing.T, from, to float64) float64 {
	t.Helper()
	a, b := -1, -1
	for i, p := range s.pts {
		if p.t <= from {
			a = i
		}
		if p.t >= to && b < 0 {
			b = i
		}
	}
	if a < 0 || b < 0 || s.pts[b].t-s.pts[a].t > 2*(to-from) {
		t.Fatalf("no rail samples around uptime %.2f..%.2f (%d samples)", from, to, len(s.pts))
	}
	return mbps(s.pts[a], s.pts[b])
}

type clPhaseResult struct {
	n            int
	supKbit      int
	settled      float64 // -1: never
	rate, best   float64
	windows      []float64 // each window's rate, for the log
	windowStarts []float64
	staticRates  map[int]float64
}

// settle evaluates one phase from its change at t0 to end.
func (s *railSampler) settle(t0, end float64, best float64) (settled, rate float64, rates, starts []float64) {
	p := s.between(t0, end)
	settled, rate = -1, 0
	type win struct {
		start float64
		rate  float64
		i     int
	}
	var wins []win
	for i := range p {
		for j := i + 1; j < len(p); j++ {
			if p[j].t-p[i].t >= clWindow.Seconds() {
				wins = append(wins, win{p[i].t - t0, mbps(p[i], p[j]), i})
				break
			}
		}
	}
	first := -1
	for k := len(wins) - 1; k >= 0; k-- {
		if wins[k].rate < clMinRatio*best {
			break
		}
		first = k
	}
	for _, w := range wins {
		rates = append(rates, w.rate)
		starts = append(starts, w.start)
	}
	if first >= 0 {
		settled = wins[first].start
		rate = mbps(p[wins[first].i], p[len(p)-1])
	} else if len(p) >= 2 {
		rate = mbps(p[len(p)/2], p[len(p)-1])
	}
	return settled, rate, rates, starts
}

func optimum(supKbit int) int {
	return int(math.Round(1024 * float64(supKbit) / float64(supKbit+clSoutKbit)))
}

func testClosedLoop(t *testing.T, agent agentCLI) {
	if os.Getenv("MPIB_CLOSEDLOOP") != "1" {
		t.Skip("the closed-loop lab test runs with MPIB_CLOSEDLOOP=1: it has not passed yet (2026-11-23: 0.85 / 0.45 / 0.85 " +
			"of the best static split in its three phases, the loop steering on posted rates; see docs/agent.md); " +
			"issue 10 stays open until it does")
	}
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	shape := func(r Rail, kbit int) {
		t.Helper()
		if err := lab.Shape(ctx, a1, r, fmt.Sprintf("netem rate %dkbit limit 10000", kbit)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, r := range Rails {
			if err := lab.Shape(context.Background(), a1, r, ""); err != nil {
				t.Errorf("restoring %s shaping: %v", r, err)
			}
		}
	})
	shape(SOUT, clSoutKbit)
	shape(SUP, 5000) // until the sweep: few bytes go by while the pair sets up (vanilla is all SUP)

	a1.Exec(ctx, nil, "rm", "-f", segPath)
	ref := goAgent // static hints and slot look-ups: the Go CLI answers in milliseconds
	ref.run(ctx, t, a1, "create")
	beat, err := a1.Start(ctx, ref.env, append(ref.cmd, "heartbeat", "--path", segPath)...)
	if err != nil {
		t.Fatal(err)
	}
	defer beat.Kill(context.Background())

	mode := []string{"MPIB_MODE=1", "MPIB_SHM_PATH=" + segPath}
	srv, cli := startPair(ctx, t, nettestPair{server: a2, client: a1, serverEnv: pluginEnv(a2, mode...), clientEnv: pluginEnv(a1, mode...),
		args: []string{"--timeout-s", "120", "--mode", "verify", "--bytes", clTransfer, "--max-size", "512K", "--window", "8",
			"--idle-us", strconv.Itoa(faultIdleUS)}})
	defer func() { // a failed test must not leave the pair running
		srv.Kill(context.Background())
		cli.Kill(context.Background())
	}()
	t.Logf("pair started at %.1f s", time.Since(start).Seconds())
	slot := ref.sendSlot(ctx, t, a1)
	samp := startSampler(ctx, t, a1)
	defer samp.p.Kill(context.Background())
	t.Logf("send connection in slot %d at %.1f s", slot, time.Since(start).Seconds())

	// 1. The sweep.
	type sweepPoint struct {
		sup, hint int
		from      float64
	}
	var sweep []sweepPoint
	for _, sup := range []int{clSupKbit, clSupCutKbit} {
		shape(SUP, sup)
		opt := optimum(sup)
		for _, hint := range []int{opt - clSweepOffset, opt, opt + clSweepOffset} {
			from := nodeSh(ctx, t, a1, `"$0" set --conn "$1" --sup-bw "$2" --path "$3" >/dev/null`,
				ref.cmd[0], strconv.Itoa(int(slot)), strconv.Itoa(hint), segPath) + clSweepSettle.Seconds()
			sweep = append(sweep, sweepPoint{sup, hint, from})
			time.Sleep(clSweepSettle + clWindow + 300*time.Millisecond) // node time is past from+window: the marker came back after it was read
		}
		if !running(cli) {
			t.Fatalf("the transfer ended during the sweep: raise clTransfer")
		}
	}

	// 2. Hand-over to the closed loop under phase 1's shaping (the sweep ended at
	// optimum(clSupCutKbit)+clSweepOffset).
	if err := beat.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	shape(SUP, clSupKbit)
	loop, err := a1.Start(ctx, agent.env, append(agent.cmd, "run", "--policy", "closed-loop", "--interval", "0.5", "--path", segPath)...)
	if err != nil {
		t.Fatal(err)
	}
	defer loop.Kill(context.Background())
	handover := time.Now()
	t.Logf("sweep done at %.1f s", time.Since(start).Seconds())
	// Phase 1 starts when the loop's first hint is in the segment (the slot's hint is no longer
	// the sweep's last one; the loop starts at 512 and probes from there), polled inside a1.
	t0 := nodeSh(ctx, t, a1, `timeout 90 sh -c 'while "$0" list --json --path "$1" | grep -q "\"sup_bw\": $2,"; do sleep 0.1; done' "$0" "$1" "$2" || exit 1`,
		ref.cmd[0], segPath, strconv.Itoa(optimum(clSupCutKbit)+clSweepOffset))
	if !running(loop) {
		out, errOut, code, _ := loop.Wait(ctx)
		t.Fatalf("%s agent run exited %d:\n%s%s", agent.name, code, out, errOut)
	}
	t.Logf("%s agent: the loop's first hint %.1f s after its start", agent.name, time.Since(handover).Seconds())

	// 3. The phases.
	phaseSup := []int{clSupKbit, clSupCutKbit, clSupKbit}
	var starts []float64
	for n, sup := range phaseSup {
		if n > 0 { // the change and its time in one command
			t0 = nodeSh(ctx, t, a1, `tc qdisc replace dev "$0" root netem rate "$1"kbit limit 10000`, a1.Netdev(SUP), strconv.Itoa(sup))
		}
		starts = append(starts, t0)
		time.Sleep(clPhase + 300*time.Millisecond) // past t0+clPhase in node time (see the sweep)
		if !running(cli) {
			t.Fatalf("the transfer ended during phase %d: raise clTransfer", n+1)
		}
	}
	samp.stop(ctx, t)
	static := map[int]map[int]float64{} // sup kbit -> hint -> Mbit/s
	best := map[int]float64{}
	for _, sp := range sweep {
		r := samp.rateOver(t, sp.from, sp.from+clWindow.Seconds())
		if static[sp.sup] == nil {
			static[sp.sup] = map[int]float64{}
		}
		static[sp.sup][sp.hint] = r
		best[sp.sup] = max(best[sp.sup], r)
	}
	var results []clPhaseResult
	for n, sup := range phaseSup {
		settled, rate, wins, ws := samp.settle(starts[n], starts[n]+clPhase.Seconds(), best[sup])
		results = append(results, clPhaseResult{n: n + 1, supKbit: sup, settled: settled, rate: rate, best: best[sup],
			windows: wins, windowStarts: ws, staticRates: static[sup]})
	}
	// The rest of the transfer goes unshaped.
	for _, r := range Rails {
		lab.Shape(ctx, a1, r, "")
	}
	cOut, cErr, cCode, err1 := cli.Wait(ctx)
	sOut, sErr, sCode, err2 := srv.Wait(ctx)
	if err1 != nil || err2 != nil {
		t.Fatalf("transfer did not finish: %v %v", err1, err2)
	}
	loop.Kill(ctx)
	lOut, lErr, _, _ := loop.Wait(ctx)
	t.Logf("%s agent run output:\n%s%s", agent.name, tail(lOut, 6000), tail(lErr, 2000))
	verified(t, pairResult{serverOut: sOut, serverErr: sErr, clientOut: cOut, clientErr: cErr, serverCode: sCode, clientCode: cCode})

	for _, r := range results {
		var ws string
		for i := range r.windows {
			ws += fmt.Sprintf(" %.1f:%.1f", r.windowStarts[i], r.windows[i])
		}
		t.Logf("phase %d: static %v; windows (start_s:mbps)%s", r.n, r.staticRates, ws)
		settled := r.settled
		if settled < 0 {
			settled = clPhase.Seconds() // never settled within the phase
		}
		ratio := r.rate / r.best
		fmt.Printf("closedloop: pair=a1-a2 agent=%s phase=%d sout_mbit=%g sup_mbit=%g settled_s=%.1f mbps=%.1f best_static_mbps=%.1f ratio=%.3f verified=true\n",
			agent.name, r.n, float64(clSoutKbit)/1000, float64(r.supKbit)/1000, settled, r.rate, r.best, ratio)
		if r.settled < 0 || r.settled > clSettleMax || ratio < clMinRatio {
			t.Errorf("phase %d: settled_s=%.1f (never: %t) ratio=%.3f, want settled_s <= %g and ratio >= %g",
				r.n, settled, r.settled < 0, ratio, clSettleMax, clMinRatio)
		}
	}
	fmt.Printf("closedloop: agent=%s lab_s=%.1f\n", agent.name, time.Since(start).Seconds())
}

func TestClosedLoopGoAgent(t *testing.T)     { testClosedLoop(t, goAgent) }
func TestClosedLoopPythonAgent(t *testing.T) { testClosedLoop(t, pythonAgent) }
