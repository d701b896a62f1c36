// threads_test.go: the idle trim waits for the handshakes in flight, and returns the heap's
// free pages.

package main

import (
	"runtime"
	"testing"
)

// stopTrimTimer stops the trim's timer, which noteActivity armed: whether it was pending.
func stopTrimTimer() bool {
	trim.mu.Lock()
	defer trim.mu.Unlock()
	return trim.timer.Stop()
}

// A trim gives the heap's free pages back to the kernel: after 16 MiB of garbage that the
// runtime collected but kept (freed, not released), the pages it holds free drop to less than
// half (to none at the collection; the trim's own goroutines then free a few stacks).
func TestTrimReleasesHeap(t *testing.T) {
	defer func() {
		noteActivity() // the Ps back for the tests after this one
		stopTrimTimer()
	}()
	held := func() uint64 {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapIdle - m.HeapReleased
	}
	// The runtime's background scavenger may return the garbage itself before the trim can (a
	// loaded machine gives it the time): the garbage is made again, a few times at most.
	var before uint64
	for try := 0; try < 5 && before < 4<<20; try++ {
		var keep [][]byte
		for range 4096 {
			keep = append(keep, make([]byte, 4096))
		}
		runtime.KeepAlive(keep)
		keep = nil
		runtime.GC()
		before = held()
	}
	if before < 4<<20 {
		t.Fatalf("the test's 16 MiB of garbage left %d KiB free and held: nothing for a trim to release", before>>10)
	}
	if !trimNow() {
		t.Fatal("trimNow did not rest the control plane with no handshake in flight")
	}
	if after := held(); after >= before/2 {
		t.Errorf("after a trim the heap holds %d KiB free, %d KiB before it: want less than half", after>>10, before>>10)
	}
}

// A trim (trimNow) that fires while a handshake runs (a burst that started no slow call for
// trimAfter) leaves the Ps and threads alone and is armed again; once the last handshake ends,
// the trim rests the control plane.
func TestTrimWaitsForHandshakes(t *testing.T) {
	if !procsOwned {
		t.Skip("GOMAXPROCS is set in the environment: MPIB leaves it alone, and this test reads it")
	}
	inFlight := true
	defer func() {
		if inFlight { // a failure before the handshake's end: the tests after this one see none
			handshakesInFlight.Add(-1)
		}
		noteActivity() // the Ps back for the tests after this one
		stopTrimTimer()
	}()
	handshakeBegins()
	noteActivity()
	if trimNow() {
		t.Error("trimNow said it rested the control plane with a handshake in flight")
	}
	if trim.atRest || runtime.GOMAXPROCS(0) != controlPlaneProcs {
		t.Fatalf("trimmed with a handshake in flight: at rest %v, GOMAXPROCS %d", trim.atRest, runtime.GOMAXPROCS(0))
	}
	if !stopTrimTimer() {
		t.Fatal("a trim deferred by a handshake in flight was not armed again")
	}
	handshakeEnds()
	inFlight = false
	if handshakesInFlight.Load() != 0 {
		t.Fatalf("handshakes in flight after the last one ended: %d", handshakesInFlight.Load())
	}
	if !trimNow() {
		t.Error("trimNow said it did not rest the control plane with no handshake in flight")
	}
	if !trim.atRest || runtime.GOMAXPROCS(0) != restProcs {
		t.Fatalf("no handshake in flight, but not at rest after the trim: at rest %v, GOMAXPROCS %d", trim.atRest, runtime.GOMAXPROCS(0))
	}
}
