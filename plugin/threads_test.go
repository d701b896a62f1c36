// threads_test.go: the idle trim waits for the handshakes in flight.

package main

import (
	"runtime"
	"testing"
)

// A trim (trimNow) that fires while a handshake runs (a burst that started no slow call for
// trimAfter) leaves the Ps and threads alone and is armed again; once the last handshake ends,
// the trim rests the control plane.
func TestTrimWaitsForHandshakes(t *testing.T) {
	if !procsOwned {
		t.Skip("GOMAXPROCS is set in the environment: MPIB leaves it alone, and this test reads it")
	}
	stopTimer := func() bool {
		trim.mu.Lock()
		defer trim.mu.Unlock()
		return trim.timer.Stop()
	}
	inFlight := true
	defer func() {
		if inFlight { // a failure before the handshake's end: the tests after this one see none
			handshakesInFlight.Add(-1)
		}
		noteActivity() // the Ps back for the tests after this one
		stopTimer()
	}()
	handshakeBegins()
	noteActivity()
	if trimNow() {
		t.Error("trimNow said it rested the control plane with a handshake in flight")
	}
	if trim.atRest || runtime.GOMAXPROCS(0) != controlPlaneProcs {
		t.Fatalf("trimmed with a handshake in flight: at rest %v, GOMAXPROCS %d", trim.atRest, runtime.GOMAXPROCS(0))
	}
	if !stopTimer() {
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
