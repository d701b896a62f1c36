package integration

import (
	"context"
	"strings"
	"testing"
	"time"
)

// An agent gate is an agent CLI call started ahead of time in a node, blocked on a FIFO until
// the test writes the call's arguments there. A Python CLI start in the lab VM is seconds of
// CPU (its imports, under TCG), and beside a transfer it competes with soft-RoCE for the VM's
// two vCPUs: four Python `set` calls made while TestPolicyPythonAgent's transfer ran took
// 40-50 s of the test, and the closed loop's first hint came 33 s after its hand-over. Started
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
