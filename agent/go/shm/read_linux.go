//go:build linux

package shm

import (
	"fmt"

	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// geometryChanged is a *ValidationError (bad_geometry) when the header in the mapping no
// longer describes the geometry validated at open: only a process writing garbage into the
// file does that. Readers keep the validated geometry (the mapping's size); the caller says so.
func (s *Segment) geometryChanged(v wire.View, h Header) error {
	hs, ss, ps := v.U32(wire.OffHeaderSize), v.U32(wire.OffSlotSize), v.U32(wire.OffPeerSize)
	if string(v.Bytes(wire.OffMagic, 8)) == Magic && h.Version == s.h.Version && hs == HeaderSize &&
		ss == SlotSize && ps == PeerSize && h.NSlots == s.h.NSlots && h.NPeers == s.h.NPeers &&
		h.TotalSize == s.h.TotalSize {
		return nil
	}
	return &ValidationError{Path: s.path, Code: ErrBadGeometry, Detail: fmt.Sprintf(
		"segment geometry changed since open (nslots %d -> %d, npeers %d -> %d, total_size %d -> %d, version %d -> %d): reopen",
		s.h.NSlots, h.NSlots, s.h.NPeers, h.NPeers, s.h.TotalSize, h.TotalSize, s.h.Version, h.Version)}
}

// Snapshot decodes the whole live segment with the geometry validated at open; hint records
// are read under their seqlock (a busy one is returned raw). A header whose geometry changed
// since open gives a bad_geometry error.
func (s *Segment) Snapshot() (*Snapshot, error) {
	var snap *Snapshot
	err := s.do(func(v wire.View) error {
		h := decodeHeader(v)
		if err := s.geometryChanged(v, h); err != nil {
			return err
		}
		// The bounds come from the validated copy, never from the mapping: a writer racing
		// this read cannot move them.
		h.Version, h.TotalSize, h.NSlots, h.NPeers = s.h.Version, s.h.TotalSize, s.h.NSlots, s.h.NPeers
		snap = decodeSnapshot(v, h)
		for i := range snap.Slots {
			snap.Slots[i].Hint, _ = readRecord(v, wire.SlotOff(snap.Slots[i].Index)+wire.SlHint)
		}
		for i := range snap.Peers {
			snap.Peers[i].Record, _ = readRecord(v, wire.PeerOff(s.h.NSlots, snap.Peers[i].Index))
		}
		for c := range snap.Class {
			snap.Class[c], _ = readRecord(v, wire.ClassOff(uint8(c)))
		}
		return nil
	})
	return snap, err
}

// Connections returns the ACTIVE slots (a bad_geometry error when the header changed since
// open, as Snapshot).
func (s *Segment) Connections() ([]Slot, error) {
	out := []Slot{}
	err := s.do(func(v wire.View) error {
		if err := s.geometryChanged(v, decodeHeader(v)); err != nil {
			return err
		}
		for i := uint32(0); i < s.h.NSlots; i++ {
			off := wire.SlotOff(i)
			if SlotState(uint32(v.U64(off+wire.SlOwner))) != StateActive {
				continue
			}
			r, _ := readRecord(v, off+wire.SlHint)
			out = append(out, decodeSlot(v, i, r))
		}
		return nil
	})
	return out, err
}

// Slot returns slot i whatever its state.
func (s *Segment) Slot(i uint32) (Slot, error) {
	var sl Slot
	err := s.do(func(v wire.View) error {
		if i >= s.h.NSlots {
			return fmt.Errorf("slot %d of %d: %w", i, s.h.NSlots, ErrSlotRange)
		}
		r, _ := readRecord(v, wire.SlotOff(i)+wire.SlHint)
		sl = decodeSlot(v, i, r)
		return nil
	})
	return sl, err
}

// Resolve is what the plugin would decide for slot now (spec 5.3); a gone segment resolves
// to stale, as for the plugin.
func (s *Segment) Resolve(slot uint32, now, staleNs uint64) Resolution {
	r := Resolution{Source: SourceStale}
	_ = s.do(func(v wire.View) error { r = resolve(v, s.h, slot, now, staleNs); return nil })
	return r
}
