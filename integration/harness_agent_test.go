package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
)

// The agents as the lab tests drive them: the Go and Python CLIs (agentCLI: run, list,
// telemetry, set), the hint segment's path, the rails' wire counters the agents read, the
// per-device records of a multi-device connection, and agent gates.

// An agent gate is an agent CLI call started ahead of time in a node, blocked on a FIFO until
// the test writes the call's arguments there. A Python CLI start in the lab VM is seconds of
// CPU (its imports, under TCG), and beside a transfer it competes with soft-RoCE for the VM's
// two vCPUs, so calls started during a transfer take tens of seconds and push the measured
// moments away from the ones the test chose. Started
// before the transfer, a call costs the shell that writes its FIFO and the CLI's own work,
// and the blocked processes take no CPU. TestClosedLoop gates both agents' `run`,
// TestPolicyPythonAgent its `set` calls.
//
// A gate creates its FIFO under another name, opens it read-write and renames it: the FIFO is
// there once the gate holds it open (the Python one: once its imports are done), so a write
// never blocks, and arguments written before the gate reads wait in the pipe. The arguments
// are one line, split on blanks (none of the tests' arguments has one).
type agentGate struct {
	p    *Process
	fifo string
}

const (
	// pyGate: what `python3 -m mpib_agent ARGS` runs (mpib_agent/__main__.py is
	// `raise SystemExit(main())`), its imports done before the arguments come.
	pyGate = `import os, sys; from mpib_agent._cli import main; p = sys.argv[1]; os.mkfifo(p + ".new"); ` +
		`f = os.fdopen(os.open(p + ".new", os.O_RDWR), "rb"); os.rename(p + ".new", p); a = f.readline().decode().split(); ` +
		`f.close(); os.unlink(p); raise SystemExit(main(a))`
	// goGate: a bash that execs the Go CLI with the arguments (its start costs what a counter
	// read does: the gate only keeps the two agents' hand-overs alike).
	goGate = `mkfifo "$0.new" && exec 3<>"$0.new" && mv "$0.new" "$0" && read -r a <&3 && exec 3<&- && set -f && exec "$1" $a`
)

// pidFile is where Node.Start had the gate record its PID (the agent's: the gate execs it or
// is it).
func (g *agentGate) pidFile() string { return "/tmp/.mpib-proc-" + g.p.tag }

// startAgentGate starts agent's gate in n; its FIFO is fifo once it is ready (waitAgentGates).
func startAgentGate(ctx context.Context, t *testing.T, n *Node, agent agentCLI, env []string, fifo string) *agentGate {
	t.Helper()
	cmd := []string{"bash", "-c", goGate, fifo, agent.cmd[0]}
	if agent.name == pythonAgent.name {
		cmd = []string{agent.cmd[0], "-c", pyGate, fifo}
	}
	p, err := n.Start(ctx, env, cmd...)
	if err != nil {
		t.Fatal(err)
	}
	g := &agentGate{p: p, fifo: fifo}
	t.Cleanup(func() { // a gate never handed its arguments blocks forever
		if running(g.p) {
			g.p.Kill(context.Background())
		}
	})
	return g
}

// waitAgentGates waits, in one exec with shell built-ins (a process start in the loaded VM
// costs what it waits for), until every gate holds its FIFO; a gate that exited first fails
// the test with its output.
func waitAgentGates(ctx context.Context, t *testing.T, n *Node, gates []*agentGate) {
	t.Helper()
	var list []string
	for _, g := range gates {
		list = append(list, g.fifo+":"+g.pidFile())
	}
	out, errOut, code, err := n.Exec(ctx, []string{"GATES=" + strings.Join(list, " ")}, "bash", "-c", `
		exec {p}<> <(:)
		for g in $GATES; do
			until [[ -p ${g%%:*} ]]; do
				if read -r pid <"${g#*:}" 2>/dev/null && ! kill -0 "$pid" 2>/dev/null; then echo "gone ${g%%:*}"; exit 3; fi
				(( SECONDS < 300 )) || exit 4
				read -t 0.2 -u $p || true
			done
		done`)
	if err == nil && code == 0 {
		return
	}
	for _, g := range gates {
		if code == 3 && strings.TrimSpace(out) == "gone "+g.fifo {
			gOut, gErr, gCode, _ := g.p.Wait(ctx)
			t.Fatalf("%s: an agent call exited %d before its arguments came:\n%s%s", n.Name(), gCode, gOut, gErr)
		}
	}
	t.Fatalf("%s: the agents' gates: %v exit %d %s %s", n.Name(), err, code, out, errOut)
}

// gateGo is the shell that hands a gate its arguments ($GATE_FIFO, $GATE_ARGV: one line): it
// is part of the caller's script, so the hand-over costs no exec of its own.
const gateGo = `exec 3<>"$GATE_FIFO" && printf '%s\n' "$GATE_ARGV" >&3 && exec 3>&-`

// gateEnv is gateGo's environment for handing g the arguments argv.
func (g *agentGate) gateEnv(t *testing.T, argv []string) []string {
	t.Helper()
	for _, a := range argv {
		if strings.ContainsAny(a, " \t\n") {
			t.Fatalf("agent gate argument %q has a blank: the gate splits its line on blanks", a)
		}
	}
	return []string{"GATE_FIFO=" + g.fifo, "GATE_ARGV=" + strings.Join(argv, " ")}
}

// call hands g its arguments and waits for the call to end; it fails the test unless the
// call exits 0, and returns how long it took from the hand-over.
func (g *agentGate) call(ctx context.Context, t *testing.T, n *Node, what string, argv ...string) time.Duration {
	t.Helper()
	start := time.Now()
	if out, errOut, code, err := n.Exec(ctx, g.gateEnv(t, argv), "bash", "-c", gateGo); err != nil || code != 0 {
		t.Fatalf("%s: %s: writing the arguments to %s: exit %d %v\n%s%s", n.Name(), what, g.fifo, code, err, out, errOut)
	}
	out, errOut, code, err := g.p.Wait(ctx)
	if err != nil || code != 0 {
		t.Fatalf("%s: %s: exit %d %v\n%s%s", n.Name(), what, code, err, out, errOut)
	}
	return time.Since(start)
}

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
		SoutActiveNs       uint64 `json:"sout_active_ns"`
		SupActiveNs        uint64 `json:"sup_active_ns"`
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
	w, err := readRailWire(ctx, n)
	return w.tx[SOUT], w.tx[SUP], err
}

// railWire is one reading of a node's rails: the netdevs' transmitted bytes and the soft-RoCE
// devices' retransmission events (the requester's timeouts, completer_retry_err, and the
// sequence NAKs it received, rcvd_seq_err): after either, go-back-N sends bytes again.
type railWire struct {
	tx, retransmits map[Rail]uint64
}

// railWireFiles are the files a railWire is read from, three per rail in Rails' order: the
// netdev's tx_bytes and the rxe device's two retransmission counters.
func railWireFiles(n *Node) []string {
	var files []string
	for _, r := range Rails {
		hw := "/sys/class/infiniband/" + n.Dev(r) + "/ports/1/hw_counters/"
		files = append(files, "/sys/class/net/"+n.Netdev(r)+"/statistics/tx_bytes", hw+"completer_retry_err", hw+"rcvd_seq_err")
	}
	return files
}

func running(p *Process) bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// deviceConn is what the agents' list --json says of a connection's device (format 4).
type deviceConn struct {
	Index   uint32      `json:"index"`
	IsSend  uint8       `json:"is_send"`
	Dev     uint16      `json:"dev"`
	SoutNIC string      `json:"sout_nic"`
	SupNIC  string      `json:"sup_nic"`
	SupPath shm.SupPath `json:"sup_path"` // format 6
}

// freshSegments creates a new agent segment (Go CLI) on each node, after removing the old one
// and the stop file; the returned function removes both again.
func freshSegments(ctx context.Context, t *testing.T, stop string, nodes ...*Node) func() {
	t.Helper()
	for _, n := range nodes {
		n.Exec(ctx, nil, "rm", "-f", segPath, stop)
		goAgent.run(ctx, t, n, "create")
	}
	return func() {
		for _, n := range nodes {
			n.Exec(context.Background(), nil, "rm", "-f", segPath, stop)
		}
	}
}

// listDev runs an agent's list --json --dev dev on n.
func listDev(ctx context.Context, t *testing.T, a agentCLI, n *Node, dev int) []deviceConn {
	t.Helper()
	var conns []deviceConn
	if err := json.Unmarshal([]byte(a.run(ctx, t, n, "list", "--json", "--dev", fmt.Sprint(dev))), &conns); err != nil {
		t.Fatalf("%s agent list --json --dev %d: %v", a.name, dev, err)
	}
	return conns
}

// railWireNow is readRailWire of n, failing the test when it cannot be read.
func railWireNow(ctx context.Context, t *testing.T, n *Node) railWire {
	t.Helper()
	w, err := readRailWire(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func readRailWire(ctx context.Context, n *Node) (railWire, error) {
	w := railWire{tx: map[Rail]uint64{}, retransmits: map[Rail]uint64{}}
	files := railWireFiles(n)
	out, errOut, code, err := n.Exec(ctx, nil, append([]string{"cat"}, files...)...)
	f := strings.Fields(out)
	if err != nil || code != 0 || len(f) != len(files) {
		return w, fmt.Errorf("%s: reading rail counters: %v exit %d %s %s", n.Name(), err, code, out, errOut)
	}
	v := make([]uint64, len(f))
	for i := range f {
		if v[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
			return w, fmt.Errorf("%s: rail counter %s: %v", n.Name(), files[i], err)
		}
	}
	for i, r := range Rails {
		w.tx[r], w.retransmits[r] = v[3*i], v[3*i+1]+v[3*i+2]
	}
	return w, nil
}
