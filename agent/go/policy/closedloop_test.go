package policy

import (
	"errors"
	"math"
	"strconv"
	"testing"

	"github.com/mpib/mpib/agent/go/shm"
)

// clBench drives a ClosedLoop by hand: one send connection whose rate is rate(w) at the hint
// last written, ticks every 0.5 s.
type clBench struct {
	t      *testing.T
	p      *ClosedLoop
	f      *fake
	slot   shm.Slot
	recv   shm.Slot
	now    uint64
	rate   func(w uint32) float64
	hint   uint32
	hinted bool
}

func newBench(t *testing.T, p *ClosedLoop, rate func(uint32) float64) *clBench {
	b := &clBench{t: t, p: p, f: &fake{gens: map[uint32]uint32{3: 1, 4: 1}}, now: 1e9, rate: rate}
	b.slot = shm.Slot{Index: 3, Gen: 1, IsSend: 1, State: shm.StateActive}
	b.recv = shm.Slot{Index: 4, Gen: 1, IsSend: 0, State: shm.StateActive}
	return b
}

// tick runs one interval at the hint in force, then one Tick; it returns the hint written
// for the next interval.
func (b *clBench) tick() uint32 {
	b.t.Helper()
	if b.hinted {
		b.slot.Telemetry.SoutBytes += uint64(b.rate(b.hint) * 0.5)
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

// tent is a two-rail rate with its optimum at opt (as max of the rails' times).
func tent(opt float64) func(uint32) float64 {
	return func(w uint32) float64 {
		x := float64(w) / 1024
		return 1e9 / math.Max((1-x)/(1-opt/1024), x/(opt/1024))
	}
}

func TestClosedLoopCycle(t *testing.T) {
	b := newBench(t, &ClosedLoop{}, tent(300))
	want := []uint32{512, 576, 448, 448, 512, 384, 384, 448, 320, 320, 384, 256}
	for i, w := range want {
		if got := b.tick(); got != w {
			t.Fatalf("tick %d: hint %d, want %d (sequence %v)", i, got, w, want)
		}
	}
	st := b.p.State()
	if len(st) != 1 || st[0].Slot != 3 || st[0].W != 320 || st[0].Step != 64 {
		t.Fatalf("state %+v: the recv connection must be ignored, w 320 step 64", st)
	}
	// Around the optimum neither probe wins: the step halves down to 8, never below.
	for i := 0; i < 60; i++ {
		b.tick()
	}
	if st := b.p.State()[0]; st.Step != 8 || math.Abs(float64(st.W)-300) > 16 {
		t.Fatalf("after converging: %+v", st)
	}
	// The rate at w drops by a third (a rail lost capacity): the step returns to 64.
	old := b.rate
	b.rate = func(w uint32) float64 { return old(w) * 0.66 }
	for b.p.State()[0].Phase != closedLoopCenter {
		b.tick()
	}
	b.tick() // the centre measurement
	if st := b.p.State()[0]; st.Step != 64 {
		t.Fatalf("after a 34 %% drop at w: %+v, want step 64", st)
	}
}

func TestClosedLoopSmallStep(t *testing.T) {
	b := newBench(t, &ClosedLoop{Step: 4}, tent(512))
	for i := 0; i < 12; i++ {
		b.tick()
	}
	if st := b.p.State()[0]; st.Step != 4 {
		t.Fatalf("an initial step below 8 is not halved: %+v", st)
	}
	b = newBench(t, &ClosedLoop{Step: 1000}, tent(512))
	b.tick()
	if b.tick(); b.hint != 512+256 {
		t.Fatalf("step above 256 is capped: probe %d", b.hint)
	}
}

func TestClosedLoopFailoverAndGen(t *testing.T) {
	b := newBench(t, &ClosedLoop{}, tent(700))
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
	if got := b.tick(); got != uint32(w) || b.p.State()[0].Failover || b.p.State()[0].Step != 64 {
		t.Fatalf("both up: hint %d, want %d with the initial step (%+v)", got, w, b.p.State()[0])
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
