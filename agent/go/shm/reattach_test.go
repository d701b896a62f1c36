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

// TestSetSlotHintRacesReattach: a slot index that was in range before Reattach swapped in a
// segment with fewer slots must give ErrSlotRange, never an out-of-range access (a panic that
// kills the agent). Writers hammer the last slot of a large segment while it is replaced by
// a one-slot segment and back.
func TestSetSlotHintRacesReattach(t *testing.T) {
	const big = 4096
	s, _ := newSeg(t, big, 0)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				err := s.SetSlotHint(big-1, 1, 100, true)
				if err != nil && !errors.Is(err, shm.ErrSlotInactive) && !errors.Is(err, shm.ErrSlotRange) {
					t.Errorf("SetSlotHint: %v", err)
					return
				}
				if _, err := s.LeaseHeld(big - 1); err != nil && !errors.Is(err, shm.ErrSlotRange) {
					t.Errorf("LeaseHeld: %v", err)
					return
				}
			}
		}()
	}
	moves := 0
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); moves++ {
		n, err := shm.Create(s.Path(), uint32(1+(moves%2)*(big-1)), 0, true)
		if err != nil {
			t.Fatal(err)
		}
		n.Close()
		if moved, err := s.Reattach(); !moved || err != nil {
			t.Fatalf("reattach %d: %v %v", moves, moved, err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if s.Attachment() != uint64(moves) {
		t.Fatalf("Attachment after %d moves: %d", moves, s.Attachment())
	}
}
