//go:build linux

package shm_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
)

// TestGCNeverFreesALeasedSlot: the owner word (ACTIVE | pid << 32) is not unique per
// registration: a plugin that releases its slot and claims it again writes the same word. A
// reclaim that read the word before the release and found the lease free after it must not
// clear the new registration. A live plugin releases and claims the one slot with a fixed pid
// while the agent reclaims: GC must free nothing (the plugin never dies), and every
// registration must read ACTIVE until it is released.
func TestGCNeverFreesALeasedSlot(t *testing.T) {
	s, _ := newSeg(t, 1, 0)
	plugin := attach(t, s) // another process: its own open file description
	d := desc(1, "10.0.1.2", shm.IntraIsland)
	d.PID = 37
	var stop atomic.Bool
	var freed atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			f, err := s.GC()
			if err != nil {
				t.Errorf("GC: %v", err)
				return
			}
			freed.Add(int64(len(f)))
		}
	}()
	claims := 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && freed.Load() == 0; {
		slot, err := plugin.Register(d)
		if errors.Is(err, shm.ErrSlotsFull) {
			continue // the reclaim holds the lease for a moment
		}
		if err != nil {
			t.Fatal(err)
		}
		claims++
		if sl, err := s.Slot(slot); err != nil || sl.State != shm.StateActive || sl.OwnerPID != d.PID {
			t.Fatalf("claim %d: the leased slot reads %v pid %d (%v)", claims, sl.State, sl.OwnerPID, err)
		}
		if err := plugin.Release(slot); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if n := freed.Load(); n != 0 || claims == 0 {
		t.Fatalf("GC freed %d slot(s) of a live plugin (%d claims)", n, claims)
	}
}
