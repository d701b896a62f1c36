package integration

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"
)

// The lab's SUP mesh (docs/lab.md "Mesh"): point-to-point cables, each its own
// subnet, between island A's a1, a2 and a3 (a full mesh, with a second a2-a3 cable whose /29
// shares a /24 with a1-a3) and around island B's ring b1-b2-b3-b4, with routes b1<->b3 via b2
// and b2<->b4 via b3 and forwarding on b2 and b3. Only the mesh tests use it, so StartMesh
// adds it to the running topology and Close takes it away again; the other tests never see
// its devices.
//
// a3, b3 and b4 are not containers: each is a network namespace the router makes, its command
// runner started by `ip netns exec` in the router container (same image, build directory and
// /dev/infiniband; `ip netns exec` mounts a sysfs of the namespace, so a process there sees
// only its own netdevs and, in exclusive RDMA netns mode, its own rxe devices). A container
// costs seconds under the lab's emulated CPUs; a namespace costs milliseconds. Their SOUT is a
// veth into the island's SOUT Docker bridge, with an address Docker never hands out (.13, .14).
// Cables are veth pairs with no bridge: one rxe per cable end, named <node>_sup_<peer>.

// meshNodeSpec is a node only the mesh has.
type meshNodeSpec struct {
	name, island string
	host         int // last octet of its SOUT address
}

var meshNodeSpecs = []meshNodeSpec{{"a3", "A", 13}, {"b3", "B", 13}, {"b4", "B", 14}}

// soutAddr is the node's SOUT address, numbered as the containers' (nodeSpec.ip).
func (ms meshNodeSpec) soutAddr() string { return nodeSpec{island: ms.island, host: ms.host}.ip(SOUT) }

// soutMAC is the MAC of the node's SOUT port, derived from its address as Docker derives a
// container's (02:42:<address>; here 02:4d): each mesh makes the node anew, and a neighbour
// entry the containers and the router kept from the previous mesh must still name it. With a
// new MAC each time, a STALE entry naming the old one kept a2's TCP connect to a3 failing for
// 30 s.
func (ms meshNodeSpec) soutMAC() string {
	return fmt.Sprintf("02:4d:0a:00:%02x:%02x", islandOctet(ms.island), ms.host)
}

// meshLinkSpec is one cable: its two ends and their addresses with the cable's prefix.
// parallel marks a second cable between the same two nodes (its rails end in "P").
type meshLinkSpec struct {
	a, b         string
	aAddr, bAddr string
	parallel     bool
}

var meshLinkSpecs = []meshLinkSpec{
	{"a1", "a3", "10.9.13.1/29", "10.9.13.2/29", false},
	{"a2", "a3", "10.9.23.2/24", "10.9.23.3/24", false},
	{"a2", "a3", "10.9.13.9/29", "10.9.13.10/29", true},
	{"b1", "b2", "10.9.112.1/24", "10.9.112.2/24", false},
	{"b2", "b3", "10.9.123.2/24", "10.9.123.3/24", false},
	{"b3", "b4", "10.9.134.3/24", "10.9.134.4/24", false},
	{"b4", "b1", "10.9.141.4/24", "10.9.141.1/24", false},
}

// meshRoutes are the relay fabric's routes, present in every mesh run (relay off too: a route
// alone must never enable SUP): b1<->b3 through b2, b2<->b4 through b3. b2 and b3 forward.
var meshRoutes = map[string][][2]string{
	"b1": {{"10.9.123.0/24", "10.9.112.2"}},
	"b3": {{"10.9.112.0/24", "10.9.123.2"}},
	"b2": {{"10.9.134.0/24", "10.9.123.3"}},
	"b4": {{"10.9.123.0/24", "10.9.134.3"}},
}

var meshForwarders = []string{"b2", "b3"}

// LinkRail is the rail of a node's end of its cable to peer: "SUP_A3", or "SUP_A3P" for the
// parallel cable. Its device is <node>_sup_a3, its netdev sup_a3.
func LinkRail(peer string, parallel bool) Rail {
	r := "SUP_" + strings.ToUpper(peer)
	if parallel {
		r += "P"
	}
	return Rail(r)
}

// Mesh is the mesh added to a running topology.
type Mesh struct {
	topo   *Topology
	nodes  map[string]*Node
	light  []*Node // the namespace nodes (a3, b3, b4)
	ready  time.Duration
	phases []string // each StartMesh step's seconds, for the log
}

// Node is a node of the mesh: a1, a2, b1, b2 (the topology's) or a3, b3, b4.
func (m *Mesh) Node(name string) *Node { return m.nodes[name] }

// Ready is how long StartMesh took, and its steps' seconds.
func (m *Mesh) Ready() (time.Duration, string) { return m.ready, strings.Join(m.phases, ", ") }

// Links lists a node's cable ends, in meshLinkSpecs order.
func (n *Node) Links() []Rail { return n.links }

// LinkAddr is the node's address on rail r with its prefix (a cable's real /29 or /24).
func (n *Node) LinkAddr(r Rail) netip.Prefix { return n.prefix[r] }

// StartMesh adds the mesh to the topology: the namespace nodes, the cables, their rxe
// devices, the routes and forwarding. On an error what was made is removed again.
func (t *Topology) StartMesh(ctx context.Context) (*Mesh, error) {
	start := time.Now()
	m := &Mesh{topo: t, nodes: map[string]*Node{}}
	for _, name := range []string{"a1", "a2", "b1", "b2"} {
		m.nodes[name] = t.nodes[name]
	}
	for _, step := range []struct {
		name string
		fn   func(context.Context) error
	}{{"namespaces", m.makeNamespaces}, {"runners", m.startLightRunners}, {"cables", m.addLinks}, {"gids", m.waitGIDs}} {
		t0 := time.Now()
		if err := step.fn(ctx); err != nil {
			_ = m.Close(context.WithoutCancel(ctx))
			return nil, err
		}
		m.phases = append(m.phases, fmt.Sprintf("%s %.1f", step.name, time.Since(t0).Seconds()))
	}
	m.ready = time.Since(start)
	return m, nil
}

func nsExec(node string) string { return "nsenter --net=/var/run/netns/mpib-" + node + " " }

// makeNamespaces makes a3, b3 and b4 with their SOUT ports, bridged into the island's SOUT
// network, and their rxe devices (one script in the router).
func (m *Mesh) makeNamespaces(ctx context.Context) error {
	var s strings.Builder
	s.WriteString("set -e; mkdir -p /var/run/netns\n")
	for _, ms := range meshNodeSpecs {
		bridge := "br-" + m.topo.nets[netKey(SOUT, ms.island)].ID[:12]
		host := "mpib-" + ms.name + "-s" // the veth end in the engine host's namespace
		sout := ms.soutAddr()
		other := map[string]string{"A": "10.0.2.0/24 via " + routerA, "B": "10.0.1.0/24 via " + routerB}[ms.island]
		fmt.Fprintf(&s, "ip netns add mpib-%s; ip -n mpib-%[1]s link set lo up\n", ms.name)
		fmt.Fprintf(&s, "nsenter -t 1 -n ip link add %s type veth peer name sout address %s netns mpib-%s\n", host, ms.soutMAC(), ms.name)
		fmt.Fprintf(&s, "nsenter -t 1 -n ip link set %s master %s up\n", host, bridge)
		fmt.Fprintf(&s, "ip -n mpib-%[1]s addr add %[2]s/24 dev sout; ip -n mpib-%[1]s link set sout up; ip -n mpib-%[1]s route add %[3]s\n", ms.name, sout, other)
		m.rxe(&s, ms.name, ms.name+"_sout", "sout")
	}
	if err := m.topo.router.run(ctx, "sh", "-c", s.String()); err != nil {
		return fmt.Errorf("mesh nodes: %w", err)
	}
	return nil
}

// rxe adds the script lines that make rxe device dev on a netdev of the node's namespace (in
// exclusive mode it is made in the initial namespace and moved, as createRxe does).
func (m *Mesh) rxe(s *strings.Builder, node, dev, netdev string) {
	fmt.Fprintf(s, "%srdma link add %s type rxe netdev %s\n", nsExec(node), dev, netdev)
	if m.topo.exclusive {
		fmt.Fprintf(s, "nsenter -t 1 -n rdma dev set %s netns mpib-%s\n", dev, node)
	}
}

// startLightRunners starts a command runner in each namespace node (at once: each is a docker
// exec and a Python start, seconds under TCG) and describes its SOUT.
func (m *Mesh) startLightRunners(ctx context.Context) error {
	nodes := make([]*Node, len(meshNodeSpecs))
	err := forEach(len(meshNodeSpecs), func(i int) error {
		ms := meshNodeSpecs[i]
		r, err := startRunner(ctx, m.topo.cli.Client, ms.name, m.topo.router.ctr.GetContainerID(), "ip", "netns", "exec", "mpib-"+ms.name)
		if err != nil {
			return err
		}
		nodes[i] = &Node{name: ms.name, topo: m.topo, runner: r, rails: []Rail{SOUT},
			ip:  map[Rail]string{SOUT: ms.soutAddr()},
			dev: map[Rail]string{SOUT: ms.name + "_sout"}, netdev: map[Rail]string{SOUT: "sout"}, gid: map[Rail]int{}}
		return nil
	})
	for _, n := range nodes {
		if n != nil {
			m.nodes[n.name], m.light = n, append(m.light, n)
		}
	}
	return err
}

// addLinks makes the cables, their rxe devices, the routes and forwarding, and records each
// end on its node.
func (m *Mesh) addLinks(ctx context.Context) error {
	var s strings.Builder
	s.WriteString("set -e\n")
	for _, l := range meshLinkSpecs {
		ra, rb := LinkRail(l.b, l.parallel), LinkRail(l.a, l.parallel)
		na, nb := m.nodes[l.a].addLink(ra, l.aAddr), m.nodes[l.b].addLink(rb, l.bAddr)
		fmt.Fprintf(&s, "ip link add %s netns mpib-%s type veth peer name %s netns mpib-%s\n", na.netdev[ra], l.a, nb.netdev[rb], l.b)
		for _, end := range []struct {
			n    *Node
			r    Rail
			addr string
		}{{na, ra, l.aAddr}, {nb, rb, l.bAddr}} {
			fmt.Fprintf(&s, "ip -n mpib-%s addr add %s dev %s; ip -n mpib-%[1]s link set %[3]s up\n", end.n.name, end.addr, end.n.netdev[end.r])
			m.rxe(&s, end.n.name, end.n.dev[end.r], end.n.netdev[end.r])
		}
	}
	for node, routes := range meshRoutes {
		for _, rt := range routes {
			fmt.Fprintf(&s, "ip -n mpib-%s route add %s via %s\n", node, rt[0], rt[1])
		}
	}
	for _, node := range meshForwarders {
		fmt.Fprintf(&s, "ip netns exec mpib-%s sysctl -qw net.ipv4.ip_forward=1\n", node)
	}
	if err := m.topo.router.run(ctx, "sh", "-c", s.String()); err != nil {
		return fmt.Errorf("mesh cables: %w", err)
	}
	return nil
}

// lineRoutes turn the ring into a line (b4-b1 down): b1 reaches b4 through b2 and b3, and back.
var lineRoutes = map[string][2]string{"b1": {"10.9.134.0/24", "10.9.112.2"}, "b4": {"10.9.112.0/24", "10.9.134.3"}}

// SetLine takes the ring's b4-b1 cable down and routes b1<->b4 through b2 and b3 (on), or
// puts the ring back (off).
func (m *Mesh) SetLine(ctx context.Context, on bool) error {
	state, verb := "down", "add"
	if !on {
		state, verb = "up", "del"
	}
	var s strings.Builder
	for _, end := range [][2]string{{"b1", "b4"}, {"b4", "b1"}} {
		fmt.Fprintf(&s, "ip -n mpib-%s link set %s %s\n", end[0], LinkRail(end[1], false).suffix(), state)
	}
	for node, rt := range lineRoutes {
		fmt.Fprintf(&s, "ip -n mpib-%s route %s %s via %s\n", node, verb, rt[0], rt[1])
	}
	return m.topo.router.run(ctx, "sh", "-c", s.String())
}

// addLink records a cable end on the node (its rail's device, netdev and address).
func (n *Node) addLink(r Rail, addr string) *Node {
	p := netip.MustParsePrefix(addr)
	if n.prefix == nil {
		n.prefix = map[Rail]netip.Prefix{}
	}
	n.links = append(n.links, r)
	n.ip[r], n.prefix[r] = p.Addr().String(), p
	n.dev[r], n.netdev[r] = n.name+"_"+r.suffix(), r.suffix()
	return n
}

// waitGIDs waits for every new device's RoCE v2 IPv4 GID.
func (m *Mesh) waitGIDs(ctx context.Context) error {
	var nodes []*Node
	for _, n := range m.nodes {
		nodes = append(nodes, n)
	}
	return forEach(len(nodes), func(i int) error {
		n := nodes[i]
		rails := append([]Rail(nil), n.links...)
		if n.ctr == nil {
			rails = append(rails, SOUT)
		}
		return n.waitRailGIDs(ctx, 30*time.Second, rails)
	})
}

// Close removes the mesh: the cables (their rxe devices go with their netdevs, and the routes
// through them), forwarding on b2, the namespace nodes. Best effort, every step tried.
func (m *Mesh) Close(ctx context.Context) error {
	var s strings.Builder
	for _, l := range meshLinkSpecs {
		n := m.nodes[l.a]
		r := LinkRail(l.b, l.parallel)
		fmt.Fprintf(&s, "%srdma link delete %s_%s 2>/dev/null; ip -n mpib-%s link del %s 2>/dev/null\n", nsExec(l.a), l.a, r.suffix(), l.a, r.suffix())
		if n != nil {
			n.dropLink(r)
		}
		if peer := m.nodes[l.b]; peer != nil {
			peer.dropLink(LinkRail(l.a, l.parallel))
		}
	}
	for _, node := range meshForwarders {
		fmt.Fprintf(&s, "ip netns exec mpib-%s sysctl -qw net.ipv4.ip_forward=0 2>/dev/null\n", node)
	}
	for _, n := range m.light {
		n.runner.close()
	}
	for _, ms := range meshNodeSpecs {
		fmt.Fprintf(&s, "%srdma link delete %s_sout 2>/dev/null; ip netns del mpib-%s 2>/dev/null\n", nsExec(ms.name), ms.name, ms.name)
	}
	s.WriteString("true\n")
	err := m.topo.router.run(ctx, "sh", "-c", s.String())
	if err != nil {
		fmt.Fprintf(os.Stderr, "lab: mesh teardown: %v\n", err)
	}
	return err
}

// dropLink forgets a cable end.
func (n *Node) dropLink(r Rail) {
	for i, l := range n.links {
		if l == r {
			n.links = append(n.links[:i], n.links[i+1:]...)
			break
		}
	}
	delete(n.ip, r)
	delete(n.dev, r)
	delete(n.netdev, r)
	delete(n.gid, r)
	delete(n.prefix, r)
}
