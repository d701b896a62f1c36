//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// Segment is a live read-write mapping of a hint segment. Methods are safe for concurrent use
// by goroutines; writes of hint records take the cross-process writer lock (flock, spec 5.5).
//
// A segment truncated under the process (spec 5.9) never crashes it: every access runs with
// debug.SetPanicOnFault, a fault marks the segment gone and the method returns
// ErrSegmentGone. Reattach moves the Segment to the file now at its path.
type Segment struct {
	path string

	mu    sync.RWMutex // Reattach swaps the fields below under mu; every access holds it
	f     *os.File
	v     wire.View
	h     Header // validated at open; never re-read
	dev   uint64
	ino   uint64
	agent bool // holds the agent lock (spec 5.7)

	gone       atomic.Bool
	lastBeat   atomic.Uint64 // the heartbeat value this Segment last stored
	attachment atomic.Uint64 // counts the moves of Reattach (Attachment)
}

// Now returns CLOCK_MONOTONIC in nanoseconds, the segment's time base.
func Now() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Sec)*1e9 + uint64(ts.Nsec)
}

// Create makes a new zeroed segment at path with mode 0600 (spec 5.8), every page allocated
// (a full file system fails it at once, wrapping ENOSPC), and opens it. It refuses
// (ErrSegmentLive) to replace a segment that is live (an agent beats it, or a plugin or agent
// holds it open) unless force is set; plugins then move to the new segment within their poll
// period. A file at path owned by another user is always refused (ErrBadOwner).
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
	v := wire.View{B: hdr}
	copy(hdr, Magic)
	v.Put32(wire.OffVersion, Version)
	v.Put32(wire.OffHeaderSize, HeaderSize)
	v.Put64(wire.OffTotalSize, size)
	v.Put32(wire.OffNSlots, nslots)
	v.Put32(wire.OffSlotSize, SlotSize)
	v.Put32(wire.OffNPeers, npeers)
	v.Put32(wire.OffPeerSize, PeerSize)
	v.Put64(wire.OffCreated, Now())

	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	tmp := f.Name()
	err = f.Chmod(0o600)
	if err == nil {
		err = reserve(f, int64(size))
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

// fallocate allocates a file's first size bytes (a variable: tests make the file system full).
var fallocate = func(fd int, size int64) error { return unix.Fallocate(fd, 0, 0, size) }

// reserve sizes a new segment file to size zero bytes with every page allocated, so that a
// full file system (a container's /dev/shm is 64 MiB by default) fails the create at once,
// not the first touch of a page later: that is a SIGBUS in every process mapping the file. A
// file system without fallocate gets the zeros written.
func reserve(f *os.File, size int64) error {
	err := fallocate(int(f.Fd()), size)
	for errors.Is(err, unix.EINTR) { // tmpfs gives up a long allocation at any signal (Go's preemption sends some)
		err = fallocate(int(f.Fd()), size)
	}
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		_, err = f.WriteAt(make([]byte, size), 0)
	}
	switch {
	case errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("cannot reserve the segment's %d bytes: %w (the file system is full: free space, "+
			"give a container a larger /dev/shm (docker run --shm-size), or create fewer --slots/--peers)", size, err)
	case err != nil:
		return fmt.Errorf("reserve %d bytes: %w", size, err)
	}
	return nil
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
	s.f, s.v, s.h, s.dev, s.ino = f, wire.View{B: mem, Live: true}, h, uint64(st.Dev), st.Ino
	return nil
}

// Close unmaps the segment; the kernel drops this Segment's locks (the agent lock).
func (s *Segment) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := unix.Munmap(s.v.B)
	if cerr := s.f.Close(); err == nil {
		err = cerr
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
func (s *Segment) do(fn func(v wire.View) error) (err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.Err(); err != nil {
		return err
	}
	faulted, err := wire.Guarded(s.v, fn)
	if faulted {
		s.gone.Store(true)
		return s.Err()
	}
	return err
}

// Header returns the header, with the live heartbeat and epoch (zero once the segment is gone).
func (s *Segment) Header() Header {
	var h Header
	_ = s.do(func(v wire.View) error { h = decodeHeader(v); return nil })
	return h
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

// Attachment names the file the Segment maps: 0 for the one Open mapped, one more after each
// Reattach that moved. Slot indices, generations and hints belong to one attachment: a writer
// that remembers what it wrote must forget it when the attachment changes (the new segment
// holds none of it, and its generations start again at 1).
func (s *Segment) Attachment() uint64 { return s.attachment.Load() }

// Reattach moves the Segment to the segment now at its path when the file was replaced or
// truncated (Replaced). An agent lock held on the old file is taken on the new one first
// (ErrAgentRunning when another agent holds it: the Segment then stays where it was).
// It reports whether it moved (Attachment then changed).
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
	oldF, oldB := s.f, s.v.B
	s.f, s.v, s.h, s.dev, s.ino = n.f, n.v, n.h, n.dev, n.ino
	s.gone.Store(false)
	s.lastBeat.Store(0)
	s.attachment.Add(1)
	_ = unix.Munmap(oldB)
	oldF.Close()
	return true, nil
}
