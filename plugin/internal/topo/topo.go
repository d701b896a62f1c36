// Package topo classifies a connection by island: nodes whose SOUT IPv4 addresses share the
// first MPIB_ISLAND_PREFIX_LEN bits form an island, reachable over SUP.
package topo

import (
	"fmt"
	"net/netip"
)

// PathClass is the connection's relation to the peer (values match mpib_policy.h).
type PathClass int

const (
	IntraIsland PathClass = 0
	InterIsland PathClass = 1
)

func (p PathClass) String() string {
	if p == IntraIsland {
		return "intra-island"
	}
	return "inter-island"
}

// Classify compares two SOUT addresses under a prefix length. Both sides of a connection call
// it with the two ends of the same TCP socket, so they agree without an exchange.
func Classify(local, peer netip.Addr, prefixLen int) (PathClass, error) {
	if !local.Is4() || !peer.Is4() {
		return 0, fmt.Errorf("island classification needs IPv4 SOUT addresses, got %v and %v", local, peer)
	}
	if prefixLen < 0 || prefixLen > 32 {
		return 0, fmt.Errorf("island prefix length %d is outside 0..32", prefixLen)
	}
	lp, _ := local.Prefix(prefixLen)
	pp, _ := peer.Prefix(prefixLen)
	if lp == pp {
		return IntraIsland, nil
	}
	return InterIsland, nil
}

// Island returns the peer's island as the masked address in host byte order (for the agent).
func Island(addr netip.Addr, prefixLen int) uint32 {
	p, err := addr.Prefix(prefixLen)
	if err != nil || !addr.Is4() {
		return 0
	}
	return IPv4ToUint32(p.Addr())
}

// IPv4ToUint32 returns an IPv4 address in host byte order (0 for anything else).
func IPv4ToUint32(a netip.Addr) uint32 {
	if !a.Is4() {
		return 0
	}
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}
