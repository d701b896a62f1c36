// Package integration is the soft-RoCE lab suite. The non-test files are the harness the
// suite's tests share: Start brings up the two-island topology on the lab's Docker engine
// (see docs/lab.md for every address and device), and Node gives tests exec, background
// processes, per-rail counters and link shaping.
package integration

import (
	"fmt"
	"strings"
)

// Rail is one of a node's two RDMA rails.
type Rail string

// The two rails. SOUT is routed between islands (and carries the TCP control path); SUP
// has no route between islands. SOUT2 and SUP2 are a second fused device's rails, on a1 and
// a2 only (docs/lab.md): a SOUT2 and a SUP2 network of their own inside island A.
const (
	SOUT  Rail = "SOUT"
	SUP   Rail = "SUP"
	SOUT2 Rail = "SOUT2"
	SUP2  Rail = "SUP2"
)

// Rails lists both rails of the first fused device, in a fixed order.
var Rails = []Rail{SOUT, SUP}

// SecondDevice lists the second fused device's rails (SOUT2, SUP2), on the nodes in
// nodesWithSecondDevice.
var SecondDevice = []Rail{SOUT2, SUP2}

func (r Rail) suffix() string {
	return strings.ToLower(string(r))
}

// netSpec is one Docker bridge network: one rail of one island.
type netSpec struct {
	key    string // e.g. "sout-a"
	rail   Rail
	island string
	subnet string
	// gateway is the bridge's own address in the engine's host. It is not the router:
	// nodes get no default route, so nothing is forwarded through the engine's host.
	gateway string
}

var netSpecs = []netSpec{
	{"sout-a", SOUT, "A", "10.0.1.0/24", "10.0.1.254"},
	{"sout-b", SOUT, "B", "10.0.2.0/24", "10.0.2.254"},
	{"sup-a", SUP, "A", "10.9.1.0/24", "10.9.1.254"},
	{"sup-b", SUP, "B", "10.9.2.0/24", "10.9.2.254"},
	{"sout2-a", SOUT2, "A", "10.0.3.0/24", "10.0.3.254"},
	{"sup2-a", SUP2, "A", "10.9.3.0/24", "10.9.3.254"},
}

// nodeSpec is a compute node: one address per rail in its island.
type nodeSpec struct {
	name   string
	island string
	host   int // last octet on every rail
	rails  []Rail
}

var (
	twoDevices = []Rail{SOUT, SUP, SOUT2, SUP2}
	nodeSpecs  = []nodeSpec{
		{"a1", "A", 11, twoDevices}, {"a2", "A", 12, twoDevices},
		{"b1", "B", 11, Rails}, {"b2", "B", 12, Rails},
	}
)

// Router addresses on SOUT: the first address of each island's SOUT subnet.
const (
	routerA = "10.0.1.1"
	routerB = "10.0.2.1"
)

func islandOctet(island string) int {
	if island == "A" {
		return 1
	}
	return 2
}

// ip is the node's address on rail r.
func (s nodeSpec) ip(r Rail) string {
	switch r {
	case SOUT:
		return fmt.Sprintf("10.0.%d.%d", islandOctet(s.island), s.host)
	case SUP:
		return fmt.Sprintf("10.9.%d.%d", islandOctet(s.island), s.host)
	case SOUT2:
		return fmt.Sprintf("10.0.3.%d", s.host)
	default:
		return fmt.Sprintf("10.9.3.%d", s.host)
	}
}

func netKey(r Rail, island string) string {
	return fmt.Sprintf("%s-%s", r.suffix(), map[string]string{"A": "a", "B": "b"}[island])
}

// routes are the node's SOUT routes to the other island, through the router.
func (s nodeSpec) routes() [][2]string {
	if s.island == "A" {
		return [][2]string{{"10.0.2.0/24", routerA}}
	}
	return [][2]string{{"10.0.1.0/24", routerB}}
}
