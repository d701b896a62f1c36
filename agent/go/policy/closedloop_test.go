package policy

import (
	"errors"
	"math"
	"strconv"
	"testing"

	"github.com/mpib/mpib/agent/go/shm"
)

// clBench drives a ClosedLoop by hand: one send connection over two rails of capacity
// capBps (bytes/s, no latency) whose messages follow each other (a message takes as long as
// its slower part), ticks every 0.5 s; each rail is active while it carries its part.
type clBench struct {
	t      *testing.T
	p      *ClosedLoop
	f      *fake
	slot   shm.Slot
	recv   shm.Slot
	now    uint64
	capBps [2]float64
	hint   uint32
	hinted bool
	stall  bool // SUP completes nothing: its part is stuck on it
}

func newBench(t *testing.T, p *ClosedLoop, soutBps, supBps float64) *clBench {
	b := &clBench{t: t, p: p, f: &fake{gens: map[uint32]uint32{3: 1, 4: 1}}, now: 1e9, capBps: [2]float64{soutBps, supBps}}
	b.slot = shm.Slot{Index: 3, Gen: 1, IsSend: 1, State: shm.StateActive}
	b.recv = shm.Slot{Index: 4, Gen: 1, IsSend: 0, State: shm.StateActive}
	return b
}

// carry adds 0.5 s of traffic at the hint in force to the telemetry.
func (b *clBench) carry() {
	const msg = 1 << 20
	x := float64(b.hint) / 1024
	part := [2]float64{msg * (1 - x), msg * x}
	onRail := [2]float64{part[0] / b.capBps[0], part[1] / b.capBps[1]}
	n := 0.5 / math.Max(onRail[0], onRail[1]) // messages in the interval
	t := &b.slot.Telemetry
	if b.stall {
		t.SupActiveNs += 5e8
		return
	}
	t.SoutCompletedBytes += uint64(n * part[0])
	t.SupCompletedBytes += uint64(n * part[1])
	t.SoutActiveNs += uint64(n * onRail[0] * 1e9)
	t.SupActiveNs += uint64(n * onRail[1] * 1e9)
}

// tick runs one interval at the hint in force, then one Tick; it returns the hint written
// for the next interval.
func (b *clBench) tick() uint32 {
	b.t.Helper()
	if b.hinted {
		b.carry()
	}
	b.now += 5e8
	n := len(b.f.calls)
	if _, err := b.p.Tick(b.f, b.now, []shm.Slot{b.slot, b.recv}); err != nil {
		b.t.Fatal(err)
	}
	for _, c := range b.f.calls[n:] {
		if c.key != "3/"+itoa(b.slot.Gen) || !c.valid {
			b.t.Fatalf("unexpected write %+v", c)
		}
		b.hint, b.hinted = c.value, true
	}
	return b.hint
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

func TestClosedLoopTarget(t *testing.T) {
	for _, c := range []struct {
		sout, sup float64
		want      int
		ok        bool
	}{
		{1, 1, 512, true}, {1, 2, 683, true}, {2, 1, 341, true}, {100e9, 25e9, 205, true},
		{1, 1e6, 1024 - ClosedLoopMinShare, true}, {1e6, 1, ClosedLoopMinShare, true}, // both rails stay measured
		{1, 0, 0, false}, {0, 1, 0, false}, {0, 0, 0, false}, {-1, 1, 0, false},
		{math.NaN(), 1, 0, false}, {1, math.Inf(1), 0, false},
	} {
		w, ok := ClosedLoopTarget(c.sout, c.sup)
		if w != c.want || ok != c.ok {
			t.Errorf("ClosedLoopTarget(%g, %g) = %d, %t; want %d, %t", c.sout, c.sup, w, ok, c.want, c.ok)
		}
	}
}

func TestClosedLoopMove(t *testing.T) {
	for _, c := range []struct {
		w, target int
		gain      float64
		step      int
		want      int
	}{
		{512, 683, 0.5, 64, 576},  // half of 171 is 86: capped at 64
		{512, 683, 0.5, 256, 598}, // 512 + round(85.5)
		{600, 610, 0.5, 64, 605},
		{600, 601, 0.5, 64, 601}, // at least one step while w differs from the target
		{600, 599, 0.5, 64, 599},
		{600, 600, 0.5, 64, 600},
		{683, 341, 0.5, 64, 619}, // downwards, capped
		{683, 341, 1, 1024, 341},
		{10, 8, 1, 64, 8},
	} {
		if got := ClosedLoopMove(c.w, c.target, c.gain, c.step); got != c.want {
			t.Errorf("ClosedLoopMove(%d, %d, %g, %d) = %d, want %d", c.w, c.target, c.gain, c.step, got, c.want)
		}
	}
}

func TestClosedLoopConverges(t *testing.T) {
	b := newBench(t, &ClosedLoop{}, 25e6/8, 50e6/8) // SOUT 25, SUP 50 Mbit/s: best 683
	if got := b.tick(); got != 512 {
		t.Fatalf("first hint %d, want 512 (ClosedLoopStart)", got)
	}
	prev := uint32(512)
	for i := 0; i < 12; i++ {
		w := b.tick()
		if d := int(w) - int(prev); d > ClosedLoopStep || d < -ClosedLoopStep {
			t.Fatalf("tick %d: moved %d -> %d, more than the step %d", i, prev, w, ClosedLoopStep)
		}
		prev = w
	}
	if st := b.p.State(); len(st) != 1 || st[0].Slot != 3 || !st[0].TargetKnown || abs(st[0].W-683) > 1 {
		t.Fatalf("after 6 s: %+v, want slot 3 only (the recv connection is ignored) at 683", st)
	}
	// SUP drops to 12.5 Mbit/s: best 341, reached within 10 s (20 ticks).
	b.capBps[1] = 12.5e6 / 8
	for i := 0; i < 20; i++ {
		b.tick()
	}
	if st := b.p.State()[0]; abs(st.W-341) > 1 {
		t.Fatalf("10 s after SUP dropped to 12.5: %+v, want 341", st)
	}
	// A rail that completes nothing for a while (its part stuck) keeps its rate; when the part
	// completes, the stall counts in its rate and the split moves away from it.
	w := b.tick()
	b.stall = true
	if got := b.tick(); got != w {
		t.Fatalf("interval without completions: hint %d -> %d, want it kept", w, got)
	}
	b.stall = false
	if got := b.tick(); got+8 > w {
		t.Fatalf("after a 0.5 s SUP stall: hint %d, want below %d by 8 or more", got, w)
	}
}

func TestClosedLoopFailoverAndGen(t *testing.T) {
	b := newBench(t, &ClosedLoop{}, 30e6, 70e6)
	for i := 0; i < 30; i++ {
		b.tick()
	}
	w := b.p.State()[0].W
	b.slot.Telemetry.SupState = shm.RailDown
	if got := b.tick(); got != 0 || !b.p.State()[0].Failover {
		t.Fatalf("SUP down: hint %d, want 0 (%+v)", got, b.p.State()[0])
	}
	b.slot.Telemetry.SupState, b.slot.Telemetry.SoutState = shm.RailUp, shm.RailFailed
	if got := b.tick(); got != 1024 {
		t.Fatalf("SOUT failed: hint %d, want 1024", got)
	}
	b.slot.Telemetry.SoutState = shm.RailUp
	if got := b.tick(); got != uint32(w) || b.p.State()[0].Failover || b.p.State()[0].TargetKnown {
		t.Fatalf("both up: hint %d, want %d with the rates measured afresh (%+v)", got, w, b.p.State()[0])
	}
	// The slot is registered again: a new connection starts at 512, written for the new gen.
	b.slot.Gen, b.f.gens[3] = 2, 2
	b.slot.Telemetry = shm.Telemetry{}
	b.hinted = false
	if got := b.tick(); got != 512 || b.f.calls[len(b.f.calls)-1].key != "3/2" {
		t.Fatalf("new gen: hint %d %+v", got, b.f.calls[len(b.f.calls)-1])
	}
	// The slot closed between the read and the write: skipped, no error, state dropped.
	b.slot.Gen = 3
	if _, err := b.p.Tick(b.f, b.now+5e8, []shm.Slot{b.slot}); err != nil || len(b.p.State()) != 0 {
		t.Fatalf("gen changed under the write: %v, state %+v", err, b.p.State())
	}
	// A write error other than a gone slot stops the policy.
	bad := errors.New("boom")
	if _, err := b.p.Tick(errWriter{bad}, b.now+1e9, []shm.Slot{b.slot}); !errors.Is(err, bad) {
		t.Fatalf("write error: %v", err)
	}
}

type errWriter struct{ err error }

func (e errWriter) SetSlotHint(uint32, uint32, uint32, bool) error  { return e.err }
func (e errWriter) SetPeerHint(shm.IPv4, uint8, uint32, bool) error { return e.err }
func (e errWriter) SetClassHint(shm.PathClass, uint32, bool) error  { return e.err }
