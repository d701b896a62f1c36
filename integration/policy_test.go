package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Advanced mode in the lab: an agent in a1 changes the live a1->a2 connection's hint during
// one long verified transfer; the SUP byte share of each phase, from a1's rail counters,
// must follow the hint. Killing the agent returns the plugin to vanilla.

const segPath = "/dev/shm/mpib-hints"

// agentCLI is how to run one agent's CLI in a node.
type agentCLI struct {
	name string
	cmd  []string
	env  []string
}

var (
	goAgent = agentCLI{"go", []string{NodeBuildDir + "/mpib-agent"}, nil}
	// The nodes see build/ read-only, so Python cannot keep the package's bytecode there and
	// would compile it at every CLI call (about 1.5 s of the 4 s a call takes under the lab's
	// emulated CPUs, many times that while a transfer runs): the cache goes to the node's /tmp.
	pythonAgent = agentCLI{"python", []string{"python3", "-m", "mpib_agent"},
		[]string{"PYTHONPATH=" + NodeBuildDir + "/python/src", "PYTHONPYCACHEPREFIX=/tmp/mpib-pycache"}}
)

func (a agentCLI) run(ctx context.Context, t *testing.T, n *Node, args ...string) string {
	t.Helper()
	out, errOut, code, err := n.Exec(ctx, a.env, append(a.cmd, append(args, "--path", segPath)...)...)
	if err != nil || code != 0 {
		t.Fatalf("%s agent %s: exit %d %v\n%s%s", a.name, strings.Join(args, " "), code, err, out, errOut)
	}
	return out
}

type listedConn struct {
	Index     uint32 `json:"index"`
	IsSend    uint8  `json:"is_send"`
	PID       uint32 `json:"pid"`
	Telemetry struct {
		AppliedSupBw       uint32 `json:"applied_sup_bw"`
		SoutCompletedBytes uint64 `json:"sout_completed_bytes"`
		SupCompletedBytes  uint64 `json:"sup_completed_bytes"`
		SoutBusyNs         uint64 `json:"sout_busy_ns"`
		SupBusyNs          uint64 `json:"sup_busy_ns"`
		ReadsStale         uint64 `json:"reads_stale"`
	} `json:"telemetry"`
}

// list runs the agent's list --json.
func (a agentCLI) list(ctx context.Context, t *testing.T, n *Node) []listedConn {
	t.Helper()
	var conns []listedConn
	if err := json.Unmarshal([]byte(a.run(ctx, t, n, "list", "--json")), &conns); err != nil {
		t.Fatalf("%s agent list --json: %v", a.name, err)
	}
	return conns
}

// telemetry reads one slot's telemetry through the agent's list --json.
func (a agentCLI) telemetry(ctx context.Context, t *testing.T, n *Node, slot uint32) listedConn {
	t.Helper()
	for _, c := range a.list(ctx, t, n) {
		if c.Index == slot {
			return c
		}
	}
	t.Fatalf("%s agent list --json: slot %d is gone", a.name, slot)
	return listedConn{}
}

// sendSlot waits until a send connection is registered in the segment and returns its slot.
func (a agentCLI) sendSlot(ctx context.Context, t *testing.T, n *Node) uint32 {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		for _, c := range a.list(ctx, t, n) {
			if c.IsSend == 1 {
				return c.Index
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("%s agent: no send connection registered in %s", a.name, segPath)
	return 0
}

// readRailTx reads both rails' transmitted bytes in one command, so that while traffic flows
// the two counters are taken at the same instant (one exec per rail would skew the window).
func readRailTx(ctx context.Context, n *Node) (sout, sup uint64, err error) {
	out, errOut, code, err := n.Exec(ctx, nil, "cat", "/sys/class/net/"+n.Netdev(SOUT)+"/statistics/tx_bytes",
		"/sys/class/net/"+n.Netdev(SUP)+"/statistics/tx_bytes")
	f := strings.Fields(out)
	if err != nil || code != 0 || len(f) != 2 {
		return 0, 0, fmt.Errorf("%s: reading rail counters: %v exit %d %s %s", n.Name(), err, code, out, errOut)
	}
	sout, _ = strconv.ParseUint(f[0], 10, 64)
	sup, _ = strconv.ParseUint(f[1], 10, 64)
	return sout, sup, nil
}

func railTx(ctx context.Context, t *testing.T, n *Node) (sout, sup uint64) {
	t.Helper()
	sout, sup, err := readRailTx(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	return sout, sup
}

// supShareOver waits until n has transmitted `settle` more bytes (requests posted under the
// previous policy drain), then measures n's SUP share over the next `measure` bytes. Phases
// are counted in bytes, not seconds, so they hold whatever speed the lab runs at.
// atMeasure, when given, runs when the measured window starts and again when it ends.
func supShareOver(ctx context.Context, t *testing.T, n *Node, settle, measure uint64, atMeasure func()) (float64, uint64) {
	t.Helper()
	waitBytes := func(want uint64) (sout, sup uint64) {
		sout0, sup0 := railTx(ctx, t, n)
		deadline := time.Now().Add(3 * time.Minute)
		for {
			sout, sup = railTx(ctx, t, n)
			if (sout-sout0)+(sup-sup0) >= want {
				return sout - sout0, sup - sup0
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s sent only %d of %d bytes in 3 minutes", n.Name(), (sout-sout0)+(sup-sup0), want)
			}
			time.Sleep(time.Second) // a process start per poll: leave the CPUs to the transfer and the agent CLI
		}
	}
	waitBytes(settle)
	if atMeasure != nil {
		atMeasure()
	}
	sout, sup := waitBytes(measure)
	if atMeasure != nil {
		atMeasure()
	}
	return share(sup, sup+sout), sup + sout
}

func running(p *Process) bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

const (
	// Settle: several times the bytes that can be in flight (8 requests of <= 1 MiB): a
	// rail's backlog under the old hint drains while the other rail already runs the new one.
	// Within a phase the rails can drift apart by at most what is in flight, so the measured
	// window is many times larger than that.
	// Measured shares were within 0.005 of the hint over 128 MiB windows in the runs on record; 96 MiB
	// keeps that error under 0.007 if it scales with 1/window (the tolerance is 0.01) and
	// takes a quarter less lab time.
	phaseSettle  = 24 << 20
	phaseMeasure = 96 << 20 // bytes measured per phase
	policyStale  = 2 * time.Second
)

// policyPhase is one hint's measurement: the wire's SUP share over the window and the
// agent's view of the slot when the window started and ended.
type policyPhase struct {
	hint  int
	share float64
	bytes uint64
	tele  [2]listedConn
}

func testAgentPhases(t *testing.T, agent agentCLI) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	a1.Exec(ctx, nil, "rm", "-f", segPath)
	agent.run(ctx, t, a1, "create")
	// The agent beats at a quarter of the plugins' staleness limit, which it reads from the
	// same variable.
	staleEnv := "MPIB_AGENT_STALE_MS=" + strconv.Itoa(int(policyStale.Milliseconds()))
	beat, err := a1.Start(ctx, append([]string{staleEnv}, agent.env...), append(agent.cmd, "heartbeat", "--path", segPath)...)
	if err != nil {
		t.Fatal(err)
	}
	defer beat.Kill(context.Background())

	// The staleness limit leaves room for the lab's scheduling hiccups (a heartbeat process
	// descheduled for half a second under the emulated CPUs would send a message the vanilla
	// way and move a phase's share).
	mode := []string{"MPIB_MODE=1", staleEnv, "MPIB_SHM_PATH=" + segPath}
	// Verified byte for byte. The transfer is open-ended: it runs until every phase has been
	// measured and the receiver sees the stop file (a fixed size would have to cover the
	// slowest agent's CLI calls and then keep the lab busy after the last phase).
	stopFile := fmt.Sprintf("/tmp/policy-%s-%d.stop", agent.name, time.Now().UnixNano())
	a2.Exec(ctx, nil, "rm", "-f", stopFile)
	srv, cli := startPair(ctx, t, nettestPair{server: a2, client: a1, serverEnv: pluginEnv(a2, mode...), clientEnv: pluginEnv(a1, mode...),
		args: []string{"--timeout-s", "120", "--mode", "verify", "--bytes", "1000G", "--stop-file", stopFile, "--max-size", "1M", "--window", "8",
			"--idle-us", strconv.Itoa(faultIdleUS)}}) // idle drivers leave the CPUs to rxe and to the agent's CLI
	defer func() { // a phase that failed leaves the transfer running
		for _, p := range []*Process{srv, cli} {
			if running(p) {
				p.Kill(context.Background())
			}
		}
	}()
	// The harness reads the segment with the Go CLI: the agent under test creates, beats and
	// sets; its own list is held against Go's in TestCLIsAgree and TestMultiDeviceAgentRecords.
	// Each Python start costs seconds in the loaded VM: reading with it took 2 of the test's 4
	// minutes.
	slot := goAgent.sendSlot(ctx, t, a1)

	var phases []policyPhase
	for _, hint := range []int{0, 512, 1024, 256} {
		agent.run(ctx, t, a1, "set", "--conn", strconv.Itoa(int(slot)), "--sup-bw", strconv.Itoa(hint))
		var tele []listedConn
		s, b := supShareOver(ctx, t, a1, phaseSettle, phaseMeasure, func() { tele = append(tele, goAgent.telemetry(ctx, t, a1, slot)) })
		if !running(cli) {
			t.Fatalf("the transfer ended before phase hint=%d was measured", hint)
		}
		phases = append(phases, policyPhase{hint, s, b, [2]listedConn{tele[0], tele[1]}})
	}
	// The agent dies: its heartbeat goes stale and the plugin falls back to vanilla (all SUP).
	if err := beat.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(policyStale)
	fallback, fbBytes := supShareOver(ctx, t, a1, phaseSettle, phaseMeasure, nil)
	fbApplied := goAgent.telemetry(ctx, t, a1, slot).Telemetry.AppliedSupBw
	stillRunning := running(cli)
	if _, _, code, err := a2.Exec(ctx, nil, "touch", stopFile); err != nil || code != 0 {
		t.Fatalf("touch %s in a2: exit %d %v", stopFile, code, err)
	}
	defer a2.Exec(context.Background(), nil, "rm", "-f", stopFile)

	cOut, cErr, cCode, err1 := cli.Wait(ctx)
	sOut, sErr, sCode, err2 := srv.Wait(ctx)
	res := pairResult{serverOut: sOut, serverErr: sErr, clientOut: cOut, clientErr: cErr, serverCode: sCode, clientCode: cCode}
	if err1 != nil || err2 != nil {
		t.Fatalf("transfer did not finish: %v %v", err1, err2)
	}
	verified(t, res)
	for _, p := range phases {
		fmt.Printf("policy: pair=a1-a2 agent=%s hint=%d sup_share=%.3f verified=true\n", agent.name, p.hint, p.share)
		if want := float64(p.hint) / 1024; math.Abs(p.share-want) > 0.01 || p.bytes < 1<<20 {
			t.Errorf("hint %d: SUP share %.4f over %d bytes, want %.4f within 0.01 (rail events of the run: %q)",
				p.hint, p.share, p.bytes, want, railEventLines(cErr+sErr))
		}
	}
	checkPhaseTelemetry(t, agent.name, phases)
	if fbApplied != 1024 {
		t.Errorf("after the agent died the plugin's telemetry says applied_sup_bw=%d, want vanilla 1024", fbApplied)
	}
	fmt.Printf("policy: pair=a1-a2 agent=none fallback=vanilla sup_share=%.3f verified=true\n", fallback)
	if !stillRunning || fallback < 0.99 || fbBytes < 1<<20 {
		t.Errorf("after the agent died: SUP share %.4f over %d bytes (transfer running: %t), want vanilla ~1.0", fallback, fbBytes, stillRunning)
	}
}

func TestPolicyGoAgent(t *testing.T)     { testAgentPhases(t, goAgent) }
func TestPolicyPythonAgent(t *testing.T) { testAgentPhases(t, pythonAgent) }

// A segment full of garbage must not change correctness: the plugin refuses it and stays on
// the vanilla policy.
func TestPolicyGarbageSegment(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx := context.Background()
	if _, _, code, err := a1.Exec(ctx, nil, "sh", "-c", "head -c 300000 /dev/urandom >"+segPath+" && chmod 600 "+segPath); err != nil || code != 0 {
		t.Fatalf("writing garbage segment: %v exit %d", err, code)
	}
	defer a1.Exec(ctx, nil, "rm", "-f", segPath)
	mode := []string{"MPIB_MODE=1", "MPIB_SHM_PATH=" + segPath}
	res := runPair(ctx, t, a2, a1, pluginEnv(a2, mode...), pluginEnv(a1, mode...), "--mode", "verify", "--bytes", "24M", "--max-size", "1M")
	verified(t, res)
	sout, sup := res.tx["a1"][SOUT], res.tx["a1"][SUP]
	s := share(sup, sup+sout)
	fmt.Printf("policy: pair=a1-a2 agent=garbage fallback=vanilla sup_share=%.3f verified=true\n", s)
	if s < 0.99 {
		t.Errorf("garbage segment: SUP share %.4f, want vanilla ~1.0", s)
	}
	if !strings.Contains(res.clientErr, "agent segment") {
		t.Errorf("the plugin did not say why it ignored the segment:\n%s", tail(res.clientErr, 2000))
	}
}

// railEventLines are the plugin's failover and recovery lines in a driver's stderr: a rail
// that left service moves traffic off the hinted split.
func railEventLines(stderr string) []string { return linesContaining(stderr, "failover:", "recovery:") }

// checkPhaseTelemetry holds the plugin's completion telemetry (segment format 3) against what
// the wire showed: over each phase's window the completed bytes split like the hint (within
// 0.02: a batch of up to 1 MiB may be unpublished at either end of the window), the applied
// split is the hint, and completions took time on every rail that carried bytes.
func checkPhaseTelemetry(t *testing.T, agent string, phases []policyPhase) {
	for _, p := range phases {
		hint, a, b := p.hint, p.tele[0].Telemetry, p.tele[1].Telemetry
		sout, sup := b.SoutCompletedBytes-a.SoutCompletedBytes, b.SupCompletedBytes-a.SupCompletedBytes
		s := share(sup, sup+sout)
		fmt.Printf("policy-telemetry: agent=%s hint=%d completed_sup_share=%.3f completed_bytes=%d applied_sup_bw=%d sout_busy_ms=%.0f sup_busy_ms=%.0f\n",
			agent, hint, s, sup+sout, b.AppliedSupBw, float64(b.SoutBusyNs-a.SoutBusyNs)/1e6, float64(b.SupBusyNs-a.SupBusyNs)/1e6)
		if want := float64(hint) / 1024; math.Abs(s-want) > 0.02 || sup+sout < 64<<20 {
			t.Errorf("hint %d: the telemetry's completed bytes split %.4f over %d bytes, want %.4f within 0.02", hint, s, sup+sout, want)
		}
		if b.AppliedSupBw != uint32(hint) {
			t.Errorf("hint %d: the telemetry's applied_sup_bw is %d", hint, b.AppliedSupBw)
		}
		if (sout > 0 && b.SoutBusyNs <= a.SoutBusyNs) || (sup > 0 && b.SupBusyNs <= a.SupBusyNs) {
			t.Errorf("hint %d: bytes completed with no time spent on the rail: %+v -> %+v", hint, a, b)
		}
	}
}
