//go:build linux

package sim_test

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/policy"
	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/sim"
)

// point is each connection's cumulative delivered and optimal bytes at one tick.
type point struct {
	at                 time.Duration
	delivered, optimal []float64
}

// ratio is delivered/optimal bytes of connection i between from and to.
func ratio(pts []point, i int, from, to time.Duration) (float64, bool) {
	var a, b *point
	for k := range pts {
		if a == nil && pts[k].at >= from {
			a = &pts[k]
		}
		if pts[k].at <= to {
			b = &pts[k]
		}
	}
	if a == nil || b == nil || b.at <= a.at {
		return 0, false
	}
	opt := b.optimal[i] - a.optimal[i]
	if opt <= 0 {
		return 1, true
	}
	return (b.delivered[i] - a.delivered[i]) / opt, true
}

// runClosedLoop runs the closed-loop policy on sc (ticks every 0.5 s) and returns the tick
// points.
func runClosedLoop(t *testing.T, sc sim.Scenario, seed int64) (*sim.Sim, []point) {
	t.Helper()
	p := &policy.ClosedLoop{}
	seg, err := shm.Create(filepath.Join(t.TempDir(), "seg"), 16, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	s, err := sim.New(seg, sim.Config{Seed: seed}, sc.Conns, sc.Events)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var pts []point
	record := func() {
		pt := point{at: s.Elapsed()}
		for i := range sc.Conns {
			pt.delivered = append(pt.delivered, s.Delivered(i))
			pt.optimal = append(pt.optimal, s.Optimal(i))
		}
		pts = append(pts, pt)
	}
	record()
	err = s.Run(sc.Duration, 500*time.Millisecond, func(now uint64) error {
		conns, err := seg.Connections()
		if err != nil {
			return err
		}
		if _, err := p.Tick(seg, now, conns); err != nil {
			return err
		}
		record()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, pts
}

// TestClosedLoopScenarios: in every scenario of the table, every send connection moves at
// least 95 % of the simulated optimum, time-averaged from 10 s after each change to the end
// of its phase, and over the last third of each phase.
func TestClosedLoopScenarios(t *testing.T) {
	for _, sc := range sim.Scenarios() {
		t.Run(sc.Name, func(t *testing.T) { testScenario(t, sc) })
	}
}

func testScenario(t *testing.T, sc sim.Scenario) {
	t.Parallel()
	for _, seed := range []int64{1, 2} {
		s, pts := runClosedLoop(t, sc, seed)
		ch := append(sc.Changes(), sc.Duration)
		for i, c := range sc.Conns {
			if c.Recv {
				continue
			}
			for k := 0; k+1 < len(ch); k++ {
				a, b := ch[k], ch[k+1]
				for _, win := range [][2]time.Duration{{a + 10*time.Second, b}, {b - (b-a)/3, b}} {
					r, ok := ratio(pts, i, win[0], win[1])
					if !ok {
						t.Fatalf("seed %d conn %d: no samples in %v..%v", seed, i, win[0], win[1])
					}
					t.Logf("seed %d conn %d phase %v..%v window %v..%v: %.3f of optimum", seed, i, a, b, win[0], win[1], r)
					if r < 0.95 {
						t.Errorf("seed %d conn %d phase %v..%v: %.3f of the optimum over %v..%v (want >= 0.95)",
							seed, i, a, b, r, win[0], win[1])
					}
				}
			}
			opt, _ := s.OptimumOf(i)
			t.Logf("seed %d conn %d: final split %d, optimum %d", seed, i, s.Split(i), opt)
		}
	}
}

// TestClosedLoopFailover: a rail going down moves everything to the live rail at the next
// tick, and the loop resumes from its previous split when the rail is back.
func TestClosedLoopFailover(t *testing.T) {
	sc := sim.Scenarios()[3]
	seg, err := shm.Create(filepath.Join(t.TempDir(), "seg"), 4, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	s, err := sim.New(seg, sim.Config{Seed: 3}, sc.Conns, sc.Events)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p := &policy.ClosedLoop{}
	tick := func(now uint64) error {
		conns, err := seg.Connections()
		if err != nil {
			return err
		}
		_, err = p.Tick(seg, now, conns)
		return err
	}
	if err := s.Run(30*time.Second, 500*time.Millisecond, tick); err != nil {
		t.Fatal(err)
	}
	before := p.State()[0].W
	if err := s.Run(time.Second, 500*time.Millisecond, tick); err != nil {
		t.Fatal(err)
	}
	if st := p.State()[0]; !st.Failover || st.Applied != 0 {
		t.Fatalf("SUP down: want the hint 0 (all SOUT) in failover, got %+v", st)
	}
	if r := s.Resolution(0); !r.Applies || r.SupBw != 0 {
		t.Fatalf("SUP down: the plugin reads %+v, want sup_bw 0", r)
	}
	if err := s.Run(15*time.Second, 500*time.Millisecond, tick); err != nil {
		t.Fatal(err)
	}
	if st := p.State()[0]; st.Failover || !st.TargetKnown || abs(st.W-before) > 16 {
		t.Fatalf("SUP up again: want the loop resumed near %d with both rails measured, got %+v", before, st)
	}
}

// TestSimModel checks the rail model against hand-computed values.
func TestSimModel(t *testing.T) {
	rails := [2]sim.Rail{sim.Gbps(100, 0), sim.Gbps(200, 0)}
	up := [2]bool{true, true}
	if w, tm := sim.Optimum(rails, up, 3e6); w != 683 || tm > 3e6*8/300e9*1.01 {
		t.Fatalf("optimum of 100+200 Gb/s: w=%d t=%g", w, tm)
	}
	if w, _ := sim.Optimum(rails, [2]bool{true, false}, 3e6); w != 0 {
		t.Fatalf("SUP down: optimum %d, want 0", w)
	}
	lat := [2]sim.Rail{sim.Gbps(100, time.Millisecond), sim.Gbps(100, 0)}
	if w, _ := sim.Optimum(lat, up, 1e3); w != 1024 {
		t.Fatalf("tiny messages avoid the slow-latency rail: optimum %d, want 1024", w)
	}
	if got, want := sim.MsgTime(rails, up, 1e6, 512), 0.5e6*8/100e9; fmt.Sprintf("%.9g", got) != fmt.Sprintf("%.9g", want) {
		t.Fatalf("MsgTime: %g, want %g", got, want)
	}
}

// TestClosedLoopCapacityRise: SUP's capacity rises fourfold at 30 s (100+25 -> 100+100 Gb/s).
// At the balance point a rise changes nothing in the connection's throughput (SOUT binds), so
// a loop steering on throughput cannot see it; the active rate of SUP shows it at once.
func TestClosedLoopCapacityRise(t *testing.T) {
	us := time.Microsecond
	sc := sim.Scenario{Name: "capacity rises", Conns: []sim.Conn{{Rails: [2]sim.Rail{sim.Gbps(100, 5*us), sim.Gbps(25, 5*us)}}},
		Events:   []sim.Event{{At: 30 * time.Second, Conn: -1, Rail: 1, Mbps: 100_000}},
		Duration: 75 * time.Second}
	s, pts := runClosedLoop(t, sc, 1)
	before, _ := ratio(pts, 0, 10*time.Second, 30*time.Second)
	after, _ := ratio(pts, 0, 40*time.Second, 75*time.Second)
	opt, _ := s.OptimumOf(0)
	t.Logf("%.3f of the optimum before the rise, %.3f from 10 s after it; split %d, optimum %d", before, after, s.Split(0), opt)
	if before < 0.95 || after < 0.95 {
		t.Errorf("%.3f before, %.3f after the rise (want >= 0.95)", before, after)
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// TestSimSegment checks what the simulator writes into the segment: registration, hint reads
// and their telemetry, bytes and requests at the modelled rate, vanilla without a heartbeat,
// rail states and failover.
func TestSimSegment(t *testing.T) {
	seg, err := shm.Create(filepath.Join(t.TempDir(), "seg"), 8, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	conns := []sim.Conn{
		{PID: 11, ConnID: 5, PathClass: shm.InterIsland, MsgBytes: 1 << 20, Rails: [2]sim.Rail{sim.Gbps(100, 0), sim.Gbps(100, 0)}},
		{PID: 12, Recv: true, PathClass: shm.IntraIsland, Rails: [2]sim.Rail{sim.Gbps(10, 0), sim.Gbps(10, 0)}},
		{PID: 12, ConnID: 9, StartAfter: 3 * time.Second, Rails: [2]sim.Rail{sim.Gbps(10, 0), sim.Gbps(10, 0)}},
	}
	events := []sim.Event{{At: 2 * time.Second, Conn: 0, Rail: 1, State: shm.RailDown}}
	s, err := sim.New(seg, sim.Config{Noise: -1, SupRelay: true}, conns, events) // conn 0 is inter-island
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	got, _ := seg.Connections()
	if len(got) != 2 || got[0].PID == got[1].PID {
		t.Fatalf("registered: %+v", got)
	}
	sl, _ := seg.Slot(s.Slot(0))
	if sl.PID != 11 || sl.ConnID != 5 || sl.IsSend != 1 || sl.PathClass != shm.InterIsland || sl.Gen != 1 {
		t.Fatalf("slot 0: %+v", sl)
	}
	if err := seg.SetSlotHint(s.Slot(0), 1, 256, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Run(time.Second, 100*time.Millisecond, func(uint64) error { return nil }); err != nil {
		t.Fatal(err)
	}
	sl, _ = seg.Slot(s.Slot(0))
	tel := sl.Telemetry
	// 256/1024 on SUP: SOUT carries 3/4 of each message and binds: 100 Gb/s / (3/4).
	wantRate := 100e9 / 8 / 0.75
	if tot := float64(tel.SoutBytes + tel.SupBytes); math.Abs(tot/wantRate-1) > 0.001 ||
		math.Abs(float64(tel.SupBytes)/tot-0.25) > 0.001 {
		t.Fatalf("bytes: sout %d sup %d, want %.0f in all, a quarter on SUP", tel.SoutBytes, tel.SupBytes, wantRate)
	}
	if msgs := wantRate / (1 << 20); math.Abs(float64(tel.SupRequests)-msgs) > 1 || math.Abs(float64(tel.SoutRequests)-msgs) > 1 {
		t.Fatalf("requests: %d %d, want %.0f", tel.SoutRequests, tel.SupRequests, msgs)
	}
	if tel.LastSupBw != 256 || tel.LastSource != uint32(shm.SourceSlot) || tel.ReadsApplied != 100 || tel.ReadsFallback != 0 {
		t.Fatalf("read telemetry: %+v", tel)
	}
	if d, o := s.Delivered(0), s.Optimal(0); math.Abs(d/o-2.0/3) > 0.001 {
		t.Fatalf("delivered %.0f of optimal %.0f: want 2/3 (0.5/0.75)", d, o)
	}
	// Without beats the heartbeat goes stale: vanilla (inter-island: all SOUT).
	if err := s.Advance(time.Second); err != nil {
		t.Fatal(err)
	}
	sl, _ = seg.Slot(s.Slot(0))
	if s.Split(0) != 0 || sl.Telemetry.ReadsStale == 0 || sl.Telemetry.LastSource != uint32(shm.SourceStale) {
		t.Fatalf("stale heartbeat: split %d, %+v", s.Split(0), sl.Telemetry)
	}
	// At 2 s SUP goes down: the state is recorded and SUP carries nothing whatever the hint.
	if err := s.Run(2*time.Second, time.Second, func(uint64) error { return seg.SetSlotHint(s.Slot(0), 1, 1024, true) }); err != nil {
		t.Fatal(err)
	}
	sl, _ = seg.Slot(s.Slot(0))
	if sl.Telemetry.SupState != shm.RailDown || sl.Telemetry.Failovers != 1 || sl.Telemetry.SupStateNs == 0 || s.Split(0) != 0 {
		t.Fatalf("SUP down: split %d, %+v", s.Split(0), sl.Telemetry)
	}
	if got, _ := seg.Connections(); len(got) != 3 {
		t.Fatalf("the third connection registers at 3 s: %d connections", len(got))
	}
}

// TestInterIslandGuard: without a relay (MPIB_SUP_RELAY) the plugin forces an inter-island
// connection's SUP share to 0 whatever the hint, so the simulator moves nothing on SUP and
// counts the optimum all on SOUT; with a relay the hint applies.
func TestInterIslandGuard(t *testing.T) {
	for _, relay := range []bool{false, true} {
		seg, err := shm.Create(filepath.Join(t.TempDir(), "seg"), 4, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		conns := []sim.Conn{{PathClass: shm.InterIsland, Rails: [2]sim.Rail{sim.Gbps(40, 0), sim.Gbps(40, 0)}}}
		s, err := sim.New(seg, sim.Config{Noise: -1, SupRelay: relay}, conns, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := seg.SetSlotHint(s.Slot(0), 1, 512, true); err != nil {
			t.Fatal(err)
		}
		if err := s.Run(time.Second, time.Second, func(uint64) error { return nil }); err != nil {
			t.Fatal(err)
		}
		sl, _ := seg.Slot(s.Slot(0))
		opt, _ := s.OptimumOf(0)
		wantSplit, wantOpt := uint32(0), uint32(0)
		if relay {
			wantSplit, wantOpt = 512, 512
		}
		if s.Split(0) != wantSplit || opt != wantOpt || (sl.Telemetry.SupBytes > 0) != relay || sl.Telemetry.LastSupBw != 512 {
			t.Errorf("relay %v: split %d optimum %d, want %d and %d; %+v", relay, s.Split(0), opt, wantSplit, wantOpt, sl.Telemetry)
		}
		if d, o := s.Delivered(0), s.Optimal(0); math.Abs(d/o-1) > 0.001 {
			t.Errorf("relay %v: delivered %.0f of optimal %.0f: the split in force is the optimum", relay, d, o)
		}
		s.Close()
		seg.Close()
	}
}

// TestNoiseMeanOne: the noise is a mean-one factor on the rate, so the static optimum scores
// about 100 % of the noise-free optimum at any noise (exp(sd*Z) dividing the time scored
// exp(sd²/2): 113 % at 0.5). 30000 steps at sd 0.5: the mean factor's sd is
// sqrt((exp(0.25)-1)/30000) = 0.3 %, so 99..101 is three of them.
func TestNoiseMeanOne(t *testing.T) {
	seg, err := shm.Create(filepath.Join(t.TempDir(), "seg"), 4, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	conns := []sim.Conn{{Rails: [2]sim.Rail{sim.Gbps(100, 0), sim.Gbps(100, 0)}}}
	s, err := sim.New(seg, sim.Config{Seed: 1, Noise: 0.5}, conns, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Run(300*time.Second, 100*time.Millisecond, func(uint64) error { return seg.SetSlotHint(s.Slot(0), 1, 512, true) })
	if err != nil {
		t.Fatal(err)
	}
	if pct := 100 * s.Delivered(0) / s.Optimal(0); pct < 99 || pct > 101 {
		t.Fatalf("static optimum at noise 0.5: %.2f %% of the optimum, want 99..101", pct)
	}
}
