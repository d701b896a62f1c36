package integration

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The pair runner: an mpib-nettest server and client on two nodes, each side with its own
// environment (nodeEnv), over a fresh side-channel port. runPair runs a pair to its end and
// measures the rails' bytes around it; startPair and waitPair, or waitExit and waitBoth (each
// side until its own deadline, killed and reported hung past it), split the two; verified
// judges a verify transfer. A faultPair's drivers write to files in the nodes, read while they
// run (the plugin's failover and recovery events) and after stop, which asks the receiver to
// stop posting; it paces itself for the fault cases (--gap-ms, --idle-us). waitRailTraffic
// waits until a rail carries a transfer's bytes.

const nettestBin = NodeBuildDir + "/mpib-nettest"
const pluginLib = NodeBuildDir + "/libnccl-net-mpib.so"

var oobPort atomic.Int32

func init() { oobPort.Store(18600) }

// railSample is the sender's and receiver's counters on both rails.
type railSample map[string]map[Rail]Counters

func sampleRails(ctx context.Context, nodes ...*Node) (railSample, error) {
	s := railSample{}
	for _, n := range nodes {
		s[n.Name()] = map[Rail]Counters{}
		for _, r := range Rails {
			c, err := n.Counters(ctx, r)
			if err != nil {
				return nil, err
			}
			s[n.Name()][r] = c
		}
	}
	return s, nil
}

// pairResult is one finished server/client run.
type pairResult struct {
	serverOut, serverErr   string
	clientOut, clientErr   string
	serverCode, clientCode int
	// tx is the bytes each node transmitted per rail during the run (netdev statistics).
	tx map[string]map[Rail]uint64
}

func (p pairResult) String() string {
	return fmt.Sprintf("server exit %d\n--- stdout\n%s\n--- stderr\n%s\nclient exit %d\n--- stdout\n%s\n--- stderr\n%s",
		p.serverCode, p.serverOut, tail(p.serverErr, 4000), p.clientCode, p.clientOut, tail(p.clientErr, 4000))
}

// nettestPair describes one nettest server/client pair (the client sends).
type nettestPair struct {
	server, client       *Node
	serverEnv, clientEnv []string // the whole environment (see nodeEnv)
	clientWrap           []string // a command the client runs under (valgrind), or none
	args                 []string // options for both sides after --plugin and the role
	serverLib, clientLib string   // the plugin each side loads (default pluginLib)
}

// startPair starts the server, then the client connecting to it over a fresh OOB port.
func startPair(ctx context.Context, t *testing.T, p nettestPair) (srv, cli *Process) {
	t.Helper()
	port := strconv.Itoa(int(oobPort.Add(1)))
	lib := func(l string) []string {
		if l == "" {
			l = pluginLib
		}
		return append([]string{"--plugin", l}, p.args...)
	}
	srv, err := p.server.Start(ctx, p.serverEnv, append([]string{nettestBin, "--role", "server", "--oob-listen", p.server.IP(SOUT) + ":" + port}, lib(p.serverLib)...)...)
	if err != nil {
		t.Fatal(err)
	}
	clientCmd := append(append([]string(nil), p.clientWrap...), nettestBin, "--role", "client", "--oob-connect", p.server.IP(SOUT)+":"+port)
	cli, err = p.client.Start(ctx, p.clientEnv, append(clientCmd, lib(p.clientLib)...)...)
	if err != nil {
		srv.Kill(context.Background())
		t.Fatal(err)
	}
	return srv, cli
}

// waitPair waits for both drivers of a pair and returns their outputs; when either does not
// end (ctx), it kills both and fails the test, naming what.
func waitPair(ctx context.Context, t *testing.T, srv, cli *Process, what string) pairResult {
	t.Helper()
	var res pairResult
	var cerr, serr error
	res.clientOut, res.clientErr, res.clientCode, cerr = cli.Wait(ctx)
	res.serverOut, res.serverErr, res.serverCode, serr = srv.Wait(ctx)
	if cerr != nil || serr != nil {
		srv.Kill(context.Background())
		cli.Kill(context.Background())
		t.Fatalf("%s did not finish: client %v, server %v", what, cerr, serr)
	}
	return res
}

// runPair runs a nettest server on `server` and a client on `client` (the client sends).
func runPair(ctx context.Context, t *testing.T, server, client *Node, serverEnv, clientEnv []string, args ...string) pairResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	before, err := sampleRails(ctx, server, client)
	if err != nil {
		t.Fatal(err)
	}
	srv, cli := startPair(ctx, t, nettestPair{server: server, client: client, serverEnv: serverEnv, clientEnv: clientEnv,
		args: append([]string{"--timeout-s", "90"}, args...)})
	res := waitPair(ctx, t, srv, cli, "nettest")
	after, err := sampleRails(ctx, server, client)
	if err != nil {
		t.Fatal(err)
	}
	res.tx = map[string]map[Rail]uint64{}
	for name, rails := range after {
		res.tx[name] = map[Rail]uint64{}
		for r, c := range rails {
			res.tx[name][r] = c.TxBytes - before[name][r].TxBytes
		}
	}
	return res
}

var resultRe = regexp.MustCompile(`nettest-result: role=(\w+) mode=verify messages=(\d+) payload_bytes=(\d+) verified=(\w+)`)

// verified returns the receiver's payload byte count, failing the test unless both sides
// finished cleanly and the receiver verified every byte.
func verified(t *testing.T, res pairResult) uint64 {
	t.Helper()
	if res.serverCode != 0 || res.clientCode != 0 {
		t.Fatalf("nettest failed:\n%s", res)
	}
	m := resultRe.FindStringSubmatch(res.serverOut)
	if m == nil || m[4] != "true" {
		t.Fatalf("receiver did not report verified=true:\n%s", res)
	}
	n, _ := strconv.ParseUint(m[3], 10, 64)
	return n
}

// supQPs reads the SUP QP count the plugin logged for its connection ("SUP QPs N").
func supQPs(t *testing.T, log string) []int {
	t.Helper()
	var counts []int
	for _, m := range regexp.MustCompile(`SOUT QPs (\d+), SUP QPs (\d+), CTS on (\w+)`).FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[2])
		counts = append(counts, n)
	}
	if len(counts) == 0 {
		t.Fatalf("no connection line in the plugin log:\n%s", tail(log, 3000))
	}
	return counts
}

func ctsRails(log string) []string {
	var rails []string
	for _, m := range regexp.MustCompile(`recv comm .*CTS on (\w+)`).FindAllStringSubmatch(log, -1) {
		rails = append(rails, m[1])
	}
	return rails
}

func pairName(a, b *Node) string { return a.Name() + "-" + b.Name() }

func share(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

// lcArgs appends `--plugin $MPIB_NETTEST_PLUGIN` when that is set (a path in the nodes, e.g.
// /opt/mpib/head/libnccl-net-mpib.so) to run a test against another plugin build.
func lcArgs(args ...string) []string {
	if p := os.Getenv("MPIB_NETTEST_PLUGIN"); p != "" {
		args = append(args, "--plugin", p)
	}
	return args
}

// exitInfo is how one process ended: by itself before a deadline, or killed there (hung).
type exitInfo struct {
	out, err string
	code     int
	hung     bool
	at       time.Time
}

// crashed is true unless the process exited 0 by itself.
func (e exitInfo) crashed() bool { return e.hung || e.code != 0 }

// signaled is true when the process died of a signal (docker reports 128+N) or was killed.
func (e exitInfo) signaled() bool { return e.hung || e.code >= 128 || e.code < 0 }

func (e exitInfo) String() string {
	return fmt.Sprintf("exit %d hung=%v\n--- stdout\n%s\n--- stderr\n%s", e.code, e.hung, e.out, stderrExcerpt(e.err))
}

// stderrExcerpt keeps the start of a crash report (a Go runtime's fatal error or panic, whose
// goroutine dump would push it out of a plain tail) and the end of the output.
func stderrExcerpt(s string) string {
	for _, k := range []string{"fatal error:", "panic:", "SIGSEGV", "SIGABRT", "SIGBUS", "unexpected signal"} {
		if i := strings.Index(s, k); i >= 0 {
			from, to := max(0, i-1500), min(len(s), i+2500)
			if to >= len(s)-1500 {
				return tail(s, len(s)-from)
			}
			return "..." + s[from:to] + "\n[...]\n" + tail(s, 1500)
		}
	}
	return tail(s, 4000)
}

// waitExit waits for p until deadline; past it, p is killed and reported hung.
func waitExit(p *Process, deadline time.Time) exitInfo {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var e exitInfo
	var err error
	e.out, e.err, e.code, err = p.Wait(ctx)
	e.at = time.Now()
	if err != nil {
		e.hung = true
		kctx, kcancel := context.WithTimeout(context.Background(), time.Minute)
		defer kcancel()
		p.Kill(kctx)
		e.out, e.err, e.code, _ = p.Wait(kctx)
	}
	return e
}

// waitBoth waits for two processes at once, each until its own deadline.
func waitBoth(a, b *Process, da, db time.Time) (exitInfo, exitInfo) {
	ch := make(chan exitInfo, 1)
	go func() { ch <- waitExit(b, db) }()
	ea := waitExit(a, da)
	return ea, <-ch
}

// waitRailTraffic waits until node n has sent at least min more bytes on rail r.
func waitRailTraffic(ctx context.Context, n *Node, r Rail, min uint64, procs ...*Process) error {
	c0, err := n.Counters(ctx, r)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		c, err := n.Counters(ctx, r)
		if err != nil {
			return err
		}
		if c.TxBytes-c0.TxBytes >= min {
			return nil
		}
		for _, p := range procs {
			select {
			case <-p.done:
				return fmt.Errorf("a nettest process exited before %s carried %d bytes", r, min)
			default:
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	return ctx.Err()
}

// verifyArgs sends random sizes from 0 B to 4 MiB, 8 in flight, every byte checked.
var verifyArgs = []string{"--mode", "verify", "--bytes", "48M", "--max-size", "4M", "--window", "8"}

// faultGapMS is the driver's --gap-ms: gaps between completions shorter than this are not
// reported, so a stall_ms of 0 means "under 50 ms".
const faultGapMS = 50

// faultIdleUS is the drivers' --idle-us: a polling turn that completed nothing sleeps 200 µs
// (at most 0.2 ms added to a completion that takes milliseconds in the lab), which leaves the
// emulated CPUs to rxe and to the fault commands instead of two spinning drivers.
const faultIdleUS = 200

var faultSeq atomic.Int32

type faultPair struct {
	server, client *Node
	srv, cli       *Process
	base           string // /tmp/fault-N: <base>-server.{out,err} in the server, -client in the client
	stopFile       string // in the server (the receiver stops posting when it exists)
	stopped        bool   // stop ran: the drivers have ended (or were killed there)
}

func startFaultPair(ctx context.Context, t *testing.T, server, client *Node, serverEnv, clientEnv []string, args ...string) *faultPair {
	t.Helper()
	fp := &faultPair{server: server, client: client, base: fmt.Sprintf("/tmp/fault-%d-%d", os.Getpid(), faultSeq.Add(1))}
	fp.stopFile = fp.base + ".stop"
	port := strconv.Itoa(oobPorts(args))
	common := []string{"--plugin", pluginLib}
	if i := slices.Index(args, "--mode"); i < 0 || i+1 >= len(args) || (args[i+1] != "connect" && args[i+1] != "resources") {
		// verify and the other transfer modes; the scale modes pace and stop themselves
		common = append(common, "--gap-ms", strconv.Itoa(faultGapMS), "--stop-file", fp.stopFile, "--idle-us", strconv.Itoa(faultIdleUS))
	}
	common = append(common, args...)
	wrap := func(role string) []string {
		return []string{"sh", "-c", `exec "$@" >"$0.out" 2>"$0.err"`, fp.base + "-" + role, nettestBin, "--role", role}
	}
	var err error
	fp.srv, err = server.Start(ctx, serverEnv, append(append(wrap("server"), "--oob-listen", server.IP(SOUT)+":"+port), common...)...)
	if err != nil {
		t.Fatal(err)
	}
	fp.cli, err = client.Start(ctx, clientEnv, append(append(wrap("client"), "--oob-connect", server.IP(SOUT)+":"+port), common...)...)
	if err != nil {
		fp.srv.Kill(context.Background())
		t.Fatal(err)
	}
	return fp
}

// oobPorts reserves the side-channel ports of a driver with these arguments (--parallel N
// takes N consecutive ones) and returns the first.
func oobPorts(args []string) int {
	n := 1
	for i, a := range args {
		if a == "--parallel" && i+1 < len(args) {
			n, _ = strconv.Atoi(args[i+1])
		}
	}
	return int(oobPort.Add(int32(n))) - n + 1
}

// pid is the process's PID in its node (the harness's PID file; sh execs nettest in place).
func (p *Process) pid(ctx context.Context) (string, error) {
	out, err := p.node.output(ctx, "cat", "/tmp/.mpib-proc-"+p.tag)
	return strings.TrimSpace(out), err
}

// stop asks the receiver to stop posting (the sender follows) and waits for both to exit.
// startFaultTransfer starts a long verified a1 -> a2 transfer in the given mode (ended by
// stop) and waits until it carries traffic on SUP; the caller defers killUnlessStopped.
func startFaultTransfer(ctx context.Context, t *testing.T, a1, a2 *Node, mode string, args ...string) *faultPair {
	t.Helper()
	fp := startFaultPair(ctx, t, a2, a1, faultEnv(a2, mode), faultEnv(a1, mode),
		append([]string{"--mode", "verify", "--bytes", "1000G", "--timeout-s", "30"}, args...)...)
	if err := waitRailTraffic(ctx, a1, SUP, 1<<20, fp.srv, fp.cli); err != nil {
		s, c := fp.stop(ctx, time.Now())
		t.Fatalf("no SUP traffic from a1 before the faults: %v\nserver %s\nclient %s", err, s, c)
	}
	return fp
}

// killUnlessStopped kills drivers that stop never ended (a test that failed early).
func (fp *faultPair) killUnlessStopped() {
	if !fp.stopped {
		fp.srv.Kill(context.Background())
		fp.cli.Kill(context.Background())
	}
}

func (fp *faultPair) stop(ctx context.Context, deadline time.Time) (s, c exitInfo) {
	fp.stopped = true
	fp.server.Exec(ctx, nil, "touch", fp.stopFile)
	s, c = waitBoth(fp.srv, fp.cli, deadline, deadline)
	s.out, s.err = fp.files(fp.server, "server")
	c.out, c.err = fp.files(fp.client, "client")
	return s, c
}

func (fp *faultPair) files(n *Node, role string) (out, errOut string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, _, _, _ = n.Exec(ctx, nil, "cat", fp.base+"-"+role+".out")
	// INFO lines are left out (thousands), but for the plugin's slow QP transitions.
	errOut, _, _, _ = n.Exec(ctx, nil, "sh", "-c", "awk '!/NCCL INFO/ || /to RTR took/' "+fp.base+"-"+role+".err | tail -c 20000")
	return out, errOut
}

// events reads both sides' failover and recovery lines so far.
func (fp *faultPair) events(ctx context.Context) []railEvent {
	var evs []railEvent
	for _, x := range []struct {
		n    *Node
		role string
	}{{fp.client, "client"}, {fp.server, "server"}} {
		out, _, _, err := x.n.Exec(ctx, nil, "sh", "-c", "grep -h -E 'failover:|recovery:' "+fp.base+"-"+x.role+".err; true")
		if err == nil {
			evs = append(evs, parseRailEvents(x.n.Name(), out)...)
		}
	}
	return evs
}

// dataPath is true for the events of the comms that carry the transfer: the client's send
// comm and the server's recv comm (the reverse direction is idle).
func (fp *faultPair) dataPath(e railEvent) bool {
	return (e.node == fp.client.Name() && e.side == "send") || (e.node == fp.server.Name() && e.side == "recv")
}

// waitEvent polls until an event matches or the deadline passes.
func (fp *faultPair) waitEvent(ctx context.Context, deadline time.Time, match func(railEvent) bool) (railEvent, bool) {
	for {
		for _, e := range fp.events(ctx) {
			if match(e) {
				return e, true
			}
		}
		if time.Now().After(deadline) || fp.exited() {
			return railEvent{}, false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (fp *faultPair) exited() bool {
	for _, p := range []*Process{fp.srv, fp.cli} {
		select {
		case <-p.done:
			return true
		default:
		}
	}
	return false
}
