//go:build linux

package shm

import (
	"fmt"
	"os"

	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// Beat stores the heartbeat (now, CLOCK_MONOTONIC ns) and the agent pid.
func (s *Segment) Beat(now uint64) error {
	return s.do(func(v wire.View) error {
		v.Put32(wire.OffAgentPID, uint32(os.Getpid()))
		v.Put64(wire.OffHeartbeat, now)
		s.lastBeat.Store(now)
		return nil
	})
}

// StopBeat marks a clean agent exit (the plugin falls back to vanilla at once), but only when
// the heartbeat is still the one this Segment stored: another agent's beat is never cleared.
// It reports whether it cleared the heartbeat.
func (s *Segment) StopBeat() bool {
	last := s.lastBeat.Swap(0)
	if last == 0 {
		return false
	}
	cleared := false
	_ = s.do(func(v wire.View) error {
		cleared = v.CAS64(wire.OffHeartbeat, last, 0)
		return nil
	})
	return cleared
}

// SetSlotHint sets (valid) or clears the hint of ACTIVE slot `slot`, for the registration
// `gen` the caller read (Slot.Gen): when the slot now holds another registration the write is
// refused with a *GenChangedError (errors.Is ErrGenChanged), so a hint never lands on another
// connection. A value above 1024 is written as 1024 and reported with a *ClampedError.
func (s *Segment) SetSlotHint(slot, gen uint32, supBw uint32, valid bool) error {
	bw, cerr := clampErr(supBw)
	err := s.locked(func(v wire.View) error {
		if slot >= s.h.NSlots { // under mu: Reattach may swap in a segment with fewer slots
			return fmt.Errorf("set slot %d hint: %w", slot, ErrSlotRange)
		}
		off := wire.SlotOff(slot)
		if SlotState(uint32(v.U64(off+wire.SlOwner))) != StateActive {
			return fmt.Errorf("set slot %d hint: %w", slot, ErrSlotInactive)
		}
		if cur := v.U32(off + wire.SlGen); cur != gen {
			return &GenChangedError{Slot: slot, Expected: gen, Current: cur}
		}
		writeRecord(v, off+wire.SlHint, Record{SupBw: bw, Flags: flags(valid), Gen: gen, SetNs: Now()})
		return nil
	})
	if err != nil {
		return err
	}
	return cerr
}

// SetClassHint sets or clears the default of a path class.
func (s *Segment) SetClassHint(class PathClass, supBw uint32, valid bool) error {
	if class > InterIsland {
		return fmt.Errorf("set class %d hint: %w", class, ErrBadClass)
	}
	bw, cerr := clampErr(supBw)
	err := s.locked(func(v wire.View) error {
		writeRecord(v, wire.ClassOff(uint8(class)), Record{SupBw: bw, Flags: flags(valid), SetNs: Now()})
		return nil
	})
	if err != nil {
		return err
	}
	return cerr
}

// SetPeerHint sets or clears the default for peers matching ip/prefixLen (32: one peer,
// 24: an island). The key is ip masked to prefixLen (spec 5.6): 10.0.2.7/24 and 10.0.2.0/24
// name one entry, whichever spelling wrote it.
func (s *Segment) SetPeerHint(ip IPv4, prefixLen uint8, supBw uint32, valid bool) error {
	if prefixLen > 32 {
		return fmt.Errorf("set peer %v/%d hint: %w", ip, prefixLen, ErrBadPrefix)
	}
	ip = ip.Masked(prefixLen)
	bw, cerr := clampErr(supBw)
	err := s.locked(func(v wire.View) error {
		target, free, repaired := -1, -1, false
		for j := uint32(0); j < s.h.NPeers && target < 0; j++ {
			off := wire.PeerOff(s.h.NSlots, j)
			// An odd entry is a dead writer's (spec 5.1): skipping it could write its key a
			// second time. Repaired, it is free.
			repaired = repairRecord(v, off) || repaired
			r, err := readRecord(v, off)
			switch {
			case err == nil && !r.Valid() && free < 0:
				free = int(j)
			case err == nil && r.Valid() && r.PrefixLen == prefixLen && r.PeerIP.Masked(prefixLen) == ip:
				target = int(j)
			}
		}
		if target < 0 {
			if !valid {
				if repaired {
					v.Add32(wire.OffPeersEpoch, 1)
				}
				cerr = nil
				return nil
			}
			if free < 0 {
				return fmt.Errorf("set peer %v/%d hint: %w (%d entries)", ip, prefixLen, ErrPeerTableFull, s.h.NPeers)
			}
			target = free
		}
		writeRecord(v, wire.PeerOff(s.h.NSlots, uint32(target)),
			Record{SupBw: bw, Flags: flags(valid), SetNs: Now(), PeerIP: ip, PrefixLen: prefixLen})
		v.Add32(wire.OffPeersEpoch, 1)
		return nil
	})
	if err != nil {
		return err
	}
	return cerr
}

func flags(valid bool) uint32 {
	if valid {
		return FlagValid
	}
	return 0
}
