// Package gid chooses a port's GID for a connection and decides whether the SUP fabric can
// reach a peer. Pure functions: the plugin reads the GID table through verbs and the
// interface addresses through the OS, and asks these.
package gid

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/mpib/mpib/plugin/internal/config"
)

// GID types as libibverbs numbers them (enum ibv_gid_type).
const (
	TypeIB     = 0 // InfiniBand, also "IB/RoCE v1"
	TypeRoCEv1 = 1
	TypeRoCEv2 = 2
)

// Entry is one slot of a port's GID table; Present is false for an empty or unreadable slot.
type Entry struct {
	Present bool
	GID     [16]byte
	Type    int
}

// Addr is the IP address a RoCE GID carries: IPv4 for IPv4-mapped GIDs, else IPv6.
func (e Entry) Addr() netip.Addr {
	return netip.AddrFrom16(e.GID).Unmap()
}

func (e Entry) roceVersion() int {
	if e.Type == TypeRoCEv2 {
		return 2
	}
	return 1
}

// valid is net_ib's test: configured (not all zero, not a bare fe80:: prefix) and not link-local.
func (e Entry) valid() bool {
	if !e.Present {
		return false
	}
	a := netip.AddrFrom16(e.GID)
	return !a.IsUnspecified() && !a.IsLinkLocalUnicast()
}

// ErrNoGID means no GID of the port satisfies the configuration.
var ErrNoGID = errors.New("no usable GID")

// ChooseRoCE picks the RoCE GID index with net_ib's rule: a configured index wins; otherwise
// the first valid (not link-local) GID of the wanted address family inside NCCL_IB_ADDR_RANGE,
// preferring NCCL_IB_ROCE_VERSION_NUM. Unlike net_ib it refuses, with a reason, a port where
// nothing qualifies instead of connecting from index 0 and timing out later.
// MaxIndex is the highest GID index a connection can use: an address handle names its source
// GID in 8 bits (ibv_global_route.sgid_index), though tables can be longer (soft-RoCE's has
// 1024 entries). A larger index would be truncated to another entry.
const MaxIndex = 255

func ChooseRoCE(table []Entry, index int, p config.GIDPolicy) (int, error) {
	if index > MaxIndex {
		return -1, fmt.Errorf("%w: GID index %d is above %d: verbs address a GID with 8 bits (sgid_index)", ErrNoGID, index, MaxIndex)
	}
	if index >= 0 {
		if index >= len(table) || !table[index].Present {
			return -1, fmt.Errorf("%w: GID index %d is empty or beyond the table of %d", ErrNoGID, index, len(table))
		}
		return index, nil
	}
	best, beyond := -1, 0
	for i, e := range table {
		if !e.valid() || e.Addr().Is4() == p.IPv6 || (p.Range.IsValid() && !p.Range.Contains(e.Addr())) {
			continue
		}
		if i > MaxIndex {
			beyond++
			continue
		}
		if best < 0 || (table[best].roceVersion() != p.RoCEVersion && e.roceVersion() == p.RoCEVersion) {
			best = i
		}
	}
	if best < 0 {
		fam := "IPv4"
		if p.IPv6 {
			fam = "IPv6"
		}
		where := ""
		if p.Range.IsValid() {
			where = " in " + p.Range.String()
		}
		if beyond > 0 {
			return -1, fmt.Errorf("%w: the %s RoCE GIDs%s are all above index %d (%d of them), which verbs cannot use (sgid_index is 8 bits): remove addresses from the interface so that the one to use gets a lower index", ErrNoGID, fam, where, MaxIndex, beyond)
		}
		return -1, fmt.Errorf("%w: no %s RoCE GID%s among %d entries (set NCCL_IB_GID_INDEX or MPIB_GID_INDEX_*)", ErrNoGID, fam, where, len(table))
	}
	return best, nil
}

// RoutableFLIDIndex is the GID index net_ib uses on InfiniBand when it carries a FLID
// (NCCL_IB_ROUTABLE_FLID_GID_INDEX, default 1); otherwise index 0.
const RoutableFLIDIndex = 1

// ChooseIB picks the InfiniBand GID index: RoutableFLIDIndex when that GID has a FLID
// (bytes 4..5), else 0.
func ChooseIB(table []Entry) (int, error) {
	if len(table) > RoutableFLIDIndex && table[RoutableFLIDIndex].Present {
		g := table[RoutableFLIDIndex].GID
		if g[4] != 0 || g[5] != 0 {
			return RoutableFLIDIndex, nil
		}
	}
	if len(table) == 0 || !table[0].Present {
		return -1, fmt.Errorf("%w: GID index 0 is empty", ErrNoGID)
	}
	return 0, nil
}

// SupReachable tells whether two SUP ports can talk directly: each address must lie in the
// other's subnet (the direct-attach fabric has no router). A prefix length of 0 means the
// side could not tell (InfiniBand, no matching interface): then the island rule decides alone.
func SupReachable(local netip.Addr, localBits uint8, peer netip.Addr, peerBits uint8) bool {
	if localBits == 0 || peerBits == 0 {
		return true
	}
	l, err1 := local.Prefix(int(localBits))
	p, err2 := peer.Prefix(int(peerBits))
	if err1 != nil || err2 != nil {
		return false
	}
	return l.Contains(peer) && p.Contains(local)
}
