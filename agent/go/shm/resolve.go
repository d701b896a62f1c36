package shm

import (
	"fmt"

	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// Source says where a resolved hint came from, or why none applies (spec 5.3).
type Source uint8

const (
	SourceNoHint   Source = 0
	SourceSlot     Source = 1
	SourcePeer     Source = 2
	SourceClass    Source = 3
	SourceStale    Source = 4
	SourceInactive Source = 5
	SourceBusy     Source = 6
	SourceBadSlot  Source = 7
)

var sourceNames = [...]string{"no_hint", "slot", "peer", "class", "stale", "inactive", "busy", "bad_slot"}

func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "invalid"
}

// MarshalText writes the source's name ("slot", "stale", ...).
func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a source's name.
func (s *Source) UnmarshalText(b []byte) error {
	for i, n := range sourceNames {
		if n == string(b) {
			*s = Source(i)
			return nil
		}
	}
	return fmt.Errorf("unknown hint source %q", b)
}

// Resolution is the outcome of the plugin's per-transfer hint lookup.
type Resolution struct {
	Applies bool   `json:"applies"` // a hint applies (source slot, peer or class)
	SupBw   uint32 `json:"sup_bw"`  // clamped to 0..1024; 0 when !Applies
	Source  Source `json:"source"`
	Clamped bool   `json:"clamped"` // the stored value was above 1024
}

// HeartbeatFresh applies spec 5.2.
func HeartbeatFresh(hb, now, staleNs uint64) bool {
	if hb == 0 {
		return false
	}
	if now >= hb {
		return now-hb <= staleNs
	}
	return hb-now <= staleNs
}

// prefixMask is the mask of a prefix of prefixLen bits, 0..32.
func prefixMask(prefixLen uint8) uint32 {
	if prefixLen == 0 {
		return 0
	}
	return ^uint32(0) << (32 - prefixLen)
}

func prefixMatch(ip, key IPv4, prefixLen uint8) bool {
	if prefixLen > 32 {
		return false
	}
	mask := prefixMask(prefixLen)
	return uint32(ip)&mask == uint32(key)&mask
}

func applied(v uint32, src Source) Resolution {
	c, clamped := Clamp(v)
	return Resolution{Applies: true, SupBw: c, Source: src, Clamped: clamped}
}

// resolve is spec 5.3 over a validated view with header h (no caching: agents are not hot).
func resolve(v wire.View, h Header, slot uint32, now, staleNs uint64) Resolution {
	if slot >= h.NSlots {
		return Resolution{Source: SourceBadSlot}
	}
	if !HeartbeatFresh(v.U64(wire.OffHeartbeat), now, staleNs) {
		return Resolution{Source: SourceStale}
	}
	off := wire.SlotOff(slot)
	if SlotState(uint32(v.U64(off+wire.SlOwner))) != StateActive {
		return Resolution{Source: SourceInactive}
	}
	gen := v.U32(off + wire.SlGen)
	r, err := readRecord(v, off+wire.SlHint)
	if err != nil {
		return Resolution{Source: SourceBusy}
	}
	if r.Valid() && r.Gen == gen {
		return applied(r.SupBw, SourceSlot)
	}
	ip := IPv4(v.U32(off + wire.SlPeerIP))
	if j, ok := peerScan(v, h, ip); ok {
		r, err := readRecord(v, wire.PeerOff(h.NSlots, j))
		if err != nil {
			return Resolution{Source: SourceBusy}
		}
		if r.Valid() && prefixMatch(ip, r.PeerIP, r.PrefixLen) {
			return applied(r.SupBw, SourcePeer)
		}
	}
	if c := v.U8(off + wire.SlPathClass); c <= 1 {
		r, err := readRecord(v, wire.ClassOff(c))
		if err != nil {
			return Resolution{Source: SourceBusy}
		}
		if r.Valid() {
			return applied(r.SupBw, SourceClass)
		}
	}
	return Resolution{Source: SourceNoHint}
}

// peerScan finds the valid entry with the longest prefix matching ip (ties: lowest index).
// Entries caught mid-write are skipped.
func peerScan(v wire.View, h Header, ip IPv4) (uint32, bool) {
	best, bestLen := uint32(0), -1
	for j := uint32(0); j < h.NPeers; j++ {
		r, err := readRecord(v, wire.PeerOff(h.NSlots, j))
		if err != nil || !r.Valid() {
			continue
		}
		if prefixMatch(ip, r.PeerIP, r.PrefixLen) && int(r.PrefixLen) > bestLen {
			best, bestLen = j, int(r.PrefixLen)
		}
	}
	return best, bestLen >= 0
}

// Resolve applies spec 5.3 to a validated segment image (the vectors' "reads").
func Resolve(b []byte, slot uint32, now, staleNs uint64) (Resolution, error) {
	h, err := Validate(b)
	if err != nil {
		return Resolution{}, err
	}
	return resolve(wire.View{B: b[:h.TotalSize]}, h, slot, now, staleNs), nil
}
