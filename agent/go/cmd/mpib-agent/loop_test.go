package main

import (
	"bytes"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
)

func TestNextTick(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		name     string
		ended    time.Duration // after t0, the tick due at t0 ended
		want     time.Duration // after t0
		interval time.Duration
	}{
		{"a short tick keeps the schedule", 10 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
		{"a tick that ends on the next due time", 100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
		{"an overrun: an interval after its end", 150 * time.Millisecond, 250 * time.Millisecond, 100 * time.Millisecond},
	} {
		if got := nextTick(t0, t0.Add(c.ended), c.interval); !got.Equal(t0.Add(c.want)) {
			t.Errorf("%s: next tick at +%v, want +%v", c.name, got.Sub(t0), c.want)
		}
	}
}

// A policy whose every tick overruns its interval still lets the agent follow a replaced
// segment: the beater takes its turn between two ticks.
func TestSlowTicksFollowAReplacedSegment(t *testing.T) {
	t.Setenv("MPIB_AGENT_STALE_MS", "100") // beats every 25 ms
	path := filepath.Join(t.TempDir(), "seg")
	c, err := shm.Create(path, 8, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	s, err := shm.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first := s.Attachment()
	done := make(chan error, 1)
	out := &lockedWriter{w: &bytes.Buffer{}}
	go func() {
		done <- agentLoop(s, out, 100*time.Millisecond, func() error { time.Sleep(150 * time.Millisecond); return nil })
	}()
	time.Sleep(300 * time.Millisecond)
	n, err := shm.Create(path, 8, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	deadline := time.Now().Add(3 * time.Second)
	for s.Attachment() == first && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	followed := s.Attachment() != first
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil { // agentLoop's signal ends it
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("agent loop: %v", err)
	}
	if !followed {
		t.Error("with every tick overrunning its interval the agent never followed the replaced segment in 3 s")
	}
}

// TestReclaimDue: a policy loop runs its reclaim pass on its first tick and then whenever
// reclaimPeriod has passed, whatever its interval (spec 5.7: at least every 5 s).
func TestReclaimDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		name      string
		last, now time.Time
		want      bool
	}{
		{"first tick", time.Time{}, t0, true},
		{"a 1 s loop's next tick", t0, t0.Add(time.Second), false},
		{"5 s after the last pass", t0, t0.Add(5 * time.Second), true},
		{"a 10 s loop's next tick", t0, t0.Add(10 * time.Second), true},
	} {
		if got := reclaimDue(c.last, c.now); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
