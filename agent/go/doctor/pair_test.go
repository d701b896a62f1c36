package doctor

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/mpib/mpib/plugin/rules"
)

// The lab's layout (docs/lab.md): a1 and a2 in island A, b1 in island B; SOUT 10.0.x.0/24
// routed through a router, SUP 10.9.x.0/24 per island with no route between islands.

var oneDev = []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0"}

// twin is the fixture's report as another node: its name, SOUT and SUP addresses, routes.
// A JSON round trip copies it (and proves the report survives the exchange's encoding).
func twin(t *testing.T, r Report, node, sout, sup string, routes []rules.Route) Report {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var c Report
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	c.Node = node
	c.OOB.Addr = netip.MustParseAddr(sout)
	c.OOB.Island, _ = c.OOB.Addr.Prefix(c.IslandPrefixLen)
	c.Devices[0].Sout.Addr = c.OOB.Addr
	c.Devices[0].Sup[0].Addr = netip.MustParseAddr(sup)
	if routes != nil {
		c.Routes = routes
	}
	return c
}

func withPrefix(r Report, bits int) Report {
	r.IslandPrefixLen = bits
	r.OOB.Island, _ = r.OOB.Addr.Prefix(bits)
	return r
}

func labPair(t *testing.T) (a1, a2, b1 Report) {
	base := inspectFixture(t, "roce-2dev", oneDev...)
	if len(base.Problems) != 0 {
		t.Fatalf("fixture problems: %v", kinds(base.Problems))
	}
	a1 = twin(t, base, "a1", "10.0.1.11", "10.9.1.11", nil)
	a2 = twin(t, base, "a2", "10.0.1.12", "10.9.1.12", nil)
	b1 = twin(t, base, "b1", "10.0.2.11", "10.9.2.11",
		[]rules.Route{rt("10.0.2.0/24", "", "eth0"), rt("10.0.1.0/24", "10.0.2.1", "eth0"), rt("10.9.2.0/24", "", "eth1")})
	return a1, a2, b1
}

func pairOutput(rails []PairRail, problems []Problem) string {
	var b bytes.Buffer
	WritePairs(&b, rails, problems)
	return b.String()
}

func TestComparePair(t *testing.T) {
	a1, a2, b1 := labPair(t)
	noSupRoute := []rules.Route{rt("10.0.1.0/24", "", "eth0"), rt("10.0.2.0/24", "10.0.1.1", "eth0")}
	for _, c := range []struct {
		name     string
		a, b     Report
		problems []string
		lines    []string
	}{
		{"same island", a1, a2, nil, []string{
			"doctor: pair=a1-a2 device=0 rail=SOUT class=intra-island used=false path=direct mtu=4096/4096 reachable=unknown mbps=none speed_mbps=200000",
			"doctor: pair=a1-a2 device=0 rail=SUP class=intra-island used=true path=direct mtu=4096/4096 reachable=unknown mbps=none speed_mbps=200000"}},
		{"two islands", a1, b1, nil, []string{
			"doctor: pair=a1-b1 device=0 rail=SOUT class=inter-island used=true path=routed",
			"doctor: pair=a1-b1 device=0 rail=SUP class=inter-island used=false path=none mtu=4096/4096 reachable=unknown mbps=none speed_mbps=200000 why=inter-island:_no_SUP_QPs_in_this_mode"}},
		{"island prefix merges islands", withPrefix(a1, 8), withPrefix(b1, 8), []string{"island/SUP"}, []string{
			"rail=SUP class=intra-island used=true path=none mtu=4096/4096 reachable=false",
			"doctor: problem=island device=0 rail=SUP island_prefix_len=8 island=10.0.0.0/8/10.0.0.0/8 sup=10.9.1.11/24/10.9.2.11/24 want=SUP reachable between the nodes of one island: set MPIB_ISLAND_PREFIX_LEN=23 or longer on every node"}},
		{"island prefix splits an island", withPrefix(a1, 32), withPrefix(a2, 32), []string{"island/SUP"}, []string{
			"want=nodes whose SUP ports share a subnet in one island: set MPIB_ISLAND_PREFIX_LEN=29 or shorter"}},
		{"MTU differs on SUP", a1, func() Report {
			r := a2
			r.Devices = []Device{{Sout: a2.Devices[0].Sout, Sup: []Port{a2.Devices[0].Sup[0]}}}
			r.Devices[0].Sup[0].NetdevMTU, r.Devices[0].Sup[0].ActiveMTU = 1000, 512
			return r
		}(), []string{"mtu/SUP"}, []string{
			"rail=SUP class=intra-island used=true path=direct mtu=4096/512",
			"doctor: problem=mtu device=0 rail=SUP port=mlx5_1:1/mlx5_1:1 mtu=4096/512 netdev_mtu=9000/1000 netdev=eth1/eth1 want=one MTU on both ends of the rail"}},
		{"SUP peer without a route on its SUP netdev", a1, twin(t, a2, "a2", "10.0.1.12", "10.9.1.12", noSupRoute), nil, []string{
			"rail=SUP class=intra-island used=true path=direct mtu=4096/4096 reachable=unknown mbps=none speed_mbps=200000 why=no_route_to_10.9.1.11_leaves_on_eth1_in_a2's_main_table_(a_policy-routing_table_may_hold_one)"}},
		{"SOUT peer without a route on its SOUT netdev", a1, twin(t, b1, "b1", "10.0.2.11", "10.9.2.11", []rules.Route{rt("10.0.2.0/24", "", "eth0")}),
			nil, []string{"rail=SOUT class=inter-island used=true path=routed mtu=4096/4096 reachable=unknown mbps=none speed_mbps=200000 why=no_route_to_10.0.1.11_leaves_on_eth0_in_b1's_main_table"}},
		{"settings differ", a1, func() Report { r := a2; r.Mode = 1; return r }(), []string{"settings/"}, []string{
			"doctor: problem=settings mode=0/1 island_prefix_len=24/24 sup_relay=0/0 sout_qp=1/1 sup_qp=1/1 want=the same MPIB_MODE"}},
		{"QP counts differ", a1, twin(t, inspectFixture(t, "roce-2dev", append([]string{"MPIB_SOUT_QP=4"}, oneDev...)...), "a2", "10.0.1.12", "10.9.1.12", nil),
			[]string{"settings/"}, []string{
				"doctor: problem=settings mode=0/0 island_prefix_len=24/24 sup_relay=0/0 sout_qp=1/4 sup_qp=1/1 want=the same MPIB_MODE, MPIB_ISLAND_PREFIX_LEN, MPIB_SUP_RELAY, MPIB_SOUT_QP and MPIB_SUP_QP on every node"}},
		{"one OOB address on both nodes", a1, twin(t, a2, "a2", "10.0.1.11", "10.9.1.12", nil), []string{"oob-if/"}, []string{
			"doctor: problem=oob-if oob_if=eth0/eth0 address=10.0.1.11/10.0.1.11 want=a different OOB address on each node"}},
		{"SUP port down on one end", a1, func() Report {
			r := twin(t, a2, "a2", "10.0.1.12", "10.9.1.12", nil)
			r.Devices[0].Sup[0].State = "DOWN"
			return r
		}(), nil, []string{"rail=SUP class=intra-island used=true path=none mtu=4096/4096 reachable=false mbps=none speed_mbps=200000 why=a2_mlx5_1:1_is_DOWN"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rails, problems := ComparePair(c.a, c.b)
			out := pairOutput(rails, problems)
			if got := strings.Join(kinds(problems), " "); got != strings.Join(c.problems, " ") {
				t.Errorf("problems %q, want %q\n%s", got, strings.Join(c.problems, " "), out)
			}
			for _, l := range c.lines {
				if !strings.Contains(out, l) {
					t.Errorf("no line with\n%s\nin\n%s", l, out)
				}
			}
		})
	}
}

// The route to a peer is looked up among those leaving on the port's netdev, as the kernel
// does for a RoCE v2 address bound to the GID's netdev: a rail-optimized SOUT fabric has one
// route to the SOUT supernet per NIC, each through its own leaf.
func TestComparePairRailRoutes(t *testing.T) {
	base := inspectFixture(t, "roce-2dev", roce2dev...)
	a := twin(t, base, "a1", "10.0.1.11", "10.9.1.11", nil)
	b := twin(t, base, "b1", "10.0.2.11", "10.9.2.11", nil)
	a.Devices[1].Sout.Addr, b.Devices[1].Sout.Addr = netip.MustParseAddr("10.0.3.11"), netip.MustParseAddr("10.0.4.11")
	b.Devices[1].Sup[0].Addr = netip.MustParseAddr("10.9.4.11")
	a.Routes = []rules.Route{rt("10.0.1.0/24", "", "eth0"), rt("10.0.3.0/24", "", "eth2"),
		rt("10.0.0.0/8", "10.0.1.1", "eth0"), rt("10.0.0.0/8", "10.0.3.1", "eth2")}
	b.Routes = []rules.Route{rt("10.0.2.0/24", "", "eth0"), rt("10.0.4.0/24", "", "eth2"),
		rt("10.0.0.0/8", "10.0.2.1", "eth0"), rt("10.0.0.0/8", "10.0.4.1", "eth2")}
	rails, problems := ComparePair(a, b)
	out := pairOutput(rails, problems)
	if len(problems) != 0 {
		t.Errorf("problems %v, want none\n%s", kinds(problems), out)
	}
	for _, want := range []string{
		"doctor: pair=a1-b1 device=0 rail=SOUT class=inter-island used=true path=routed mtu=4096/4096 reachable=unknown mbps=none speed_mbps=200000\n",
		"doctor: pair=a1-b1 device=1 rail=SOUT class=inter-island used=true path=routed mtu=4096/4096 reachable=unknown mbps=none speed_mbps=200000\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no line\n%s\nin\n%s", want, out)
		}
	}
}

// meshPeer is the mesh fixture's report as a neighbour: its name, SOUT address and SUP ports,
// each "ADDRESS/PREFIX", "DOWN" after it for a port whose link is down (and whose connected
// route is gone with it).
func meshPeer(t *testing.T, r Report, node, sout string, sup ...string) Report {
	t.Helper()
	c := twin(t, r, node, sout, "10.9.99.1", []rules.Route{rt("10.0.1.0/24", "", "eth0")})
	for i, s := range sup {
		f := strings.Fields(s)
		p := &c.Devices[0].Sup[i]
		pfx := netip.MustParsePrefix(f[0])
		p.Addr, p.PrefixLen, p.State, p.Described = pfx.Addr(), pfx.Bits(), "ACTIVE", true
		if len(f) > 1 {
			p.State, p.Described = f[1], false
			continue
		}
		c.Routes = append(c.Routes, rules.Route{Dst: pfx.Masked(), Dev: p.Netdev})
	}
	return c
}

// A mesh pair is judged on the ports the two ends can pair: a port whose link is down is
// left out, and only a pair that needs it finds it down.
func TestComparePairMesh(t *testing.T) {
	n1 := inspectFixture(t, "roce-mesh", meshEnv...)
	if len(n1.Problems) != 0 {
		t.Fatalf("fixture problems: %v", kinds(n1.Problems))
	}
	for _, c := range []struct {
		name     string
		peer     Report
		problems []string
		line     string
		test     bool
	}{
		{"cabled to a port that is up", meshPeer(t, n1, "n2", "10.0.1.12", "10.9.12.1/31", "10.9.15.0/31", "10.9.16.0/31"), nil,
			"doctor: pair=n1-n2 device=0 rail=SUP class=intra-island used=true path=direct mtu=4096/4096 reachable=unknown mbps=none speed_mbps=100000\n", true},
		{"the peer's first port down, cabled to its second", meshPeer(t, n1, "n3", "10.0.1.13", "10.9.17.0/31 DOWN", "10.9.14.1/31", "10.9.18.0/31"), nil,
			"doctor: pair=n1-n3 device=0 rail=SUP class=intra-island used=true path=direct mtu=4096/4096 reachable=unknown mbps=none speed_mbps=100000\n", true},
		{"cabled to the port that is down", meshPeer(t, n1, "n4", "10.0.1.14", "10.9.13.1/31", "10.9.19.0/31", "10.9.20.0/31"), []string{"port-down/SUP"},
			"doctor: problem=port-down device=0 rail=SUP port=mlx5_9:1 node=n1 state=DOWN phys_state=Disabled want=state ACTIVE on the SUP port cabled to n4: bring the netdev up (ip link set dev eth9 up), then check the cable and the switch port", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rails, problems := ComparePair(n1, c.peer)
			out := pairOutput(rails, problems)
			if got := strings.Join(kinds(problems), " "); got != strings.Join(c.problems, " ") || !strings.Contains(out, c.line) {
				t.Errorf("problems %q, want %q with\n%s\nin\n%s", got, strings.Join(c.problems, " "), c.line, out)
			}
			if sup := rails[len(rails)-1]; sup.Rail != "SUP" || sup.test != c.test {
				t.Errorf("SUP rail %+v: traffic test %v, want %v", sup, sup.test, c.test)
			}
		})
	}
}

func TestComparePairDevices(t *testing.T) {
	one := inspectFixture(t, "roce-2dev", oneDev...)
	two := inspectFixture(t, "roce-2dev", roce2dev...)
	two.Node = "x"
	one = twin(t, one, "y", "10.0.1.12", "10.9.1.12", nil)
	rails, problems := ComparePair(two, one)
	if got := strings.Join(kinds(problems), " "); got != "devices/" || len(rails) != 2 {
		t.Errorf("problems %q with %d rails, want devices/ and device 0's two rails", got, len(rails))
	}
	if rails, problems := ComparePair(Report{Config: "bad"}, one); rails != nil || problems != nil {
		t.Errorf("a report with an invalid configuration compared: %v %v", rails, problems)
	}
}

func TestPeerProblems(t *testing.T) {
	r := Report{Node: "a2", Problems: []Problem{{Kind: KindPortDown, Device: 0, Rail: "SUP", Facts: []string{"state=DOWN"}}}}
	got := PeerProblems(r)
	if len(got) != 1 || strings.Join(got[0].Facts, " ") != "node=a2 state=DOWN" || r.Problems[0].Facts[0] != "state=DOWN" {
		t.Errorf("PeerProblems = %+v (the peer's report must stay as it was: %+v)", got, r.Problems)
	}
}

func TestPairableAndCabled(t *testing.T) {
	up := Port{State: "ACTIVE", GIDOK: true, Addr: netip.MustParseAddr("10.9.12.0"), PrefixLen: 31, Described: true}
	down := Port{State: "DOWN", GIDOK: true, Addr: netip.MustParseAddr("10.9.13.0"), PrefixLen: 31}
	noAddr := Port{State: "ACTIVE", GIDOK: true, Addr: netip.MustParseAddr("fe80::1")}
	for _, c := range []struct {
		name             string
		sup              []Port
		pairable, cabled []int
	}{
		{"one port up", []Port{up}, []int{0}, []int{0}},
		{"one port down", []Port{down}, []int{0}, []int{0}},
		{"one port unaddressed", []Port{noAddr}, []int{0}, nil},
		{"mesh, the middle port down", []Port{up, down, up}, []int{0, 2}, []int{0, 1, 2}},
		{"mesh, the first port down", []Port{down, up}, []int{1}, []int{0, 1}},
		{"mesh, every port down", []Port{down, down}, []int{0}, []int{0, 1}},
		{"mesh, one port unaddressed", []Port{noAddr, up}, []int{1}, []int{1}},
	} {
		if got := pairable(c.sup); !slices.Equal(got, c.pairable) {
			t.Errorf("%s: pairable = %v, want %v", c.name, got, c.pairable)
		}
		if got := cabled(c.sup); !slices.Equal(got, c.cabled) {
			t.Errorf("%s: cabled = %v, want %v", c.name, got, c.cabled)
		}
	}
}
