package suppair

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/mpib/mpib/plugin/internal/config"
	"github.com/mpib/mpib/plugin/internal/gid"
	"github.com/mpib/mpib/plugin/internal/topo"
	"github.com/mpib/mpib/plugin/internal/wire"
)

func port(index int, name, cidr string) topo.Port {
	p := netip.MustParsePrefix(cidr)
	return topo.Port{Index: index, Name: name, Addr: p.Addr(), Bits: uint8(p.Bits())}
}

func local(ports ...topo.Port) Local { return Local{Ports: ports} }

func route(dst, via, dev string) topo.Route {
	r := topo.Route{Dst: netip.MustParsePrefix(dst), Dev: dev}
	if via != "" {
		r.Via = netip.MustParseAddr(via)
	}
	return r
}

// side is one end of a connection: its SUP ports, routes and MPIB_SUP_RELAY.
type side struct {
	l      Local
	routes []topo.Route
	relay  bool
}

// outcome is what each end decided and the errors, after the handshake's first two steps
// went through the wire encoders and decoders as the plugin runs them.
type outcome struct {
	conn, acc       Plan
	connErr, accErr error
}

func handshake(t *testing.T, listener, connector side, wanted bool) outcome {
	t.Helper()
	h := wire.Handle{Addr: netip.MustParseAddrPort("10.0.1.12:40000"), Nonce: 77}
	Advertise(&h, listener.l, listener.relay)
	b := make([]byte, wire.HandleSize)
	if err := wire.EncodeHandle(b, h); err != nil {
		t.Fatalf("listener's handle: %v", err)
	}
	got, err := wire.DecodeHandle(b)
	if err != nil {
		t.Fatalf("connector decoding the handle: %v", err)
	}
	var o outcome
	o.conn, o.connErr = Connect(got, connector.l, connector.routes, connector.relay, wanted)
	hb, err := wire.EncodeHello(o.conn.Hello(got.Nonce, connector.relay)) // sent even after a mismatch
	if err != nil {
		t.Fatalf("connector's hello for %v: %v", o.conn, err)
	}
	hello, err := wire.DecodeHello(hb)
	if err != nil {
		t.Fatalf("acceptor decoding the hello: %v", err)
	}
	o.acc, o.accErr = Accept(h, hello, listener.l, listener.routes, listener.relay, wanted)
	return o
}

// agree checks that both ends build SUP QPs or neither, on mirrored addresses.
func (o outcome) agree() error {
	if o.conn.Kind != o.acc.Kind || o.conn.Path != o.acc.Path {
		return fmt.Errorf("connector %v, acceptor %v", o.conn, o.acc)
	}
	if o.conn.Pair.Local != o.acc.Pair.Peer || o.conn.Pair.Peer != o.acc.Pair.Local {
		return fmt.Errorf("pairs do not mirror: connector %v, acceptor %v", o.conn.Pair, o.acc.Pair)
	}
	if len(o.conn.Stripe) != len(o.acc.Stripe) {
		return fmt.Errorf("striped lanes differ: connector %v, acceptor %v", o.conn, o.acc)
	}
	for i, c := range o.conn.Stripe {
		if a := o.acc.Stripe[i]; c.Pair.Local != a.Pair.Peer || c.Pair.Peer != a.Pair.Local {
			return fmt.Errorf("striped pair %d does not mirror: connector %v, acceptor %v", i+2, c.Pair, a.Pair)
		}
	}
	return nil
}

// TestStripePairs: which of ChooseSupPairs' direct pairs a connection stripes over.
func TestStripePairs(t *testing.T) {
	pair := func(port int, local, peer string) topo.Pair {
		return topo.Pair{Port: port, Local: netip.MustParseAddr(local), Peer: netip.MustParseAddr(peer)}
	}
	a, b, c, d, e := pair(0, "10.9.1.1", "10.9.1.2"), pair(1, "10.9.2.1", "10.9.2.2"), pair(2, "10.9.3.1", "10.9.3.2"),
		pair(3, "10.9.4.1", "10.9.4.2"), pair(4, "10.9.5.1", "10.9.5.2")
	tests := []struct {
		name string
		in   []topo.Pair
		want []topo.Pair
	}{
		{"one", []topo.Pair{a}, []topo.Pair{a}},
		{"parallel cables", []topo.Pair{a, b}, []topo.Pair{a, b}},
		// One port in a /24 holding two of the peer's addresses: one cable, not two.
		{"one port, two peer addresses", []topo.Pair{a, pair(0, "10.9.1.1", "10.9.1.3")}, []topo.Pair{a}},
		// Two of our ports to one peer address: one cable end on the peer, not two.
		{"two ports, one peer address", []topo.Pair{a, pair(1, "10.9.1.5", "10.9.1.2")}, []topo.Pair{a}},
		{"at most wire.MaxPairs", []topo.Pair{a, b, c, d, e}, []topo.Pair{a, b, c, d}},
	}
	for _, tt := range tests {
		got := stripePairs(tt.in)
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestAcceptRefusesStripes: the acceptor checks every pair of a striped hello.
func TestAcceptRefusesStripes(t *testing.T) {
	a3 := local(port(0, "to-a1", "10.9.13.3/29"), port(1, "to-a2", "10.9.23.3/24"), port(2, "to-a2b", "10.9.13.11/29"))
	adv := wire.Handle{Addr: netip.MustParseAddrPort("10.0.1.13:40000"), Nonce: 77}
	Advertise(&adv, a3, false)
	base := wire.Hello{Nonce: 77, Kind: wire.PairAddressed, Local: wire.SupAddr{Addr: netip.MustParseAddr("10.9.23.2"), Bits: 24},
		Peer: netip.MustParseAddr("10.9.23.3")}
	striped := func(local string, bits uint8, peer string) wire.Hello {
		h := base
		h.Stripe[0] = wire.HelloPair{Local: wire.SupAddr{Addr: netip.MustParseAddr(local), Bits: bits}, Peer: netip.MustParseAddr(peer)}
		return h
	}
	if p, err := Accept(adv, striped("10.9.13.10", 29, "10.9.13.11"), a3, nil, false, true); err != nil || len(p.Stripe) != 1 || p.Stripe[0].Port.Index != 2 {
		t.Fatalf("the lab's parallel cable: %v, %v", p, err)
	}
	tests := []struct {
		name, want string
		hello      wire.Hello
	}{
		{"not advertised", "did not advertise 10.9.13.12", striped("10.9.13.10", 29, "10.9.13.12")},
		{"not reachable from that port", "refused", striped("10.9.30.1", 24, "10.9.13.11")},
		// (A pair repeating an address of another is refused by wire.DecodeHello already.)
	}
	for _, tt := range tests {
		p, err := Accept(adv, tt.hello, a3, nil, false, true)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, %v; want an error saying %q", tt.name, p, err, tt.want)
		}
	}
}

func TestDescribe(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		name   string
		down   bool
		ib     bool
		addr   string
		bits   int
		netdev string
		why    string // "" = described
	}{
		{"RoCE /24", false, false, "10.9.1.11", 24, "a1_sup", ""},
		{"RoCE /31", false, false, "10.9.200.0", 31, "to-c2", ""},
		{"RoCE /32", false, false, "10.9.200.9", 32, "lo9", ""},
		{"a mesh port whose link is down", true, false, "10.9.141.1", 24, "sup_b4", "is down"},
		{"InfiniBand", false, true, "fe80::1", 0, "", "InfiniBand"},
		{"IPv6 GID", false, false, "fd00::11", 64, "sup0", "not IPv4"},
		{"no netdev holds it", false, false, "10.9.1.11", 0, "", "prefix is unknown"},
		{"prefix /7", false, false, "10.9.1.11", 7, "sup0", "cannot be advertised"},
		{"prefix /33", false, false, "10.9.1.11", 33, "sup0", "prefix length 33"},
		{"subnet broadcast", false, false, "10.9.1.255", 24, "sup0", "broadcast"},
	}
	for _, tt := range tests {
		p, why := Describe(3, tt.down, tt.ib, a(tt.addr), tt.bits, tt.netdev)
		if tt.why == "" {
			want := topo.Port{Index: 3, Name: tt.netdev, Addr: a(tt.addr), Bits: uint8(tt.bits)}
			if why != "" || p != want {
				t.Errorf("%s: %v, %q; want %v", tt.name, p, why, want)
			}
		} else if !strings.Contains(why, tt.why) || p != (topo.Port{}) {
			t.Errorf("%s: %v, %q; want a reason saying %q", tt.name, p, why, tt.why)
		}
	}
}

func TestAdvertise(t *testing.T) {
	var h wire.Handle
	Advertise(&h, local(port(0, "a1_sup", "10.9.1.11/24")), true)
	if !h.SupRelay || h.SupUnaddressed || h.NSup != 1 || h.Sup[0] != (wire.SupAddr{Addr: netip.MustParseAddr("10.9.1.11"), Bits: 24}) {
		t.Errorf("one port: %+v", h)
	}
	Advertise(&h, Local{Unaddressed: "SUP is InfiniBand"}, false)
	if h.SupRelay || !h.SupUnaddressed || h.NSup != 0 {
		t.Errorf("unaddressed: %+v", h)
	}
}

// Today's lab: one SUP port per fused device, island A on 10.9.1.0/24, island B on 10.9.2.0/24.
var (
	a1 = side{l: local(port(0, "a1_sup", "10.9.1.11/24"))}
	a2 = side{l: local(port(0, "a2_sup", "10.9.1.12/24"))}
	b1 = side{l: local(port(0, "b1_sup", "10.9.2.11/24"))}
)

func TestOnePortLab(t *testing.T) {
	o := handshake(t, a2, a1, true)
	if o.connErr != nil || o.accErr != nil || o.agree() != nil {
		t.Fatalf("a1>a2: %+v (%v)", o, o.agree())
	}
	if o.conn.String() != "direct 10.9.1.11/24 -> 10.9.1.12" || o.acc.String() != "direct 10.9.1.12/24 -> 10.9.1.11" {
		t.Errorf("a1>a2: connector %v, acceptor %v", o.conn, o.acc)
	}
	// A peer whose SUP address shares no subnet: no SUP QP on either side, one reason that
	// names both addresses (advanced mode with relay wants SUP across islands).
	for _, relay := range []bool{false, true} {
		a, b := a1, b1
		a.relay, b.relay = relay, relay
		o = handshake(t, b, a, true)
		if o.connErr != nil || o.accErr != nil || o.conn.SUP() || o.acc.SUP() {
			t.Fatalf("a1>b1 relay=%v: %+v", relay, o)
		}
		if !strings.Contains(o.conn.Why, "10.9.2.11/24") || !strings.Contains(o.conn.Why, "10.9.1.11/24") || o.acc.Why == "" {
			t.Errorf("a1>b1 relay=%v: reasons %q / %q", relay, o.conn.Why, o.acc.Why)
		}
	}
	// The path does not want SUP (vanilla across islands): none, and no reason to log.
	o = handshake(t, b1, a1, false)
	if o.conn.SUP() || o.acc.SUP() || o.conn.Why != "" || o.acc.Why != "" || o.connErr != nil || o.accErr != nil {
		t.Errorf("not wanted: %+v", o)
	}
}

// One port each side: SUP exactly when the rule before wire version 4 (gid.SupReachable on
// the two rails' metadata, run by dropUnreachableSup) kept it.
func TestOnePortMatchesMetadataRule(t *testing.T) {
	cidrs := []string{"10.9.1.11/24", "10.9.1.12/24", "10.9.2.11/24", "10.9.1.200/30", "10.9.1.12/16",
		"10.9.13.3/29", "10.9.13.10/29", "10.9.13.1/29", "10.9.200.0/31", "10.9.200.1/31", "10.9.200.2/31"}
	for _, lc := range cidrs {
		for _, pc := range cidrs {
			if lc == pc || netip.MustParsePrefix(lc).Addr() == netip.MustParsePrefix(pc).Addr() {
				continue
			}
			l, p := netip.MustParsePrefix(lc), netip.MustParsePrefix(pc)
			want := gid.SupReachable(l.Addr(), uint8(l.Bits()), p.Addr(), uint8(p.Bits()))
			o := handshake(t, side{l: local(port(0, "p", pc))}, side{l: local(port(0, "l", lc))}, true)
			if o.connErr != nil || o.accErr != nil || o.agree() != nil || o.conn.SUP() != want {
				t.Errorf("%s > %s: connector %v, acceptor %v (%v, %v); the metadata rule says %v", lc, pc, o.conn, o.acc, o.connErr, o.accErr, want)
			}
		}
	}
}

// The planned lab mesh: island A a full mesh with a parallel a2-a3 cable on a /29 of a1-a3's
// /24 (the /24 trap), island B a ring b1-b2-b3-b4 with routes b1<->b3 via b2, b2<->b4 via b3.
// Every connection, relay off and on, each side's lists carried through the wire: both ends
// agree; relay off never routes.
func TestMeshLab(t *testing.T) {
	nodes := map[string]Local{
		"a1": local(port(0, "to-a2", "10.9.1.1/24"), port(1, "to-a3", "10.9.13.1/29")),
		"a2": local(port(0, "to-a1", "10.9.1.2/24"), port(1, "to-a3", "10.9.23.2/24"), port(2, "to-a3b", "10.9.13.10/29")),
		"a3": local(port(0, "to-a1", "10.9.13.3/29"), port(1, "to-a2", "10.9.23.3/24"), port(2, "to-a2b", "10.9.13.11/29")),
		"b1": local(port(0, "to-b2", "10.9.112.1/24"), port(1, "to-b4", "10.9.141.1/24")),
		"b2": local(port(0, "to-b1", "10.9.112.2/24"), port(1, "to-b3", "10.9.123.2/24")),
		"b3": local(port(0, "to-b2", "10.9.123.3/24"), port(1, "to-b4", "10.9.134.3/24")),
		"b4": local(port(0, "to-b3", "10.9.134.4/24"), port(1, "to-b1", "10.9.141.4/24")),
	}
	routes := map[string][]topo.Route{
		"b1": {route("10.9.123.0/24", "10.9.112.2", "to-b2"), route("0.0.0.0/0", "10.9.141.4", "to-b4")},
		"b2": {route("10.9.134.0/24", "10.9.123.3", "to-b3")},
		"b3": {route("10.9.112.0/24", "10.9.123.2", "to-b2")},
		"b4": {route("10.9.123.0/24", "10.9.134.3", "to-b3")},
	}
	want := map[string]string{ // relay on; relay off gives none where this is routed
		"a1>a2": "direct 10.9.1.1/24 -> 10.9.1.2", "a1>a3": "direct 10.9.13.1/29 -> 10.9.13.3",
		// Both cables: the /24 first (ChooseSupPairs' order), the parallel /29 striped.
		"a2>a3": "direct 10.9.23.2/24 -> 10.9.23.3 + 10.9.13.10/29 -> 10.9.13.11",
		"a3>a2": "direct 10.9.23.3/24 -> 10.9.23.2 + 10.9.13.11/29 -> 10.9.13.10",
		"b1>b3": "routed 10.9.112.1/24 -> 10.9.123.3 via 10.9.112.2", "b3>b1": "routed 10.9.123.3/24 -> 10.9.112.1 via 10.9.123.2",
		"b2>b4": "routed 10.9.123.2/24 -> 10.9.134.4 via 10.9.123.3", "b4>b2": "routed 10.9.134.4/24 -> 10.9.123.2 via 10.9.134.3",
		"b1>b4": "direct 10.9.141.1/24 -> 10.9.141.4",
	}
	for conn, w := range want {
		from, to, _ := strings.Cut(conn, ">")
		for _, relay := range []bool{true, false} {
			o := handshake(t, side{nodes[to], routes[to], relay}, side{nodes[from], routes[from], relay}, true)
			if o.connErr != nil || o.accErr != nil {
				t.Fatalf("%s relay=%v: %v / %v", conn, relay, o.connErr, o.accErr)
			}
			if err := o.agree(); err != nil {
				t.Errorf("%s relay=%v: %v", conn, relay, err)
			}
			wantNow := w
			if !relay && strings.HasPrefix(w, "routed") {
				wantNow = "none"
			}
			if o.conn.String() != wantNow {
				t.Errorf("%s relay=%v: %v, want %s", conn, relay, o.conn, wantNow)
			}
		}
	}
}

func TestRelayMismatch(t *testing.T) {
	on, off := a2, a1
	on.relay = true
	for _, tt := range []struct {
		name                string
		listener, connector side
		conn, acc           string
	}{
		{"listener on", on, off, "ours (connecting side) 0, the peer's 1", "ours (listening side) 1, the peer's 0"},
		{"connector on", off, on, "ours (connecting side) 1, the peer's 0", "ours (listening side) 0, the peer's 1"},
	} {
		for _, wanted := range []bool{true, false} { // a mismatch is an error whatever the path
			o := handshake(t, tt.listener, tt.connector, wanted)
			var m *RelayMismatch
			if !errors.As(o.connErr, &m) || !errors.As(o.accErr, &m) {
				t.Fatalf("%s: errors %v / %v, want RelayMismatch on both sides", tt.name, o.connErr, o.accErr)
			}
			for _, c := range []struct {
				err  error
				want string
			}{{o.connErr, tt.conn}, {o.accErr, tt.acc}} {
				if !strings.Contains(c.err.Error(), "MPIB_SUP_RELAY") || !strings.Contains(c.err.Error(), c.want) {
					t.Errorf("%s: %q does not say MPIB_SUP_RELAY and %q", tt.name, c.err, c.want)
				}
			}
			if o.conn.SUP() {
				t.Errorf("%s: the connector's hello named %v after a mismatch", tt.name, o.conn)
			}
		}
	}
}

func TestAcceptRefuses(t *testing.T) {
	adv := wire.Handle{}
	Advertise(&adv, a2.l, false)
	hello := func(local, peer string) wire.Hello {
		p := netip.MustParsePrefix(local)
		return wire.Hello{Nonce: 1, Kind: wire.PairAddressed, Local: wire.SupAddr{Addr: p.Addr(), Bits: uint8(p.Bits())}, Peer: netip.MustParseAddr(peer)}
	}
	unaddressed := wire.Handle{}
	Advertise(&unaddressed, Local{Unaddressed: "SUP is InfiniBand"}, false)
	tests := []struct {
		name  string
		adv   wire.Handle
		hello wire.Hello
		now   Local
		want  []string
	}{
		{"an address the handle did not advertise", adv, hello("10.9.1.11/24", "10.9.1.13"), a2.l,
			[]string{"10.9.1.13", "10.9.1.11/24", "did not advertise", "10.9.1.12/24"}},
		{"a pair with an unaddressed handle", unaddressed, hello("10.9.1.11/24", "10.9.1.12"), a2.l,
			[]string{"10.9.1.12", "10.9.1.11", "unaddressed"}},
		{"stale handle: the advertised address is gone", adv, hello("10.9.1.11/24", "10.9.1.12"),
			local(port(0, "a2_sup", "10.9.1.200/24")), []string{"10.9.1.12", "10.9.1.11", "stale"}},
		{"the connector's prefix excludes us", adv, hello("10.9.1.11/30", "10.9.1.12"), a2.l,
			[]string{"10.9.1.12", "10.9.1.11", "no common subnet"}},
		{"our port became unaddressed", adv, hello("10.9.1.11/24", "10.9.1.12"), Local{Unaddressed: "x"},
			[]string{"10.9.1.12", "10.9.1.11"}},
	}
	for _, tt := range tests {
		p, err := Accept(tt.adv, tt.hello, tt.now, nil, false, true)
		if err == nil {
			t.Errorf("%s: accepted %v", tt.name, p)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tt.name, err, w)
			}
		}
	}
	// Not wanted on our side: the pair is ignored (the metadata check names the setting).
	if p, err := Accept(adv, hello("10.9.1.11/24", "10.9.1.13"), a2.l, nil, false, false); err != nil || p.SUP() {
		t.Errorf("not wanted: %v, %v", p, err)
	}
}

func TestUnaddressed(t *testing.T) {
	ib := side{l: Local{Unaddressed: "SUP is InfiniBand"}}
	for _, tt := range []struct {
		name                string
		listener, connector side
	}{
		{"both InfiniBand", ib, ib}, {"listener unaddressed", ib, a1}, {"connector unaddressed", a2, ib},
	} {
		o := handshake(t, tt.listener, tt.connector, true)
		if o.connErr != nil || o.accErr != nil || o.conn.Kind != wire.PairUnaddressed || o.acc.Kind != wire.PairUnaddressed {
			t.Errorf("%s: %+v", tt.name, o)
		}
	}
	gidOf := func(a string) [16]byte { return netip.MustParseAddr(a).As16() }
	roce := func(a string, bits uint8) wire.RailInfo {
		return wire.RailInfo{LaneInfo: wire.LaneInfo{GID: gidOf(a), LinkLayer: wire.LinkLayerEthernet, PrefixLen: bits}}
	}
	for _, tt := range []struct {
		name         string
		mine, theirs wire.RailInfo
		ok           bool
	}{
		{"InfiniBand", wire.RailInfo{LaneInfo: wire.LaneInfo{LinkLayer: wire.LinkLayerInfiniBand}}, wire.RailInfo{LaneInfo: wire.LaneInfo{LinkLayer: wire.LinkLayerInfiniBand}}, true},
		{"same /24", roce("10.9.1.11", 24), roce("10.9.1.12", 24), true},
		{"prefix unknown", roce("10.9.1.11", 0), roce("10.9.2.12", 24), true},
		{"IPv6, one /64", roce("fd00::11", 64), roce("fd00::12", 64), true},
		{"IPv6, two /64s", roce("fd00::11", 64), roce("fd01::12", 64), false},
		{"two /24s", roce("10.9.1.11", 24), roce("10.9.2.11", 24), false},
	} {
		ok, why := UnaddressedReachable(tt.mine, tt.theirs)
		if ok != tt.ok || (!ok && !strings.Contains(why, "share no subnet")) {
			t.Errorf("%s: %v %q", tt.name, ok, why)
		}
	}
}

func TestCheckPeerGID(t *testing.T) {
	o := handshake(t, a2, a1, true)
	if err := o.conn.CheckPeerGID(netip.MustParseAddr("::ffff:10.9.1.12")); err != nil {
		t.Errorf("the named address as a mapped GID: %v", err)
	}
	err := o.conn.CheckPeerGID(netip.MustParseAddr("::ffff:10.9.1.99"))
	if err == nil || !strings.Contains(err.Error(), "10.9.1.99") || !strings.Contains(err.Error(), "10.9.1.11") {
		t.Errorf("another GID: %v", err)
	}
	if err := (Plan{Kind: wire.PairUnaddressed}).CheckPeerGID(netip.MustParseAddr("fe80::1")); err != nil {
		t.Errorf("unaddressed: %v", err)
	}
}

// The handle carries as many SUP addresses as a device may have ports, and the configuration
// allows as many (the plugin's build checks config against the C arrays).
func TestBoundsAgree(t *testing.T) {
	if topo.MaxSupPorts != wire.MaxSupAddrs || config.MaxSupPorts != topo.MaxSupPorts {
		t.Fatalf("topo.MaxSupPorts %d, wire.MaxSupAddrs %d, config.MaxSupPorts %d", topo.MaxSupPorts, wire.MaxSupAddrs, config.MaxSupPorts)
	}
}

// RecordPath is what an advanced-mode agent reads of the SUP path (sup_path, spec 4.3).
func TestRecordPath(t *testing.T) {
	for _, c := range []struct {
		name string
		plan Plan
		want uint8
	}{
		{"no SUP", Plan{}, RecordNone},
		{"no SUP, with a reason", Plan{Kind: wire.PairNone, Why: "no direct pair"}, RecordNone},
		{"direct", Plan{Kind: wire.PairAddressed, Path: topo.PathDirect}, RecordDirect},
		{"routed", Plan{Kind: wire.PairAddressed, Path: topo.PathRouted}, RecordRouted},
		{"addressed but no path (never built)", Plan{Kind: wire.PairAddressed, Path: topo.PathNone}, RecordNone},
		{"unaddressed (InfiniBand, no IPv4 GID)", Plan{Kind: wire.PairUnaddressed}, RecordIsland},
	} {
		if got := c.plan.RecordPath(); got != c.want {
			t.Errorf("%s: RecordPath() = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestCheckPeerLaneGID: each striped lane's GID in the peer's metadata must carry its pair's
// peer address (the lab's a2 -> a3 over both cables).
func TestCheckPeerLaneGID(t *testing.T) {
	a2 := local(port(0, "to-a1", "10.9.1.2/24"), port(1, "to-a3", "10.9.23.2/24"), port(2, "to-a3b", "10.9.13.10/29"))
	a3 := local(port(0, "to-a1", "10.9.13.3/29"), port(1, "to-a2", "10.9.23.3/24"), port(2, "to-a2b", "10.9.13.11/29"))
	o := handshake(t, side{a3, nil, false}, side{a2, nil, false}, true)
	if o.connErr != nil || o.accErr != nil || len(o.conn.Stripe) != 1 {
		t.Fatalf("a2 -> a3: %v %v / %v %v", o.conn, o.connErr, o.acc, o.accErr)
	}
	if err := o.conn.CheckPeerLaneGID(0, netip.MustParseAddr("::ffff:10.9.13.11")); err != nil {
		t.Errorf("connector, the parallel cable's far end: %v", err)
	}
	if err := o.acc.CheckPeerLaneGID(0, netip.MustParseAddr("::ffff:10.9.13.10")); err != nil {
		t.Errorf("acceptor, the parallel cable's far end: %v", err)
	}
	// The first cable's address on the striped lane: the peer put that lane on the wrong port.
	if err := o.conn.CheckPeerLaneGID(0, netip.MustParseAddr("::ffff:10.9.23.3")); err == nil || !strings.Contains(err.Error(), "10.9.13.11") {
		t.Errorf("a lane on the wrong port: %v", err)
	}
	if err := o.conn.CheckPeerLaneGID(1, netip.MustParseAddr("::ffff:10.9.13.11")); err == nil {
		t.Error("a lane the plan does not have: no error")
	}
}

// A listener's SUP port that goes down between listen and accept: the connector chose a pair
// on it from the handle, and the acceptor accepts it on the port it now holds as down (the
// connection starts degraded there, as on a device's only port). A port that is gone
// altogether (its address removed) is still refused.
func TestAcceptOnPortDownSinceListen(t *testing.T) {
	q0, q1 := port(0, "b_q0", "10.9.12.2/30"), port(1, "b_q1", "10.9.21.2/30")
	p0, p1 := port(0, "a_p0", "10.9.12.1/30"), port(1, "a_p1", "10.9.21.1/30")
	tests := []struct {
		name      string
		connector Local
		atAccept  Local
		want      string // the acceptor's plan, or "refused"
		lanePorts []int  // the acceptor's port of each lane
	}{
		{"the pair's port down", local(p0), Local{Ports: []topo.Port{q1}, Down: []topo.Port{q0}},
			"direct 10.9.12.2/30 -> 10.9.12.1", []int{0}},
		{"the first lane's port down", local(p0, p1), Local{Ports: []topo.Port{q1}, Down: []topo.Port{q0}},
			"direct 10.9.12.2/30 -> 10.9.12.1 + 10.9.21.2/30 -> 10.9.21.1", []int{0, 1}},
		{"the striped lane's port down", local(p0, p1), Local{Ports: []topo.Port{q0}, Down: []topo.Port{q1}},
			"direct 10.9.12.2/30 -> 10.9.12.1 + 10.9.21.2/30 -> 10.9.21.1", []int{0, 1}},
		{"every port down", local(p0), Local{Down: []topo.Port{q0, q1}, Unaddressed: "SUP port b_q0: the port is down"},
			"direct 10.9.12.2/30 -> 10.9.12.1", []int{0}},
		{"the pair's port gone", local(p0), local(q1), "refused", nil},
	}
	for _, tt := range tests {
		adv := wire.Handle{Addr: netip.MustParseAddrPort("10.0.1.12:40000"), Nonce: 5}
		Advertise(&adv, local(q0, q1), false)
		conn, err := Connect(adv, tt.connector, nil, false, true)
		if err != nil || !conn.SUP() {
			t.Fatalf("%s: the connector's plan %v, %v", tt.name, conn, err)
		}
		acc, err := Accept(adv, conn.Hello(5, false), tt.atAccept, nil, false, true)
		if tt.want == "refused" {
			if err == nil || !strings.Contains(err.Error(), "stale") {
				t.Errorf("%s: %v, %v; want a refusal saying stale", tt.name, acc, err)
			}
			continue
		}
		if err != nil || acc.String() != tt.want {
			t.Errorf("%s: %v, %v; want %s", tt.name, acc, err, tt.want)
			continue
		}
		if err := (outcome{conn: conn, acc: acc}).agree(); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
		got := []int{acc.Port.Index}
		for _, l := range acc.Stripe {
			got = append(got, l.Port.Index)
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.lanePorts) || acc.Port.Addr != acc.Pair.Local {
			t.Errorf("%s: lanes on ports %v (first %v), want %v", tt.name, got, acc.Port, tt.lanePorts)
		}
	}
}

// The relay variant: b1 reaches b3 through b2, and b3's port towards b2 (the pair's port and
// its route's egress) went down after b3 listened.
func TestAcceptRoutedOnPortDownSinceListen(t *testing.T) {
	toB2, toB4 := port(0, "to-b2", "10.9.123.3/24"), port(1, "to-b4", "10.9.134.3/24")
	b1 := side{local(port(0, "to-b2", "10.9.112.1/24"), port(1, "to-b4", "10.9.141.1/24")),
		[]topo.Route{route("10.9.123.0/24", "10.9.112.2", "to-b2")}, true}
	b3Routes := []topo.Route{route("10.9.112.0/24", "10.9.123.2", "to-b2")}
	adv := wire.Handle{Nonce: 5}
	Advertise(&adv, local(toB2, toB4), true)
	conn, err := Connect(adv, b1.l, b1.routes, true, true)
	if err != nil || conn.String() != "routed 10.9.112.1/24 -> 10.9.123.3 via 10.9.112.2" {
		t.Fatalf("b1>b3: %v, %v", conn, err)
	}
	acc, err := Accept(adv, conn.Hello(5, true), Local{Ports: []topo.Port{toB4}, Down: []topo.Port{toB2}}, b3Routes, true, true)
	if err != nil || acc.String() != "routed 10.9.123.3/24 -> 10.9.112.1 via 10.9.123.2" || acc.Port != toB2 {
		t.Errorf("b3 accepting on its down port to b2: %v on %v, %v", acc, acc.Port, err)
	}
}

// A port that is down is neither advertised nor chosen by the connector: its peers are
// reached on another cable.
func TestDownPortNotChosen(t *testing.T) {
	p0, p1 := port(0, "a_p0", "10.9.12.1/30"), port(1, "a_p1", "10.9.21.1/30")
	withDown := Local{Ports: []topo.Port{p1}, Down: []topo.Port{p0}}
	var h wire.Handle
	Advertise(&h, withDown, false)
	if h.NSup != 1 || h.Sup[0].Addr != p1.Addr {
		t.Errorf("advertised %v, want only %v", h.SupAddrs(), p1)
	}
	peer := wire.Handle{}
	Advertise(&peer, local(port(0, "b_q0", "10.9.12.2/30"), port(1, "b_q1", "10.9.21.2/30")), false)
	plan, err := Connect(peer, withDown, nil, false, true)
	if err != nil || plan.String() != "direct 10.9.21.1/30 -> 10.9.21.2" {
		t.Errorf("connecting with port 0 down: %v, %v", plan, err)
	}
}

// Ports of one device on one subnet (a port's two PCI functions, parallel cables) still pair
// and stripe: both ends agree, as before the subnets were compared.
func TestPortsSharingASubnetStillPair(t *testing.T) {
	flatA := local(port(0, "a_p0", "10.9.0.1/24"), port(1, "a_p1", "10.9.0.2/24"))
	flatB := local(port(0, "b_q0", "10.9.0.3/24"), port(1, "b_q1", "10.9.0.4/24"))
	o := handshake(t, side{l: flatB}, side{l: flatA}, true)
	if o.connErr != nil || o.accErr != nil || !o.conn.SUP() || !o.acc.SUP() || len(o.conn.Stripe) != len(o.acc.Stripe) {
		t.Errorf("both flat: %+v", o)
	}
}

// A /32 SUP address holds no peer: no direct pair, and the reason says why and what to do.
func TestSlash32Reason(t *testing.T) {
	o := handshake(t, side{l: local(port(0, "b_q0", "10.9.12.2/32"))}, side{l: local(port(0, "a_p0", "10.9.12.1/32"))}, true)
	if o.connErr != nil || o.accErr != nil || o.conn.SUP() || o.acc.SUP() {
		t.Fatalf("/32 both ends: %+v", o)
	}
	if !strings.Contains(o.conn.Why, "/32 address") || !strings.Contains(o.conn.Why, "use /31") {
		t.Errorf("the connector's reason %q does not explain the /32", o.conn.Why)
	}
}

// The SUP rail's QP count: MPIB_SUP_QP rounded up to a multiple of the lanes, so that each
// lane (QP q on lane q mod lanes, messages round-robin over the QPs) carries an equal share.
func TestSupQPCount(t *testing.T) {
	for _, c := range []struct{ configured, lanes, want int }{
		{1, 1, 1},
		{3, 1, 3},
		{16, 1, 16},
		{1, 2, 2}, // a QP on each lane at least
		{2, 2, 2},
		{3, 2, 4},
		{5, 4, 8},
		{4, 3, 6},
		{16, 2, 16},
		{15, 2, 16},
		{16, 3, 15}, // 18 is beyond the rail's 16: the largest multiple that fits
		{14, 4, 16},
		{16, 4, 16},
	} {
		got := SupQPCount(c.configured, c.lanes)
		if got != c.want || got%c.lanes != 0 || got > MaxQPsPerRail {
			t.Errorf("SupQPCount(%d, %d) = %d, want %d", c.configured, c.lanes, got, c.want)
		}
	}
}

// TestDeadSupDevice: a side whose every SUP port's device died builds no SUP QPs, and both
// ends agree on that through the wire, whatever the other end's ports (addressed, unaddressed
// InfiniBand); an acceptor whose device died after its handle was written refuses a pair on it
// with the reason instead of building QPs on a dead device.
func TestDeadSupDevice(t *testing.T) {
	dead := side{l: Local{Dead: "the device of every SUP port of fused device 0 died"}}
	ib := side{l: Local{Unaddressed: "SUP is InfiniBand"}}
	for _, tt := range []struct {
		name                string
		listener, connector side
	}{
		{"dead listener, addressed connector", dead, a1},
		{"dead listener, unaddressed connector", dead, ib},
		{"dead connector, addressed listener", a2, dead},
		{"dead connector, unaddressed listener", ib, dead},
		{"both dead", dead, dead},
	} {
		o := handshake(t, tt.listener, tt.connector, true)
		if o.connErr != nil || o.accErr != nil || o.conn.SUP() || o.acc.SUP() {
			t.Errorf("%s: want no SUP on either end: %+v", tt.name, o)
		}
		if err := o.agree(); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	// The listener's device died after it wrote an addressed handle.
	h := wire.Handle{Addr: netip.MustParseAddrPort("10.0.1.12:40000"), Nonce: 77}
	Advertise(&h, a2.l, false)
	plan, err := Connect(h, a1.l, nil, false, true)
	if err != nil || !plan.SUP() {
		t.Fatalf("connector's plan: %v %v", plan, err)
	}
	if _, err := Accept(h, plan.Hello(h.Nonce, false), dead.l, nil, false, true); err == nil || !strings.Contains(err.Error(), "died") {
		t.Errorf("acceptor whose SUP device died since its handle: err %v, want a refusal naming the death", err)
	}
}
