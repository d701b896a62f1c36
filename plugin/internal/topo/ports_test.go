package topo

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/mpib/mpib/plugin/internal/gid"
)

// port builds a SUP port from its address in CIDR form, as `ip -4 addr` shows it.
func port(index int, name, cidr string) Port {
	p := netip.MustParsePrefix(cidr)
	return Port{Index: index, Name: name, Addr: p.Addr(), Bits: uint8(p.Bits())}
}

// advertise is what a node's handle carries: its SUP addresses with their prefixes.
func advertise(ports []Port) []PeerAddr {
	out := make([]PeerAddr, len(ports))
	for i, p := range ports {
		out[i] = PeerAddr{Addr: p.Addr, Bits: p.Bits}
	}
	return out
}

func route(dst, via, dev string) Route {
	r := Route{Dst: netip.MustParsePrefix(dst), Dev: dev}
	if via != "" {
		r.Via = netip.MustParseAddr(via)
	}
	return r
}

// kernelTable is a node's main table: a connected route per SUP port, SOUT's subnet and
// default route, then the extra routes.
func kernelTable(ports []Port, extra ...Route) []Route {
	var t []Route
	for _, p := range ports {
		pfx, _ := p.Addr.Prefix(int(p.Bits))
		t = append(t, Route{Dst: pfx, Dev: p.Name})
	}
	t = append(t, route("10.0.0.0/16", "", "sout0"), route("0.0.0.0/0", "10.0.0.254", "sout0"))
	return append(t, extra...)
}

// Fixture: the lab's planned island A, a full mesh of three nodes. a1-a3 is a /29 and a
// second, parallel a2-a3 cable is the next /29 of the same /24 (the /24 trap).
var labMeshA = map[string][]Port{
	"a1": {port(0, "to-a2", "10.9.1.1/24"), port(1, "to-a3", "10.9.13.1/29")},
	"a2": {port(0, "to-a1", "10.9.1.2/24"), port(1, "to-a3", "10.9.23.2/24"), port(2, "to-a3b", "10.9.13.10/29")},
	"a3": {port(0, "to-a1", "10.9.13.3/29"), port(1, "to-a2", "10.9.23.3/24"), port(2, "to-a2b", "10.9.13.11/29")},
}

// Fixture: the lab's planned island B, a ring b1-b2-b3-b4-b1, one /24 per cable.
var labRingB = map[string][]Port{
	"b1": {port(0, "to-b2", "10.9.112.1/24"), port(1, "to-b4", "10.9.141.1/24")},
	"b2": {port(0, "to-b1", "10.9.112.2/24"), port(1, "to-b3", "10.9.123.2/24")},
	"b3": {port(0, "to-b2", "10.9.123.3/24"), port(1, "to-b4", "10.9.134.3/24")},
	"b4": {port(0, "to-b3", "10.9.134.4/24"), port(1, "to-b1", "10.9.141.4/24")},
}

// Fixture: island B's routes, b1<->b3 through b2 and b2<->b4 through b3. b1 also has a
// default route on a SUP netdev, which must never count.
var labRingBRoutes = map[string][]Route{
	"b1": kernelTable(labRingB["b1"], route("10.9.123.0/24", "10.9.112.2", "to-b2"), route("0.0.0.0/0", "10.9.141.4", "to-b4")),
	"b2": kernelTable(labRingB["b2"], route("10.9.134.0/24", "10.9.123.3", "to-b3")),
	"b3": kernelTable(labRingB["b3"], route("10.9.112.0/24", "10.9.123.2", "to-b2")),
	"b4": kernelTable(labRingB["b4"], route("10.9.123.0/24", "10.9.134.3", "to-b3")),
}

func choose(t *testing.T, local []Port, peer []PeerAddr, routes []Route, relay bool) Choice {
	t.Helper()
	c, err := ChooseSupPairs(local, peer, routes, relay)
	if err != nil {
		t.Fatalf("ChooseSupPairs: %v", err)
	}
	return c
}

func TestChooseSupPairsLabMeshA(t *testing.T) {
	want := map[string]string{
		"a1>a2": "direct: port 0 10.9.1.1 -> 10.9.1.2",
		"a1>a3": "direct: port 1 10.9.13.1 -> 10.9.13.3",
		"a2>a1": "direct: port 0 10.9.1.2 -> 10.9.1.1",
		"a2>a3": "direct: port 1 10.9.23.2 -> 10.9.23.3, port 2 10.9.13.10 -> 10.9.13.11",
		"a3>a1": "direct: port 0 10.9.13.3 -> 10.9.13.1",
		"a3>a2": "direct: port 1 10.9.23.3 -> 10.9.23.2, port 2 10.9.13.11 -> 10.9.13.10",
	}
	for conn, w := range want {
		from, to, _ := strings.Cut(conn, ">")
		for _, relay := range []bool{false, true} {
			got := choose(t, labMeshA[from], advertise(labMeshA[to]), kernelTable(labMeshA[from]), relay)
			if got.String() != w {
				t.Errorf("%s relay=%v:\n got %s\nwant %s", conn, relay, got, w)
			}
		}
	}
}

func TestChooseSupPairsLabRingB(t *testing.T) {
	tests := []struct {
		conn, relayOn string // relay off: the same when direct, else none
	}{
		{"b1>b2", "direct: port 0 10.9.112.1 -> 10.9.112.2"},
		{"b1>b3", "routed: port 0 10.9.112.1 -> 10.9.123.3 via 10.9.112.2"},
		{"b1>b4", "direct: port 1 10.9.141.1 -> 10.9.141.4"},
		{"b2>b1", "direct: port 0 10.9.112.2 -> 10.9.112.1"},
		{"b2>b3", "direct: port 1 10.9.123.2 -> 10.9.123.3"},
		{"b2>b4", "routed: port 1 10.9.123.2 -> 10.9.134.4 via 10.9.123.3"},
		{"b3>b1", "routed: port 0 10.9.123.3 -> 10.9.112.1 via 10.9.123.2"},
		{"b3>b2", "direct: port 0 10.9.123.3 -> 10.9.123.2"},
		{"b3>b4", "direct: port 1 10.9.134.3 -> 10.9.134.4"},
		{"b4>b1", "direct: port 1 10.9.141.4 -> 10.9.141.1"},
		{"b4>b2", "routed: port 0 10.9.134.4 -> 10.9.123.2 via 10.9.134.3"},
		{"b4>b3", "direct: port 0 10.9.134.4 -> 10.9.134.3"},
	}
	for _, tt := range tests {
		from, to, _ := strings.Cut(tt.conn, ">")
		local, peer, routes := labRingB[from], advertise(labRingB[to]), labRingBRoutes[from]
		if got := choose(t, local, peer, routes, true); got.String() != tt.relayOn {
			t.Errorf("%s relay on:\n got %s\nwant %s", tt.conn, got, tt.relayOn)
		}
		off := choose(t, local, peer, routes, false)
		if strings.HasPrefix(tt.relayOn, "direct") {
			if off.String() != tt.relayOn {
				t.Errorf("%s relay off: got %s, want %s", tt.conn, off, tt.relayOn)
			}
			continue
		}
		// A route alone never enables SUP; the reason names both sides' addresses.
		if off.Kind != PathNone || len(off.Pairs) != 0 {
			t.Errorf("%s relay off: got %s, want none", tt.conn, off)
		}
		for _, a := range append(advertise(local), peer...) {
			if !strings.Contains(off.Reason, a.String()) {
				t.Errorf("%s relay off: reason %q does not name %s", tt.conn, off.Reason, a)
			}
		}
	}
}

// Every pair a connector chooses in the lab fixtures is one its acceptor accepts, and both
// agree on direct vs routed.
func TestLabPairsAccepted(t *testing.T) {
	for _, fix := range []struct {
		nodes  map[string][]Port
		routes func(string) []Route
	}{
		{labMeshA, func(n string) []Route { return kernelTable(labMeshA[n]) }},
		{labRingB, func(n string) []Route { return labRingBRoutes[n] }},
	} {
		for from := range fix.nodes {
			for to := range fix.nodes {
				if from == to {
					continue
				}
				c := choose(t, fix.nodes[from], advertise(fix.nodes[to]), fix.routes(from), true)
				if c.Kind == PathNone {
					t.Errorf("%s>%s: none in the lab fixture: %s", from, to, c.Reason)
				}
				for _, p := range c.Pairs {
					bits := fix.nodes[from][slices.IndexFunc(fix.nodes[from], func(l Port) bool { return l.Index == p.Port })].Bits
					back, err := CheckAcceptedPair(fix.nodes[to], p.Peer, PeerAddr{p.Local, bits}, fix.routes(to), true)
					if err != nil {
						t.Errorf("%s>%s %s refused: %v", from, to, p, err)
					} else if back.Via.IsValid() != (c.Kind == PathRouted) {
						t.Errorf("%s>%s %s: the acceptor sees %s", from, to, p, back)
					}
				}
			}
		}
	}
}

// A /24 matcher on island A pairs a port with an address on another cable: a3's /29 port to a1
// and its /29 port to a2 share 10.9.13.0/24. The real prefixes must not. (Read as /24s, a3's
// ports would share a subnet, which CheckPorts refuses: the trap is shown by the matching alone.)
func TestSlash24Trap(t *testing.T) {
	as24 := func(ports []Port) []Port {
		out := slices.Clone(ports)
		for i := range out {
			out[i].Bits = 24
		}
		return out
	}
	tests := []struct{ from, to, wrong string }{
		{"a3", "a2", "port 0 10.9.13.3 -> 10.9.13.10"}, // a3's cable to a1, a2's parallel cable
		{"a1", "a3", "port 1 10.9.13.1 -> 10.9.13.11"}, // a1's cable to a3, the a2-a3 cable's far end
		{"a2", "a3", "port 2 10.9.13.10 -> 10.9.13.3"}, // a2's parallel cable, a3's cable to a1
	}
	for _, tt := range tests {
		trap := Choice{Kind: PathDirect, Pairs: directPairs(as24(labMeshA[tt.from]), advertise(as24(labMeshA[tt.to])))}
		if !strings.Contains(trap.String(), tt.wrong) {
			t.Fatalf("fixture lost its trap: a /24 matcher %s>%s gives %s, expected it to include %s", tt.from, tt.to, trap, tt.wrong)
		}
		real := choose(t, labMeshA[tt.from], advertise(labMeshA[tt.to]), nil, false)
		if strings.Contains(real.String(), tt.wrong) {
			t.Errorf("%s>%s with the real prefixes: %s includes the wrong pair %s", tt.from, tt.to, real, tt.wrong)
		}
	}
}

// A default route on a SUP netdev never makes a peer reachable, even with relay on.
func TestDefaultRouteOnSupIgnored(t *testing.T) {
	routes := kernelTable(labRingB["b1"], route("0.0.0.0/0", "10.9.141.4", "to-b4"))
	c := choose(t, labRingB["b1"], advertise(labRingB["b3"]), routes, true)
	if c.Kind != PathNone {
		t.Fatalf("b1>b3 with only a default route on to-b4: %s, want none", c)
	}
	for _, a := range []string{"10.9.123.3/24", "10.9.134.3/24", "10.9.112.1/24", "10.9.141.1/24", "no non-default route"} {
		if !strings.Contains(c.Reason, a) {
			t.Errorf("reason %q does not say %q", c.Reason, a)
		}
	}
	if _, err := CheckAcceptedPair(labRingB["b1"], netip.MustParseAddr("10.9.141.1"), PeerAddr{netip.MustParseAddr("10.9.134.3"), 24}, routes, true); err == nil {
		t.Error("acceptor took a pair reachable only by its default route")
	}
}

func TestRoutedChoiceRules(t *testing.T) {
	b1, b3 := labRingB["b1"], advertise(labRingB["b3"])
	tests := []struct {
		name   string
		routes []Route
		want   string
	}{
		{"equal /24s to both addresses: first port wins", []Route{
			route("10.9.134.0/24", "10.9.141.4", "to-b4"), route("10.9.123.0/24", "10.9.112.2", "to-b2")},
			"routed: port 0 10.9.112.1 -> 10.9.123.3 via 10.9.112.2"},
		{"a /32 beats a /24", []Route{
			route("10.9.123.0/24", "10.9.112.2", "to-b2"), route("10.9.134.3/32", "10.9.141.4", "to-b4")},
			"routed: port 1 10.9.141.1 -> 10.9.134.3 via 10.9.141.4"},
		{"a more specific route on SOUT shadows the SUP one", []Route{
			route("10.9.123.0/24", "10.9.112.2", "to-b2"), route("10.9.123.0/25", "10.0.0.254", "sout0")},
			"none"},
		{"an on-link route (no gateway) is not relay", []Route{route("10.9.123.0/24", "", "to-b2")}, "none"},
		{"multipath over SOUT and SUP: SUP taken", []Route{
			route("10.9.123.0/24", "10.0.0.254", "sout0"), route("10.9.123.0/24", "10.9.112.2", "to-b2")},
			"routed: port 0 10.9.112.1 -> 10.9.123.3 via 10.9.112.2"},
		{"a route on a netdev that is no SUP port", []Route{route("10.9.123.0/24", "10.9.5.1", "eth9")}, "none"},
	}
	for _, tt := range tests {
		for _, routes := range [][]Route{tt.routes, reversed(tt.routes)} {
			got := choose(t, b1, b3, routes, true)
			if s := got.String(); s != tt.want && !(tt.want == "none" && got.Kind == PathNone) {
				t.Errorf("%s (routes %v): got %s, want %s", tt.name, routes, s, tt.want)
			}
		}
	}
}

func reversed(r []Route) []Route {
	out := slices.Clone(r)
	slices.Reverse(out)
	return out
}

// One port and one peer address: exactly today's rule, gid.SupReachable, on the same inputs.
func TestOnePortMatchesSupReachable(t *testing.T) {
	tests := []struct {
		local string
		lbits uint8
		peer  string
		pbits uint8
	}{
		{"10.9.1.11", 24, "10.9.1.12", 24},
		{"10.9.1.11", 24, "10.9.2.11", 24},
		{"10.9.1.11", 16, "10.9.1.200", 30},
		{"10.9.1.11", 0, "10.9.2.11", 24},
		{"10.9.1.11", 24, "10.9.2.11", 0},
		{"10.9.1.11", 0, "10.9.2.11", 0},
		{"10.9.13.3", 29, "10.9.13.10", 29},
		{"10.9.13.3", 24, "10.9.13.10", 29},
		{"10.9.13.11", 29, "10.9.13.10", 29},
		{"10.9.200.0", 31, "10.9.200.1", 31},
		{"10.9.200.1", 31, "10.9.200.2", 31},
		{"10.9.200.1", 32, "10.9.200.1", 32},
		{"10.9.1.11", 33, "10.9.1.12", 24},
		{"10.9.1.11", 24, "10.9.1.12", 40},
		{"fd00::11", 64, "fd00::12", 64},
		{"fd00::11", 64, "10.9.1.12", 24},
		{"fd00::11", 0, "10.9.1.12", 24},
	}
	for _, tt := range tests {
		l, p := netip.MustParseAddr(tt.local), netip.MustParseAddr(tt.peer)
		want := gid.SupReachable(l, tt.lbits, p, tt.pbits)
		local := []Port{{Index: 0, Name: "sup0", Addr: l, Bits: tt.lbits}}
		// Relay on with a route to the peer: a one-port direct verdict must not move.
		routes := []Route{{Dst: netip.PrefixFrom(p, p.BitLen()), Via: l, Dev: "sup0"}}
		for _, relay := range []bool{false, true} {
			c, _ := ChooseSupPairs(local, []PeerAddr{{p, tt.pbits}}, routes, relay)
			if got := c.Kind == PathDirect; got != want {
				t.Errorf("%s/%d vs %s/%d relay=%v: %s, SupReachable says %v", tt.local, tt.lbits, tt.peer, tt.pbits, relay, c, want)
			}
			if want && (len(c.Pairs) != 1 || c.Pairs[0] != (Pair{Port: 0, Local: l, Peer: p})) {
				t.Errorf("%s vs %s: pairs %v", tt.local, tt.peer, c.Pairs)
			}
		}
	}
}

func TestSlash31Link(t *testing.T) {
	c1 := []Port{port(0, "to-c2", "10.9.200.0/31"), port(1, "to-c3", "10.9.200.2/31")}
	c2 := []Port{port(0, "to-c1", "10.9.200.1/31")}
	c3 := []Port{port(0, "to-c1", "10.9.200.3/31")}
	if got := choose(t, c1, advertise(c2), nil, false).String(); got != "direct: port 0 10.9.200.0 -> 10.9.200.1" {
		t.Errorf("c1>c2 on a /31: %s", got)
	}
	if got := choose(t, c1, advertise(c3), nil, false).String(); got != "direct: port 1 10.9.200.2 -> 10.9.200.3" {
		t.Errorf("c1>c3 on the next /31: %s", got)
	}
	if got := choose(t, c2, advertise(c3), nil, false); got.Kind != PathNone {
		t.Errorf("c2>c3 share no /31: %s", got)
	}
}

// Several direct pairs to one peer are all used (striping), e.g. a DGX Spark port's two PCI
// functions, each on a subnet of its own (docs/mesh.md): each local function to the peer's.
func TestStripeOverPortFunctions(t *testing.T) {
	s1 := []Port{port(0, "f0", "10.9.50.1/24"), port(1, "f1", "10.9.51.1/24")}
	s2 := []Port{port(0, "f0", "10.9.50.2/24"), port(1, "f1", "10.9.51.2/24")}
	want := "direct: port 0 10.9.50.1 -> 10.9.50.2, port 1 10.9.51.1 -> 10.9.51.2"
	if got := choose(t, s1, advertise(s2), nil, false).String(); got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

// A prefix length of 0 (InfiniBand, no netdev) counts as reachable, as today, but only when no
// pair is proven by known prefixes.
func TestUnknownPrefix(t *testing.T) {
	ib := []Port{{Index: 0, Name: "ib0", Addr: netip.MustParseAddr("fe80::1")}, {Index: 1, Name: "ib1", Addr: netip.MustParseAddr("fe80::2")}}
	peerIB := []PeerAddr{{Addr: netip.MustParseAddr("fe80::9")}}
	if got := choose(t, ib, peerIB, nil, false).String(); got != "direct: port 0 fe80::1 -> fe80::9, port 1 fe80::2 -> fe80::9" {
		t.Errorf("all prefixes unknown: %s", got)
	}
	mixed := []Port{port(0, "known", "10.9.1.1/24"), {Index: 1, Name: "unknown", Addr: netip.MustParseAddr("10.9.7.1")}}
	if got := choose(t, mixed, []PeerAddr{{netip.MustParseAddr("10.9.1.2"), 24}}, nil, false).String(); got != "direct: port 0 10.9.1.1 -> 10.9.1.2" {
		t.Errorf("a proven pair must leave out the unknown port: %s", got)
	}
	if got := choose(t, mixed, []PeerAddr{{netip.MustParseAddr("10.9.9.2"), 24}}, nil, false).String(); got != "direct: port 1 10.9.7.1 -> 10.9.9.2" {
		t.Errorf("no proven pair: the unknown port is assumed reachable, as today: %s", got)
	}
}

func TestCheckAcceptedPair(t *testing.T) {
	a := netip.MustParseAddr
	b1, b1routes := labRingB["b1"], labRingBRoutes["b1"]
	tests := []struct {
		name   string
		ours   string
		theirs PeerAddr
		relay  bool
		want   string // the pair from our side, or "refused"
	}{
		{"direct", "10.9.112.1", PeerAddr{a("10.9.112.2"), 24}, false, "port 0 10.9.112.1 -> 10.9.112.2"},
		{"routed, relay on", "10.9.112.1", PeerAddr{a("10.9.123.3"), 24}, true, "port 0 10.9.112.1 -> 10.9.123.3 via 10.9.112.2"},
		{"routed, relay off", "10.9.112.1", PeerAddr{a("10.9.123.3"), 24}, false, "refused"},
		{"routed, our route leaves on another port", "10.9.141.1", PeerAddr{a("10.9.123.3"), 24}, true, "refused"},
		{"stale handle: an address we no longer have", "10.9.112.9", PeerAddr{a("10.9.112.2"), 24}, false, "refused"},
		{"stale handle: our old address, relay on", "10.9.99.1", PeerAddr{a("10.9.123.3"), 24}, true, "refused"},
		{"peer's prefix excludes us", "10.9.112.1", PeerAddr{a("10.9.112.200"), 30}, true, "refused"},
		{"peer behind a /29 of our /24 (the trap, from the acceptor)", "10.9.13.3", PeerAddr{a("10.9.13.10"), 29}, true, "refused"},
	}
	for _, tt := range tests {
		local, routes := b1, b1routes
		if strings.Contains(tt.name, "trap") {
			local, routes = labMeshA["a3"], kernelTable(labMeshA["a3"])
		}
		got, err := CheckAcceptedPair(local, a(tt.ours), tt.theirs, routes, tt.relay)
		if tt.want != "refused" {
			if err != nil || got.String() != tt.want {
				t.Errorf("%s: got %s, %v; want %s", tt.name, got, err, tt.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: accepted %s", tt.name, got)
			continue
		}
		if !strings.Contains(err.Error(), tt.ours) || !strings.Contains(err.Error(), tt.theirs.Addr.String()) {
			t.Errorf("%s: %q does not name both %s and %s", tt.name, err, tt.ours, tt.theirs.Addr)
		}
	}
}

// Bounds: at most MaxSupPorts ports and peer addresses; invalid or repeated entries refused.
// An error comes with a none Choice whose reason is the error.
func TestChooseSupPairsRejects(t *testing.T) {
	var nine []Port
	var nineAddrs []PeerAddr
	for i := range MaxSupPorts + 1 {
		nine = append(nine, port(i, fmt.Sprintf("sup%d", i), fmt.Sprintf("10.9.%d.1/24", i)))
		nineAddrs = append(nineAddrs, PeerAddr{netip.MustParseAddr(fmt.Sprintf("10.9.%d.2", i)), 24})
	}
	one := nine[:1]
	tests := []struct {
		name  string
		local []Port
		peer  []PeerAddr
	}{
		{"9 local ports", nine, nineAddrs[:1]},
		{"9 peer addresses", one, nineAddrs},
		{"repeated index", []Port{port(0, "x", "10.9.0.1/24"), port(0, "y", "10.9.1.1/24")}, nineAddrs[:1]},
		{"repeated address", []Port{port(0, "x", "10.9.0.1/24"), port(1, "y", "10.9.0.1/24")}, nineAddrs[:1]},
		{"repeated netdev", []Port{port(0, "x", "10.9.0.1/24"), port(1, "x", "10.9.1.1/24")}, nineAddrs[:1]},
		{"invalid local address", []Port{{Index: 0, Name: "x", Bits: 24}}, nineAddrs[:1]},
		{"local prefix beyond 32", []Port{{Index: 0, Name: "x", Addr: netip.MustParseAddr("10.9.0.1"), Bits: 33}}, nineAddrs[:1]},
		{"invalid peer address", one, []PeerAddr{{Bits: 24}}},
		{"repeated peer address", one, []PeerAddr{nineAddrs[0], nineAddrs[0]}},
	}
	for _, tt := range tests {
		c, err := ChooseSupPairs(tt.local, tt.peer, nil, true)
		if err == nil || c.Kind != PathNone || len(c.Pairs) != 0 || c.Reason != err.Error() {
			t.Errorf("%s: got %s, %v; want an error and none", tt.name, c, err)
		}
	}
	if _, err := ChooseSupPairs(nine[:MaxSupPorts], nineAddrs[:MaxSupPorts], nil, false); err != nil {
		t.Errorf("%d ports and addresses refused: %v", MaxSupPorts, err)
	}
	if _, err := CheckAcceptedPair(nine, nine[0].Addr, nineAddrs[0], nil, false); err == nil {
		t.Error("CheckAcceptedPair took 9 local ports")
	}
}

// Two ports of one device whose subnets overlap make every pair on them look proven, cabled
// or not: refused on either side (ours, or the peer's handle), naming both and docs/mesh.md.
func TestPortsSharingASubnet(t *testing.T) {
	unknown := Port{Index: 1, Name: "sup1", Addr: netip.MustParseAddr("10.9.0.2")}
	tests := []struct {
		name  string
		ports []Port
		share bool
	}{
		{"one /24, two ports", []Port{port(0, "sup0", "10.9.0.1/24"), port(1, "sup1", "10.9.0.2/24")}, true},
		{"a /29 inside the other's /24", []Port{port(0, "sup0", "10.9.13.1/24"), port(1, "sup1", "10.9.13.9/29")}, true},
		{"the third port shares the first's", []Port{port(0, "sup0", "10.9.0.1/24"), port(1, "sup1", "10.9.1.1/24"), port(2, "sup2", "10.9.0.2/24")}, true},
		{"two /29s of one /24", []Port{port(0, "sup0", "10.9.13.1/29"), port(1, "sup1", "10.9.13.9/29")}, false},
		{"two /30s", []Port{port(0, "sup0", "10.9.12.1/30"), port(1, "sup1", "10.9.13.1/30")}, false},
		{"two /31s side by side", []Port{port(0, "sup0", "10.9.200.0/31"), port(1, "sup1", "10.9.200.2/31")}, false},
		{"one port", []Port{port(0, "sup0", "10.9.0.1/24")}, false},
		{"a prefix unknown (cannot tell)", []Port{port(0, "sup0", "10.9.0.1/24"), unknown}, false},
	}
	peer := []PeerAddr{{netip.MustParseAddr("10.9.0.77"), 24}}
	for _, tt := range tests {
		a, b, ok := SharedSubnet(tt.ports)
		if ok != tt.share || (ok && (a.Index == b.Index || !a.Addr.IsValid() || !b.Addr.IsValid())) {
			t.Errorf("%s: SharedSubnet %v %v %v, want %v", tt.name, a, b, ok, tt.share)
		}
		// Shared or not, the choice still pairs (parallel cables and a port's two functions
		// on one subnet lead to the same node): the plugin only warns.
		if _, err := ChooseSupPairs(tt.ports, peer, nil, false); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

// A /32 address holds no other: its port is in no direct pair, and the reason says so. With
// relay, a route through a gateway on it still gives a routed pair.
func TestSlash32(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		name   string
		local  Port
		peer   PeerAddr
		routes []Route
		relay  bool
		want   string // the choice, or a reason that mentions the /32 ("hint") or not ("no hint")
	}{
		{"/32 both ends", port(0, "p", "10.9.12.1/32"), PeerAddr{a("10.9.12.2"), 32}, nil, false, "hint"},
		{"our /32, the peer's /24 holding it", port(0, "p", "10.9.12.1/32"), PeerAddr{a("10.9.12.2"), 24}, nil, false, "hint"},
		{"our /24, the peer's /32 in it", port(0, "p", "10.9.12.1/24"), PeerAddr{a("10.9.12.2"), 32}, nil, true, "hint"},
		{"two /24s, no /32", port(0, "p", "10.9.12.1/24"), PeerAddr{a("10.9.13.2"), 24}, nil, false, "no hint"},
		{"/32 routed through a gateway", port(0, "p", "10.9.12.1/32"), PeerAddr{a("10.9.34.2"), 32},
			[]Route{route("10.9.34.0/24", "10.9.12.2", "p")}, true, "routed: port 0 10.9.12.1 -> 10.9.34.2 via 10.9.12.2"},
	}
	for _, tt := range tests {
		c := choose(t, []Port{tt.local}, []PeerAddr{tt.peer}, tt.routes, tt.relay)
		hint := strings.Contains(c.Reason, "a /32 address") && strings.Contains(c.Reason, "use /31") &&
			strings.Contains(c.Reason, "docs/mesh.md")
		switch tt.want {
		case "hint", "no hint":
			if c.Kind != PathNone || hint != (tt.want == "hint") {
				t.Errorf("%s: %s", tt.name, c)
			}
		default:
			if c.String() != tt.want {
				t.Errorf("%s: %s, want %s", tt.name, c, tt.want)
			}
		}
	}
}
