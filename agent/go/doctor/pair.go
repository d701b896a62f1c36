package doctor

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/mpib/mpib/plugin/rules"
)

// PairRail is one rail of one device between two nodes: how a connection between them would
// use it, whether the two ends agree, and (after the traffic test) whether data crossed it.
type PairRail struct {
	Pair      string  `json:"pair"` // "A-B": the listener's node, then the peer's
	Device    int     `json:"device"`
	Rail      string  `json:"rail"`
	Class     string  `json:"class"` // intra-island, inter-island or unknown
	Used      bool    `json:"used"`  // the configured mode carries data on the rail between the two
	Path      string  `json:"path"`  // direct, routed or none
	MTU       [2]int  `json:"mtu"`   // A's and B's active MTU (0 unknown)
	SpeedMbps int     `json:"speed_mbps"`
	Reachable string  `json:"reachable"` // true, false or unknown
	Why       string  `json:"why,omitempty"`
	Mbps      float64 `json:"mbps"` // -1 not measured
	// test says whether the traffic test runs on this rail (both ends fit and the rail is used
	// or, for SOUT, always there); nettest.go reads it.
	test bool
}

// ComparePair checks what needs both ends: a is the listener's report, b the peer's, and
// both nodes call it in that order so that they print the same verdicts. Device i of one node
// is checked against device i of the other (NCCL's rail-aligned pairing).
func ComparePair(a, b Report) ([]PairRail, []Problem) {
	if a.Config != "" || b.Config != "" {
		return nil, nil
	}
	c := &pairCheck{a: a, b: b, name: a.Node + "-" + b.Node}
	c.settings()
	n := min(len(a.Devices), len(b.Devices))
	if len(a.Devices) != len(b.Devices) {
		c.problem(Problem{Kind: KindDevices, Device: -1, Facts: []string{c.both("devices", len(a.Devices), len(b.Devices))},
			Want: "the same number of fused devices on both nodes",
			Fix:  "give every node MPIB_HCA_SOUT and MPIB_HCA_SUP lists of one length"})
	}
	c.class = "unknown"
	if cl, err := rules.Classify(a.OOB.Addr, b.OOB.Addr, a.IslandPrefixLen); err == nil {
		c.class, c.known, c.pathClass = cl.String(), true, cl
	}
	for d := range n {
		c.sout(d)
		c.sup(d)
	}
	return c.rails, c.problems
}

type pairCheck struct {
	a, b      Report
	name      string
	class     string
	known     bool
	pathClass rules.PathClass
	rails     []PairRail
	problems  []Problem
}

func (c *pairCheck) problem(p Problem) { c.problems = append(c.problems, p) }

// both prints a fact of both nodes, "key=A/B".
func (c *pairCheck) both(key string, a, b any) string { return fmt.Sprintf("%s=%v/%v", key, a, b) }

// settings: the two nodes must classify and split alike.
func (c *pairCheck) settings() {
	sa, sb := c.a.Settings, c.b.Settings
	if sa == sb {
		return
	}
	c.problem(Problem{Kind: KindSettings, Device: -1, Facts: []string{c.both("mode", sa.Mode, sb.Mode),
		c.both("island_prefix_len", sa.IslandPrefixLen, sb.IslandPrefixLen), c.both("sup_relay", boolInt(sa.SupRelay), boolInt(sb.SupRelay))},
		Want: "the same MPIB_MODE, MPIB_ISLAND_PREFIX_LEN and MPIB_SUP_RELAY on every node",
		Fix:  "pass one environment to every rank (scripts/launch_nccl.sh passes every MPIB_* on)"})
}

// sout checks device d's SOUT rail: both ends present, each end's route to the other's GID
// address leaving on its SOUT netdev, the same MTU. SOUT always exists; vanilla mode carries
// data on it between islands.
func (c *pairCheck) sout(d int) {
	pa, pb := c.a.Devices[d].Sout, c.b.Devices[d].Sout
	pr := c.rail(d, "SOUT", pa, pb)
	pr.Used = c.class != rules.IntraIsland.String() || c.a.Mode == 1
	pr.Path = "none"
	if pr.Reachable == "false" {
		c.rails = append(c.rails, pr)
		return
	}
	if pa.Addr.Is4() != pb.Addr.Is4() {
		c.problem(Problem{Kind: KindGID, Device: d, Rail: "SOUT", Facts: []string{c.both("address", pa.Addr, pb.Addr)},
			Want: "SOUT GIDs of one address family on both nodes", Fix: "set NCCL_IB_ADDR_FAMILY alike on every node"})
		pr.Reachable, pr.Why = "false", "address families differ"
	}
	fwd, okA := c.routeCheck(d, "SOUT", c.a, pa, pb.Addr, true)
	_, okB := c.routeCheck(d, "SOUT", c.b, pb, pa.Addr, true)
	pr.Path = fwd
	if !okA || !okB {
		pr.Reachable, pr.Why = "false", "no route"
	}
	pr.test = pr.Reachable == "unknown"
	c.rails = append(c.rails, pr)
}

// rail starts a PairRail from both ends' ports; an end that is missing or whose GID does not
// fit makes the rail unreachable (its own problem line says why).
func (c *pairCheck) rail(d int, rail string, pa, pb Port) PairRail {
	pr := PairRail{Pair: c.name, Device: d, Rail: rail, Class: c.class, MTU: [2]int{pa.ActiveMTU, pb.ActiveMTU},
		SpeedMbps: minKnown(pa.SpeedMbps, pb.SpeedMbps), Reachable: "unknown", Mbps: -1}
	for _, e := range []struct {
		node string
		p    Port
	}{{c.a.Node, pa}, {c.b.Node, pb}} {
		switch {
		case !e.p.Found:
			pr.Reachable, pr.Why = "false", e.node+" has no "+e.p.Name()
		case StateProblem(e.p.State):
			pr.Reachable, pr.Why = "false", e.node+" "+e.p.Name()+" is "+e.p.State
		case !e.p.GIDOK:
			pr.Reachable, pr.Why = "false", e.node+" "+e.p.Name()+" has no usable GID"
		}
		if pr.Reachable == "false" {
			return pr
		}
	}
	c.mtu(d, rail, pa, pb)
	return pr
}

// mtu flags two ends of a rail whose active MTUs, or whose RoCE netdevs' MTUs, differ: the
// QPs run at the smaller one and the larger side's frames are dropped by the smaller.
func (c *pairCheck) mtu(d int, rail string, pa, pb Port) {
	if !MTUMismatch(pa, pb) {
		return
	}
	c.problem(Problem{Kind: KindMTU, Device: d, Rail: rail, Port: pa.Name() + "/" + pb.Name(),
		Facts: []string{c.both("mtu", pa.ActiveMTU, pb.ActiveMTU), c.both("netdev_mtu", pa.NetdevMTU, pb.NetdevMTU),
			c.both("netdev", orNone(pa.Netdev), orNone(pb.Netdev))},
		Want: "one MTU on both ends of the rail",
		Fix:  "set the same MTU on both netdevs (ip link set dev NETDEV mtu N) and on the switch ports between them"})
}

// MTUMismatch: both ends known and different, in the active MTU or the netdev's.
func MTUMismatch(a, b Port) bool {
	differ := func(x, y int) bool { return x > 0 && y > 0 && x != y }
	return differ(a.ActiveMTU, b.ActiveMTU) || differ(a.NetdevMTU, b.NetdevMTU)
}

// routeCheck: from's kernel route to the peer's address must exist and leave on from's port
// netdev. It returns the path (direct: on-link, routed: through a gateway) and whether it
// holds; a failure is a no-route problem of the node from.
func (c *pairCheck) routeCheck(d int, rail string, from Report, p Port, to netip.Addr, withDefault bool) (string, bool) {
	if !to.Is4() || p.Netdev == "" {
		return "direct", true // /proc/net/route is IPv4 only; InfiniBand has no netdev route
	}
	rt, ok := LookupRoute(from.Routes, to, withDefault)
	if ok && rt.Dev == p.Netdev {
		if rt.Via.IsValid() {
			return "routed", true
		}
		return "direct", true
	}
	dev := "none"
	if ok {
		dev = rt.Dev
	}
	c.problem(Problem{Kind: KindNoRoute, Device: d, Rail: rail, Port: p.Name(),
		Facts: []string{"node=" + from.Node, "peer_address=" + to.String(), "netdev=" + p.Netdev, "route_dev=" + dev},
		Want:  "a route to " + to.String() + " leaving on " + p.Netdev,
		Fix:   "add the route on " + from.Node + " (ip route replace PREFIX dev " + p.Netdev + ", with via GATEWAY where the fabric is routed)"})
	return "none", false
}

// sup checks device d's SUP rail: the plugin's SUP pair verdict (rules.ChooseSupPairs) from
// each end, routes for the chosen pairs, the MTU, and whether the island prefix agrees with
// what SUP reaches.
func (c *pairCheck) sup(d int) {
	da, db := c.a.Devices[d], c.b.Devices[d]
	if len(da.Sup) == 0 || len(db.Sup) == 0 {
		return
	}
	pr := c.rail(d, "SUP", da.Sup[0], db.Sup[0])
	wanted := c.known && SupWanted(c.pathClass, c.a.Settings)
	pr.Path, pr.Used = "none", wanted
	if pr.Reachable == "false" || !c.addressed(da, db) {
		if pr.Reachable != "false" {
			pr.Why = "a SUP port is unaddressed: the island alone decides"
		}
		c.rails = append(c.rails, pr)
		return
	}
	choice, err := rules.ChooseSupPairs(supPorts(da), peerAddrs(db), routesIf(c.a), c.a.SupRelay)
	if err != nil {
		pr.Reachable, pr.Why = "false", noNewline(err.Error())
		c.rails = append(c.rails, pr)
		return
	}
	pr.Path = choice.Kind.String()
	c.islandCheck(d, da, db, choice)
	switch {
	case !wanted:
		pr.Why = c.class + ": no SUP QPs in this mode"
	case choice.Kind == rules.PathNone:
		pr.Reachable, pr.Why = "false", noSpace(choice.Reason)
	default:
		pr.test = c.supRoutes(d, da, db, choice)
		if !pr.test {
			pr.Reachable, pr.Why = "false", "no route"
		}
	}
	c.rails = append(c.rails, pr)
}

// addressed: every SUP port of both devices is described (IPv4 with a known prefix).
func (c *pairCheck) addressed(da, db Device) bool {
	for _, p := range append(append([]Port{}, da.Sup...), db.Sup...) {
		if !p.Described {
			return false
		}
	}
	return true
}

// supRoutes checks both ends' kernel routes for each chosen pair (a's view; b's reversed).
func (c *pairCheck) supRoutes(d int, da, db Device, choice rules.Choice) bool {
	ok := true
	for _, pair := range choice.Pairs {
		pa := da.Sup[pair.Port]
		pb, found := portWithAddr(db.Sup, pair.Peer)
		if !found {
			continue
		}
		_, okA := c.routeCheck(d, "SUP", c.a, pa, pb.Addr, c.a.SupRelay)
		_, okB := c.routeCheck(d, "SUP", c.b, pb, pa.Addr, c.b.SupRelay)
		ok = ok && okA && okB
	}
	return ok
}

// islandCheck: an island prefix that puts two nodes in one island whose SUP ports share no
// subnet merges islands (vanilla mode then builds SUP QPs that cannot connect); one that
// splits two nodes whose SUP ports share a subnet leaves SUP unused between them.
func (c *pairCheck) islandCheck(d int, da, db Device, choice rules.Choice) {
	if !c.known || c.a.SupRelay {
		return
	}
	split := SplittingPrefix(c.a.OOB.Addr, c.b.OOB.Addr)
	facts := []string{"island_prefix_len=" + strconv.Itoa(c.a.IslandPrefixLen), c.both("island", c.a.OOB.Island, c.b.OOB.Island),
		c.both("sup", supList(da), supList(db))}
	switch {
	case c.pathClass == rules.IntraIsland && choice.Kind == rules.PathNone && split <= 32:
		c.problem(Problem{Kind: KindIsland, Device: d, Rail: "SUP", Facts: facts,
			Want: "SUP reachable between the nodes of one island",
			Fix: fmt.Sprintf("set MPIB_ISLAND_PREFIX_LEN=%d or longer on every node (%s and %s differ from bit %d on), or put their SUP ports on one subnet",
				split, c.a.OOB.Addr, c.b.OOB.Addr, split)})
	case c.pathClass == rules.InterIsland && choice.Kind == rules.PathDirect:
		c.problem(Problem{Kind: KindIsland, Device: d, Rail: "SUP", Facts: facts,
			Want: "nodes whose SUP ports share a subnet in one island",
			Fix:  fmt.Sprintf("set MPIB_ISLAND_PREFIX_LEN=%d or shorter on every node so that vanilla mode uses SUP between them", split-1)})
	}
}

func supPorts(d Device) []rules.SupPort {
	out := make([]rules.SupPort, len(d.Sup))
	for i, p := range d.Sup {
		out[i] = rules.SupPort{Index: i, Name: p.Netdev, Addr: p.Addr, Bits: uint8(p.PrefixLen)}
	}
	return out
}

func peerAddrs(d Device) []rules.PeerAddr {
	out := make([]rules.PeerAddr, len(d.Sup))
	for i, p := range d.Sup {
		out[i] = rules.PeerAddr{Addr: p.Addr, Bits: uint8(p.PrefixLen)}
	}
	return out
}

// routesIf is what the plugin consults: the routes only with MPIB_SUP_RELAY=1.
func routesIf(r Report) []rules.Route {
	if r.SupRelay {
		return r.Routes
	}
	return nil
}

func portWithAddr(ps []Port, a netip.Addr) (Port, bool) {
	for _, p := range ps {
		if p.Addr == a {
			return p, true
		}
	}
	return Port{}, false
}

func supList(d Device) string {
	s := make([]string, len(d.Sup))
	for i, p := range d.Sup {
		s[i] = fmt.Sprintf("%v/%d", p.Addr, p.PrefixLen)
	}
	return strings.Join(s, ",")
}

func minKnown(a, b int) int {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
