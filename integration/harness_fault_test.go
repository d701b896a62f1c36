package integration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Lab faults and their restore, for every test that breaks the lab on purpose: the limits a
// fault case's figures are held to (faultLimits), commands that cut a link or a route in a node
// stamped with the node's clock (nodeStamp, linkDownCmd, routeBack), fault scripts run from the
// router into a node's namespace with the sender's rail counters read at the same moment
// (faultCtl: black holes, tc switches, device deletion), rxe devices deleted and recreated as
// the topology made them (deleteRxe, restoreRxe), the no-rail-left error cases (runErrorCase),
// and restoreLab, which every fault test runs in a t.Cleanup: links up, no qdiscs, routes and
// rxe devices back. A failure to restore breaks later tests and is reported as LAB BROKEN.

// faultLimits are what a case's figures are checked against. The failover targets
// (faultTargets: detection 1 s, stall 1.5 s, recovery 3 s, an error where no rail is left
// within 5 s) are timing targets, and a timing target is only as good as the host it is
// measured on: the default lab suite (CI, a shared machine) checks that failover works at all,
// within bounds a broken or stuck failover cannot meet (detection and stall within 5 s,
// recovery within 10 s, an error within what detection and the case's stall limit allow:
// errorBound), and prints a `fault-target:` line for each figure over its target;
// `go run mage.go test:faults` (MPIB_FAULTS=1) checks the targets themselves.
type faultLimits struct {
	detectMS, stallMS, recoverMS, errorMS int64 // errorMS 0: errorBound derives it
	name                                  string
}

var (
	faultTargets = faultLimits{1000, 1500, 3000, 5000, "the failover targets"}
	faultBounds  = faultLimits{5000, 5000, 10000, 0, "the lab suite's bounds (MPIB_FAULTS=1 checks the targets)"}
)

// errorBound is how long after the cut a plugin error may come where no rail is left, in a
// case whose connection stalls for stallMS (its MPIB_STALL_TIMEOUT_MS; 0 where nothing stalls:
// a killed peer) before it fails. The target is errorMS whatever the stall. The error comes
// after the loss is detected and the stall limit has run out, so where detection alone may take
// detectMS (the lab bounds: 5 s on a loaded host) the bound is detectMS + stallMS + 1 s, the
// second for the expiry to be seen and the error to reach the caller on both ends.
func (l faultLimits) errorBound(stallMS int64) int64 {
	if l.errorMS > 0 {
		return l.errorMS
	}
	return l.detectMS + stallMS + 1000
}

func currentFaultLimits() faultLimits {
	if os.Getenv("MPIB_FAULTS") == "1" {
		return faultTargets
	}
	return faultBounds
}

// nodeStamp runs script (bash) in n and returns the node's clock (unix ms) read right before
// it, with bash's clock (nowUS): a `date` process would put its own exit and the shell's next
// fork between the stamp and the command, hundreds of ms in the loaded emulated VM, all of it
// counted into the times measured from the stamp.
func nodeStamp(ctx context.Context, n *Node, script string) (int64, error) {
	out, errOut, code, err := n.Exec(ctx, nil, "bash", "-c", "echo "+nowUS+"; "+script)
	if err != nil {
		return 0, err
	}
	if code != 0 {
		return 0, fmt.Errorf("%s: %s: exit %d: %s %s", n.Name(), script, code, strings.TrimSpace(errOut), strings.TrimSpace(out))
	}
	us, err := strconv.ParseInt(strings.Fields(out)[0], 10, 64)
	return us / 1000, err
}

// routeBack re-adds the node's SOUT route to the other island (a link going down drops
// routes through it) once the link is up again.
func routeBack(n *Node, r Rail) string {
	if r != SOUT {
		return ""
	}
	for _, s := range nodeSpecs {
		if s.name == n.Name() {
			cmd := ""
			for _, rt := range s.routes() {
				cmd += fmt.Sprintf("; for i in $(seq 50); do ip route replace %s via %s 2>/dev/null && break; sleep 0.1; done", rt[0], rt[1])
			}
			return cmd
		}
	}
	return ""
}

func linkDownCmd(n *Node, r Rail) string { return "ip link set dev " + n.Netdev(r) + " down" }

// restoreLab puts every fault back: links up, no qdiscs, routes, rxe devices present (with
// their GIDs). A failure here breaks later lab tests: say so loudly.
func restoreLab(t *testing.T, nodes ...*Node) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, n := range nodes {
		var script strings.Builder
		for _, r := range n.Rails() {
			d := n.Netdev(r)
			fmt.Fprintf(&script, "ip link set dev %s up; tc qdisc del dev %s root 2>/dev/null; tc qdisc del dev %s ingress 2>/dev/null%s\n",
				d, d, d, routeBack(n, r))
		}
		script.WriteString("ls /sys/class/infiniband\n")
		out, _, _, err := n.Exec(ctx, nil, "sh", "-c", script.String())
		if err != nil {
			t.Errorf("LAB BROKEN: restoring %s: %v", n.Name(), err)
			continue
		}
		for _, r := range n.Rails() {
			if !slices.Contains(strings.Fields(out), n.Dev(r)) { // whole names: a1_sup is a prefix of a1_sup2
				if err := restoreRxe(ctx, n, r); err != nil {
					fmt.Fprintf(os.Stderr, "fault: LAB BROKEN: recreating %s: %v\n", n.Dev(r), err)
					t.Errorf("LAB BROKEN: recreating %s: %v", n.Dev(r), err)
				}
			}
		}
		if err := n.waitGIDs(ctx, 30*time.Second); err != nil {
			t.Errorf("LAB BROKEN: GIDs of %s after the faults: %v", n.Name(), err)
		}
	}
}

// deleteScript (bash, no single quotes) deletes an rxe device through one `rdma -b -` that
// was started and proven ready first, so the moment of the cut (T) is the hand-over of the
// command, not a process start (hundreds of ms in the loaded emulated VM, a large part of the
// detection time being measured). The deletion waits for the processes' verbs
// contexts, so the script does not wait for it: rdma's exit status lands in rcFile.
func deleteScript(dev, rcFile string) string {
	return fmt.Sprintf(`coproc RD { stdbuf -oL rdma -b - 2>&1; echo rc=$? >%[2]s; } 2>/dev/null
echo "dev show %[1]s" >&${RD[1]}
while read -t 10 -r -u ${RD[0]} l; do [[ $l == *"%[1]s:"* ]] && break; done
echo T=%[3]s; echo "link delete %[1]s" >&${RD[1]}; echo E=%[3]s
exec {RD[1]}>&-`, dev, rcFile, nowUS)
}

// faultCtl runs fault scripts in the router, which reaches every node's network namespace
// through nsenter: one exec per step, stamped with the VM's clock, and reading a1's rail
// tx bytes (/proc/net/dev follows the network namespace) at the same moment.
type faultCtl struct {
	lab     *Topology
	pid     map[string]int
	src     *Node // whose tx bytes are read (the sender)
	netdevs map[Rail]string
}

type fcStamp struct {
	ms  int64
	tx  map[Rail]uint64
	out string // the script's own output
}

func newFaultCtl(ctx context.Context, src *Node, others ...*Node) (*faultCtl, error) {
	fc := &faultCtl{lab: src.topo, pid: map[string]int{}, src: src, netdevs: map[Rail]string{}}
	for _, n := range append([]*Node{src}, others...) {
		info, err := n.ctr.Inspect(ctx)
		if err != nil {
			return nil, err
		}
		fc.pid[n.Name()] = info.State.Pid
	}
	for _, r := range Rails {
		fc.netdevs[r] = src.Netdev(r)
	}
	return fc, nil
}

// in wraps a command to run in node n's network namespace.
// It prints T=<unix ms> right before the command (the moment of the cut: taken in the same
// shell, one process start before it) and E=<unix ms> after it (how long the command took
// to run: under load a process start in the emulated VM can take hundreds of ms).
func (fc *faultCtl) in(n *Node, cmd string) string { return fc.around(n, cmd, "") }

// around is in with a clean-up after E.
func (fc *faultCtl) around(n *Node, cmd, after string) string {
	if after != "" {
		after = "; " + after
	}
	return fmt.Sprintf("nsenter -t %d -n bash -c 'echo T=%s; %s; echo E=%s%s'", fc.pid[n.Name()], nowUS, cmd, nowUS, after)
}

// nowUS is bash's clock in microseconds, read without starting a process: under load a
// process start in the emulated VM (a `date`) takes hundreds of ms, which would widen the
// window in which a fault's moment is known.
const nowUS = "${EPOCHREALTIME/./}"

// The far-end black hole is an ingress filter whose action is switched between pass and
// drop by its index: installing the filter (and loading its modules) happens in the
// preparation, so the cut itself is one quick netlink change.
const blackholeAction = "41"

func blackholePrep(dev string) string {
	return "tc actions flush action gact 2>/dev/null; tc qdisc add dev " + dev + " ingress && tc filter add dev " + dev +
		" parent ffff: matchall action gact pass index " + blackholeAction
}

// window is the moment a fault command took effect and how uncertain it is (half the window):
// between U and W when the script marks them (it knows), else between T and E (the whole
// command, process start included).
func (x fcStamp) window() (mid, halfWidth int64) {
	from, to := x.ms, x.mark("E", true)
	if u, w := x.mark("U", false), x.mark("W", false); u != 0 && w != 0 {
		from, to = u, w
	}
	return (from + to) / 2, (to - from) / 2
}

// tcBatchReady starts one `tc -batch` as the coprocess TC (its output line-buffered: a pipe
// would hold it) and waits until it answers a query about the black hole's action.
const tcBatchReady = `coproc TC { exec stdbuf -oL tc -force -batch - 2>&1; }
echo "actions get action gact index ` + blackholeAction + `" >&${TC[1]}
while read -t 10 -r -u ${TC[0]} l; do [[ $l == *"index ` + blackholeAction + `"* ]] && break; done`

// tcSwitchScript switches the black hole's action to verdict through one `tc -batch` that
// was started and proven ready first (see glitchScript), so the switch is known to within
// tc's own turnaround (U: handed over, W: tc shows it done) instead of a process start.
func tcSwitchScript(verdict string) string {
	return tcBatchReady + fmt.Sprintf(`
echo U=%[2]s; echo "actions change action gact %[3]s index %[1]s" >&${TC[1]}
echo "actions get action gact index %[1]s" >&${TC[1]}
while read -t 10 -r -u ${TC[0]} l; do [[ $l == *"gact action %[3]s"* ]] && break; done; echo W=%[2]s
exec {TC[1]}>&-; wait`, blackholeAction, nowUS, verdict)
}

// glitchScript (bash, no single quotes: it runs inside fc.in) opens a black hole for d with
// the action of blackholePrep. Process starts take hundreds of ms in the loaded emulated VM,
// so one `tc -batch` is started first and proven ready (tcBatchReady), then drop and pass are
// written to it d apart, timed by bash's own clock and read timeouts.
func glitchScript(d time.Duration) string {
	return tcBatchReady + fmt.Sprintf(`
echo "actions change action gact drop index %[1]s" >&${TC[1]}; echo U=%[2]s
end=$(( %[2]s + %[3]d ))
while left=$(( end - %[2]s )); (( left > 0 )); do read -t $(printf "%%d.%%06d" $((left/1000000)) $((left%%1000000))) -r -u ${TC[0]} l; done
echo "actions change action gact pass index %[1]s" >&${TC[1]}; echo V=%[2]s
echo "actions get action gact index %[1]s" >&${TC[1]}
while read -t 10 -r -u ${TC[0]} l; do [[ $l == *"gact action pass"* ]] && break; done; echo W=%[2]s
exec {TC[1]}>&-; wait`, blackholeAction, nowUS, d.Microseconds())
}

// mark returns the value in ms of the first (or with last, the last) line KEY=<µs> (nowUS) of a
// script's output.
func (x fcStamp) mark(key string, last bool) int64 {
	var v int64
	for _, l := range strings.Split(x.out, "\n") {
		if s, ok := strings.CutPrefix(strings.TrimSpace(l), key+"="); ok {
			n, err := strconv.ParseInt(s, 10, 64)
			if err == nil && (v == 0 || last) {
				v = n / 1000 // nowUS
			}
		}
	}
	return v
}

// txMark returns the moment (unix ms) and the sender's tx bytes per rail of the last line
// KEY=<µs> <rail> <bytes>... that the script printed with txnow (ok false: none).
func (x fcStamp) txMark(key string) (ms int64, tx map[Rail]uint64, ok bool) {
	for _, l := range strings.Split(x.out, "\n") {
		s, found := strings.CutPrefix(strings.TrimSpace(l), key+"=")
		f := strings.Fields(s)
		if !found || len(f) != 1+2*len(Rails) {
			continue
		}
		us, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		ms, tx, ok = us/1000, map[Rail]uint64{}, true
		for i := 1; i+1 < len(f); i += 2 {
			tx[Rail(f[i])], _ = strconv.ParseUint(f[i+1], 10, 64)
		}
	}
	return ms, tx, ok
}

// split cuts a script's output at its line sep into the stamps of the commands before and
// after it, each with its own marks (both halves run fc.in, whose T and E would otherwise be
// read from the first half); the second's moment is its first T.
func (x fcStamp) split(sep string) (before, after fcStamp) {
	b, a, _ := strings.Cut(x.out, sep+"\n")
	before, after = fcStamp{ms: x.ms, tx: x.tx, out: b}, fcStamp{out: a}
	after.ms = after.mark("T", false)
	return before, after
}

// run prints the clock and the sender's tx bytes per rail, then runs script. The script may
// call `txnow KEY` to print the same at any moment, as one line KEY=<µs> SOUT <bytes> SUP
// <bytes> (read back with fcStamp.txMark).
func (fc *faultCtl) run(ctx context.Context, script string) (fcStamp, error) {
	// Only bash builtins before the script: /proc/PID/net/dev is the node's own table.
	full := fmt.Sprintf(`txnow() { local name tx l=$1=%[1]s; while read -r name _ _ _ _ _ _ _ _ tx _; do case $name in %[2]s:) l+=" %[5]s $tx";; %[3]s:) l+=" %[6]s $tx";; esac; done </proc/%[4]d/net/dev; echo "$l"; }
echo %[1]s; while read -r name _ _ _ _ _ _ _ _ tx _; do case $name in %[2]s:|%[3]s:) echo ${name%%:} $tx;; esac; done </proc/%[4]d/net/dev; echo ---; %[7]s`,
		nowUS, fc.netdevs[SOUT], fc.netdevs[SUP], fc.pid[fc.src.Name()], SOUT, SUP, script)
	out, errOut, code, err := fc.lab.router.Exec(ctx, nil, "bash", "-c", full)
	if err != nil {
		return fcStamp{}, err
	}
	if code != 0 {
		return fcStamp{}, fmt.Errorf("router: %s: exit %d: %s %s", script, code, strings.TrimSpace(errOut), strings.TrimSpace(out))
	}
	head, rest, _ := strings.Cut(out, "---\n")
	f := strings.Fields(head)
	x := fcStamp{tx: map[Rail]uint64{}, out: rest}
	if len(f) != 5 {
		return x, fmt.Errorf("router: stamp and counters: %q", head)
	}
	x.ms, _ = strconv.ParseInt(f[0], 10, 64)
	x.ms /= 1000 // nowUS
	if t := x.mark("T", false); t != 0 {
		x.ms = t
	}
	for i := 1; i+1 < len(f); i += 2 {
		v, _ := strconv.ParseUint(f[i+1], 10, 64)
		for _, r := range Rails {
			if f[i] == fc.netdevs[r] {
				x.tx[r] = v
			}
		}
	}
	return x, nil
}

// waitFile waits for a file in the router and returns its content ("" at the deadline).
func (fc *faultCtl) waitFile(ctx context.Context, path string, within time.Duration) string {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		out, _, code, err := fc.lab.router.Exec(ctx, nil, "cat", path)
		if err == nil && code == 0 {
			return strings.TrimSpace(out)
		}
		time.Sleep(time.Second)
	}
	return ""
}

type errorCase struct {
	senderMS, receiverMS int64 // plugin error relative to the cut, -1: none
	hang                 bool
	s, c                 exitInfo
}

// runErrorCase starts a transfer client -> server that ignores the side channel (only the
// plugin or the 30 s stall limit can end it), applies cut once the data rail carries traffic
// and waits up to 30 s for both to exit.
func runErrorCase(t *testing.T, server, client *Node, dataRail Rail, extraEnv []string, cut func(ctx context.Context, fp *faultPair) (int64, error)) errorCase {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fp := startFaultPair(ctx, t, server, client, faultEnv(server, "vanilla", extraEnv...), faultEnv(client, "vanilla", extraEnv...),
		"--mode", "verify", "--bytes", "1000G", "--max-size", "512K", "--timeout-s", "30", "--ignore-peer-abort")
	if err := waitRailTraffic(ctx, client, dataRail, 2<<20, fp.srv, fp.cli); err != nil {
		s, c := fp.stop(ctx, time.Now())
		t.Fatalf("no %s traffic before the cut: %v\nserver %s\nclient %s", dataRail, err, s, c)
	}
	at, err := cut(ctx, fp)
	if err != nil {
		fp.srv.Kill(context.Background())
		fp.cli.Kill(context.Background())
		t.Fatalf("cut: %v", err)
	}
	deadline := time.Now().Add(40 * time.Second)
	s, c := waitBoth(fp.srv, fp.cli, deadline, deadline)
	s.out, s.err = fp.files(server, "server")
	c.out, c.err = fp.files(client, "client")
	ec := errorCase{senderMS: firstErrorMS(c.out, at), receiverMS: firstErrorMS(s.out, at), s: s, c: c}
	ec.hang = s.hung || c.hung
	t.Logf("server %s\nclient %s", s, c)
	return ec
}

// checkErrorCase checks that the wanted sides got a plugin error within the error bound of a
// case whose connection stalls for stallMS before it fails (errorBound) and nobody hung.
func checkErrorCase(t *testing.T, name string, ec errorCase, stallMS int64, wantSender, wantReceiver bool) {
	if ec.hang {
		t.Errorf("%s: a driver still ran 40 s after the cut (killed)", name)
	}
	for _, x := range []struct {
		want bool
		ms   int64
		who  string
	}{{wantSender, ec.senderMS, "sender"}, {wantReceiver, ec.receiverMS, "receiver"}} {
		if bound := currentFaultLimits().errorBound(stallMS); x.want && (x.ms < 0 || x.ms > bound) {
			t.Errorf("%s: %s_error_ms=%d, want a plugin error within %d ms (-1: none; the stall limit or a signal ended it)", name, x.who, x.ms, bound)
		}
	}
}

// rxeScript runs a shell script on the router, which shares the engine host's PID namespace
// and created every rxe device (createRxe); $0 is the node's PID there.
func rxeScript(ctx context.Context, n *Node, script string) (*Process, error) {
	info, err := n.ctr.Inspect(ctx)
	if err != nil {
		return nil, err
	}
	return n.topo.router.Start(ctx, nil, "sh", "-c", script, strconv.Itoa(info.State.Pid))
}

// deleteRxe starts `rdma link delete` of node n's rail device in the node's namespace, timed
// inside the VM; its stdout ends with "rc=N delete_ms=N".
func deleteRxe(ctx context.Context, n *Node, r Rail) (*Process, error) {
	return rxeScript(ctx, n, fmt.Sprintf(`t0=$(date +%%s%%N); nsenter -t $0 -n rdma link delete %s; rc=$?
		t1=$(date +%%s%%N); echo "rc=$rc delete_ms=$(( (t1 - t0) / 1000000 ))"`, n.Dev(r)))
}

// restoreRxe recreates node n's rail device exactly as createRxe did (same name, netdev and
// namespace) and waits for its RoCE v2 GID, recording the new GID index.
func restoreRxe(ctx context.Context, n *Node, r Rail) error {
	script := fmt.Sprintf("set -e; mkdir -p /var/run/netns; ln -sfn /proc/$0/ns/net /var/run/netns/mpib-%s\n"+
		"nsenter -t $0 -n rdma link add %s type rxe netdev %s\n", n.Name(), n.Dev(r), n.Netdev(r))
	if n.topo.exclusive {
		script += fmt.Sprintf("nsenter -t 1 -n rdma dev set %s netns mpib-%s\n", n.Dev(r), n.Name())
	}
	p, err := rxeScript(ctx, n, script)
	if err != nil {
		return err
	}
	out, errOut, code, err := p.Wait(ctx)
	if err != nil || code != 0 {
		return fmt.Errorf("recreating %s: exit %d %v: %s %s", n.Dev(r), code, err, out, errOut)
	}
	return n.waitGIDs(ctx, 30*time.Second)
}
