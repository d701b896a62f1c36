package topo

// SUP ports on a direct-attach mesh (docs/mesh.md): a fused device may have several SUP ports, each
// cabled to a different neighbour on its own small subnet (/24 down to /31). Which local port
// talks to which of a peer's SUP addresses is decided here from the ports' real prefixes and,
// when relay is on, the kernel's routes. Pure: the caller reads interfaces, routes and the
// peer's handle. The plugin runs both ends through package suppair, with every SUP port
// MPIB_HCA_SUP names for the device (docs/topology.md, "SUP ports on a mesh").
//
// The SOUT island (Classify) still gives the path class for the agent and the policy; SUP
// reachability comes from the ports alone.

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// MaxSupPorts bounds the SUP ports of one fused device and the SUP addresses a peer's handle
// may name: the handle carries a fixed array of this size (wire.MaxSupAddrs).
const MaxSupPorts = 8

// Port is one local SUP port.
type Port struct {
	Index int        // the port's index in the fused device (what the wire names)
	Name  string     // its netdev; routes name their egress by it
	Addr  netip.Addr // its RoCE v2 address (IPv4 on the mesh)
	Bits  uint8      // Addr's prefix length on the netdev; 0 = unknown (InfiniBand, no netdev)
}

func (p Port) String() string { return fmt.Sprintf("%s %v/%d", p.Name, p.Addr, p.Bits) }

// PeerAddr is one SUP address of the peer with its prefix length, as its handle carries it.
type PeerAddr struct {
	Addr netip.Addr
	Bits uint8 // 0 = the peer could not tell
}

func (a PeerAddr) String() string { return fmt.Sprintf("%v/%d", a.Addr, a.Bits) }

// Route is one entry of the kernel's routing table.
type Route struct {
	Dst netip.Prefix
	Via netip.Addr // gateway; the zero Addr for an on-link (connected) route
	Dev string     // egress netdev
}

// IsDefault tells a default route by its destination (/0) rather than by a flag, so a caller
// cannot pass one that still counts.
func (r Route) IsDefault() bool { return r.Dst.Bits() == 0 }

// PathKind says how a SUP connection reaches the peer.
type PathKind int

const (
	PathNone   PathKind = iota // no SUP QP: the connection uses SOUT only
	PathDirect                 // on a cable: the peer address is in the port's connected subnet
	PathRouted                 // through the fabric: a relay node forwards (MPIB_SUP_RELAY=1)
)

func (k PathKind) String() string {
	switch k {
	case PathDirect:
		return "direct"
	case PathRouted:
		return "routed"
	}
	return "none"
}

// Pair is one local port talking to one peer address.
type Pair struct {
	Port  int        // the local port's Index
	Local netip.Addr // the local port's address
	Peer  netip.Addr
	Via   netip.Addr // the route's gateway for a routed pair; zero when direct
}

func (p Pair) String() string {
	s := fmt.Sprintf("port %d %v -> %v", p.Port, p.Local, p.Peer)
	if p.Via.IsValid() {
		s += fmt.Sprintf(" via %v", p.Via)
	}
	return s
}

// Choice is the connector's decision. Pairs are in local port order, then peer address
// order; SUP QPs are striped over all of them.
type Choice struct {
	Kind   PathKind
	Pairs  []Pair
	Reason string // for PathNone: one line naming the addresses, for an INFO message
}

func (c Choice) String() string {
	if c.Kind == PathNone {
		return "none: " + c.Reason
	}
	s := make([]string, len(c.Pairs))
	for i, p := range c.Pairs {
		s[i] = p.String()
	}
	return c.Kind.String() + ": " + strings.Join(s, ", ")
}

// ChooseSupPairs picks the SUP port pairs to a peer (the connector's side).
//
// Direct: every (local port, peer address) where each address lies in the other's prefix,
// gid.SupReachable's rule for one pair. A prefix length of 0 on either side (InfiniBand, or an
// address with no netdev) means "cannot tell" and counts as reachable, as today; such assumed
// pairs are used only when no pair is proven by two known prefixes, so one unknown port does
// not join a stripe over ports whose cables are known. One port and one address therefore
// behave exactly as gid.SupReachable.
//
// Routed (relay only, and only when no direct pair exists): for each peer address, the route
// the kernel would take to it, default routes left out; it counts when it has a gateway and
// leaves on a SUP port. The most specific such route wins (ties: local port order, then peer
// address order) and gives one pair. A route alone never enables SUP: relay off means none.
//
// Invalid input (more than MaxSupPorts on either side, an invalid address or prefix length, a
// repeated port or address) is an error; the Choice is then none with the error as reason.
func ChooseSupPairs(local []Port, peer []PeerAddr, routes []Route, relay bool) (Choice, error) {
	if err := CheckPorts(local); err != nil {
		return Choice{Reason: err.Error()}, err
	}
	if err := checkPeerAddrs(peer); err != nil {
		return Choice{Reason: err.Error()}, err
	}
	if pairs := directPairs(local, peer); len(pairs) > 0 {
		return Choice{Kind: PathDirect, Pairs: pairs}, nil
	}
	why := fmt.Sprintf("peer SUP addresses %s share no subnet with our SUP ports %s",
		listAddrs(peer), listPorts(local)) + slash32Hint(local, peer)
	if !relay {
		return Choice{Reason: why + " (MPIB_SUP_RELAY is off)"}, nil
	}
	if p, ok := routedPair(local, peer, routes); ok {
		return Choice{Kind: PathRouted, Pairs: []Pair{p}}, nil
	}
	return Choice{Reason: why + ", and no non-default route with a gateway leads to them from a SUP port"}, nil
}

// CheckAcceptedPair is the acceptor's check of the pair the connector named: ours is the
// address it chose on our side, theirs its own address and prefix. It refuses an address we do
// not have (a stale handle: the address was removed or renumbered since we published it) and
// a peer we cannot reach from that port directly or, with relay, by our own route (our replies
// must leave on that port too). It returns the pair from our side.
func CheckAcceptedPair(local []Port, ours netip.Addr, theirs PeerAddr, routes []Route, relay bool) (Pair, error) {
	if err := CheckPorts(local); err != nil {
		return Pair{}, err
	}
	if err := checkPeerAddrs([]PeerAddr{theirs}); err != nil {
		return Pair{}, err
	}
	refuse := func(format string, args ...any) (Pair, error) {
		return Pair{}, fmt.Errorf("SUP pair %v (ours) - %s (peer) refused: %s", ours, theirs, fmt.Sprintf(format, args...))
	}
	at := -1
	for i, l := range local {
		if l.Addr == ours {
			at = i
		}
	}
	if at < 0 {
		return refuse("%v is not one of our SUP addresses %s (stale handle?)", ours, listPorts(local))
	}
	l := local[at]
	if reachable(l, theirs) {
		return Pair{Port: l.Index, Local: ours, Peer: theirs.Addr}, nil
	}
	if !relay {
		return refuse("no common subnet with our port %s and MPIB_SUP_RELAY is off", l)
	}
	r, port, ok := kernelRoute(local, routes, theirs.Addr)
	if !ok || !r.Via.IsValid() || port != at {
		return refuse("no common subnet with our port %s and our route to %v does not leave on it through a gateway", l, theirs.Addr)
	}
	return Pair{Port: l.Index, Local: ours, Peer: theirs.Addr, Via: r.Via}, nil
}

// reachable is gid.SupReachable for one port and one peer address: each address in the
// other's prefix, a prefix length of 0 on either side counting as reachable.
func reachable(l Port, p PeerAddr) bool {
	if l.Bits == 0 || p.Bits == 0 {
		return true
	}
	return mutual(l, p)
}

// mutual is true when both prefixes are known and each contains the other's address. A /24
// matcher would be wrong here: two /29 links can share a /24 (docs/topology.md).
func mutual(l Port, p PeerAddr) bool {
	lp, err1 := l.Addr.Prefix(int(l.Bits))
	pp, err2 := p.Addr.Prefix(int(p.Bits))
	return err1 == nil && err2 == nil && l.Bits != 0 && p.Bits != 0 && lp.Contains(p.Addr) && pp.Contains(l.Addr)
}

// directPairs returns the proven pairs, or the assumed ones (a prefix unknown) when none is
// proven, in local port order then peer address order.
func directPairs(local []Port, peer []PeerAddr) []Pair {
	var proven, assumed []Pair
	for _, l := range local {
		for _, p := range peer {
			pair := Pair{Port: l.Index, Local: l.Addr, Peer: p.Addr}
			switch {
			case mutual(l, p):
				proven = append(proven, pair)
			case l.Bits == 0 || p.Bits == 0:
				assumed = append(assumed, pair)
			}
		}
	}
	if len(proven) > 0 {
		return proven
	}
	return assumed
}

// routedPair picks the most specific usable route to any of the peer's addresses.
func routedPair(local []Port, peer []PeerAddr, routes []Route) (Pair, bool) {
	best, bestBits, bestPort := Pair{}, -1, -1
	for _, p := range peer {
		r, port, ok := kernelRoute(local, routes, p.Addr)
		if !ok || port < 0 || !r.Via.IsValid() {
			continue
		}
		// Strictly better only: on a tie the earlier port, then the earlier address, stays.
		bits := r.Dst.Bits()
		if bits > bestBits || (bits == bestBits && port < bestPort) {
			l := local[port]
			best, bestBits, bestPort = Pair{Port: l.Index, Local: l.Addr, Peer: p.Addr, Via: r.Via}, bits, port
		}
	}
	return best, bestBits >= 0
}

// kernelRoute returns the route the kernel would take to addr, default routes left out, and
// the position in local of its egress port (-1 when it leaves on another netdev). Routes on
// any netdev compete: a more specific one elsewhere (SOUT, say) shadows a SUP one, as in the
// kernel, whose route RoCE's address resolution follows. Among equally specific routes
// (multipath) a SUP egress is preferred, the first SUP port in local order.
func kernelRoute(local []Port, routes []Route, addr netip.Addr) (Route, int, bool) {
	var best Route
	bestPort, found := -1, false
	for _, r := range routes {
		if r.IsDefault() || !r.Dst.Contains(addr) {
			continue
		}
		port := portByName(local, r.Dev)
		better := !found || r.Dst.Bits() > best.Dst.Bits()
		if found && r.Dst.Bits() == best.Dst.Bits() && port >= 0 && (bestPort < 0 || port < bestPort) {
			better = true
		}
		if better {
			best, bestPort, found = r, port, true
		}
	}
	return best, bestPort, found
}

func portByName(local []Port, dev string) int {
	for i, l := range local {
		if dev != "" && l.Name == dev {
			return i
		}
	}
	return -1
}

// CheckPorts refuses a fused device's port list the choice cannot be trusted on: too many
// ports, an invalid address, a repeated index, address or netdev.
func CheckPorts(local []Port) error {
	if len(local) > MaxSupPorts {
		return fmt.Errorf("%d SUP ports: at most %d per fused device", len(local), MaxSupPorts)
	}
	for i, l := range local {
		if err := checkAddr(l.Addr, l.Bits); err != nil {
			return fmt.Errorf("SUP port %s: %w", l, err)
		}
		for _, o := range local[:i] {
			if o.Index == l.Index || o.Addr == l.Addr || (l.Name != "" && o.Name == l.Name) {
				return fmt.Errorf("SUP ports %s (index %d) and %s (index %d) repeat an index, address or netdev", o, o.Index, l, l.Index)
			}
		}
	}
	return nil
}

// checkPeerAddrs refuses a peer address list no valid handle carries.
func checkPeerAddrs(peer []PeerAddr) error {
	if len(peer) > MaxSupPorts {
		return fmt.Errorf("peer names %d SUP addresses: at most %d", len(peer), MaxSupPorts)
	}
	for i, p := range peer {
		if err := checkAddr(p.Addr, p.Bits); err != nil {
			return fmt.Errorf("peer SUP address %s: %w", p, err)
		}
		for _, o := range peer[:i] {
			if o.Addr == p.Addr {
				return fmt.Errorf("peer names SUP address %v twice", p.Addr)
			}
		}
	}
	return nil
}

// SharedSubnet finds two ports of one device whose subnets overlap. Each port's address then
// lies in the other's subnet, so every peer address in it pairs with both ports: right where
// both lead to the same node (parallel cables, the two PCI functions of one port), wrong on a
// mesh whose cables lead to different nodes, where a pair may name a port whose cable goes
// elsewhere. The plugin warns (docs/mesh.md: one subnet per cable on a mesh).
func SharedSubnet(local []Port) (a, b Port, ok bool) {
	for i, l := range local {
		for _, o := range local[:i] {
			if subnetsOverlap(o.Addr, o.Bits, l.Addr, l.Bits) {
				return o, l, true
			}
		}
	}
	return Port{}, Port{}, false
}

// subnetsOverlap says whether two addresses' subnets overlap; a prefix length of 0 (unknown)
// cannot tell and says no.
func subnetsOverlap(a netip.Addr, aBits uint8, b netip.Addr, bBits uint8) bool {
	pa, err1 := a.Prefix(int(aBits))
	pb, err2 := b.Prefix(int(bBits))
	return err1 == nil && err2 == nil && aBits != 0 && bBits != 0 && pa.Overlaps(pb)
}

// slash32Hint is the part of a no-pair reason that names the /32 addresses on either side: a
// /32 subnet holds no other address, so its port is in no direct pair (a relay's route may
// still use it).
func slash32Hint(local []Port, peer []PeerAddr) string {
	var s []string
	for _, l := range local {
		if l.Addr.Is4() && l.Bits == 32 {
			s = append(s, l.String())
		}
	}
	for _, p := range peer {
		if p.Addr.Is4() && p.Bits == 32 {
			s = append(s, "peer "+p.String())
		}
	}
	if len(s) == 0 {
		return ""
	}
	return fmt.Sprintf(" (%s: a /32 address: use /31 or a shared subnet per cable (docs/mesh.md))", strings.Join(s, ", "))
}

var errBadAddr = errors.New("invalid address")

func checkAddr(a netip.Addr, bits uint8) error {
	if !a.IsValid() {
		return errBadAddr
	}
	if int(bits) > a.BitLen() {
		return fmt.Errorf("prefix length %d is beyond the address's %d bits", bits, a.BitLen())
	}
	return nil
}

func listPorts(local []Port) string {
	s := make([]string, len(local))
	for i, l := range local {
		s[i] = l.String()
	}
	return "[" + strings.Join(s, ", ") + "]"
}

func listAddrs(peer []PeerAddr) string {
	s := make([]string, len(peer))
	for i, p := range peer {
		s[i] = p.String()
	}
	return "[" + strings.Join(s, ", ") + "]"
}
