//go:build linux

package shm

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func newSeg(t *testing.T, nslots, npeers uint32) *Segment {
	t.Helper()
	s, err := Create(filepath.Join(t.TempDir(), "hints"), nslots, npeers, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func gen(t *testing.T, s *Segment, slot uint32) uint32 {
	t.Helper()
	sl, err := s.Slot(slot)
	if err != nil {
		t.Fatal(err)
	}
	return sl.Gen
}

func conns(t *testing.T, s *Segment) []Slot {
	t.Helper()
	c, err := s.Connections()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCreateMode(t *testing.T) {
	s := newSeg(t, 8, 4)
	st, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode: expected 0600 but got %o", st.Mode().Perm())
	}
	if st.Size() != int64(TotalSize(8, 4)) {
		t.Fatalf("size: expected %d but got %d", TotalSize(8, 4), st.Size())
	}
	if h := s.Header(); h.NSlots != 8 || h.NPeers != 4 || h.Version != Version || h.CreatedNs == 0 {
		t.Fatalf("header: %+v", h)
	}
	if _, err := Create(filepath.Join(t.TempDir(), "x"), 0, 1, false); !errors.Is(err, ErrBadGeometry) {
		t.Fatalf("zero slots: expected ErrBadGeometry but got %v", err)
	}
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	s, err := Create(good, 4, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	write := func(name string, b []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	img, _ := os.ReadFile(good)
	bad := append([]byte(nil), img...)
	bad[0] = 'X'
	tests := []struct {
		name string
		path string
		want error
	}{
		{"world writable", write("ww", img, 0o666), ErrBadMode},
		{"group writable", write("gw", img, 0o620), ErrBadMode},
		{"world readable", write("wr", img, 0o644), ErrBadMode}, // others would see peers and rates
		{"group readable", write("gr", img, 0o640), ErrBadMode},
		{"other executable", write("ox", img, 0o601), ErrBadMode},
		{"directory", dir, nil},
		{"too small", write("small", img[:10], 0o600), ErrTooSmall},
		{"truncated", write("trunc", img[:300], 0o600), ErrTooSmall},
		{"bad magic", write("magic", bad, 0o600), ErrBadMagic},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(tc.path)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("expected %v but got %v", tc.want, err)
			}
		})
	}
	if os.Geteuid() == 0 {
		p := write("owner", img, 0o600)
		os.Chown(p, 65534, 65534)
		if _, err := Open(p); !errors.Is(err, ErrBadOwner) {
			t.Fatalf("other owner: expected ErrBadOwner but got %v", err)
		}
	}
	if s, err := Open(write("ok600", img, 0o600)); err != nil {
		t.Fatalf("0600 must open: %v", err)
	} else {
		s.Close()
	}
}

// TestCreateFullFileSystem: a file system without room for the segment fails Create at once
// with ENOSPC, naming the path and the size, and leaves no file behind (neither at the path
// nor the temporary one), instead of a sparse file whose first touch of a page raises SIGBUS.
func TestCreateFullFileSystem(t *testing.T) {
	saved := fallocate
	t.Cleanup(func() { fallocate = saved })
	fallocate = func(int, int64) error { return unix.ENOSPC }
	dir := t.TempDir()
	path := filepath.Join(dir, "hints")
	_, err := Create(path, 8, 4, false)
	size := strconv.FormatUint(TotalSize(8, 4), 10)
	if !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), size) {
		t.Fatalf("expected ENOSPC naming %s and %s bytes but got %v", path, size, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("files left behind: %v", left)
	}
}

// TestCreateReservesPages: the segment file's pages are allocated at create, not left sparse.
func TestCreateReservesPages(t *testing.T) {
	s := newSeg(t, 1024, 256)
	var st unix.Stat_t
	if err := unix.Stat(s.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if got, want := st.Blocks*512, int64(TotalSize(1024, 256)); got < want {
		t.Fatalf("%d bytes allocated of %d: the file is sparse", got, want)
	}
}

// TestCreateWithoutFallocate: a file system without fallocate gets the segment's zeros written:
// the file is still fully allocated and the segment usable.
func TestCreateWithoutFallocate(t *testing.T) {
	saved := fallocate
	t.Cleanup(func() { fallocate = saved })
	fallocate = func(int, int64) error { return unix.EOPNOTSUPP }
	s := newSeg(t, 64, 16)
	var st unix.Stat_t
	if err := unix.Stat(s.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if want := int64(TotalSize(64, 16)); st.Size != want || st.Blocks*512 < want {
		t.Fatalf("size %d, %d bytes allocated: want %d of both", st.Size, st.Blocks*512, want)
	}
	if h := s.Header(); h.NSlots != 64 || h.NPeers != 16 {
		t.Fatalf("header: %+v", h)
	}
}
