package doctor

import (
	"bytes"
	"encoding/json"
	"net/netip"
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
		{"SUP peer without a route", a1, twin(t, a2, "a2", "10.0.1.12", "10.9.1.12", noSupRoute), []string{"no-route/SUP"}, []string{
			"rail=SUP class=intra-island used=true path=direct mtu=4096/4096 reachable=false mbps=none speed_mbps=200000 why=no_route",
			"doctor: problem=no-route device=0 rail=SUP port=mlx5_1:1 node=a2 peer_address=10.9.1.11 netdev=eth1 route_dev=none want=a route to 10.9.1.11 leaving on eth1"}},
		{"SOUT peer without a route", a1, twin(t, b1, "b1", "10.0.2.11", "10.9.2.11", []rules.Route{rt("10.0.2.0/24", "", "eth0")}),
			[]string{"no-route/SOUT"}, []string{"doctor: problem=no-route device=0 rail=SOUT port=mlx5_0:1 node=b1 peer_address=10.0.1.11 netdev=eth0 route_dev=none"}},
		{"settings differ", a1, func() Report { r := a2; r.Mode = 1; return r }(), []string{"settings/"}, []string{
			"doctor: problem=settings mode=0/1 island_prefix_len=24/24 sup_relay=0/0 want=the same MPIB_MODE"}},
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

func TestComparePairDevices(t *testing.T) {
	one := inspectFixture(t, "roce-2dev", oneDev...)
	two := inspectFixture(t, "roce-2dev", roce2dev...)
	two.Node, one.Node = "x", "y"
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
