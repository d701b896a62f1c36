package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

// Node is one container of the topology.
type Node struct {
	name   string
	topo   *Topology
	ctr    *testcontainers.DockerContainer
	ip     map[Rail]string
	dev    map[Rail]string
	netdev map[Rail]string
	gid    map[Rail]int
	rails  []Rail  // its rails: SOUT and SUP, and SOUT2 and SUP2 where it has a second device
	runner *runner // starts the node's commands (a docker exec each would cost ~1 s)
	// links are its cable ends while the mesh is up (StartMesh), with their prefixes; their
	// devices, netdevs and addresses are in the maps above like any rail's.
	links  []Rail
	prefix map[Rail]netip.Prefix
}

// Name is the node's name, e.g. "a1".
func (n *Node) Name() string { return n.name }

// Rails lists the node's rails: SOUT and SUP, then SOUT2 and SUP2 on a node with a second
// fused device.
func (n *Node) Rails() []Rail { return n.rails }

// IP is the node's IPv4 address on rail r, e.g. "10.0.1.11".
func (n *Node) IP(r Rail) string { return n.ip[r] }

// Dev is the node's rxe device on rail r, e.g. "a1_sout".
func (n *Node) Dev(r Rail) string { return n.dev[r] }

// Netdev is the network interface of rail r inside the node (found by address).
func (n *Node) Netdev(r Rail) string { return n.netdev[r] }

// GIDIndex is the index of the RoCE v2 IPv4 GID of the node's device on rail r (perftest -x).
func (n *Node) GIDIndex(r Rail) int { return n.gid[r] }

// Exec runs cmd in the node and waits for it. env holds extra "KEY=value" entries. A
// non-zero exit is reported in exitCode, not err; err is for failures to run it at all.
func (n *Node) Exec(ctx context.Context, env []string, cmd ...string) (stdout, stderr string, exitCode int, err error) {
	p, err := n.Start(ctx, env, cmd...)
	if err != nil {
		return "", "", -1, err
	}
	return p.Wait(ctx)
}

// Process is a command running in a node.
type Process struct {
	node   *Node
	tag    string
	cmd    []string // as the caller gave it
	argv   []string // what the runner starts: cmd wrapped to record its PID
	done   chan struct{}
	stdout bytes.Buffer
	stderr bytes.Buffer
	code   int
	err    error
}

var procSeq atomic.Uint64

// Start runs cmd in the node in the background, through the node's command runner. Its
// output is collected until it exits; Wait returns it. The process records its PID in the
// node so that Kill can reach it.
func (n *Node) Start(ctx context.Context, env []string, cmd ...string) (*Process, error) {
	if len(cmd) == 0 {
		return nil, fmt.Errorf("%s: empty command", n.name)
	}
	p := &Process{node: n, tag: strconv.FormatUint(procSeq.Add(1), 10), cmd: cmd, done: make(chan struct{}), code: -1}
	p.argv = append([]string{"sh", "-c", `echo $$ >"/tmp/.mpib-proc-$0"; exec "$@"`, p.tag}, cmd...)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: exec %s: %w", n.name, strings.Join(cmd, " "), err)
	}
	if err := n.runner.start(p, env); err != nil {
		return nil, fmt.Errorf("%s: exec %s: %w", n.name, strings.Join(cmd, " "), err)
	}
	return p, nil
}

// Wait waits for the process to exit (or ctx to end) and returns its output and exit code.
func (p *Process) Wait(ctx context.Context) (stdout, stderr string, exitCode int, err error) {
	select {
	case <-p.done:
		return p.stdout.String(), p.stderr.String(), p.code, p.err
	case <-ctx.Done():
		return "", "", -1, fmt.Errorf("%s: waiting for process: %w", p.node.name, ctx.Err())
	}
}

// Kill sends SIGKILL to the process and its children and waits for it to exit.
func (p *Process) Kill(ctx context.Context) error {
	script := `p=$(cat "/tmp/.mpib-proc-$0" 2>/dev/null) || exit 0; pkill -KILL -P "$p"; kill -KILL "$p" 2>/dev/null; true`
	if _, _, _, err := p.node.Exec(ctx, nil, "sh", "-c", script, p.tag); err != nil {
		return err
	}
	_, _, _, err := p.Wait(ctx)
	return err
}

// Counters are a rail's traffic counters in a node. The byte counts come from the rail
// netdev's statistics (every RoCE v2 packet, plus any IP traffic on that rail); the packet
// counts from the rxe device's hw_counters (RDMA only).
type Counters struct {
	TxBytes, RxBytes uint64
	RdmaTxPkts       uint64 // hw_counters/sent_pkts
	RdmaRxPkts       uint64 // hw_counters/rcvd_pkts
	TxPkts, RxPkts   uint64 // the netdev's packets (forwarded ones too)
}

// Sub returns c - before.
func (c Counters) Sub(before Counters) Counters {
	return Counters{c.TxBytes - before.TxBytes, c.RxBytes - before.RxBytes,
		c.RdmaTxPkts - before.RdmaTxPkts, c.RdmaRxPkts - before.RdmaRxPkts,
		c.TxPkts - before.TxPkts, c.RxPkts - before.RxPkts}
}

// Counters reads rail r's counters in the node.
func (n *Node) Counters(ctx context.Context, r Rail) (Counters, error) {
	c, err := n.RailCounters(ctx, r)
	return c[r], err
}

// RailCounters reads the counters of every rail given in one exec (one `cat`: an exec costs
// hundreds of ms under TCG, and a mesh node has up to four rails).
func (n *Node) RailCounters(ctx context.Context, rails ...Rail) (map[Rail]Counters, error) {
	args := []string{"cat"}
	for _, r := range rails {
		nd, hw := "/sys/class/net/"+n.netdev[r]+"/statistics/", "/sys/class/infiniband/"+n.dev[r]+"/ports/1/hw_counters/"
		args = append(args, nd+"tx_bytes", nd+"rx_bytes", hw+"sent_pkts", hw+"rcvd_pkts", nd+"tx_packets", nd+"rx_packets")
	}
	out, err := n.output(ctx, args...)
	if err != nil {
		return nil, err
	}
	f := strings.Fields(out)
	if len(f) != 6*len(rails) {
		return nil, fmt.Errorf("%s: counters of %v: %q", n.name, rails, out)
	}
	cs := map[Rail]Counters{}
	for i, r := range rails {
		var v [6]uint64
		for j := range v {
			if v[j], err = strconv.ParseUint(f[6*i+j], 10, 64); err != nil {
				return nil, fmt.Errorf("%s: counters of %s: %w", n.name, r, err)
			}
		}
		cs[r] = Counters{v[0], v[1], v[2], v[3], v[4], v[5]}
	}
	return cs, nil
}

// waitGIDs waits for the RoCE v2 IPv4-mapped GID of every rail's device and records their
// indexes (one exec: execs are slow under TCG).
func (n *Node) waitGIDs(ctx context.Context, timeout time.Duration) error {
	return n.waitRailGIDs(ctx, timeout, n.rails)
}

// waitRailGIDs is waitGIDs for the given rails.
func (n *Node) waitRailGIDs(ctx context.Context, timeout time.Duration, rails []Rail) error {
	// bash built-ins only, in index order: a `cat` per table entry, in ls's order (0, 1, 10,
	// 100, 1000, ...), started hundreds of processes under TCG before it reached index 3 of an
	// rxe device's 1024-entry table.
	script := `exec {pause}<> <(:); end=$(( ${EPOCHSECONDS} + $0 ))
	for dev in "$@"; do
		d=/sys/class/infiniband/$dev/ports/1; found=
		while :; do
			for ((i = 0; ; i++)); do
				[[ -e $d/gids/$i ]] || break
				g=; t=; { read -r g < $d/gids/$i; read -r t < $d/gid_attrs/types/$i; } 2>/dev/null
				[[ $g == 0000:0000:0000:0000:0000:ffff:* && $t == "RoCE v2" ]] && { found=$i; break; }
			done
			[[ -n $found ]] && break
			(( EPOCHSECONDS < end )) || { echo "no RoCE v2 IPv4 GID on $dev" >&2; exit 1; }
			read -t 0.2 -u $pause
		done
		echo $found
	done`
	args := []string{"bash", "-c", script, strconv.Itoa(int(timeout.Seconds()))}
	for _, r := range rails {
		args = append(args, n.dev[r])
	}
	out, err := n.output(ctx, args...)
	if err != nil {
		return err
	}
	f := strings.Fields(out)
	if len(f) != len(rails) {
		return fmt.Errorf("%s: GID indexes: %q", n.name, out)
	}
	for i, r := range rails {
		if n.gid[r], err = strconv.Atoi(f[i]); err != nil {
			return fmt.Errorf("%s: GID index of %s: %w", n.name, n.dev[r], err)
		}
	}
	return nil
}

// run runs a command that must succeed.
func (n *Node) run(ctx context.Context, cmd ...string) error {
	_, err := n.output(ctx, cmd...)
	return err
}

// output runs a command that must succeed and returns its stdout.
func (n *Node) output(ctx context.Context, cmd ...string) (string, error) {
	stdout, stderr, code, err := n.Exec(ctx, nil, cmd...)
	if err != nil {
		return "", err
	}
	if code != 0 {
		return "", fmt.Errorf("%s: %s: exit %d: %s", n.name, strings.Join(cmd, " "), code, strings.TrimSpace(stderr+" "+stdout))
	}
	return stdout, nil
}
