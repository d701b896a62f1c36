// Package suppair decides a connection's SUP pair on both ends of the handshake (docs/topology.md,
// "SUP ports on a mesh"). The listener describes its SUP ports in the
// handle (Advertise); the connector chooses a pair with topo.ChooseSupPairs and names it in
// its hello (Connect, Plan.Hello); the acceptor checks the named pair with
// topo.CheckAcceptedPair (Accept). Both ends know the verdict before any SUP QP exists, so a
// peer without a usable pair gets no SUP QP at all. Pure: the plugin reads GIDs, netdevs and
// routes, and builds QPs from the verdict.
package suppair

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/mpib/mpib/plugin/internal/gid"
	"github.com/mpib/mpib/plugin/internal/topo"
	"github.com/mpib/mpib/plugin/internal/wire"
)

// Local is one side's SUP ports as read now: every port of the fused device that could be
// described (MPIB_HCA_SUP names up to MaxSupPorts per device, joined by '+'), at most
// MaxSupPorts in Ports and Down together.
type Local struct {
	Ports []topo.Port // the described ports that are up: IPv4 address and real prefix
	// Down is the described ports of a device with several, whose link is down now. A listener
	// does not advertise them and a connector does not choose them (their peers are reached on
	// another cable, through a relay or on SOUT), but an acceptor accepts a pair naming one: the
	// connector chose it from a handle written while it was up, or its own end of the cable has
	// not seen the link go down yet. The connection then starts degraded on that port, as on a
	// device's only port (docs/failover.md, "Degraded start"), rather than being refused.
	Down []topo.Port
	// Unaddressed, when set, says why the SUP port cannot be described (Ports is then empty):
	// the connection decides SUP as before wire version 4 (UnaddressedReachable).
	Unaddressed string
	// Dead, when set, says that the device of every SUP port died (Ports, Down and Unaddressed
	// are then empty): no connection builds SUP QPs, whose verbs calls would fail there. The
	// listener advertises no SUP address (neither addressed nor unaddressed), and a connector
	// given such a handle plans no SUP either.
	Dead string
}

// all is every described port, up or down, in the device's port order: what an acceptor
// accepts a pair on, and what the checks of a device's port list look at.
func (l Local) all() []topo.Port {
	ports := append(slices.Clone(l.Ports), l.Down...)
	slices.SortFunc(ports, func(a, b topo.Port) int { return a.Index - b.Index })
	return ports
}

// Describe turns one SUP port's facts into a described port, or says why it cannot be one:
// left out because it is down (leftOutDown: the caller's rule, a mesh device's port whose link
// is down, which is neither advertised nor chosen; a device's only port is described down too,
// its connections fail over and back), InfiniBand (no IP subnet), a GID whose address is not
// IPv4, an address no netdev of this namespace holds (bits 0: prefix unknown), or one the
// handle could not carry. The plugin describes a mesh port that is down with leftOutDown false
// and lists it in Local.Down, since an acceptor still accepts a pair on it.
func Describe(index int, leftOutDown, infiniband bool, addr netip.Addr, bits int, netdev string) (topo.Port, string) {
	switch {
	case leftOutDown:
		return topo.Port{}, "the port is down"
	case infiniband:
		return topo.Port{}, "SUP is InfiniBand"
	case !addr.Is4():
		return topo.Port{}, fmt.Sprintf("the SUP GID's address %v is not IPv4", addr)
	case bits <= 0 || netdev == "":
		return topo.Port{}, fmt.Sprintf("no netdev here holds the SUP address %v (its prefix is unknown)", addr)
	case bits > 32:
		return topo.Port{}, fmt.Sprintf("the SUP address %v has prefix length %d", addr, bits)
	}
	if err := wire.CheckSupAddr(wire.SupAddr{Addr: addr, Bits: uint8(bits)}); err != nil {
		return topo.Port{}, fmt.Sprintf("%v/%d cannot be advertised: %v", addr, bits, err)
	}
	return topo.Port{Index: index, Name: netdev, Addr: addr, Bits: uint8(bits)}, ""
}

// Advertise writes the listener's SUP fields into its handle: its described ports, or
// unaddressed, and its MPIB_SUP_RELAY.
func Advertise(h *wire.Handle, l Local, relay bool) {
	h.SupRelay = relay
	if l.Dead != "" {
		h.SupUnaddressed = false
		h.SetSupAddrs(nil)
		return
	}
	if l.Unaddressed != "" || len(l.Ports) == 0 || len(l.Ports) > wire.MaxSupAddrs {
		h.SupUnaddressed = true
		h.SetSupAddrs(nil)
		return
	}
	addrs := make([]wire.SupAddr, len(l.Ports))
	for i, p := range l.Ports {
		addrs[i] = wire.SupAddr{Addr: p.Addr, Bits: p.Bits}
	}
	h.SupUnaddressed = false
	h.SetSupAddrs(addrs)
}

// Plan is one side's SUP verdict for a connection.
type Plan struct {
	Kind wire.PairKind
	Path topo.PathKind // PairAddressed: direct or routed
	Port topo.Port     // PairAddressed: our port
	Pair topo.Pair     // PairAddressed: from our side (Local ours, Peer theirs, Via the gateway when routed)
	// Stripe: further direct pairs to the peer (parallel cables), each on a port and a peer
	// address no other pair of the plan uses; the SUP rail stripes over all of them. At most
	// wire.MaxPairs - 1; none for a routed pair.
	Stripe []Lane
	Why    string // PairNone while the path wanted SUP: why not, for one INFO line
}

// Lane is one further pair of a striped plan.
type Lane struct {
	Port topo.Port
	Pair topo.Pair
}

// SUP says whether the connection builds SUP QPs.
func (p Plan) SUP() bool { return p.Kind != wire.PairNone }

// The agent segment's sup_path values (docs/shm-format.md 4.3, version 6).
const (
	RecordNone   = 0 // no SUP QPs
	RecordDirect = 1 // the peer's address is in our port's connected prefix
	RecordRouted = 2 // through the fabric's forwarding (MPIB_SUP_RELAY=1)
	RecordIsland = 3 // a pair without addresses: the SOUT island says SUP reaches
)

// RecordPath is the plan's sup_path for the agent's connection record: how SUP reaches the
// peer, so that an advanced-mode agent can weigh a routed SUP path differently.
func (p Plan) RecordPath() uint8 {
	switch {
	case p.Kind == wire.PairUnaddressed:
		return RecordIsland
	case p.Kind != wire.PairAddressed:
		return RecordNone
	case p.Path == topo.PathRouted:
		return RecordRouted
	case p.Path == topo.PathDirect:
		return RecordDirect
	}
	return RecordNone
}

func (p Plan) String() string {
	switch p.Kind {
	case wire.PairAddressed:
		s := fmt.Sprintf("%v %v/%d -> %v", p.Path, p.Pair.Local, p.Port.Bits, p.Pair.Peer) + via(p.Pair)
		for _, l := range p.Stripe {
			s += fmt.Sprintf(" + %v/%d -> %v", l.Pair.Local, l.Port.Bits, l.Pair.Peer)
		}
		return s
	case wire.PairUnaddressed:
		return "unaddressed"
	}
	return "none"
}

func via(p topo.Pair) string {
	if p.Via.IsValid() {
		return fmt.Sprintf(" via %v", p.Via)
	}
	return ""
}

// RelayMismatch is a connection whose two ends set MPIB_SUP_RELAY differently: they would
// disagree on which peers SUP reaches, and so on QP counts and the path of every message.
type RelayMismatch struct {
	Ours, Theirs bool
	Side         string // ours: "connecting" or "listening"
}

func (e *RelayMismatch) Error() string {
	return fmt.Sprintf("MPIB_SUP_RELAY differs: ours (%s side) %d, the peer's %d: set it the same on every rank",
		e.Side, b2i(e.Ours), b2i(e.Theirs))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Connect is the connector's decision from the listener's handle. wanted: the mode and path
// class want SUP QPs (mpib_sup_qps_wanted; the SOUT island still gives the path class). A relay
// mismatch is an error the caller reports after sending its hello, so that the listener fails
// too instead of waiting. When ChooseSupPairs finds several direct pairs (parallel cables, a
// port's two functions) the plan stripes over those that use distinct ports on both sides
// (stripePairs), the first pair first. Our ports that are down are checked with the others
// (a port list is valid or not whatever its links' states) but not chosen.
func Connect(h wire.Handle, l Local, routes []topo.Route, relay, wanted bool) (Plan, error) {
	if h.SupRelay != relay {
		return Plan{}, &RelayMismatch{Ours: relay, Theirs: h.SupRelay, Side: "connecting"}
	}
	if !wanted {
		return Plan{}, nil
	}
	if l.Dead != "" {
		return Plan{Why: l.Dead}, nil
	}
	if !h.SupUnaddressed && h.NSup == 0 {
		return Plan{Why: "the listener advertised no SUP port (its SUP device died)"}, nil
	}
	if l.Unaddressed != "" || h.SupUnaddressed {
		return Plan{Kind: wire.PairUnaddressed}, nil
	}
	if err := topo.CheckPorts(l.all()); err != nil {
		return Plan{}, fmt.Errorf("choosing the SUP pair: %w", err)
	}
	c, err := topo.ChooseSupPairs(l.Ports, peerAddrs(h.SupAddrs()), routes, relay)
	if err != nil {
		return Plan{}, fmt.Errorf("choosing the SUP pair: %w", err)
	}
	if c.Kind == topo.PathNone {
		return Plan{Why: c.Reason}, nil
	}
	pair := c.Pairs[0]
	plan := Plan{Kind: wire.PairAddressed, Path: c.Kind, Port: portOf(l, pair.Port), Pair: pair}
	if c.Kind == topo.PathDirect {
		for _, q := range stripePairs(c.Pairs)[1:] {
			plan.Stripe = append(plan.Stripe, Lane{Port: portOf(l, q.Port), Pair: q})
		}
	}
	return plan, nil
}

// stripePairs is the pairs a striped connection uses, in order: each takes a local port and a
// peer address no earlier one took (one lane per cable end), at most wire.MaxPairs. Two pairs
// from one port to two addresses of the peer would be one cable counted twice.
func stripePairs(pairs []topo.Pair) []topo.Pair {
	var out []topo.Pair
	ports, peers := map[int]bool{}, map[netip.Addr]bool{}
	for _, p := range pairs {
		if len(out) == wire.MaxPairs || ports[p.Port] || peers[p.Peer] {
			continue
		}
		ports[p.Port], peers[p.Peer] = true, true
		out = append(out, p)
	}
	return out
}

// Hello is the connector's hello for this plan.
func (p Plan) Hello(nonce uint64, relay bool) wire.Hello {
	h := wire.Hello{Nonce: nonce, SupRelay: relay, Kind: p.Kind}
	if p.Kind == wire.PairAddressed {
		h.Local, h.Peer = wire.SupAddr{Addr: p.Pair.Local, Bits: p.Port.Bits}, p.Pair.Peer
		for i, l := range p.Stripe {
			h.Stripe[i] = wire.HelloPair{Local: wire.SupAddr{Addr: l.Pair.Local, Bits: l.Port.Bits}, Peer: l.Pair.Peer}
		}
	}
	return h
}

// Accept is the acceptor's check of the connector's hello against the handle it advertised
// (adv) and its ports now. It refuses a relay mismatch, a pair naming an address the handle did
// not advertise, and one CheckAcceptedPair refuses (an address we no longer have, a peer we
// cannot reach from that port); every refusal names both addresses. When our path does not
// want SUP a named pair is ignored: the metadata check then names the differing setting.
func Accept(adv wire.Handle, hello wire.Hello, l Local, routes []topo.Route, relay, wanted bool) (Plan, error) {
	if hello.SupRelay != relay {
		return Plan{}, &RelayMismatch{Ours: relay, Theirs: hello.SupRelay, Side: "listening"}
	}
	if !wanted {
		return Plan{}, nil
	}
	switch {
	case hello.Kind == wire.PairNone:
		return Plan{Why: "the connecting side found no SUP pair (its log says why)"}, nil
	case l.Dead != "":
		return Plan{}, fmt.Errorf("SUP pair refused: %s after our handle was written", l.Dead)
	case hello.Kind == wire.PairUnaddressed:
		return Plan{Kind: wire.PairUnaddressed}, nil
	}
	pair, err := acceptPair(adv, wire.HelloPair{Local: hello.Local, Peer: hello.Peer}, l, routes, relay)
	if err != nil {
		return Plan{}, err
	}
	path := topo.PathDirect
	if pair.Via.IsValid() {
		path = topo.PathRouted
	}
	plan := Plan{Kind: wire.PairAddressed, Path: path, Port: portOf(l, pair.Port), Pair: pair}
	ports := map[int]bool{pair.Port: true}
	for _, hp := range hello.Stripe[:hello.Pairs()-1] {
		q, err := acceptPair(adv, hp, l, routes, relay)
		if err != nil {
			return Plan{}, err
		}
		// Striping is over parallel cables: every lane direct, each on a port of its own.
		if path != topo.PathDirect || q.Via.IsValid() || ports[q.Port] {
			return Plan{}, fmt.Errorf("SUP pair %v (ours) - %v (peer) refused: a striped pair must be direct, on a port no other "+
				"pair of the connection uses (the first pair is %v)", hp.Peer, hp.Local.Addr, plan)
		}
		ports[q.Port] = true
		plan.Stripe = append(plan.Stripe, Lane{Port: portOf(l, q.Port), Pair: q})
	}
	return plan, nil
}

// acceptPair checks one pair of a hello: an address our handle advertised, which our port
// still has, up or down, and reaches the peer's from (CheckAcceptedPair).
func acceptPair(adv wire.Handle, hp wire.HelloPair, l Local, routes []topo.Route, relay bool) (topo.Pair, error) {
	if !adv.HasSupAddr(hp.Peer) {
		return topo.Pair{}, fmt.Errorf("SUP pair %v (ours) - %v (peer) refused: our handle did not advertise %v (it advertised %s)",
			hp.Peer, hp.Local, hp.Peer, advertised(adv))
	}
	theirs := topo.PeerAddr{Addr: hp.Local.Addr, Bits: hp.Local.Bits}
	return topo.CheckAcceptedPair(l.all(), hp.Peer, theirs, routes, relay)
}

// CheckPeerGID checks that the peer's SUP GID in its metadata is the address the pair names:
// a peer whose QPs sit on another port would never be reached.
func (p Plan) CheckPeerGID(peerGID netip.Addr) error {
	if p.Kind != wire.PairAddressed {
		return nil
	}
	return checkPairGID(p.Pair, "SUP GID", peerGID)
}

// CheckPeerLaneGID checks a striped lane's GID in the peer's metadata likewise: lane i+2
// carries the peer address of the plan's Stripe[i].
func (p Plan) CheckPeerLaneGID(i int, peerGID netip.Addr) error {
	if i < 0 || i >= len(p.Stripe) {
		return fmt.Errorf("the plan has no striped SUP lane %d", i+2)
	}
	return checkPairGID(p.Stripe[i].Pair, fmt.Sprintf("SUP lane %d GID", i+2), peerGID)
}

// checkPairGID: the peer's GID (named what) carries the pair's peer address.
func checkPairGID(pair topo.Pair, what string, peerGID netip.Addr) error {
	if peerGID.Unmap() == pair.Peer {
		return nil
	}
	return fmt.Errorf("the peer's %s carries %v, not %v, the address of the SUP pair %v (ours) - %v (peer)",
		what, peerGID.Unmap(), pair.Peer, pair.Local, pair.Peer)
}

// UnaddressedReachable is the rule for PairUnaddressed, decided on both ends from the two
// rails' metadata as before wire version 4: InfiniBand always; RoCE when each GID's address
// lies in the other's subnet (gid.SupReachable, a prefix of 0 counting as reachable). why
// names both addresses when not.
func UnaddressedReachable(mine, theirs wire.RailInfo) (ok bool, why string) {
	if mine.LinkLayer != wire.LinkLayerEthernet {
		return true, ""
	}
	la, pa := netip.AddrFrom16(mine.GID).Unmap(), netip.AddrFrom16(theirs.GID).Unmap()
	if gid.SupReachable(la, mine.PrefixLen, pa, theirs.PrefixLen) {
		return true, ""
	}
	return false, fmt.Sprintf("its SUP address %v/%d and ours %v/%d share no subnet", pa, theirs.PrefixLen, la, mine.PrefixLen)
}

func peerAddrs(s []wire.SupAddr) []topo.PeerAddr {
	out := make([]topo.PeerAddr, len(s))
	for i, a := range s {
		out[i] = topo.PeerAddr{Addr: a.Addr, Bits: a.Bits}
	}
	return out
}

// portOf is our port with the given index, up or down.
func portOf(l Local, index int) topo.Port {
	for _, p := range l.all() {
		if p.Index == index {
			return p
		}
	}
	return topo.Port{}
}

func advertised(h wire.Handle) string {
	if h.SupUnaddressed {
		return "no address: its SUP port is unaddressed"
	}
	s := make([]string, h.NSup)
	for i, a := range h.SupAddrs() {
		s[i] = a.String()
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// MaxQPsPerRail is the most QPs a rail has (MPIB_MAX_QPS_PER_RAIL, checked by the plugin's
// build).
const MaxQPsPerRail = 16

// SupQPCount is the SUP rail's QP count for a connection whose SUP rail has lanes lanes
// (1 + len(Plan.Stripe)) and MPIB_SUP_QP set to configured: configured rounded up to a
// multiple of lanes, at most MaxQPsPerRail (then the largest multiple below it). QP q sits on
// lane q mod lanes and messages go round-robin over the QPs, so only a multiple gives every
// cable an equal share. Both ends compute it from the same plan and setting, so they agree.
func SupQPCount(configured, lanes int) int {
	lanes = max(lanes, 1)
	n := (max(configured, 1) + lanes - 1) / lanes * lanes
	if n > MaxQPsPerRail {
		n = MaxQPsPerRail / lanes * lanes
	}
	return n
}
