//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// Liveness says whether a segment file is in use (spec 5.8).
type Liveness struct {
	HeartbeatFresh bool   // an agent beat within MPIB_AGENT_STALE_MS
	AgentPID       uint32 // the last beating agent's pid (informational)
	Locked         bool   // a plugin has it attached, an agent holds the agent lock, or a slot is leased
}

// Live reports whether the segment is in use by anyone.
func (l Liveness) Live() bool { return l.HeartbeatFresh || l.Locked }

func (l Liveness) String() string {
	switch {
	case l.Locked && l.HeartbeatFresh:
		return fmt.Sprintf("an agent (pid %d) beats it and processes hold it open", l.AgentPID)
	case l.HeartbeatFresh:
		return fmt.Sprintf("an agent (pid %d) beats it", l.AgentPID)
	case l.Locked:
		return "plugin or agent processes hold it open"
	}
	return "unused"
}

// Live inspects the file at path without mapping it: a missing file or one that is not a
// segment is not live.
func Live(path string) (Liveness, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
		return Liveness{}, nil
	}
	if err != nil {
		return Liveness{}, fmt.Errorf("inspect %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return Liveness{}, err
	}
	var l Liveness
	head := make([]byte, HeaderSize)
	if n, _ := unix.Pread(fd, head, 0); n == HeaderSize && string(head[:8]) == Magic {
		v := wire.View{B: head}
		if v.U32(wire.OffVersion) == Version {
			h := decodeHeader(v)
			l.AgentPID = h.AgentPID
			l.HeartbeatFresh = HeartbeatFresh(h.HeartbeatNs, Now(), uint64(StaleFromEnv()))
		}
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk); err == nil {
		l.Locked = lk.Type != unix.F_UNLCK
	}
	return l, nil
}

// lock takes the writer lock of spec 5.5 (the caller holds mu for reading).
func (s *Segment) lock() (func(), error) {
	fd := int(s.f.Fd())
	for {
		err := unix.Flock(fd, unix.LOCK_EX)
		if err == nil {
			return func() { _ = unix.Flock(fd, unix.LOCK_UN) }, nil
		}
		if err != unix.EINTR {
			return nil, fmt.Errorf("lock %s: %w", s.path, err)
		}
	}
}

// locked runs fn under the writer lock, fault-guarded.
func (s *Segment) locked(fn func(v wire.View) error) error {
	return s.do(func(v wire.View) error {
		unlock, err := s.lock()
		if err != nil {
			return err
		}
		defer unlock()
		return fn(v)
	})
}

// ofdLock takes (F_RDLCK/F_WRLCK, never waiting) or drops (F_UNLCK) an OFD lock on one byte.
func ofdLock(f *os.File, off int64, typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: off, Len: 1}
	err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return unix.EAGAIN
	}
	return err
}

// lockHeld reports whether another open file description holds a lock on byte off.
func lockHeld(f *os.File, off int64) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: off, Len: 1}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}

// AcquireAgent takes the agent lock (spec 5.7): one beating agent per segment. Another agent
// holding it gives ErrAgentRunning.
func (s *Segment) AcquireAgent() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acquireAgentLocked()
}

func (s *Segment) acquireAgentLocked() error {
	if s.agent {
		return nil
	}
	if err := ofdLock(s.f, wire.LockAgent, unix.F_WRLCK); err != nil {
		if errors.Is(err, unix.EAGAIN) {
			var pid [4]byte
			_, _ = s.f.ReadAt(pid[:], wire.OffAgentPID) // not through the mapping: it may be truncated
			return fmt.Errorf("%s: %w: pid %d runs a heartbeat or policy loop on it; stop it first",
				s.path, ErrAgentRunning, binary.LittleEndian.Uint32(pid[:]))
		}
		return fmt.Errorf("agent lock %s: %w", s.path, err)
	}
	s.agent = true
	return nil
}

// ReleaseAgent drops the agent lock.
func (s *Segment) ReleaseAgent() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agent {
		_ = ofdLock(s.f, wire.LockAgent, unix.F_UNLCK)
		s.agent = false
	}
}

// LeaseHeld reports whether a live process holds slot i's lease (spec 5.7).
func (s *Segment) LeaseHeld(i uint32) (bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if i >= s.h.NSlots { // under mu: Reattach may swap in a segment with fewer slots
		return false, fmt.Errorf("slot %d: %w", i, ErrSlotRange)
	}
	return lockHeld(s.f, wire.SlotLockOff(i))
}

// GC reclaims slots whose owner is gone (spec 5.7): an owner word that is not zero while no
// process holds the slot's lease. The lease is an OFD lock the kernel drops when its holder
// dies, whatever PID namespace it lives in. It returns the reclaimed slot indices. In the same
// pass it repairs every hint record a dead writer left odd (spec 5.1).
func (s *Segment) GC() ([]uint32, error) {
	var freed []uint32
	err := s.locked(func(v wire.View) error {
		repairRecords(v, s.h.NSlots, s.h.NPeers)
		for i := uint32(0); i < s.h.NSlots; i++ {
			if v.U64(wire.SlotOff(i)+wire.SlOwner) == 0 {
				continue
			}
			ok, err := s.reclaim(v, i)
			if err != nil {
				return fmt.Errorf("gc %s: lease of slot %d: %w", s.path, i, err)
			}
			if ok {
				freed = append(freed, i)
			}
		}
		return nil
	})
	return freed, err
}

// reclaim frees slot i if its owner is dead. It takes the slot's lease itself, never waiting:
// a lease it cannot take belongs to a live owner. While it holds the lease no plugin can
// claim or release the slot (both happen under the lease), so a non-zero owner word read
// then is a dead owner's, and is cleared. Checking the lease without taking it would race:
// the owner word is not unique per registration (the same pid claims again), so a release
// and a new claim between the check and the clear would free a live slot. Taking the lease
// through s.f is sound because this open file description never holds a slot lease.
func (s *Segment) reclaim(v wire.View, i uint32) (bool, error) {
	off := wire.SlotLockOff(i)
	if err := ofdLock(s.f, off, unix.F_WRLCK); err != nil {
		if errors.Is(err, unix.EAGAIN) {
			return false, nil
		}
		return false, err
	}
	defer func() { _ = ofdLock(s.f, off, unix.F_UNLCK) }()
	owner := wire.SlotOff(i) + wire.SlOwner
	seen := v.U64(owner)
	return seen != 0 && v.CAS64(owner, seen, 0), nil
}
