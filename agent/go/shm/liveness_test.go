//go:build linux

package shm

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// TestCreateRefusesLive: create refuses a live segment (an agent beats it or a process holds it open)
// unless forced; paths are per user and symbolic links are refused.
func TestCreateRefusesLive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hints")
	s, err := Create(path, 4, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Create(path, 4, 0, false); err != nil { // nobody uses it: replaced
		t.Fatalf("re-create of an unused segment: %v", err)
	}
	s.Beat(Now())
	if _, err := Create(path, 4, 0, false); !errors.Is(err, ErrSegmentLive) {
		t.Fatalf("fresh heartbeat: expected ErrSegmentLive but got %v", err)
	}
	s.StopBeat()
	// A plugin attached (shared lock on byte 0), no agent.
	fd, err := unix.Open(path, unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	lk := unix.Flock_t{Type: unix.F_RDLCK, Start: wire.LockAttach, Len: 1}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk); err != nil {
		t.Fatal(err)
	}
	if l, _ := Live(path); !l.Locked || l.HeartbeatFresh {
		t.Fatalf("liveness with a plugin attached: %+v", l)
	}
	if _, err := Create(path, 4, 0, false); !errors.Is(err, ErrSegmentLive) || Code(err) != "segment_live" {
		t.Fatalf("plugin attached: expected ErrSegmentLive but got %v", err)
	}
	n, err := Create(path, 4, 0, true)
	if err != nil {
		t.Fatalf("forced: %v", err)
	}
	n.Close()
	unix.Close(fd)
	s.Close()

	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(path, link)
	if _, err := Open(link); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("symlink: expected ErrNotRegular but got %v", err)
	}
	t.Setenv("MPIB_SHM_PATH", "")
	if got, want := DefaultPath(), "/dev/shm/mpib-hints-"+strconv.Itoa(os.Geteuid()); got != want {
		t.Fatalf("default path: expected %s but got %s", want, got)
	}
	if os.Geteuid() == 0 {
		os.Lchown(path, 65534, 65534)
		if _, err := Create(path, 4, 0, true); !errors.Is(err, ErrBadOwner) {
			t.Fatalf("a file of another user: expected ErrBadOwner even forced but got %v", err)
		}
	}
}

// TestAgentLockAndOwnHeartbeat: one beating agent at a time; a stop clears only its own
// heartbeat; the beat period follows MPIB_AGENT_STALE_MS.
func TestAgentLockAndOwnHeartbeat(t *testing.T) {
	a := newSeg(t, 2, 0)
	b, err := Open(a.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.AcquireAgent(); err != nil {
		t.Fatal(err)
	}
	a.Beat(Now())
	if err := b.AcquireAgent(); !errors.Is(err, ErrAgentRunning) || Code(err) != "agent_running" {
		t.Fatalf("second agent: expected ErrAgentRunning but got %v", err)
	}
	b.Beat(Now() + 1) // another writer beats anyway (an old tool)...
	if a.StopBeat() {
		t.Fatal("StopBeat cleared a heartbeat it did not write")
	}
	if a.Header().HeartbeatNs == 0 {
		t.Fatal("the other agent's heartbeat was cleared")
	}
	if !b.StopBeat() || a.Header().HeartbeatNs != 0 {
		t.Fatal("the own heartbeat must be cleared")
	}
	a.ReleaseAgent()
	if err := b.AcquireAgent(); err != nil {
		t.Fatalf("after release: %v", err)
	}
	t.Setenv("MPIB_AGENT_STALE_MS", "200")
	if p := BeatPeriod(StaleFromEnv()); p != 50*time.Millisecond {
		t.Fatalf("beat period for 200 ms: %v", p)
	}
	t.Setenv("MPIB_AGENT_STALE_MS", "0")
	if StaleFromEnv() != DefaultStaleMs*time.Millisecond {
		t.Fatal("an invalid MPIB_AGENT_STALE_MS must give the default")
	}
}
