package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpib/mpib/integration/closedloop"
)

// The closed-loop policy in the lab: one long verified a1->a2 transfer in advanced
// mode for both agents, a1's rails shaped SOUT 25 / SUP 50 Mbit/s (phase 1), SUP cut to 12.5
// (phase 2), SUP back to 50 (phase 3). The loop is never told the capacities.
//
// What the lab judges, and what it leaves to the simulator (docs/agent.md, "The closed loop
// in the lab"): the lab judges the loop's split, which the rails' byte shares show whatever
// the lab's speed (the sender puts each message's bytes on the rails as the split says; a slow
// lab slows both rails, not the share): within clSettleMax (10 s) of each change the SUP share
// must be where the rails call for and stay there to the phase's end, judged as the share over
// the phase's last clEndWindow (from 10 s to 16 s after the change: end_share). Where the rails
// call for, within clShareTol, is either the shaped optimum 1024*sup/(sup+sout)
// (optimum_share) or the optimum of what they really delivered over that stretch: SUP's
// active rate over the sum of both (the plugin's completed bytes over the time each rail had
// work, read from the segment when the stretch begins and ends: active_optimum_share); and
// always within the wider clShapedTol of the shaped one, so that a loop that does not follow
// the shaping fails whatever the counters say (splitOK). On a busy host the lab VM's rails
// deliver less than their shaping, unevenly, and the loop rightly follows them. The stretch is
// judged live; one that missed after the transport retransmitted is judged again after
// another settle time under the same shaping (runPhase, clMaxExtensions). How fast the loop settles and how much throughput it gets are
// judged on the simulator, where capacities are exact: agent/go/sim TestClosedLoopScenarios
// (>= 95 % of the optimum from 10 s after each change, every scenario) and the Python
// `evaluate` suite (>= 95 % mean). The lab prints both (split_settled_s, settled_s, mbps, ratio,
// lowest_window_ratio) but no longer judges them: on a 2-core host with one core taken by
// another process, the lab VM carried 24 Mbit/s where it carries 60, its shaped rails ran
// 20-40 % under their rates for seconds at a time, and a window-by-window settle time (a 3 s
// window at 9 Mbit/s holds a few of the 512 KiB messages) or a throughput floor flipped with
// the host, not the loop (docs/agent.md quotes such runs).
//
// One transfer; first one sweep, then per agent (Go, then Python) a hand-over and 3 phases:
//  1. sweep: a static hint at the theoretical optimum (the Go CLI's `set` and `heartbeat`, the
//     reference, not the agent under test) under phase 1's and phase 2's shaping, each
//     measured over clSweepMeasure: best_static_mbps and ratio (printed, not judged) compare
//     the loop's rate with it (phase 3 has phase 1's shaping and reuses its point);
//  2. hand-over: no heartbeat, the marker hint, shaping back to phase 1, the agent's
//     `run --policy closed-loop --interval 0.5` goes; its phase 1 starts when the loop's first
//     hint (512, ClosedLoopStart) replaces the marker; phases 2 and 3 start at the shaping
//     change, the loop running throughout; the loop stops after phase 3. Each agent's process
//     starts before the transfer, blocked on a FIFO in a1 (agentGate: the Python CLI with its
//     imports done), and the hand-over writes its `run` arguments there: the Python CLI's
//     start under TCG (tens of seconds, competing with the transfer for a1's vCPUs) is
//     start-up, not the loop, and must not fall between the hand-over and phase 1.
//
// Every exec into the lab VM starts processes there, up to seconds each beside the transfer
// (5-14 s a mark beside the Python loop while the nodes ran build/ from the 9p share: see
// docs/lab.md), so each step is one exec (a1Script): the marker,
// shaping, go and wait for the first hint in one; a phase's change, its time and first mark in
// one; a mark (the slot's telemetry and a1's rail counters) in one. With a mark of two execs
// and the change, the stale-read count and the marks each their own, the Python agent's
// phases took 41-43 s of the 16 planned (the first mark ate the settle time, the middle one
// ran past the phase's end).
//
// The rails must be what limits the transfer, not the lab VM's CPU: a slow host's lab carries
// less than the 75 Mbit/s of phase 1 on two rails at once (47 Mbit/s in one benchmark run),
// and then every split looks alike and the test measures the VM. Before the sweep a probe at
// phase 1's optimum measures what the lab carries, and every rate is divided by 1, 2, 4 or 8,
// the least at which that is clCarryHeadroom times phase 1's shaped rate (closedloop.CarryDivisor; the
// same ratios: the same optima); the closedloop: lines say so in their sout_mbit / sup_mbit
// fields. Below the halved rates the test runs in slow motion (clRun.slow: the loop's
// interval, the phases and the judged end window longer by div/2; field slow=).
//
// The plugins and agents run with a staleness limit of clStaleMS (2 s; the agents beat at a
// quarter of it), as in TestPolicy*: with the default 500 ms, a Python agent's heartbeat in the
// starved VM of a busy host went stale 9-36 times a phase, each read fell back to vanilla (all
// SUP) and moved the share the loop is judged on. The fallback itself is proven where it is
// the subject (TestPolicy*: the agent killed); stale_reads= still counts such reads here.
//
// Rates are a1's rail tx byte counters (headers included, the same for static and loop),
// sampled continuously. Each window's line (t.Log) shows SOUT and SUP apart: a split that moved
// saturates one rail and starves the other; a slow lab saturates neither.

const (
	clWindow      = closedloop.RateWindow
	clSweepSettle = 1 * time.Second // a static hint's in-flight requests drain
	// clSweepMeasure is how long each sweep point is measured: two windows. A single 3 s
	// window can overstate what the lab carries by a tenth (the best of three is the luckiest),
	// and the phase it is compared with is an average over many windows.
	clSweepMeasure = 2 * clWindow
	clPhase        = 16 * time.Second
	clSettleMax    = 10.0
	// clEndWindow is the end of each phase whose SUP share is the verdict: from clSettleMax to
	// the phase's end. Six seconds average over the lab VM's moments (a single 3 s window at the
	// rates of a busy host holds a handful of messages).
	clEndWindow     = clPhase - clSettleMax*time.Second
	clShareTol      = closedloop.ShareTol
	clShapedTol     = closedloop.ShapedTol
	clStaleMS       = 2000
	clSoutKbit      = closedloop.SoutKbit
	clSupKbit       = closedloop.SupKbit
	clSupCutKbit    = 12500
	clCarryHeadroom = closedloop.CarryHeadroom
	// The transfer: a sweep (2 points of >= 7 s) + per agent a hand-over + 3 phases x 16 s,
	// about 700 MB at the shaped rates when a docker exec takes well under a second (1.4 GB
	// for both agents); on a loaded machine (execs of 10-30 s, two lab VMs on 2 cores) a sweep
	// alone takes ~3 minutes, hence the margin. After Python's phase 3 the receiver stops
	// posting (clStopFile, in a2) and the sender follows: draining the rest unshaped would
	// take minutes.
	clTransfer = "4000M"
	// clMaxSize: messages of up to 128 KiB, 8 in flight (1 MiB). The rails' byte counters show
	// the split only as fast as what is in flight drains: with 512 KiB messages (4 MiB in
	// flight) a rail shaped to 3.125 Mbit/s (phase 2 at a quarter of the rates, a busy host)
	// held up to 10 s of backlog in its queue, so a phase's last 6 s showed the split of
	// seconds before (0.41-0.43 at a loop split of 0.34, SUP at its rate and SOUT idling while
	// the messages waited for their SUP part).
	clMaxSize  = "128K"
	clStopFile = "/tmp/closedloop.stop"
)

// clPhaseSup is SUP's shaping in phases 1, 2 and 3, at full rates.
var clPhaseSup = []int{clSupKbit, clSupCutKbit, clSupKbit}

// railPoint is one sample of a1's rails (the node's /proc/uptime, each rail's tx bytes).
type railPoint = closedloop.Point

// railMarks are the connection's per-rail telemetry at one moment.
type railMarks = closedloop.Marks

// railSampler reads a1's rail tx counters every 0.2 s inside the node (bash built-ins, no
// exec per sample: a process start in the loaded emulated VM takes hundreds of ms); the
// samples are read when it stops, and events are placed on the same clock by nodeNow.
type railSampler struct {
	p   *Process
	pts []railPoint
}

func startSampler(ctx context.Context, t *testing.T, n *Node) *railSampler {
	t.Helper()
	// The pause is a bash read timeout, not a `sleep` process: five process starts a second
	// took CPU from the VM that carries the rails, and on a busy host the loop fell so far
	// behind that a phase's last 6 s held too few samples to judge.
	script := `exec {p}<> <(:); while :; do read u x </proc/uptime; read a <"$0"; read b <"$1"; echo "$u $a $b"; read -t 0.2 -u $p; done`
	p, err := n.Start(ctx, nil, "bash", "-c", script, "/sys/class/net/"+n.Netdev(SOUT)+"/statistics/tx_bytes",
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
			s.pts = append(s.pts, railPoint{T: u, Sout: a, Sup: b})
		}
	}
	if n := len(s.pts); n >= 2 {
		t.Logf("rail sampler: %d samples over %.1f s", n, s.pts[n-1].T-s.pts[0].T)
	}
	if len(s.pts) < 10 {
		t.Fatalf("rail sampler: %d samples\n%s", len(s.pts), tail(out, 2000))
	}
}

// nodeSh runs a shell script in n that ends by printing /proc/uptime (the sampler's clock)
// right after its action (when it succeeded), and returns that time. args are $0, $1... The
// time is read with the shell's read, not cat: a process start in the loaded VM takes seconds.
func nodeSh(ctx context.Context, t *testing.T, n *Node, script string, args ...string) float64 {
	t.Helper()
	out, errOut, code, err := n.Exec(ctx, nil, append([]string{"sh", "-c", script + ` && read u x </proc/uptime && echo "$u $x"`}, args...)...)
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

// settle judges one phase on throughput (closedloop.Settle).
func (s *railSampler) settle(t0, end float64, best float64) closedloop.Verdict {
	return closedloop.Settle(s.pts, t0, end, best)
}

// settleSplit judges one phase on the loop's split (closedloop.SettleSplit).
func (s *railSampler) settleSplit(t0, end, opt float64) (settled, share float64) {
	return closedloop.SettleSplit(s.pts, t0, end, opt)
}

// rateOver is the rate between the last sample at or before from and the first at or after
// to (the sampler's shell loop can itself be slowed down by a loaded lab).
func (s *railSampler) rateOver(t *testing.T, from, to float64) float64 {
	t.Helper()
	a, b := -1, -1
	for i, p := range s.pts {
		if p.T <= from {
			a = i
		}
		if p.T >= to && b < 0 {
			b = i
		}
	}
	if a < 0 || b < 0 || s.pts[b].T-s.pts[a].T > 2*(to-from) {
		t.Fatalf("no rail samples around uptime %.2f..%.2f (%d samples)", from, to, len(s.pts))
	}
	return closedloop.Mbps(s.pts[a], s.pts[b])
}

// clRun is one closed-loop lab run: the pair, the sampler and the sweep's static rates.
type clRun struct {
	lab      *Topology
	a1       *Node
	slot     uint32
	samp     *railSampler
	cli, srv *Process
	start    time.Time
	div      int                   // every rate is divided by div: 1, or 2, 4 or 8 when the lab cannot carry full rates (closedloop.CarryDivisor)
	gates    map[string]*agentGate // by agent name: each agent's `run`, waiting for its hand-over
	unshaped bool                  // a1's shaping is removed (the cleanup need not)
}

// clPhases is one agent's three phases: their start times (node clock), and the plugin's count
// of hint reads that found the agent's heartbeat stale (and fell back to vanilla) at each
// start and after the last phase. The plugin runs with the test's staleness limit (clStaleMS;
// the agents beat at a quarter of it): a stall of the agent in the lab VM longer than that
// shows as stale_reads= on the closedloop: line of its phase.
type clPhases struct {
	starts  []float64
	staleAt []uint64
	ends    []clJudged // per phase, the judged stretch at its end (the last one, when extended)
}

// clJudged is the stretch a phase is judged on: SUP's share of a1's bytes over it, the
// optimum of the rails' active rates over it, the verdict, and how many times the phase was
// extended because the transport retransmitted (clMaxExtensions) and the retransmission
// events counted over the phase.
type clJudged struct {
	share, active float64
	ok            bool
	extended      int
	retransmits   uint64
}

// clMaxExtensions bounds how many times a missed phase is extended after retransmissions.
// A soft-RoCE packet lost in the lab VM stalls its rail until the RC timeout (4.3 s, with
// nothing completing while requests are in flight): the loop reads that as a slow rail and
// moves the split, as it should, and the phase's end can fall in its recovery, the split still
// on its way back to the optimum. Like TestPolicy*
// (supShareOver), a stretch that missed with retransmissions is not the loop's verdict: the
// phase goes on under the same shaping for another settle time and end stretch, judged
// afresh; a stretch that missed with none fails at once. At the test's rates soft-RoCE counts
// retransmissions in nearly every phase (30-283 in an idle run), so in practice a missed
// stretch gets up to two more; a wrong loop misses all of them.
const clMaxExtensions = 2

// clMark is one reading of the connection's telemetry (railMarks, and the plugin's count of
// stale hint reads) and a1's rails (railWire).
type clMark struct {
	marks railMarks
	wire  railWire
	stale uint64
}

// mark reads a clMark in one exec (clPrelude's mark).
func (r *clRun) mark(ctx context.Context, t *testing.T) clMark {
	t.Helper()
	return r.markFrom(t, r.mustScript(ctx, t, "mark", nil, "mark"))
}

func (m clMark) retransmits() (n uint64) {
	for _, v := range m.wire.retransmits {
		n += v
	}
	return n
}

// clPrelude is the start of every script a1Script runs (bash; CL_GO, CL_SEG and CL_WIRE from
// a1Script, the rest from its caller). Shell built-ins wherever they do: a process start in
// the lab VM takes 0.5-5 s while an agent runs.
//   - stamp NAME prints "@NAME <a1's /proc/uptime>", the sampler's clock;
//   - mark prints "@wire" with a1's rail counters (readRailWire's files, in its order) and then,
//     after "@json", the Go CLI's list --json: one mark, one process. It comes last in a script
//     (markFrom takes the rest of the output as the list);
//   - gone PIDFILE: the process that recorded its PID there (Node.Start) has exited (false
//     while it has not recorded it yet);
//   - pause S: S seconds without a `sleep` process.
const clPrelude = `stamp() { local u x; read -r u x </proc/uptime && echo "@$1 $u"; }
mark() {
	local f v w=
	for f in $CL_WIRE; do read -r v <"$f" || return 1; w+=" $v"; done
	echo "@wire$w"; echo "@json"
	"$CL_GO" list --json --path "$CL_SEG"
}
gone() { local pid; read -r pid <"$1" 2>/dev/null && ! kill -0 "$pid" 2>/dev/null; }
pause() { [[ -n $pfd ]] || exec {pfd}<> <(:); read -t "$1" -u $pfd || true; }
`

// a1Script runs clPrelude and script in a1 with bash, env added to the CL_* variables.
func (r *clRun) a1Script(ctx context.Context, env []string, script string) (stdout, stderr string, exitCode int, err error) {
	base := []string{"CL_GO=" + goAgent.cmd[0], "CL_SEG=" + segPath, "CL_WIRE=" + strings.Join(railWireFiles(r.a1), " ")}
	return r.a1.Exec(ctx, append(base, env...), "bash", "-c", clPrelude+script)
}

// mustScript is a1Script for a script that must succeed (what: the step, for the failure).
func (r *clRun) mustScript(ctx context.Context, t *testing.T, what string, env []string, script string) string {
	t.Helper()
	out, errOut, code, err := r.a1Script(ctx, env, script)
	if err != nil || code != 0 {
		t.Fatalf("a1: %s: %v exit %d\n%s%s", what, err, code, tail(out, 3000), tail(errOut, 2000))
	}
	return out
}

// clOut is a script's output: its "@NAME fields..." lines by name and what follows "@json".
type clOut struct {
	at   map[string][]string
	json string
}

func parseCLOut(out string) clOut {
	o := clOut{at: map[string][]string{}}
	for rest := out; rest != ""; {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		if line == "@json" {
			o.json = rest
			break
		}
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "@") {
			o.at[f[0][1:]] = f[1:]
		}
	}
	return o
}

// stampOf is the time of a script's stamp NAME.
func stampOf(t *testing.T, out, name string) float64 {
	t.Helper()
	f := parseCLOut(out).at[name]
	if len(f) != 1 {
		t.Fatalf("a1: no @%s in %q", name, tail(out, 2000))
	}
	u, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		t.Fatalf("a1: @%s: %v", name, err)
	}
	return u
}

// markFrom is the mark a script's output ends with (clPrelude's mark).
func (r *clRun) markFrom(t *testing.T, out string) clMark {
	t.Helper()
	o := parseCLOut(out)
	w := o.at["wire"]
	if len(w) != 3*len(Rails) {
		t.Fatalf("a1: mark: rail counters %q in %q", w, tail(out, 2000))
	}
	v := make([]uint64, len(w))
	for i := range w {
		var err error
		if v[i], err = strconv.ParseUint(w[i], 10, 64); err != nil {
			t.Fatalf("a1: mark: rail counter %q: %v", w[i], err)
		}
	}
	m := clMark{wire: railWire{tx: map[Rail]uint64{}, retransmits: map[Rail]uint64{}}}
	for i, rl := range Rails {
		m.wire.tx[rl], m.wire.retransmits[rl] = v[3*i], v[3*i+1]+v[3*i+2]
	}
	var conns []listedConn
	if err := json.Unmarshal([]byte(o.json), &conns); err != nil {
		t.Fatalf("a1: mark: go agent list --json: %v\n%s", err, tail(out, 2000))
	}
	for _, c := range conns {
		if c.Index == r.slot {
			tl := c.Telemetry
			m.marks = railMarks{SoutBytes: tl.SoutCompletedBytes, SoutNs: tl.SoutActiveNs, SupBytes: tl.SupCompletedBytes, SupNs: tl.SupActiveNs}
			m.stale = tl.ReadsStale
			return m
		}
	}
	t.Fatalf("go agent list --json: slot %d is gone", r.slot)
	return m
}

// kbit is a rate of the test at the rates in force.
func (r *clRun) kbit(full int) int { return full / r.div }

// slow is how much slower than CI's usual halved rates the test runs (1 at div 1 or 2, 2 at
// div 4, 4 at div 8). The loop's interval, the phases and the judged end window are that many
// times longer: the experiment runs in slow motion, and each interval of the loop measures as
// many bytes as at the halved rates. At a quarter of the rates with the loop's 0.5 s interval,
// a 0.5 s sample of a 1.56 Mbit/s rail held less than one message, and the Python loop's split
// swung by 0.1 around the optimum on that noise.
func (r *clRun) slow() float64 { return max(1, float64(r.div)/2) }

// phase is the length of each phase at the rates in force.
func (r *clRun) phase() time.Duration { return time.Duration(float64(clPhase) * r.slow()) }

type clSweepPoint struct {
	sup, hint int
	from      float64
}

// clStaleVar is the staleness limit the plugins and agents of the test share (see the top).
var clStaleVar = "MPIB_AGENT_STALE_MS=" + strconv.Itoa(clStaleMS)

// clDetectionEnv leaves failure detection of the test's connection to the RC budget alone
// (net_ib's 4.3 s a try, MPIB's default), without the no-progress watch: a1's rails are shaped
// down to 1.56 Mbit/s behind 10000-packet netem queues and the rates change in steps, so
// acknowledgements wait seconds, and a wait that grows more than fourfold at once would read as
// a dead path (a spurious failover: survived, but it moves traffic the test measures the
// policy's split of). A real fabric queues for microseconds to milliseconds. Soft-RoCE,
// retransmitting in a starved VM, can execute one RDMA write with immediate twice within one
// QP generation, which the receiver refuses (`matches no posted receive`): a try shorter than
// the queue must not retransmit into it.
var clDetectionEnv = []string{"MPIB_IB_TIMEOUT=20", "MPIB_DETECT_MS=0"}

// clStaleEnv is an agent's environment with the test's staleness limit.
func clStaleEnv(a agentCLI) []string { return append([]string{clStaleVar}, a.env...) }

// clMarker is the hint set (with the reference CLI, no heartbeat) before each agent starts;
// the agent's first write replaces it (ClosedLoopStart, 512), which starts its phase 1.
const clMarker = 384

// startClosedLoopRun starts both agents' gates (agentGate; the Python CLI's imports done) and
// then the closed-loop transfer on a1 -> a2; when the test ends, the pair and the gates are
// killed if still running and a1's shaping removed.
func startClosedLoopRun(ctx context.Context, t *testing.T, lab *Topology) *clRun {
	r := &clRun{lab: lab, a1: lab.Node("a1"), start: time.Now()}
	t.Cleanup(func() {
		if r.unshaped {
			return
		}
		if err := r.unshape(context.Background()); err != nil {
			t.Errorf("restoring a1's shaping: %v", err)
		}
	})
	r.startGates(ctx, t)
	r.startTransfer(ctx, t)
	t.Cleanup(func() { // a failed test must not leave the pair running
		for _, p := range []*Process{r.srv, r.cli} {
			if running(p) { // a Kill is an exec, also for a process that has exited
				p.Kill(context.Background())
			}
		}
	})
	return r
}

// unshape removes a1's shaping on every rail in one exec (what Topology.Shape does with "").
func (r *clRun) unshape(ctx context.Context) error {
	args := []string{"sh", "-c", `for d in "$@"; do tc qdisc del dev "$d" root 2>/dev/null; done; true`, "sh"}
	for _, rl := range Rails {
		args = append(args, r.a1.Netdev(rl))
	}
	_, errOut, code, err := r.a1.Exec(ctx, nil, args...)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(errOut))
	}
	return err
}

// TestClosedLoop: both agents' closed loops in one transfer, Go first, then Python, each
// after its own sweep and through the three phases.
func TestClosedLoop(t *testing.T) {
	lab := labOrSkip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute) // 6 phases of 64 s at div=8, each extended up to twice
	defer cancel()
	r := startClosedLoopRun(ctx, t, lab)
	phases := map[string]clPhases{}
	var outs []string
	sweep := r.runSweep(ctx, t) // one sweep serves both agents: its rates are printed, not judged
	for _, agent := range []agentCLI{goAgent, pythonAgent} {
		ph, out := r.runAgent(ctx, t, agent)
		phases[agent.name] = ph
		outs = append(outs, out)
	}
	r.samp.stop(ctx, t)
	r.unshaped = r.unshape(ctx) == nil
	lab.Node("a2").Exec(ctx, nil, "touch", clStopFile) // the transfer ends (see clTransfer)
	cOut, cErr, cCode, err1 := r.cli.Wait(ctx)
	sOut, sErr, sCode, err2 := r.srv.Wait(ctx)
	if err1 != nil || err2 != nil {
		t.Fatalf("transfer did not finish: %v %v", err1, err2)
	}
	for _, o := range outs {
		t.Log(o)
	}
	verified(t, pairResult{serverOut: sOut, serverErr: sErr, clientOut: cOut, clientErr: cErr, serverCode: sCode, clientCode: cCode})
	for _, agent := range []agentCLI{goAgent, pythonAgent} {
		static, best := r.staticRates(t, sweep)
		r.report(t, agent.name, phases[agent.name], static, best)
	}
	evidence("closedloop:", "lab_s=%.1f", time.Since(r.start).Seconds())
}

func (r *clRun) shape(ctx context.Context, t *testing.T, rl Rail, kbit int) {
	t.Helper()
	if err := r.lab.Shape(ctx, r.a1, rl, fmt.Sprintf("netem rate %dkbit limit 10000", kbit)); err != nil {
		t.Fatal(err)
	}
}

// startGates starts both agents' gates and waits until they hold their FIFOs. This is also
// the Python CLI's warm-up: its first start in the emulated VM compiles the package's bytecode
// (into the pycache the agent's env names) and took 50-65 s of a1's CPU in CI runs; it must be
// over before anything is measured, or it competes with soft-RoCE for a1's two vCPUs (the
// rails sagged below their shaped rates right at the agent's phase 1). A second start only
// showed what a warm start costs (2.3 s in CI) and is gone.
func (r *clRun) startGates(ctx context.Context, t *testing.T) {
	t0 := time.Now()
	r.gates = map[string]*agentGate{}
	id := strconv.FormatInt(time.Now().UnixNano(), 36) // a FIFO of an earlier run is not this one's
	var gates []*agentGate
	for _, a := range []agentCLI{goAgent, pythonAgent} {
		g := startAgentGate(ctx, t, r.a1, a, clStaleEnv(a), "/tmp/closedloop-"+a.name+"-"+id)
		r.gates[a.name] = g
		gates = append(gates, g)
	}
	waitAgentGates(ctx, t, r.a1, gates)
	t.Logf("python agent start 1: %.1f s (imports done: its run waits for its hand-over)", time.Since(t0).Seconds())
}

// gateExited fails the test for an agent's gate that exited, with its output.
func (r *clRun) gateExited(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	out, errOut, code, _ := r.gates[name].p.Wait(ctx)
	t.Fatalf("%s agent run exited %d:\n%s%s", name, code, out, errOut)
}

// startTransfer creates the segment, starts the verified a1->a2 transfer in advanced mode and
// the rail sampler.
func (r *clRun) startTransfer(ctx context.Context, t *testing.T) {
	a2 := r.lab.Node("a2")
	r.div = 1
	// Shaping (SUP at 5000 until the sweep: few bytes go by while the pair sets up, vanilla is
	// all SUP) and a fresh segment, in one exec.
	out, errOut, code, err := r.a1.Exec(ctx, nil, "sh", "-c", `tc qdisc replace dev "$0" root netem rate "$1"kbit limit 10000 &&
		tc qdisc replace dev "$2" root netem rate 5000kbit limit 10000 && rm -f "$3" && "$4" create --path "$3"`,
		r.a1.Netdev(SOUT), strconv.Itoa(clSoutKbit), r.a1.Netdev(SUP), segPath, goAgent.cmd[0])
	if err != nil || code != 0 {
		t.Fatalf("a1: shaping and segment: %v exit %d %s %s", err, code, out, errOut)
	}
	a2.Exec(ctx, nil, "rm", "-f", clStopFile)
	mode := append([]string{"MPIB_MODE=1", "MPIB_SHM_PATH=" + segPath, clStaleVar}, clDetectionEnv...)
	r.srv, r.cli = startPair(ctx, t, nettestPair{server: a2, client: r.a1, serverEnv: pluginEnv(a2, mode...), clientEnv: pluginEnv(r.a1, mode...),
		args: []string{"--timeout-s", "120", "--mode", "verify", "--bytes", clTransfer, "--stop-file", clStopFile, "--max-size", clMaxSize, "--window", "8",
			"--idle-us", strconv.Itoa(faultIdleUS)}})
	t.Logf("pair started at %.1f s", time.Since(r.start).Seconds())
	r.slot = goAgent.sendSlot(ctx, t, r.a1)
	r.samp = startSampler(ctx, t, r.a1)
	t.Logf("send connection in slot %d at %.1f s", r.slot, time.Since(r.start).Seconds())
}

// runSweep measures a static hint (the Go CLI's set and heartbeat: the reference, not an agent
// under test) at the optimum under phase 1's and phase 2's shaping, and returns its points. It
// first checks that the lab carries full rates (see the top).
func (r *clRun) runSweep(ctx context.Context, t *testing.T) []clSweepPoint {
	beat, err := r.a1.Start(ctx, clStaleEnv(goAgent), append(goAgent.cmd, "heartbeat", "--path", segPath)...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if running(beat) { // a Kill is an exec, also for a process that has exited
			beat.Kill(context.Background())
		}
	}()
	r.checkCarry(ctx, t)
	var sweep []clSweepPoint
	for i, full := range []int{clSupKbit, clSupCutKbit} {
		sup := r.kbit(full)
		opt := closedloop.Optimum(sup, r.kbit(clSoutKbit))
		// The shaping and the hint in one exec; SOUT's too at the first point when the rates
		// are divided (checkCarry decided that).
		script := `tc qdisc replace dev "$0" root netem rate "$1"kbit limit 10000 && "$2" set --conn "$3" --sup-bw "$4" --path "$5" >/dev/null`
		args := []string{r.a1.Netdev(SUP), strconv.Itoa(sup), goAgent.cmd[0], strconv.Itoa(int(r.slot)), strconv.Itoa(opt), segPath}
		if i == 0 && r.div > 1 {
			script = `tc qdisc replace dev "$6" root netem rate "$7"kbit limit 10000 && ` + script
			args = append(args, r.a1.Netdev(SOUT), strconv.Itoa(r.kbit(clSoutKbit)))
		}
		from := nodeSh(ctx, t, r.a1, script, args...) + clSweepSettle.Seconds()
		sweep = append(sweep, clSweepPoint{sup, opt, from})
		time.Sleep(clSweepSettle + clSweepMeasure + 300*time.Millisecond) // node time is past from+measure: the marker came back after it was read
		if !running(r.cli) {
			r.transferEnded(ctx, t, "the sweep")
		}
	}
	if err := beat.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("sweep done at %.1f s", time.Since(r.start).Seconds())
	return sweep
}

// checkCarry divides every rate by closedloop.CarryDivisor of what the lab carries at phase 1's optimum
// (a heartbeat must be running: without one the hint does not apply). The shaping, the hint,
// its settle time and the probe are one exec; SOUT's shaping at divided rates goes with the
// sweep's first point.
func (r *clRun) checkCarry(ctx context.Context, t *testing.T) {
	out, errOut, code, err := r.a1Script(ctx, []string{"CL_DEV=" + r.a1.Netdev(SUP), "CL_KBIT=" + strconv.Itoa(clSupKbit),
		"CL_SLOT=" + strconv.Itoa(int(r.slot)), "CL_HINT=" + strconv.Itoa(closedloop.Optimum(clSupKbit, clSoutKbit)),
		"CL_SETTLE=" + strconv.FormatFloat(clSweepSettle.Seconds(), 'g', -1, 64),
		"CL_SOUTTX=/sys/class/net/" + r.a1.Netdev(SOUT) + "/statistics/tx_bytes", "CL_SUPTX=/sys/class/net/" + r.a1.Netdev(SUP) + "/statistics/tx_bytes"}, `
		tc qdisc replace dev "$CL_DEV" root netem rate "${CL_KBIT}kbit" limit 10000 || exit 1
		"$CL_GO" set --conn "$CL_SLOT" --sup-bw "$CL_HINT" --path "$CL_SEG" >/dev/null || exit 1
		sleep "$CL_SETTLE"
		read a <"$CL_SOUTTX"; read b <"$CL_SUPTX"; sleep 3; read c <"$CL_SOUTTX"; read d <"$CL_SUPTX"
		echo "@carried $(( (c - a + d - b) * 8 / 3000 ))"`)
	f := parseCLOut(out).at["carried"]
	if err != nil || code != 0 || len(f) != 1 {
		t.Fatalf("carry probe: %v exit %d %q %q", err, code, out, errOut)
	}
	carried, perr := strconv.Atoi(f[0])
	if perr != nil {
		t.Fatalf("carry probe: %q: %v", out, perr)
	}
	want := clCarryHeadroom * float64(clSoutKbit+clSupKbit)
	if r.div = closedloop.CarryDivisor(carried); r.div == 1 {
		t.Logf("carry probe: %d kbit/s at phase 1's optimum, at least %.0f: full rates", carried, want)
		return
	}
	evidence("closedloop:", "carried_kbit=%d want_kbit=%.0f rates=%s div=%d (the lab VM, not the rails, would limit full rates)",
		carried, want, map[bool]string{true: "halved", false: "divided"}[r.div == 2], r.div)
}

// runAgent hands the slot to agent's closed loop under phase 1's shaping (handOver; phase 1
// starts when its first hint replaces clMarker), then changes the shaping for phases 2 and 3.
// It returns the phases and the loop's output. Each phase is three execs, two of them outside
// its sleeps: its change with its time and first mark (for phase 1 the hand-over), the mark
// at the settle time and the one at its end, which also gives the next phase's stale-read
// count before the change and the last phase's final count.
func (r *clRun) runAgent(ctx context.Context, t *testing.T, agent agentCLI) (clPhases, string) {
	g := r.gates[agent.name]
	t.Logf("%s agent: hand-over at %.1f s of the run", agent.name, time.Since(r.start).Seconds())
	t0, first := r.handOver(ctx, t, agent)
	var ph clPhases
	for n, full := range clPhaseSup {
		if n > 0 { // the change, its time and the phase's first mark in one exec
			out := r.mustScript(ctx, t, fmt.Sprintf("%s phase %d's change", agent.name, n+1),
				[]string{"CL_DEV=" + r.a1.Netdev(SUP), "CL_KBIT=" + strconv.Itoa(r.kbit(full))}, `
				tc qdisc replace dev "$CL_DEV" root netem rate "${CL_KBIT}kbit" limit 10000 || exit 1
				stamp t0 && mark`)
			t0, first = stampOf(t, out, "t0"), r.markFrom(t, out)
		}
		ph.starts = append(ph.starts, t0)
		ph.staleAt = append(ph.staleAt, first.stale)
		j, last := r.runPhase(ctx, t, agent.name, n, full, first)
		ph.ends = append(ph.ends, j)
		if n == len(clPhaseSup)-1 {
			ph.staleAt = append(ph.staleAt, last.stale)
		}
		if !running(r.cli) {
			r.transferEnded(ctx, t, fmt.Sprintf("%s agent's phase %d", agent.name, n+1))
		}
	}
	// The agent shares the lab VM's 2 vCPUs with soft-RoCE and the transfer: its CPU time
	// tells whether it could slow the rails down. The same exec stops it (it starts no
	// children, so its PID is all there is to kill).
	ps, _, code, _ := r.a1Script(ctx, []string{"CL_PIDFILE=" + g.pidFile(), "CL_FIFO=" + g.fifo}, `
		ps -eo etimes,time,args --sort=-time | head -6 | cut -c1-120
		read -r pid <"$CL_PIDFILE" && kill -KILL "$pid"; rc=$?
		rm -f "$CL_FIFO"; exit $rc`)
	t.Logf("%s agent: a1's busiest processes at the end of phase 3 (elapsed s, CPU time):\n%s", agent.name, ps)
	if code != 0 {
		g.p.Kill(ctx)
	}
	lOut, lErr, _, _ := g.p.Wait(ctx)
	return ph, fmt.Sprintf("%s agent run output:\n%s%s", agent.name, tail(lOut, 6000), tail(lErr, 2000))
}

// handOver hands the slot to agent's gate in one exec: no heartbeat (the sweep's is gone, or
// the previous agent), the marker hint, SUP's shaping back to phase 1, the gate's `run`
// arguments into its FIFO (the agent goes), then a poll until the loop's first hint replaces
// the marker, its time and the phase's first mark. It returns that time (phase 1's start) and
// mark. The poll lists the segment every 0.3 s: each poll starts processes in the VM, and at
// 0.1 s the polls took the CPU the Python CLI needed to start (its first hint came 85 s after
// its start on a host with a core taken); the pause between polls is a built-in.
func (r *clRun) handOver(ctx context.Context, t *testing.T, agent agentCLI) (float64, clMark) {
	g := r.gates[agent.name]
	interval := strconv.FormatFloat(0.5*r.slow(), 'g', -1, 64)
	argv := []string{"run", "--policy", "closed-loop", "--interval", interval, "--path", segPath}
	out, errOut, code, err := r.a1Script(ctx, append(g.gateEnv(t, argv), "CL_SLOT="+strconv.Itoa(int(r.slot)), "CL_MARKER="+strconv.Itoa(clMarker),
		"CL_DEV="+r.a1.Netdev(SUP), "CL_KBIT="+strconv.Itoa(r.kbit(clSupKbit)), "CL_PIDFILE="+g.pidFile()), `
		"$CL_GO" set --conn "$CL_SLOT" --sup-bw "$CL_MARKER" --path "$CL_SEG" >/dev/null || exit 1
		tc qdisc replace dev "$CL_DEV" root netem rate "${CL_KBIT}kbit" limit 10000 || exit 1
		gone "$CL_PIDFILE" && exit 3
		[[ -p $GATE_FIFO ]] || { echo "no FIFO $GATE_FIFO" >&2; exit 1; }
		stamp go
		`+gateGo+` || exit 1
		SECONDS=0
		while "$CL_GO" list --json --path "$CL_SEG" | grep -q "\"sup_bw\": $CL_MARKER,"; do
			gone "$CL_PIDFILE" && exit 3
			(( SECONDS < 240 )) || { echo "no hint of the agent in 240 s" >&2; exit 4; }
			pause 0.3
		done
		stamp t0 && mark`)
	if code == 3 || (err == nil && code != 0 && !running(g.p)) {
		r.gateExited(ctx, t, agent.name)
	}
	if err != nil || code != 0 {
		t.Fatalf("a1: %s agent's hand-over: %v exit %d\n%s%s", agent.name, err, code, tail(out, 3000), tail(errOut, 2000))
	}
	if !running(g.p) {
		r.gateExited(ctx, t, agent.name)
	}
	t0 := stampOf(t, out, "t0")
	t.Logf("%s agent: the loop's first hint %.1f s after its start (its go; the process started before the transfer)",
		agent.name, t0-stampOf(t, out, "go"))
	return t0, r.markFrom(t, out)
}

// runPhase lets the loop run for one phase that has just begun (the shaping for SUP at full
// rate `full` in force, first its first mark) and judges its end stretch, from clSettleMax
// after the start to the phase's end, live: a stretch that missed after the transport
// retransmitted is followed by another settle time and end stretch under the same shaping
// (clMaxExtensions). The phase's timing starts when it is called, after the exec that made
// the change and the first mark came back: started before it, a first mark that took as long
// as the settle time left none. It returns the verdict and the last mark.
func (r *clRun) runPhase(ctx context.Context, t *testing.T, agent string, n, full int, first clMark) (clJudged, clMark) {
	settle := time.Duration(clSettleMax * r.slow() * float64(time.Second))
	opt := float64(r.kbit(full)) / float64(r.kbit(full)+r.kbit(clSoutKbit))
	began := time.Now()
	time.Sleep(time.Until(began.Add(settle)))
	m0 := time.Now()
	from := r.mark(ctx, t)
	m1 := time.Now()
	time.Sleep(time.Until(began.Add(r.phase() + 300*time.Millisecond))) // past t0+phase in node time (see the sweep)
	m2 := time.Now()
	to := r.mark(ctx, t)
	// Where a phase's time goes (a mark is one exec: seconds under load).
	t.Logf("%s phase %d: began at %.1f s of the run, marks took %.1f and %.1f s, ended at %.1f s", agent, n+1,
		began.Sub(r.start).Seconds(), m1.Sub(m0).Seconds(), time.Since(m2).Seconds(), time.Since(r.start).Seconds())
	j := judge(from, to, opt)
	for ext := 1; !j.ok && to.retransmits() > first.retransmits() && ext <= clMaxExtensions; ext++ {
		t.Logf("%s phase %d: SUP share %.3f (rails' optimum %.3f) after %d retransmission events: the phase goes on (extension %d)",
			agent, n+1, j.share, j.active, to.retransmits()-first.retransmits(), ext)
		time.Sleep(settle)
		from = r.mark(ctx, t)
		time.Sleep(time.Duration(float64(clEndWindow) * r.slow()))
		to = r.mark(ctx, t)
		j = judge(from, to, opt)
		j.extended = ext
	}
	j.retransmits = to.retransmits() - first.retransmits()
	return j, to
}

// judge is the verdict on the stretch between two marks (opt: the shaped optimum).
func judge(from, to clMark, opt float64) clJudged {
	point := func(m clMark) railPoint { return railPoint{Sout: m.wire.tx[SOUT], Sup: m.wire.tx[SUP]} }
	v := closedloop.Judge(point(from), point(to), from.marks, to.marks, opt)
	return clJudged{share: v.Share, active: v.Active, ok: v.OK}
}

// transferEnded fails the test for a transfer that ended before the test stopped it, with both
// drivers' output: the bytes ran out (raise clTransfer), or the run failed.
func (r *clRun) transferEnded(ctx context.Context, t *testing.T, during string) {
	t.Helper()
	r.srv.Kill(ctx)
	cOut, cErr, cCode, _ := r.cli.Wait(ctx)
	sOut, sErr, sCode, _ := r.srv.Wait(ctx)
	t.Fatalf("the transfer ended during %s (if it completed its %s: raise clTransfer)\nclient exit %d:\n%s%s\nserver exit %d:\n%s%s",
		during, clTransfer, cCode, tail(cOut, 3000), tail(cErr, 3000), sCode, tail(sOut, 2000), tail(sErr, 2000))
}

// staticRates is the sweep's rate per shaping and hint, and the best per shaping.
func (r *clRun) staticRates(t *testing.T, sweep []clSweepPoint) (map[int]map[int]float64, map[int]float64) {
	static := map[int]map[int]float64{} // sup kbit -> hint -> Mbit/s
	best := map[int]float64{}
	for _, sp := range sweep {
		rate := r.samp.rateOver(t, sp.from, sp.from+clSweepMeasure.Seconds())
		if static[sp.sup] == nil {
			static[sp.sup] = map[int]float64{}
		}
		static[sp.sup][sp.hint] = rate
		best[sp.sup] = max(best[sp.sup], rate)
	}
	return static, best
}

// report prints one closedloop: line per phase of one agent and checks it.
func (r *clRun) report(t *testing.T, agent string, ph clPhases, static map[int]map[int]float64, best map[int]float64) {
	for n, full := range clPhaseSup {
		sup := r.kbit(full)
		phase := r.phase().Seconds()
		v := r.samp.settle(ph.starts[n], ph.starts[n]+phase, best[sup])
		t.Logf("%s phase %d: static %v; windows (start_s:mbps=sout+sup)%s", agent, n+1, static[sup], v.Windows)
		shown := v.Settled
		if v.Settled < 0 {
			shown = phase // never settled within the phase
		}
		ratio := v.Rate / best[sup]
		opt := float64(sup) / float64(sup+r.kbit(clSoutKbit))
		end := ph.starts[n] + phase
		splitAt, share := r.samp.settleSplit(ph.starts[n], end, opt)
		splitShown := splitAt
		if splitAt < 0 {
			splitShown = phase
		}
		j := ph.ends[n]
		endShare, active, ok := j.share, j.active, j.ok
		evidence("closedloop:", "pair=a1-a2 agent=%s phase=%d sout_mbit=%g sup_mbit=%g settled_s=%.1f mbps=%.1f best_static_mbps=%.1f ratio=%.3f verified=true stale_reads=%d lowest_window_ratio=%.3f split_settled_s=%.1f sup_share=%.3f optimum_share=%.3f end_share=%.3f split_ok=%t slow=%g active_optimum_share=%.3f extended=%d retransmits=%d",
			agent, n+1, float64(r.kbit(clSoutKbit))/1000, float64(sup)/1000, shown, v.Rate, best[sup], ratio, ph.staleAt[n+1]-ph.staleAt[n], v.Lowest/best[sup],
			splitShown, share, opt, endShare, ok, r.slow(), active, j.extended, j.retransmits)
		if !ok {
			t.Errorf("%s phase %d: SUP share %.3f from %g s after the change to the phase's end, want the shaped optimum %.3f or the rails' active optimum %.3f +- %.3f, and the shaped one +- %.3f (split_settled_s=%.1f, stale reads %d)",
				agent, n+1, endShare, clSettleMax*r.slow(), opt, active, clShareTol, clShapedTol, splitShown, ph.staleAt[n+1]-ph.staleAt[n])
		}
	}
}

// TestRecordLabTrace records a trace of the lab's closed loop for the Python agent's replay
// and plot (docs/agent.md, "Traces"): TestClosedLoop's transfer and shaping schedule at halved
// rates (SOUT 12.5 Mbit/s; SUP 25, 6.25, 25 Mbit/s, 16 s each), the Python agent's closed loop
// steering it, and `mpib-agent-py record --raw` on a1 writing every counter twice a second.
// The written trace is a header, the shaping as capacity points (the lab's ground truth:
// netem's rates, on a1's clock) and the records between the first and the last change.
//
// It runs only when MPIB_RECORD_TRACE names the output file (it takes about 3 minutes of lab
// time and is no check): MPIB_RECORD_TRACE=$PWD/testdata/traces/closedloop-lab.jsonl
// go test ./integration/ -run '^TestRecordLabTrace$' -v
func TestRecordLabTrace(t *testing.T) {
	out := os.Getenv("MPIB_RECORD_TRACE")
	if out == "" {
		t.Skip("MPIB_RECORD_TRACE is not set: set it to the output file to record the lab's closed-loop trace")
	}
	lab := labOrSkip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := startClosedLoopRun(ctx, t, lab)
	r.div = 2 // the halved rates: what a slow host's lab carries (see TestClosedLoop)
	r.shape(ctx, t, SOUT, r.kbit(clSoutKbit))
	const remote = "/tmp/mpib-trace.jsonl"
	rec, err := r.a1.Start(ctx, pythonAgent.env, append(pythonAgent.cmd, "record", "--raw", "--out", remote,
		"--interval", "0.5", "--path", segPath)...)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Kill(context.Background())
	ph, loopOut := r.runAgent(ctx, t, pythonAgent)
	t.Log(loopOut)
	rec.Kill(ctx) // each record is one flushed line; a torn last one is dropped below
	r.samp.stop(ctx, t)
	raw, errOut, code, err := r.a1.Exec(ctx, nil, "cat", remote)
	if err != nil || code != 0 {
		t.Fatalf("reading %s on a1: exit %d %v %s", remote, code, err, errOut)
	}
	offset := unixMinusUptime(ctx, t, r.a1)
	trace := labTrace(t, r, ph, offset, raw)
	if err := os.WriteFile(out, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, rl := range Rails {
		lab.Shape(ctx, r.a1, rl, "")
	}
	lab.Node("a2").Exec(ctx, nil, "touch", clStopFile) // the transfer ends (see clTransfer)
	r.cli.Wait(ctx)
	r.srv.Wait(ctx)
	evidence("tracerecord:", "out=%s lines=%d lab_s=%.1f", out, strings.Count(trace, "\n"), time.Since(r.start).Seconds())
}

// unixMinusUptime is a1's CLOCK_REALTIME minus its /proc/uptime: the records' t is the
// former, the phases' starts (nodeSh) the latter.
func unixMinusUptime(ctx context.Context, t *testing.T, n *Node) float64 {
	t.Helper()
	out, errOut, code, err := n.Exec(ctx, nil, "sh", "-c", "read u x </proc/uptime; echo $u $(date +%s.%N)")
	f := strings.Fields(out)
	if err != nil || code != 0 || len(f) != 2 {
		t.Fatalf("clocks of %s: exit %d %v %q %q", n.Name(), code, err, out, errOut)
	}
	up, err1 := strconv.ParseFloat(f[0], 64)
	unix, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("clocks of %s: %q", n.Name(), out)
	}
	return unix - up
}

// traceLine is one line of the trace with its time, for sorting.
type traceLine struct {
	t    float64
	line string
}

// labTrace builds the trace: a header, one capacity point per phase (the shaping in force,
// Mbit/s), the records from the first phase's start to the last one's end, and the end.
func labTrace(t *testing.T, r *clRun, ph clPhases, offset float64, records string) string {
	t.Helper()
	end := ph.starts[len(ph.starts)-1] + clPhase.Seconds() + offset
	var lines []traceLine
	for n, full := range clPhaseSup {
		at := ph.starts[n] + offset
		p, _ := json.Marshal(map[string]any{"t": at, "sout_mbps": float64(r.kbit(clSoutKbit)) / 1000,
			"sup_mbps": float64(r.kbit(full)) / 1000})
		lines = append(lines, traceLine{at, string(p)})
	}
	kept := 0
	for _, l := range strings.Split(records, "\n") {
		var rec struct {
			T *float64 `json:"t"`
		}
		if json.Unmarshal([]byte(l), &rec) != nil || rec.T == nil || *rec.T < lines[0].t || *rec.T > end {
			continue
		}
		lines = append(lines, traceLine{*rec.T, l})
		kept++
	}
	if kept < 20 {
		t.Fatalf("only %d records within the phases:\n%s", kept, tail(records, 2000))
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].t < lines[j].t })
	head, _ := json.Marshal(map[string]any{
		"comment": fmt.Sprintf("recorded in the lab by TestRecordLabTrace on %s: TestClosedLoop's shaping at halved rates "+
			"(netem, a1's rails), the Python closed loop (run --policy closed-loop --interval 0.5), record --raw every 0.5 s",
			time.Now().UTC().Format("2006-01-02")),
		"msg_bytes": 512 << 10,
	})
	var b strings.Builder
	b.WriteString(string(head) + "\n")
	for _, l := range lines {
		b.WriteString(l.line + "\n")
	}
	fmt.Fprintf(&b, "{\"t\": %.6f}\n", end)
	return b.String()
}
