//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Segment is a live read-write mapping of a hint segment. Methods are safe for concurrent use
// by goroutines; writes of hint records take the cross-process writer lock (flock, spec 5.5).
type Segment struct {
	path string
	f    *os.File
	v    view
	h    Header // validated at open; never re-read
}

// Now returns CLOCK_MONOTONIC in nanoseconds, the segment's time base.
func Now() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Sec)*1e9 + uint64(ts.Nsec)
}

// Create makes a new zeroed segment at path with mode 0600 (spec 5.8), replacing any file
// there, and opens it.
func Create(path string, nslots, npeers uint32) (*Segment, error) {
	if nslots < 1 || nslots > MaxSlots || npeers > MaxPeers {
		return nil, fmt.Errorf("create %s: %w: nslots=%d (1..%d) npeers=%d (0..%d)",
			path, ErrBadGeometry, nslots, MaxSlots, npeers, MaxPeers)
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

// Open maps an existing segment after the spec's validation (section 6).
func Open(path string) (*Segment, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	s, err := mapFile(f, path)
	if err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

func mapFile(f *os.File, path string) (*Segment, error) {
	fail := func(code error, format string, args ...any) error {
		return &ValidationError{Path: path, Code: code, Detail: fmt.Sprintf(format, args...)}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("open %s: fstat: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fail(ErrNotRegular, "not a regular file")
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return nil, fail(ErrBadOwner, "owned by uid %d, this process runs as %d", st.Uid, euid)
	}
	if st.Mode&0o022 != 0 {
		return nil, fail(ErrBadMode, "mode %04o is group/world writable (want 0600)", st.Mode&0o7777)
	}
	head := make([]byte, HeaderSize)
	n, _ := f.ReadAt(head, 0)
	h, err := validate(head[:n], st.Size, path)
	if err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(h.TotalSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("open %s: mmap: %w", path, err)
	}
	return &Segment{path: path, f: f, v: view{b: mem, live: true}, h: h}, nil
}

// Close unmaps the segment.
func (s *Segment) Close() error {
	err := unix.Munmap(s.v.b)
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Path returns the file the segment was opened from.
func (s *Segment) Path() string { return s.path }

// Header returns the header, with the live heartbeat and epoch.
func (s *Segment) Header() Header { return decodeHeader(s.v) }

// lock takes the writer lock of spec 5.5.
func (s *Segment) lock() (func(), error) {
	for {
		err := unix.Flock(int(s.f.Fd()), unix.LOCK_EX)
		if err == nil {
			return func() { _ = unix.Flock(int(s.f.Fd()), unix.LOCK_UN) }, nil
		}
		if err != unix.EINTR {
			return nil, fmt.Errorf("lock %s: %w", s.path, err)
		}
	}
}

// Beat stores the heartbeat (now, CLOCK_MONOTONIC ns) and the agent pid.
func (s *Segment) Beat(now uint64) {
	s.v.put32(offAgentPID, uint32(os.Getpid()))
	s.v.put64(offHeartbeat, now)
}

// StopBeat marks a clean agent exit: the plugin falls back to vanilla at once.
func (s *Segment) StopBeat() { s.v.put64(offHeartbeat, 0) }

// Snapshot decodes the whole live segment; hint records are read under their seqlock
// (a busy one is returned raw).
func (s *Segment) Snapshot() *Snapshot {
	snap := decodeSnapshot(s.v, s.Header())
	for i := range snap.Slots {
		r, _ := s.v.readRecord(slotOff(snap.Slots[i].Index) + slHint)
		snap.Slots[i].Hint = r
	}
	for i := range snap.Peers {
		r, _ := s.v.readRecord(peerOff(s.h.NSlots, snap.Peers[i].Index))
		snap.Peers[i].Record = r
	}
	for c := range snap.Class {
		snap.Class[c], _ = s.v.readRecord(classOff(uint8(c)))
	}
	return snap
}

// Connections returns the ACTIVE slots.
func (s *Segment) Connections() []Slot {
	var out []Slot
	for i := uint32(0); i < s.h.NSlots; i++ {
		off := slotOff(i)
		if SlotState(uint32(s.v.u64(off+slOwner))) != StateActive {
			continue
		}
		r, _ := s.v.readRecord(off + slHint)
		out = append(out, decodeSlot(s.v, i, r))
	}
	return out
}

// Slot returns slot i whatever its state.
func (s *Segment) Slot(i uint32) (Slot, error) {
	if i >= s.h.NSlots {
		return Slot{}, fmt.Errorf("slot %d of %d: %w", i, s.h.NSlots, ErrSlotRange)
	}
	r, _ := s.v.readRecord(slotOff(i) + slHint)
	return decodeSlot(s.v, i, r), nil
}

// Resolve is what the plugin would decide for slot now (spec 5.3).
func (s *Segment) Resolve(slot uint32, now, staleNs uint64) Resolution {
	return resolve(s.v, s.h, slot, now, staleNs)
}

// SetSlotHint sets (valid) or clears the hint of an ACTIVE slot, bound to its current gen.
// A value above 1024 is written as 1024 and reported with a *ClampedError.
func (s *Segment) SetSlotHint(slot uint32, supBw uint32, valid bool) error {
	if slot >= s.h.NSlots {
		return fmt.Errorf("set slot %d hint: %w", slot, ErrSlotRange)
	}
	bw, cerr := clampErr(supBw)
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	off := slotOff(slot)
	if SlotState(uint32(s.v.u64(off+slOwner))) != StateActive {
		return fmt.Errorf("set slot %d hint: %w", slot, ErrSlotInactive)
	}
	s.v.writeRecord(off+slHint, Record{SupBw: bw, Flags: flags(valid), Gen: s.v.u32(off + slGen), SetNs: Now()})
	return cerr
}

// SetClassHint sets or clears the default of a path class.
func (s *Segment) SetClassHint(class PathClass, supBw uint32, valid bool) error {
	if class > InterIsland {
		return fmt.Errorf("set class %d hint: %w", class, ErrBadClass)
	}
	bw, cerr := clampErr(supBw)
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	s.v.writeRecord(classOff(uint8(class)), Record{SupBw: bw, Flags: flags(valid), SetNs: Now()})
	return cerr
}

// SetPeerHint sets or clears the default for peers matching ip/prefixLen (32: one peer,
// 24: an island).
func (s *Segment) SetPeerHint(ip IPv4, prefixLen uint8, supBw uint32, valid bool) error {
	if prefixLen > 32 {
		return fmt.Errorf("set peer %v/%d hint: %w", ip, prefixLen, ErrBadPrefix)
	}
	bw, cerr := clampErr(supBw)
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	target, free := -1, -1
	for j := uint32(0); j < s.h.NPeers && target < 0; j++ {
		r, err := s.v.readRecord(peerOff(s.h.NSlots, j))
		switch {
		case err == nil && !r.Valid() && free < 0:
			free = int(j)
		case err == nil && r.Valid() && r.PeerIP == ip && r.PrefixLen == prefixLen:
			target = int(j)
		}
	}
	if target < 0 {
		if !valid {
			return nil
		}
		if free < 0 {
			return fmt.Errorf("set peer %v/%d hint: %w (%d entries)", ip, prefixLen, ErrPeerTableFull, s.h.NPeers)
		}
		target = free
	}
	s.v.writeRecord(peerOff(s.h.NSlots, uint32(target)),
		Record{SupBw: bw, Flags: flags(valid), SetNs: Now(), PeerIP: ip, PrefixLen: prefixLen})
	s.v.add32(offPeersEpoch, 1)
	return cerr
}

func flags(valid bool) uint32 {
	if valid {
		return FlagValid
	}
	return 0
}

// GC reclaims slots whose owner process is gone (spec 5.7); alive(pid) decides (nil: kill(pid, 0)).
// It returns the reclaimed slot indices.
func (s *Segment) GC(alive func(pid uint32) bool) ([]uint32, error) {
	if alive == nil {
		alive = pidAlive
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	var freed []uint32
	for i := uint32(0); i < s.h.NSlots; i++ {
		off := slotOff(i)
		owner := s.v.u64(off + slOwner)
		if owner == 0 || alive(uint32(owner>>32)) {
			continue
		}
		if s.v.cas64(off+slOwner, owner, 0) {
			freed = append(freed, i)
		}
	}
	return freed, nil
}

func pidAlive(pid uint32) bool {
	if pid == 0 {
		return false
	}
	err := unix.Kill(int(pid), 0)
	return err == nil || !errors.Is(err, syscall.ESRCH)
}

// Register claims a slot the way the plugin does (spec 5.4): for fakes, tests and tools.
func (s *Segment) Register(d ConnDesc) (uint32, error) {
	pid := d.PID
	if pid == 0 {
		pid = uint32(os.Getpid())
	}
	n := s.h.NSlots
	start := uint32((uint64(pid)*31 + d.ConnID) % uint64(n))
	for k := uint32(0); k < n; k++ {
		i := (start + k) % n
		off := slotOff(i)
		if s.v.u64(off+slOwner) != 0 || !s.v.cas64(off+slOwner, 0, uint64(StateClaiming)|uint64(pid)<<32) {
			continue
		}
		gen := s.v.u32(off+slGen) + 1
		if gen == 0 {
			gen = 1
		}
		s.v.put32(off+slGen, gen)
		s.v.put64(off+slConnID, d.ConnID)
		s.v.put32(off+slLocalIP, uint32(d.LocalSoutIP))
		s.v.put32(off+slPeerIP, uint32(d.PeerSoutIP))
		s.v.put32(off+slPeerIsland, uint32(d.PeerIsland))
		s.v.put8(off+slPathClass, uint8(d.PathClass))
		var send uint8
		if d.IsSend {
			send = 1
		}
		s.v.put8(off+slIsSend, send)
		s.v.put16(off+slNQPsSout, d.NQPsSout)
		s.v.put16(off+slNQPsSup, d.NQPsSup)
		s.v.put32(off+slPID, pid)
		s.v.put64(off+slRegistered, Now())
		putTelemetry(s.v, off, Telemetry{})
		s.v.put64(off+slOwner, uint64(StateActive)|uint64(pid)<<32)
		return i, nil
	}
	return 0, fmt.Errorf("register: %w (%d slots)", ErrSlotsFull, n)
}

// Release frees a slot the way the plugin does at close.
func (s *Segment) Release(slot uint32) error {
	if slot >= s.h.NSlots {
		return fmt.Errorf("release slot %d: %w", slot, ErrSlotRange)
	}
	s.v.put64(slotOff(slot)+slOwner, 0)
	return nil
}

// AddTelemetry counts bytes and one request on a rail (0 SOUT, 1 SUP), as the plugin does.
func (s *Segment) AddTelemetry(slot uint32, rail int, bytes uint64) error {
	if slot >= s.h.NSlots || rail < 0 || rail > 1 {
		return fmt.Errorf("telemetry slot %d rail %d: %w", slot, rail, ErrSlotRange)
	}
	off := slotOff(slot)
	b, r := slSoutBytes, slSoutRequests
	if rail == 1 {
		b, r = slSupBytes, slSupRequests
	}
	s.v.add64(off+b, bytes)
	s.v.add64(off+r, 1)
	return nil
}
