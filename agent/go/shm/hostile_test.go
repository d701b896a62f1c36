//go:build linux

package shm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

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
