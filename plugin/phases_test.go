// phases_test.go: the decision whether a spare needs verbs calls, and the INFO line of a
// handshake's phases that mpib-nettest parses.

package main

import (
	"testing"
	"time"
)

// spareNeedsVerbs decides whether fitting a listener's spare takes a verbs slot and a thread.
func TestSpareNeedsVerbs(t *testing.T) {
	for _, c := range []struct {
		want, have uint32
		verbs      bool
	}{
		{0, 0, false}, // inter-island, or no SUP pair: only the path class and CTS rail change
		{2, 0, true},  // SUP QPs to build on a SOUT-only spare
		{1, 0, true},
		{2, 2, false}, // already built: nothing to create
		{0, 2, false},
	} {
		if got := spareNeedsVerbs(c.want, c.have); got != c.verbs {
			t.Errorf("spareNeedsVerbs(want %d, have %d) = %v, want %v", c.want, c.have, got, c.verbs)
		}
	}
}

// The INFO line's tail is what mpib-nettest's connect-phases line parses: "setup ms: " and
// k=v pairs, dial only on the connector.
func TestPhasesLine(t *testing.T) {
	t0 := time.Now()
	ph := newPhases(t0)
	ph.params = 1500 * time.Microsecond
	ph.qpCreate = 20 * time.Millisecond
	ph.last = t0.Add(42 * time.Millisecond)
	ph.finish()
	want := "setup ms: params=1.5 hello=0.0 qp_create=20.0 verbs_wait=0.0 metadata=0.0 rtr_rts=0.0 ack=0.0 agent=0.0 total=42.0"
	if got := ph.String(); got != want {
		t.Errorf("acceptor:\n got %s\nwant %s", got, want)
	}
	ph.dial = 3 * time.Millisecond
	want = "setup ms: params=1.5 dial=3.0 hello=0.0 qp_create=20.0 verbs_wait=0.0 metadata=0.0 rtr_rts=0.0 ack=0.0 agent=0.0 total=42.0"
	if got := ph.String(); got != want {
		t.Errorf("connector:\n got %s\nwant %s", got, want)
	}
}

// joinAt moves the next step's start only forward: the connector's metadata step starts when
// both its resources and its hello are done.
func TestPhasesJoinAt(t *testing.T) {
	t0 := time.Now()
	ph := newPhases(t0)
	ph.joinAt(t0.Add(-time.Second))
	if !ph.last.Equal(t0) {
		t.Errorf("joinAt an earlier time moved the start to %v", ph.last.Sub(t0))
	}
	ph.joinAt(t0.Add(time.Second))
	if got := ph.last.Sub(t0); got != time.Second {
		t.Errorf("joinAt a later time: start %v after t0, want 1s", got)
	}
}
