package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDoctor runs `mpib-agent doctor` (agent/go/doctor, docs/deploying.md "Before the first
// job") on the lab's nodes: healthy on one node, healthy between two nodes of one island and
// of two islands with a short traffic test per rail through mpib-nettest, then with each
// problem injected, each put back by its subtest's cleanup. It prints
//
//	doctor: case=healthy problems=0 exit=0
//	doctor: pair=a1-a2 device=0 rail=SUP ... reachable=true mbps=...
//	doctor: case=NAME found=true exit=1
//
// The agent must be built (go run mage.go build): the nodes run /opt/mpib/mpib-agent.
func TestDoctor(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2, b1 := lab.Node("a1"), lab.Node("a2"), lab.Node("b1")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	defer func() { evidence("doctor:", "lab_seconds=%.1f", time.Since(start).Seconds()) }()

	t.Run("healthy", func(t *testing.T) {
		code, out := doctorOn(ctx, t, a1, doctorEnv(a1))
		evidence("doctor:", "case=healthy problems=%d exit=%d", strings.Count(out, "doctor: problem="), code)
		if code != 0 {
			t.Errorf("a healthy node: exit %d\n%s", code, out)
		}
	})
	t.Run("healthy-pair", func(t *testing.T) {
		for _, peer := range []*Node{a2, b1} {
			res := doctorPair(ctx, t, a1, peer, doctorEnv(a1), doctorEnv(peer), 1)
			printLines(res.listenOut, "doctor: pair=")
			if res.listenCode != 0 || res.peerCode != 0 {
				t.Errorf("healthy pair a1-%s: exit %d/%d\n%s", peer.Name(), res.listenCode, res.peerCode, res)
			}
			rails := map[*Node][]string{a2: {"SOUT", "SUP"}, b1: {"SOUT"}}[peer]
			for _, rail := range rails {
				if !strings.Contains(res.listenOut, " rail="+rail+" ") || !hasPairLine(res.listenOut, rail, "reachable=true") {
					t.Errorf("pair a1-%s: rail %s not reachable=true\n%s", peer.Name(), rail, res)
				}
			}
		}
	})
	doctorFaults(ctx, t, a1, a2, b1)
}

// doctorFaults injects one problem per subtest and puts it back in the subtest's cleanup.
func doctorFaults(ctx context.Context, t *testing.T, a1, a2, b1 *Node) {
	t.Run("port-down", func(t *testing.T) {
		dev := a1.Netdev(SUP)
		t.Cleanup(func() { doctorRestore(t, a1, "ip link set dev "+dev+" up", true) })
		mustRun(ctx, t, a1, "ip link set dev "+dev+" down")
		code, out := doctorOn(ctx, t, a1, doctorEnv(a1))
		doctorCase(t, "port-down", code, out, "problem=port-down device=0 rail=SUP")
	})
	t.Run("no-device", func(t *testing.T) {
		code, out := doctorOn(ctx, t, a1, doctorEnv(a1, "MPIB_HCA_SUP=nosuch"))
		doctorCase(t, "no-device", code, out, "problem=no-device device=0 rail=SUP port=nosuch:1")
	})
	t.Run("gid", func(t *testing.T) {
		idx := notRoCEv2IPv4Index(ctx, t, a1, SUP)
		code, out := doctorOn(ctx, t, a1, doctorEnv(a1, "MPIB_GID_INDEX_SUP="+strconv.Itoa(idx)))
		doctorCase(t, "gid", code, out, "problem=gid device=0 rail=SUP port="+a1.Dev(SUP)+":1 index="+strconv.Itoa(idx))
	})
	t.Run("mtu", func(t *testing.T) {
		dev := a2.Netdev(SUP)
		mtu := strings.TrimSpace(mustRun(ctx, t, a2, "cat /sys/class/net/"+dev+"/mtu"))
		t.Cleanup(func() { doctorRestore(t, a2, "ip link set dev "+dev+" mtu "+mtu, false) })
		mustRun(ctx, t, a2, "ip link set dev "+dev+" mtu 1000") // 512-byte IB MTU against 1024 at 1500
		res := doctorPair(ctx, t, a1, a2, doctorEnv(a1), doctorEnv(a2), 0)
		doctorCase(t, "mtu", res.listenCode, res.listenOut, "problem=mtu device=0 rail=SUP")
		doctorCase(t, "mtu-peer-side", res.peerCode, res.peerOut, "problem=mtu device=0 rail=SUP")
	})
	t.Run("no-route", func(t *testing.T) {
		dev, ip := a2.Netdev(SUP), a2.IP(SUP)
		subnet := ip[:strings.LastIndex(ip, ".")] + ".0/24"
		t.Cleanup(func() {
			doctorRestore(t, a2, "ip route replace "+subnet+" dev "+dev+" proto kernel scope link src "+ip, false)
		})
		mustRun(ctx, t, a2, "ip route del "+subnet+" dev "+dev)
		// RoCE resolves a peer from the port's own netdev: without a route there the kernel
		// sends on-link, and a policy-routing table the doctor cannot see may hold one. So a
		// missing route is not a problem; the traffic test, when there is one, decides.
		res := doctorPair(ctx, t, a1, a2, doctorEnv(a1), doctorEnv(a2), 0)
		flagged := strings.Contains(res.listenOut+res.peerOut, "problem=no-route")
		evidence("doctor:", "case=no-route-on-link flagged=%t exit=%d", flagged, res.peerCode)
		if flagged {
			t.Errorf("a SUP netdev without its subnet's route was called a problem\n%s", res)
		}
	})
	t.Run("island", func(t *testing.T) {
		res := doctorPair(ctx, t, a1, b1, doctorEnv(a1, "MPIB_ISLAND_PREFIX_LEN=8"), doctorEnv(b1, "MPIB_ISLAND_PREFIX_LEN=8"), 0)
		doctorCase(t, "island", res.listenCode, res.listenOut, "problem=island device=0 rail=SUP island_prefix_len=8")
		if !strings.Contains(res.listenOut, "set MPIB_ISLAND_PREFIX_LEN=23 or longer") {
			t.Errorf("the island problem does not name the prefix that splits a1 and b1\n%s", res)
		}
	})
}

const doctorAgent = NodeBuildDir + "/mpib-agent"

// doctorEnv is the job's configuration on one node (its first fused device), plus overrides
// (the node's runner applies them in order, the last value of a key winning).
func doctorEnv(n *Node, extra ...string) []string {
	return append(railEnv(n, ownHCAs(n)), extra...)
}

// doctorOn runs the doctor on one node and returns its exit status and output.
func doctorOn(ctx context.Context, t *testing.T, n *Node, env []string, args ...string) (int, string) {
	t.Helper()
	out, errOut, code, err := n.Exec(ctx, env, append([]string{doctorAgent, "doctor"}, args...)...)
	if err != nil {
		t.Fatalf("%s: doctor: %v", n.Name(), err)
	}
	if code == 126 || code == 127 {
		t.Fatalf("%s: %s did not run (exit %d; build it: go run mage.go build): %s", n.Name(), doctorAgent, code, errOut)
	}
	return code, out + errOut
}

type doctorPairResult struct {
	listenCode, peerCode int
	listenOut, peerOut   string
}

func (r doctorPairResult) String() string {
	return fmt.Sprintf("--- listener exit %d\n%s--- peer exit %d\n%s", r.listenCode, r.listenOut, r.peerCode, r.peerOut)
}

// doctorPair runs the doctor on two nodes: --listen on the first's SOUT address, --peer on
// the second, bw seconds of traffic per rail. The doctor's port and the next three (the
// traffic tests' side channels) are reserved like nettest's.
func doctorPair(ctx context.Context, t *testing.T, listener, peer *Node, lenv, penv []string, bw int) doctorPairResult {
	t.Helper()
	addr := listener.IP(SOUT) + ":" + strconv.Itoa(oobPorts([]string{"--parallel", "4"}))
	common := []string{"--wait", "60s", "--bw-seconds", strconv.Itoa(bw)}
	lp, err := listener.Start(ctx, lenv, append([]string{doctorAgent, "doctor", "--listen", addr}, common...)...)
	if err != nil {
		t.Fatal(err)
	}
	var r doctorPairResult
	r.peerCode, r.peerOut = doctorOn(ctx, t, peer, penv, append([]string{"--peer", addr}, common...)...)
	out, errOut, code, err := lp.Wait(ctx)
	if err != nil {
		lp.Kill(context.Background())
		t.Fatalf("%s: doctor --listen: %v\n%s", listener.Name(), err, r)
	}
	r.listenCode, r.listenOut = code, out+errOut
	return r
}

// doctorCase prints and checks one injected problem: exit 1 with the problem's line.
func doctorCase(t *testing.T, name string, code int, out, want string) {
	t.Helper()
	found := strings.Contains(out, "doctor: "+want)
	evidence("doctor:", "case=%s found=%t exit=%d", name, found, code)
	if !found || code != 1 {
		t.Errorf("case %s: exit %d, want 1 with a line containing %q\n%s", name, code, want, out)
	}
}

func hasPairLine(out, rail, field string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "doctor: pair=") && strings.Contains(l, " rail="+rail+" ") && strings.Contains(l, " "+field+" ") {
			return true
		}
	}
	return false
}

func printLines(out, prefix string) {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			fmt.Println(l)
		}
	}
}

func mustRun(ctx context.Context, t *testing.T, n *Node, script string) string {
	t.Helper()
	out, err := n.output(ctx, "sh", "-c", script)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// doctorRestore puts a change back; a failure would break later lab tests, so it says so.
// waitGIDs: a link that went down and up gets its GIDs back before the next test runs.
func doctorRestore(t *testing.T, n *Node, script string, waitGIDs bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := n.output(ctx, "sh", "-c", script); err != nil {
		t.Errorf("LAB BROKEN: restoring %s (%s): %v", n.Name(), script, err)
		return
	}
	if waitGIDs {
		if err := n.waitGIDs(ctx, 30*time.Second); err != nil {
			t.Errorf("LAB BROKEN: GIDs of %s: %v", n.Name(), err)
		}
	}
}

// notRoCEv2IPv4Index is a GID index of the node's device on rail r that holds no IPv4 RoCE v2
// GID: the link-local (fe80::) default GID, else an IPv4 RoCE v1 one.
func notRoCEv2IPv4Index(ctx context.Context, t *testing.T, n *Node, r Rail) int {
	t.Helper()
	script := `d=/sys/class/infiniband/$0/ports/1; v1=
	for ((i = 0; i < 64; i++)); do
		[[ -e $d/gids/$i ]] || break
		g=; t=; { read -r g < $d/gids/$i; read -r t < $d/gid_attrs/types/$i; } 2>/dev/null
		[[ $g == fe80:* && -n $t ]] && { echo $i; exit 0; }
		[[ -z $v1 && $g == 0000:0000:0000:0000:0000:ffff:* && $t == "IB/RoCE v1" ]] && v1=$i
	done
	[[ -n $v1 ]] && { echo $v1; exit 0; }
	echo "no link-local or RoCE v1 GID on $0" >&2; exit 1`
	out, err := n.output(ctx, "bash", "-c", script, n.Dev(r))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("%s: GID index %q", n.Name(), out)
	}
	return idx
}
