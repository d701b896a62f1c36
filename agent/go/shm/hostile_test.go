//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestGeometryChangedSinceOpen: a process writing garbage into the header of an open segment
// (nslots, npeers, total_size, the sizes, the version) makes Snapshot and Connections return a
// bad_geometry error saying so, never panic (a changed nslots used to slice the mapping out of
// bounds); the validated geometry stays in use and the segment works again once the header is
// restored.
func TestGeometryChangedSinceOpen(t *testing.T) {
	type field struct {
		off  int
		val  uint64
		size int
	}
	cases := []struct {
		name   string
		writes []field
	}{
		{"nslots", []field{{offNSlots, 65536, 4}}},
		{"nslots and total_size", []field{{offNSlots, 20, 4}, {offTotalSize, TotalSize(20, 2), 8}}},
		{"npeers", []field{{offNPeers, 4096, 4}}},
		{"total_size", []field{{offTotalSize, 1 << 40, 8}}},
		{"slot_size", []field{{offSlotSize, 256, 4}}},
		{"version", []field{{offVersion, Version + 1, 4}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSeg(t, 4, 2)
			if _, err := s.Register(desc(1, "10.0.2.7", InterIsland)); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(s.Path(), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			orig := make([]byte, HeaderSize)
			f.ReadAt(orig, 0)
			for _, w := range tc.writes {
				b := binary.LittleEndian.AppendUint64(nil, w.val)
				f.WriteAt(b[:w.size], int64(w.off))
			}
			snap, err := s.Snapshot()
			if !errors.Is(err, ErrBadGeometry) || snap != nil || !strings.Contains(err.Error(), "changed since open") {
				t.Fatalf("Snapshot: expected a bad_geometry error but got %v (%v)", err, snap)
			}
			if c, err := s.Connections(); !errors.Is(err, ErrBadGeometry) {
				t.Fatalf("Connections: expected a bad_geometry error but got %v (%d slots)", err, len(c))
			}
			f.WriteAt(orig, 0)
			if snap, err := s.Snapshot(); err != nil || snap.Header.NSlots != 4 || len(snap.Slots) != 1 {
				t.Fatalf("restored header: %v %+v", err, snap)
			}
		})
	}
}

// TestOpenLeasedFile: a file someone holds a write lease on is refused at once (the open is
// O_NONBLOCK), not after the lease break time (45 s).
func TestOpenLeasedFile(t *testing.T) {
	dir := "/dev/shm"
	if _, err := os.Stat(dir); err != nil {
		dir = t.TempDir()
	}
	dir, err := os.MkdirTemp(dir, "mpib-lease-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	s, err := Create(filepath.Join(dir, "hints"), 2, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	// The lease holder is this process through its own descriptor (the only one open, as a
	// write lease requires); the Go runtime ignores the SIGIO of the break notice.
	fd, err := unix.Open(s.Path(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		t.Skipf("no write lease here: %v", err)
	}
	defer unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
	t0 := time.Now()
	seg, err := Open(s.Path())
	took := time.Since(t0)
	if seg != nil {
		seg.Close()
	}
	if !errors.Is(err, unix.EWOULDBLOCK) || !strings.Contains(err.Error(), "lease") || took > 100*time.Millisecond {
		t.Fatalf("expected a quick EWOULDBLOCK naming the lease but got %v after %v", err, took)
	}
}
