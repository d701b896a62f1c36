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
	Path      string  `json:"path"`  // direct, routed, none, or (SOUT) unknown: no route seen
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
	c.oobDistinct()
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

// settings: the two nodes must classify and split alike, and build as many QPs per rail (the
// plugin's handshake refuses a connection whose ends differ).
func (c *pairCheck) settings() {
	sa, sb := c.a.Settings, c.b.Settings
	if sa == sb {
		return
	}
	c.problem(Problem{Kind: KindSettings, Device: -1, Facts: []string{c.both("mode", sa.Mode, sb.Mode),
		c.both("island_prefix_len", sa.IslandPrefixLen, sb.IslandPrefixLen), c.both("sup_relay", boolInt(sa.SupRelay), boolInt(sb.SupRelay)),
		c.both("sout_qp", sa.SoutQPs, sb.SoutQPs), c.both("sup_qp", sa.SupQPs, sb.SupQPs)},
		Want: "the same MPIB_MODE, MPIB_ISLAND_PREFIX_LEN, MPIB_SUP_RELAY, MPIB_SOUT_QP and MPIB_SUP_QP on every node",
		Fix:  "pass one environment to every rank (scripts/launch_nccl.sh passes every MPIB_* on)"})
}

// oobDistinct: the two nodes must have different OOB addresses. One address on both (a
// loopback, or an address copied onto every node) sends each node's connects to itself.
func (c *pairCheck) oobDistinct() {
	oa, ob := c.a.OOB, c.b.OOB
	if !oa.Addr.IsValid() || oa.Addr != ob.Addr {
		return
	}
	c.problem(Problem{Kind: KindOOB, Device: -1, Facts: []string{c.both("oob_if", oa.Interface, ob.Interface),
		c.both("address", oa.Addr, ob.Addr)},
		Want: "a different OOB address on each node (the plugin connects to the address the peer advertises)",
		Fix:  "set MPIB_OOB_IF on each node to its SOUT interface, and give each node its own address there"})
}

// sout checks device d's SOUT rail: both ends present, each end's route to the other's GID
// address on its SOUT netdev, the same MTU. SOUT always exists; vanilla mode carries data on
// it between islands.
func (c *pairCheck) sout(d int) {
	pa, pb := c.a.Devices[d].Sout, c.b.Devices[d].Sout
	pr := c.rail(d, "SOUT", pa, pb)
	if pr.Reachable != "false" {
		c.mtu(d, "SOUT", pa, pb)
	}
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
	fwd, whyA := routePath(c.a, pa, pb.Addr, true)
	_, whyB := routePath(c.b, pb, pa.Addr, true)
	pr.Path = fwd
	if pr.Why == "" {
		pr.Why = orName(whyA, whyB)
	}
	pr.test = pr.Reachable == "unknown"
	c.rails = append(c.rails, pr)
}

// rail starts a PairRail from both ends' ports; an end that is missing, down or whose GID does
// not fit makes the rail unreachable (its own problem line says why).
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
	return pr
}

// mtu flags two ends of a rail whose active MTUs differ: the plugin runs the QPs at the
// smaller, so one end is set below what the rail could carry.
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

// MTUMismatch: both ends' active MTUs known and different. RoCE netdev MTUs that differ
// under one active MTU (9000 and 9216 both give 4096) carry the same frames.
func MTUMismatch(a, b Port) bool {
	return a.ActiveMTU > 0 && b.ActiveMTU > 0 && a.ActiveMTU != b.ActiveMTU
}

// routePath is how from's kernel sends from port p to a peer's address: direct (on-link) or
// routed (through a gateway) by the longest route on p's netdev; unknown, with why, when no
// route there matches (a policy-routing table may hold one: /proc/net/route is the main table).
func routePath(from Report, p Port, to netip.Addr, withDefault bool) (path, why string) {
	if !to.Is4() || p.Netdev == "" {
		return "direct", "" // /proc/net/route is IPv4 only; InfiniBand has no netdev route
	}
	rt, ok := LookupRoute(from.Routes, p.Netdev, to, withDefault)
	switch {
	case !ok:
		return "unknown", fmt.Sprintf("no route to %s leaves on %s in %s's main table (a policy-routing table may hold one)",
			to, p.Netdev, from.Node)
	case rt.Via.IsValid():
		return "routed", ""
	}
	return "direct", ""
}

// sup checks device d's SUP rail on the ports a connection between the two would pair (of a
// mesh device's, those up and described): the plugin's SUP pair verdict (rules.ChooseSupPairs)
// from each end, routes and MTU for the chosen pair, and whether the island prefix agrees with
// what SUP reaches.
func (c *pairCheck) sup(d int) {
	da, db := c.a.Devices[d], c.b.Devices[d]
	if len(da.Sup) == 0 || len(db.Sup) == 0 {
		return
	}
	la, lb := pairable(da.Sup), pairable(db.Sup)
	addressed := da.Sup[la[0]].Described && db.Sup[lb[0]].Described
	var choice rules.Choice
	var err error
	pa, pb := da.Sup[la[0]], db.Sup[lb[0]]
	if addressed {
		choice, err = rules.ChooseSupPairs(supPorts(da.Sup, la), peerAddrs(db.Sup, lb), routesIf(c.a), c.a.SupRelay)
		if len(choice.Pairs) > 0 {
			pa, pb = da.Sup[choice.Pairs[0].Port], portWithAddr(db.Sup, choice.Pairs[0].Peer)
		}
	}
	pr := c.rail(d, "SUP", pa, pb)
	wanted := c.known && SupWanted(c.pathClass, c.a.Settings)
	pr.Path, pr.Used = "none", wanted
	if pr.Reachable != "false" && (!addressed || len(choice.Pairs) > 0) {
		c.mtu(d, "SUP", pa, pb)
	}
	switch {
	case pr.Reachable == "false":
	case !addressed:
		pr.Why = "a SUP port is unaddressed: the island alone decides"
	case err != nil:
		pr.Reachable, pr.Why = "false", noNewline(err.Error())
	default:
		pr.Path = choice.Kind.String()
		c.supVerdict(d, &pr, wanted, choice)
	}
	c.rails = append(c.rails, pr)
}

// supVerdict judges an addressed SUP rail by the pair chosen over the ports up now; the island
// check and a pair that only a down port would give take every port the address plan joins.
func (c *pairCheck) supVerdict(d int, pr *PairRail, wanted bool, choice rules.Choice) {
	da, db := c.a.Devices[d], c.b.Devices[d]
	ca, cb := cabled(da.Sup), cabled(db.Sup)
	plan, err := rules.ChooseSupPairs(supPorts(da.Sup, ca), peerAddrs(db.Sup, cb), routesIf(c.a), c.a.SupRelay)
	if err != nil {
		plan = choice
	}
	c.islandCheck(d, da, db, plan)
	switch {
	case !wanted:
		pr.Why = c.class + ": no SUP QPs in this mode"
	case choice.Kind == rules.PathNone:
		pr.Reachable, pr.Why = "false", noSpace(choice.Reason)
		if why := c.downCables(d, da, db, plan); why != "" {
			pr.Why = why
		}
	default:
		pr.test, pr.Why = true, c.supRoutes(da, db, choice)
	}
}

// downCables raises port-down for each port that is down on a pair the address plan gives
// (a mesh device runs on its other ports, so only the pair that needs one finds it down), and
// says why the rail has no pair; "" when no down port explains it.
func (c *pairCheck) downCables(d int, da, db Device, plan rules.Choice) string {
	why := ""
	for _, pair := range plan.Pairs {
		ends := []struct {
			node, other string
			p           Port
		}{{c.a.Node, c.b.Node, da.Sup[pair.Port]}, {c.b.Node, c.a.Node, portWithAddr(db.Sup, pair.Peer)}}
		for _, e := range ends {
			if !StateProblem(e.p.State) {
				continue
			}
			c.problem(Problem{Kind: KindPortDown, Device: d, Rail: "SUP", Port: e.p.Name(),
				Facts: []string{"node=" + e.node, "state=" + e.p.State, "phys_state=" + e.p.PhysState},
				Want:  "state ACTIVE on the SUP port cabled to " + e.other, Fix: downFix(e.p)})
			why = e.node + " " + e.p.Name() + " is " + e.p.State
		}
	}
	return why
}

// supRoutes checks both ends' kernel routes for each chosen pair (a's view; b's reversed) and
// says why one is unknown, "" when every one is seen.
func (c *pairCheck) supRoutes(da, db Device, choice rules.Choice) string {
	for _, pair := range choice.Pairs {
		pa, pb := da.Sup[pair.Port], portWithAddr(db.Sup, pair.Peer)
		_, whyA := routePath(c.a, pa, pb.Addr, c.a.SupRelay)
		_, whyB := routePath(c.b, pb, pa.Addr, c.b.SupRelay)
		if why := orName(whyA, whyB); why != "" {
			return why
		}
	}
	return ""
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

// pairable lists, by index, the SUP ports a connection can pair: of several, those the plugin
// describes now (it leaves a down or unaddressable port out), else the first, as the plugin
// then uses it; a device's only port as it is.
func pairable(sup []Port) []int {
	var out []int
	for i, p := range sup {
		if len(sup) > 1 && p.Described {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		return []int{0}
	}
	return out
}

// cabled lists, by index, the SUP ports the address plan joins: those pairable now and those
// left out only for a link that is down.
func cabled(sup []Port) []int {
	var out []int
	for i, p := range sup {
		if p.Described || (StateProblem(p.State) && p.GIDOK && p.Addr.Is4() && p.PrefixLen > 0) {
			out = append(out, i)
		}
	}
	return out
}

// supPorts are the ports of sup at the indexes idx, as the plugin describes them.
func supPorts(sup []Port, idx []int) []rules.SupPort {
	out := make([]rules.SupPort, len(idx))
	for k, i := range idx {
		out[k] = rules.SupPort{Index: i, Name: sup[i].Netdev, Addr: sup[i].Addr, Bits: uint8(sup[i].PrefixLen)}
	}
	return out
}

// peerAddrs are the addresses of the ports of sup at the indexes idx, as a handle carries them.
func peerAddrs(sup []Port, idx []int) []rules.PeerAddr {
	out := make([]rules.PeerAddr, len(idx))
	for k, i := range idx {
		out[k] = rules.PeerAddr{Addr: sup[i].Addr, Bits: uint8(sup[i].PrefixLen)}
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

// portWithAddr is the port of ps that holds address a (a pair's peer end); the zero Port
// when none does.
func portWithAddr(ps []Port, a netip.Addr) Port {
	for _, p := range ps {
		if p.Addr == a {
			return p
		}
	}
	return Port{}
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
