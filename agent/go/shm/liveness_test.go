//go:build linux

package shm

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Defect 1: liveness was kill(pid, 0) on the plugin's pid. A plugin in a container (its own
// PID namespace) registers with a pid that does not exist here: the old GC reclaimed its live
// slot. Now a slot lives as long as its owner's lease (an OFD lock) is held.
func TestGCLeaseNotPID(t *testing.T) {
	s := newSeg(t, 4, 0)
	plugin, err := Open(s.Path()) // another process: its own open file description
	if err != nil {
		t.Fatal(err)
	}
	d := desc(1, "10.0.1.2", IntraIsland)
	d.PID = 4000001 // a pid from another PID namespace: no such process here
	slot, err := plugin.Register(d)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := s.LeaseHeld(slot); err != nil || !held {
		t.Fatalf("lease of a live registration: held=%v %v", held, err)
	}
	freed, err := s.GC()
	if err != nil || len(freed) != 0 {
		t.Fatalf("GC reclaimed a live connection: %v %v", freed, err)
	}
	if c := conns(t, s); len(c) != 1 {
		t.Fatalf("after GC: %+v", c)
	}
	plugin.Close() // the plugin process dies: the kernel drops its locks
	freed, err = s.GC()
	if err != nil || len(freed) != 1 || freed[0] != slot {
		t.Fatalf("GC after the owner died: expected [%d] but got %v (%v)", slot, freed, err)
	}
	// A released slot is free and has no lease; the next claim gets a fresh lease.
	again, err := s.Register(desc(2, "10.0.1.2", IntraIsland))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := Open(s.Path())
	defer other.Close()
	if held, _ := other.LeaseHeld(again); !held {
		t.Fatal("Register did not lease its slot")
	}
	s.Release(again)
	if held, _ := other.LeaseHeld(again); held {
		t.Fatal("Release kept the lease")
	}
}

// Defect 3: a hint carries the generation the writer read; a slot registered again in
// between refuses it.
func TestSetSlotHintGenChanged(t *testing.T) {
	s := newSeg(t, 1, 0)
	s.Beat(Now())
	slot, _ := s.Register(desc(1, "10.0.1.2", IntraIsland))
	g := gen(t, s, slot)
	s.Release(slot) // the connection closes while the policy computes...
	again, _ := s.Register(desc(2, "10.0.1.9", IntraIsland))
	if again != slot {
		t.Fatalf("expected slot %d again but got %d", slot, again)
	}
	err := s.SetSlotHint(slot, g, 900, true) // ...and writes for the one it saw
	var ge *GenChangedError
	if !errors.Is(err, ErrGenChanged) || !errors.As(err, &ge) || ge.Expected != g || ge.Current != g+1 {
		t.Fatalf("expected ErrGenChanged (%d -> %d) but got %v", g, g+1, err)
	}
	if Code(err) != "gen_changed" {
		t.Fatalf("code: %q", Code(err))
	}
	if r := s.Resolve(slot, Now(), 1e9); r.Applies {
		t.Fatalf("the hint landed on the new connection: %+v", r)
	}
	if err := s.SetSlotHint(slot, g+1, 900, true); err != nil {
		t.Fatal(err)
	}
}

// Defect 4: truncating the segment under a reader (same user, `: > file`) must not crash the
// agent: every access returns ErrSegmentGone, and Reattach follows a re-created segment.
func TestTruncateUnderReaders(t *testing.T) {
	s := newSeg(t, 64, 16)
	slot, _ := s.Register(desc(1, "10.0.2.7", InterIsland))
	var stop atomic.Bool
	var wg sync.WaitGroup
	var goneSeen atomic.Int64
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				_ = s.Beat(Now())
				_, err1 := s.Connections()
				s.Resolve(slot, Now(), 1e9)
				_, err2 := s.Snapshot()
				err3 := s.SetClassHint(InterIsland, 100, true)
				for _, err := range []error{err1, err2, err3} {
					if errors.Is(err, ErrSegmentGone) {
						goneSeen.Add(1)
					} else if err != nil {
						t.Errorf("unexpected error: %v", err)
					}
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	if err := os.Truncate(s.Path(), 0); err != nil { // what `: > file` does
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if goneSeen.Load() == 0 || !errors.Is(s.Err(), ErrSegmentGone) || Code(s.Err()) != "segment_gone" {
		t.Fatalf("no ErrSegmentGone after truncation (%d, %v)", goneSeen.Load(), s.Err())
	}
	if !s.Replaced() {
		t.Fatal("Replaced must report a truncated segment")
	}
	if _, err := Create(s.Path(), 8, 4, false); !errors.Is(err, ErrSegmentLive) {
		t.Fatalf("this process still leases slots of the truncated file: expected ErrSegmentLive but got %v", err)
	}
	n, err := Create(s.Path(), 8, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	if moved, err := s.Reattach(); !moved || err != nil {
		t.Fatalf("reattach: %v %v", moved, err)
	}
	if h := s.Header(); h.NSlots != 8 || s.Err() != nil {
		t.Fatalf("after reattach: %+v %v", h, s.Err())
	}
	if moved, err := s.Reattach(); moved || err != nil {
		t.Fatalf("reattach without a change: %v %v", moved, err)
	}
}

// Defect 5: create refuses a live segment (an agent beats it or a process holds it open)
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
	lk := unix.Flock_t{Type: unix.F_RDLCK, Start: lockAttach, Len: 1}
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

// Defect 6: one beating agent at a time; a stop clears only its own heartbeat; the beat
// period follows MPIB_AGENT_STALE_MS.
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
