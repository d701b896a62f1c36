// log_test.go: burstLog's limit on lines a peer can cause.

package main

import (
	"testing"
	"time"
)

// burstLog says the first event of a burst at once, then at most one line a second, which
// stands for every event since the last line.
func TestBurstLog(t *testing.T) {
	tests := []struct {
		name   string
		at     []time.Duration // each event's time
		wantNs []int           // note's n for each event
	}{
		{"one event", []time.Duration{0}, []int{1}},
		{"a burst: the first, then silence", []time.Duration{0, 1, 2, 999 * time.Millisecond}, []int{1, 0, 0, 0}},
		{"a second later: the events since", []time.Duration{0, 1, 2, time.Second}, []int{1, 0, 0, 3}},
		{"events a second apart: each said", []time.Duration{0, time.Second, 2 * time.Second}, []int{1, 1, 1}},
		{"a quiet spell: the next said at once", []time.Duration{0, time.Hour}, []int{1, 1}},
		{"a steady flood: one line a second", []time.Duration{0, 500 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second}, []int{1, 0, 2, 0, 2}},
	}
	base := time.Unix(1000, 0)
	for _, tt := range tests {
		var b burstLog
		for i, at := range tt.at {
			n, total := b.note(base.Add(at))
			if n != tt.wantNs[i] || total != uint64(i+1) {
				t.Errorf("%s: event %d: note = (%d, %d), want (%d, %d)", tt.name, i, n, total, tt.wantNs[i], i+1)
			}
		}
	}
}
