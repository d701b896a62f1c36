//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Segment is a live read-write mapping of a hint segment. Methods are safe for concurrent use
// by goroutines; writes of hint records take the cross-process writer lock (flock, spec 5.5).
//
// A segment truncated under the process (spec 5.9) never crashes it: every access runs with
// debug.SetPanicOnFault, a fault marks the segment gone and the method returns
// ErrSegmentGone. Reattach moves the Segment to the file now at its path.
type Segment struct {
	path string

	mu     sync.RWMutex // Reattach swaps the fields below under mu; every access holds it
	f      *os.File
	v      view
	h      Header // validated at open; never re-read
	dev    uint64
	ino    uint64
	leases *os.File   // second open file description: the leases of Register (fake plugin)
	lmu    sync.Mutex // guards leases' creation (Register runs under mu for reading)
	agent  bool       // holds the agent lock (spec 5.7)

	gone     atomic.Bool
	lastBeat atomic.Uint64 // the heartbeat value this Segment last stored
}

// Now returns CLOCK_MONOTONIC in nanoseconds, the segment's time base.
func Now() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Sec)*1e9 + uint64(ts.Nsec)
}

// DefaultPath is $MPIB_SHM_PATH, else /dev/shm/mpib-hints-EUID (the plugin's default too).
func DefaultPath() string {
	if p := os.Getenv("MPIB_SHM_PATH"); p != "" {
		return p
	}
	return DefaultPathPrefix + strconv.Itoa(os.Geteuid())
}

// StaleFromEnv is MPIB_AGENT_STALE_MS (1..3600000, else the default 500 ms), read as the
// plugin reads it.
func StaleFromEnv() time.Duration {
	ms := uint64(DefaultStaleMs)
	if v, err := strconv.ParseUint(os.Getenv("MPIB_AGENT_STALE_MS"), 10, 64); err == nil && v >= 1 && v <= MaxStaleMs {
		ms = v
	}
	return time.Duration(ms) * time.Millisecond
}

// BeatPeriod is how often an agent beats for a staleness limit: stale/4 (spec 5.2).
func BeatPeriod(stale time.Duration) time.Duration {
	return max(stale/4, time.Millisecond)
}

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
		v := view{b: head}
		if v.u32(offVersion) == Version {
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

// Create makes a new zeroed segment at path with mode 0600 (spec 5.8) and opens it. It
// refuses (ErrSegmentLive) to replace a segment that is live (an agent beats it, or a plugin
// or agent holds it open) unless force is set; plugins then move to the new segment within
// their poll period. A file at path owned by another user is always refused (ErrBadOwner).
func Create(path string, nslots, npeers uint32, force bool) (*Segment, error) {
	if nslots < 1 || nslots > MaxSlots || npeers > MaxPeers {
		return nil, fmt.Errorf("create %s: %w: nslots=%d (1..%d) npeers=%d (0..%d)",
			path, ErrBadGeometry, nslots, MaxSlots, npeers, MaxPeers)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err == nil {
		if euid := uint32(os.Geteuid()); st.Uid != euid {
			return nil, &ValidationError{Path: path, Code: ErrBadOwner, Detail: fmt.Sprintf(
				"exists and belongs to uid %d (this process runs as %d): remove it or choose another MPIB_SHM_PATH", st.Uid, euid)}
		}
		if !force {
			l, err := Live(path)
			if err != nil {
				return nil, err
			}
			if l.Live() {
				return nil, fmt.Errorf("create %s: %w: %v (use --force to replace it; plugins move to the new segment)", path, ErrSegmentLive, l)
			}
		}
	}
	size := TotalSize(nslots, npeers)
	hdr := make([]byte, HeaderSize)
	v := view{b: hdr}
	copy(hdr, Magic)
	v.put32(offVersion, Version)
	v.put32(offHeaderSize, HeaderSize)
	v.put64(offTotalSize, size)
	v.put32(offNSlots, nslots)
	v.put32(offSlotSize, SlotSize)
	v.put32(offNPeers, npeers)
	v.put32(offPeerSize, PeerSize)
	v.put64(offCreated, Now())

	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	tmp := f.Name()
	err = f.Chmod(0o600)
	if err == nil {
		err = f.Truncate(int64(size))
	}
	if err == nil {
		_, err = f.WriteAt(hdr, 0)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	f.Close()
	if err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	return Open(path)
}

// Open maps an existing segment after the spec's validation (section 6). A symbolic link is
// refused (O_NOFOLLOW). The open never waits: the file is checked (type, owner, mode) before
// it is opened, and opened with O_NONBLOCK, so a file another process holds a lease on fails
// at once instead of waiting for the lease break (45 s by default).
func Open(path string) (*Segment, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil, &ValidationError{Path: path, Code: ErrNotRegular, Detail: "a symbolic link (refused: O_NOFOLLOW)"}
	}
	if err := checkStat(path, &st); err != nil {
		return nil, err
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, &ValidationError{Path: path, Code: ErrNotRegular, Detail: "a symbolic link (refused: O_NOFOLLOW)"}
	case errors.Is(err, unix.EWOULDBLOCK):
		return nil, fmt.Errorf("open %s: another process holds a lease on the file (EWOULDBLOCK): try again later: %w", path, err)
	case err != nil:
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	s := &Segment{path: path}
	if err := s.mapFile(f); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// checkStat runs checks 2..4 of the spec's validation table on a file's status.
func checkStat(path string, st *unix.Stat_t) error {
	fail := func(code error, format string, args ...any) error {
		return &ValidationError{Path: path, Code: code, Detail: fmt.Sprintf(format, args...)}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fail(ErrNotRegular, "not a regular file")
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return fail(ErrBadOwner, "owned by uid %d, this process runs as %d", st.Uid, euid)
	}
	if st.Mode&0o077 != 0 { // readable by others shows peers and rates; writable lets them steer
		return fail(ErrBadMode, "mode %04o grants group/other access (want 0600: chmod 600)", st.Mode&0o7777)
	}
	return nil
}

// mapFile validates f and fills the mapping fields (the caller holds mu or owns s). The file
// checks run again on the descriptor: the path may name another file than the one checked.
func (s *Segment) mapFile(f *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("open %s: fstat: %w", s.path, err)
	}
	if err := checkStat(s.path, &st); err != nil {
		return err
	}
	head := make([]byte, HeaderSize)
	n, _ := f.ReadAt(head, 0)
	h, err := validate(head[:n], st.Size, s.path)
	if err != nil {
		return err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(h.TotalSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("open %s: mmap: %w", s.path, err)
	}
	s.f, s.v, s.h, s.dev, s.ino = f, view{b: mem, live: true}, h, uint64(st.Dev), st.Ino
	return nil
}

// Close unmaps the segment; the kernel drops this Segment's locks (agent lock, leases).
func (s *Segment) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := unix.Munmap(s.v.b)
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	if s.leases != nil {
		s.leases.Close()
		s.leases = nil
	}
	return err
}

// Path returns the file the segment was opened from.
func (s *Segment) Path() string { return s.path }

// Err is ErrSegmentGone once the segment was truncated under this process, else nil.
func (s *Segment) Err() error {
	if s.gone.Load() {
		return fmt.Errorf("%s: %w (re-create it; Reattach follows a new one)", s.path, ErrSegmentGone)
	}
	return nil
}

// do runs fn on the mapping with faults turned into ErrSegmentGone (spec 5.9).
func (s *Segment) do(fn func(v view) error) (err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.Err(); err != nil {
		return err
	}
	v := s.v
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			fa, ok := r.(interface{ Addr() uintptr })
			base := uintptr(unsafe.Pointer(unsafe.SliceData(v.b)))
			if !ok || fa.Addr()-base >= uintptr(len(v.b)) {
				panic(r)
			}
			s.gone.Store(true)
			err = s.Err()
		}
	}()
	return fn(v)
}

// Header returns the header, with the live heartbeat and epoch (zero once the segment is gone).
func (s *Segment) Header() Header {
	var h Header
	_ = s.do(func(v view) error { h = decodeHeader(v); return nil })
	return h
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
func (s *Segment) locked(fn func(v view) error) error {
	return s.do(func(v view) error {
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
	if err := ofdLock(s.f, lockAgent, unix.F_WRLCK); err != nil {
		if errors.Is(err, unix.EAGAIN) {
			var pid [4]byte
			_, _ = s.f.ReadAt(pid[:], offAgentPID) // not through the mapping: it may be truncated
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
		_ = ofdLock(s.f, lockAgent, unix.F_UNLCK)
		s.agent = false
	}
}

// Beat stores the heartbeat (now, CLOCK_MONOTONIC ns) and the agent pid.
func (s *Segment) Beat(now uint64) error {
	return s.do(func(v view) error {
		v.put32(offAgentPID, uint32(os.Getpid()))
		v.put64(offHeartbeat, now)
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
	_ = s.do(func(v view) error {
		cleared = v.cas64(offHeartbeat, last, 0)
		return nil
	})
	return cleared
}

// geometryChanged is a *ValidationError (bad_geometry) when the header in the mapping no
// longer describes the geometry validated at open: only a process writing garbage into the
// file does that. Readers keep the validated geometry (the mapping's size); the caller says so.
func (s *Segment) geometryChanged(v view, h Header) error {
	hs, ss, ps := v.u32(offHeaderSize), v.u32(offSlotSize), v.u32(offPeerSize)
	if string(v.bytes(offMagic, 8)) == Magic && h.Version == s.h.Version && hs == HeaderSize &&
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
	err := s.do(func(v view) error {
		h := decodeHeader(v)
		if err := s.geometryChanged(v, h); err != nil {
			return err
		}
		// The bounds come from the validated copy, never from the mapping: a writer racing
		// this read cannot move them.
		h.Version, h.TotalSize, h.NSlots, h.NPeers = s.h.Version, s.h.TotalSize, s.h.NSlots, s.h.NPeers
		snap = decodeSnapshot(v, h)
		for i := range snap.Slots {
			snap.Slots[i].Hint, _ = v.readRecord(slotOff(snap.Slots[i].Index) + slHint)
		}
		for i := range snap.Peers {
			snap.Peers[i].Record, _ = v.readRecord(peerOff(s.h.NSlots, snap.Peers[i].Index))
		}
		for c := range snap.Class {
			snap.Class[c], _ = v.readRecord(classOff(uint8(c)))
		}
		return nil
	})
	return snap, err
}

// Connections returns the ACTIVE slots (a bad_geometry error when the header changed since
// open, as Snapshot).
func (s *Segment) Connections() ([]Slot, error) {
	out := []Slot{}
	err := s.do(func(v view) error {
		if err := s.geometryChanged(v, decodeHeader(v)); err != nil {
			return err
		}
		for i := uint32(0); i < s.h.NSlots; i++ {
			off := slotOff(i)
			if SlotState(uint32(v.u64(off+slOwner))) != StateActive {
				continue
			}
			r, _ := v.readRecord(off + slHint)
			out = append(out, decodeSlot(v, i, r))
		}
		return nil
	})
	return out, err
}

// Slot returns slot i whatever its state.
func (s *Segment) Slot(i uint32) (Slot, error) {
	var sl Slot
	err := s.do(func(v view) error {
		if i >= s.h.NSlots {
			return fmt.Errorf("slot %d of %d: %w", i, s.h.NSlots, ErrSlotRange)
		}
		r, _ := v.readRecord(slotOff(i) + slHint)
		sl = decodeSlot(v, i, r)
		return nil
	})
	return sl, err
}

// Resolve is what the plugin would decide for slot now (spec 5.3); a gone segment resolves
// to stale, as for the plugin.
func (s *Segment) Resolve(slot uint32, now, staleNs uint64) Resolution {
	r := Resolution{Source: SourceStale}
	_ = s.do(func(v view) error { r = resolve(v, s.h, slot, now, staleNs); return nil })
	return r
}

// SetSlotHint sets (valid) or clears the hint of ACTIVE slot `slot`, for the registration
// `gen` the caller read (Slot.Gen): when the slot now holds another registration the write is
// refused with a *GenChangedError (errors.Is ErrGenChanged), so a hint never lands on another
// connection. A value above 1024 is written as 1024 and reported with a *ClampedError.
func (s *Segment) SetSlotHint(slot, gen uint32, supBw uint32, valid bool) error {
	if slot >= s.h.NSlots {
		return fmt.Errorf("set slot %d hint: %w", slot, ErrSlotRange)
	}
	bw, cerr := clampErr(supBw)
	err := s.locked(func(v view) error {
		off := slotOff(slot)
		if SlotState(uint32(v.u64(off+slOwner))) != StateActive {
			return fmt.Errorf("set slot %d hint: %w", slot, ErrSlotInactive)
		}
		if cur := v.u32(off + slGen); cur != gen {
			return &GenChangedError{Slot: slot, Expected: gen, Current: cur}
		}
		v.writeRecord(off+slHint, Record{SupBw: bw, Flags: flags(valid), Gen: gen, SetNs: Now()})
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
	err := s.locked(func(v view) error {
		v.writeRecord(classOff(uint8(class)), Record{SupBw: bw, Flags: flags(valid), SetNs: Now()})
		return nil
	})
	if err != nil {
		return err
	}
	return cerr
}

// SetPeerHint sets or clears the default for peers matching ip/prefixLen (32: one peer,
// 24: an island).
func (s *Segment) SetPeerHint(ip IPv4, prefixLen uint8, supBw uint32, valid bool) error {
	if prefixLen > 32 {
		return fmt.Errorf("set peer %v/%d hint: %w", ip, prefixLen, ErrBadPrefix)
	}
	bw, cerr := clampErr(supBw)
	err := s.locked(func(v view) error {
		target, free := -1, -1
		for j := uint32(0); j < s.h.NPeers && target < 0; j++ {
			r, err := v.readRecord(peerOff(s.h.NSlots, j))
			switch {
			case err == nil && !r.Valid() && free < 0:
				free = int(j)
			case err == nil && r.Valid() && r.PeerIP == ip && r.PrefixLen == prefixLen:
				target = int(j)
			}
		}
		if target < 0 {
			if !valid {
				cerr = nil
				return nil
			}
			if free < 0 {
				return fmt.Errorf("set peer %v/%d hint: %w (%d entries)", ip, prefixLen, ErrPeerTableFull, s.h.NPeers)
			}
			target = free
		}
		v.writeRecord(peerOff(s.h.NSlots, uint32(target)),
			Record{SupBw: bw, Flags: flags(valid), SetNs: Now(), PeerIP: ip, PrefixLen: prefixLen})
		v.add32(offPeersEpoch, 1)
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

// LeaseHeld reports whether a live process holds slot i's lease (spec 5.7).
func (s *Segment) LeaseHeld(i uint32) (bool, error) {
	if i >= s.h.NSlots {
		return false, fmt.Errorf("slot %d: %w", i, ErrSlotRange)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return lockHeld(s.f, slotLockOff(i))
}

// GC reclaims slots whose owner is gone (spec 5.7): an owner word that is not zero while no
// process holds the slot's lease. The lease is an OFD lock the kernel drops when its holder
// dies, whatever PID namespace it lives in. It returns the reclaimed slot indices.
func (s *Segment) GC() ([]uint32, error) {
	var freed []uint32
	err := s.locked(func(v view) error {
		for i := uint32(0); i < s.h.NSlots; i++ {
			off := slotOff(i)
			owner := v.u64(off + slOwner)
			if owner == 0 {
				continue
			}
			held, err := lockHeld(s.f, slotLockOff(i))
			if err != nil {
				return fmt.Errorf("gc %s: lease of slot %d: %w", s.path, i, err)
			}
			if !held && v.cas64(off+slOwner, owner, 0) {
				freed = append(freed, i)
			}
		}
		return nil
	})
	return freed, err
}

// Replaced reports whether the path now names another file than the one mapped, or the
// mapped one was truncated.
func (s *Segment) Replaced() bool {
	if s.gone.Load() {
		return true
	}
	var st unix.Stat_t
	if err := unix.Lstat(s.path, &st); err != nil {
		return false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if uint64(st.Dev) != s.dev || st.Ino != s.ino {
		return true
	}
	var fst unix.Stat_t
	return unix.Fstat(int(s.f.Fd()), &fst) == nil && uint64(fst.Size) < s.h.TotalSize
}

// Reattach moves the Segment to the segment now at its path when the file was replaced or
// truncated (Replaced). An agent lock held on the old file is taken on the new one first
// (ErrAgentRunning when another agent holds it: the Segment then stays where it was).
// Registrations made with Register are dropped. It reports whether it moved.
func (s *Segment) Reattach() (bool, error) {
	if !s.Replaced() {
		return false, nil
	}
	n, err := Open(s.path)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agent {
		if err := n.acquireAgentLocked(); err != nil {
			n.Close()
			return false, err
		}
	}
	oldF, oldB, oldLeases := s.f, s.v.b, s.leases
	s.f, s.v, s.h, s.dev, s.ino, s.leases = n.f, n.v, n.h, n.dev, n.ino, nil
	s.gone.Store(false)
	s.lastBeat.Store(0)
	_ = unix.Munmap(oldB)
	oldF.Close()
	if oldLeases != nil {
		oldLeases.Close()
	}
	return true, nil
}

// leaseFile is the second open file description Register leases through (the caller holds
// mu): a lease taken through s.f itself would be invisible to this Segment's GC.
func (s *Segment) leaseFile() (*os.File, error) {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	if s.leases == nil {
		f, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(s.f.Fd())), os.O_RDWR|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
		if err != nil {
			return nil, fmt.Errorf("register: %w", err)
		}
		s.leases = f
	}
	return s.leases, nil
}

// Register claims a slot the way the plugin does (spec 5.4: lease, then CAS): for fakes,
// tests and tools. The lease lives as long as the Segment (or until Release).
func (s *Segment) Register(d ConnDesc) (uint32, error) {
	pid := d.PID
	if pid == 0 {
		pid = uint32(os.Getpid())
	}
	var slot uint32
	err := s.do(func(v view) error {
		lf, err := s.leaseFile()
		if err != nil {
			return err
		}
		n := s.h.NSlots
		start := uint32((uint64(pid)*31 + d.ConnID) % uint64(n))
		for k := uint32(0); k < n; k++ {
			i := (start + k) % n
			off := slotOff(i)
			if v.u64(off+slOwner) != 0 || ofdLock(lf, slotLockOff(i), unix.F_WRLCK) != nil {
				continue
			}
			if !v.cas64(off+slOwner, 0, uint64(StateClaiming)|uint64(pid)<<32) {
				_ = ofdLock(lf, slotLockOff(i), unix.F_UNLCK)
				continue
			}
			gen := v.u32(off+slGen) + 1
			if gen == 0 {
				gen = 1
			}
			v.put32(off+slGen, gen)
			v.put64(off+slConnID, d.ConnID)
			v.put32(off+slLocalIP, uint32(d.LocalSoutIP))
			v.put32(off+slPeerIP, uint32(d.PeerSoutIP))
			v.put32(off+slPeerIsland, uint32(d.PeerIsland))
			v.put8(off+slPathClass, uint8(d.PathClass))
			var send uint8
			if d.IsSend {
				send = 1
			}
			v.put8(off+slIsSend, send)
			v.put16(off+slNQPsSout, d.NQPsSout)
			v.put16(off+slNQPsSup, d.NQPsSup)
			v.put32(off+slPID, pid)
			v.put64(off+slRegistered, Now())
			v.put16(off+slDev, d.Dev)
			v.put8(off+slSoutPort, d.Ports[0])
			v.put8(off+slSupPort, d.Ports[1])
			v.put8(off+slSupPath, uint8(d.SupPath))
			putNICName(v, off+slSoutNIC, d.NICs[0])
			putNICName(v, off+slSupNIC, d.NICs[1])
			putTelemetry(v, off, Telemetry{})
			v.put64(off+slOwner, uint64(StateActive)|uint64(pid)<<32)
			slot = i
			return nil
		}
		return fmt.Errorf("register: %w (%d slots)", ErrSlotsFull, n)
	})
	return slot, err
}

// Release frees a slot the way the plugin does at close: owner word to 0, then the lease.
func (s *Segment) Release(slot uint32) error {
	if slot >= s.h.NSlots {
		return fmt.Errorf("release slot %d: %w", slot, ErrSlotRange)
	}
	s.lmu.Lock()
	lf := s.leases
	s.lmu.Unlock()
	return s.do(func(v view) error {
		v.put64(slotOff(slot)+slOwner, 0)
		if lf != nil {
			_ = ofdLock(lf, slotLockOff(slot), unix.F_UNLCK)
		}
		return nil
	})
}

// AddTelemetry counts bytes and one request posted on a rail (0 SOUT, 1 SUP): the posted part
// of a plugin's telemetry batch (FlushTelemetry publishes a whole one).
func (s *Segment) AddTelemetry(slot uint32, rail int, bytes uint64) error {
	return s.AddTelemetryN(slot, rail, bytes, 1)
}

// SetRailState records a rail's (0 SOUT, 1 SUP) state change at realtimeNs as the plugin
// does (mpib_shm_set_rail_state): failovers counts a rail leaving service (up -> not up),
// recoveries its return (not up -> up).
// For fakes, tests and tools.
func (s *Segment) SetRailState(slot uint32, rail int, state RailState, realtimeNs uint64) error {
	if slot >= s.h.NSlots || rail < 0 || rail > 1 {
		return fmt.Errorf("rail state slot %d rail %d: %w", slot, rail, ErrSlotRange)
	}
	return s.do(func(v view) error {
		off := slotOff(slot)
		st, ns := slSoutState, slSoutStateNs
		if rail == 1 {
			st, ns = slSupState, slSupStateNs
		}
		wasUp := RailState(v.u8(off+st)) == RailUp
		if state != RailUp && wasUp {
			v.add32(off+slFailovers, 1)
		} else if state == RailUp && !wasUp {
			v.add32(off+slRecoveries, 1)
		}
		v.put64(off+ns, realtimeNs)
		v.put8(off+st, uint8(state))
		return nil
	})
}

// AddTelemetryN counts bytes carried by requests requests posted on a rail (0 SOUT, 1 SUP), the
// posted part of a plugin's batch of transfers. For fakes, simulators and tools.
func (s *Segment) AddTelemetryN(slot uint32, rail int, bytes, requests uint64) error {
	if slot >= s.h.NSlots || rail < 0 || rail > 1 {
		return fmt.Errorf("telemetry slot %d rail %d: %w", slot, rail, ErrSlotRange)
	}
	return s.do(func(v view) error {
		off := slotOff(slot)
		b, r := slSoutBytes, slSoutRequests
		if rail == 1 {
			b, r = slSupBytes, slSupRequests
		}
		v.add64(off+b, bytes)
		v.add64(off+r, requests)
		return nil
	})
}

// RailBatch is one rail's part of a telemetry batch: counters to add, and InflightBytes, a
// gauge that replaces the stored value.
type RailBatch struct {
	PostedBytes, PostedRequests       uint64
	CompletedBytes, CompletedRequests uint64
	BusyNs                            uint64 // sum of completion - post time over CompletedRequests
	ActiveNs                          uint64 // time with at least one request in flight on the rail
	InflightBytes                     uint64
}

// TelemetryBatch is what the plugin publishes to a slot at one flush (mpib_shm_flush_telemetry).
type TelemetryBatch struct {
	Rails        [2]RailBatch // 0 SOUT, 1 SUP
	AppliedSupBw uint32       // split of the last posted message, after the guard and failover
	WallNs       uint64       // CLOCK_REALTIME ns of the flush
}

// FlushTelemetry publishes a batch as the plugin does at a telemetry flush (spec 4.3):
// relaxed adds of the counters, stores of the gauges, the applied split and the wall-clock
// stamp. For fakes, simulators and tools.
func (s *Segment) FlushTelemetry(slot uint32, b TelemetryBatch) error {
	if slot >= s.h.NSlots {
		return fmt.Errorf("telemetry slot %d: %w", slot, ErrSlotRange)
	}
	return s.do(func(v view) error {
		off := slotOff(slot)
		for r, rb := range b.Rails {
			bytes, reqs := slSoutBytes, slSoutRequests
			if r == 1 {
				bytes, reqs = slSupBytes, slSupRequests
			}
			v.add64(off+bytes, rb.PostedBytes)
			v.add64(off+reqs, rb.PostedRequests)
			blk := off + slRailDone + r*rdSize
			v.add64(blk+rdBytes, rb.CompletedBytes)
			v.add64(blk+rdRequests, rb.CompletedRequests)
			v.add64(blk+rdBusyNs, rb.BusyNs)
			v.add64(off+slActiveNs+r*8, rb.ActiveNs)
			v.put64(blk+rdInflight, rb.InflightBytes)
		}
		v.put32(off+slAppliedSupBw, b.AppliedSupBw)
		v.put64(off+slFlushWallNs, b.WallNs)
		return nil
	})
}

// RecordRead updates a slot's read telemetry after a hint read that returned res at now, as
// the plugin does (spec 5.3, end): reads_applied or reads_fallback (+reads_stale), clamped,
// last_sup_bw (applied reads), last_source, last_read_ns. For fakes, simulators and tools.
func (s *Segment) RecordRead(slot uint32, res Resolution, now uint64) error {
	if slot >= s.h.NSlots {
		return fmt.Errorf("record read slot %d: %w", slot, ErrSlotRange)
	}
	return s.do(func(v view) error {
		off := slotOff(slot)
		if SlotState(uint32(v.u64(off+slOwner))) != StateActive {
			return nil
		}
		if res.Applies {
			v.add64(off+slReadsApplied, 1)
			v.put32(off+slLastSupBw, res.SupBw)
		} else {
			v.add64(off+slReadsFallback, 1)
			if res.Source == SourceStale {
				v.add64(off+slReadsStale, 1)
			}
		}
		if res.Clamped {
			v.add64(off+slClamped, 1)
		}
		v.put32(off+slLastSource, uint32(res.Source))
		v.put64(off+slLastReadNs, now)
		return nil
	})
}
