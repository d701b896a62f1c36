package closedloop

import (
	"math"
	"strings"
	"testing"
)

// phase builds samples 0.2 s apart over a 16 s phase starting at uptime 100: rate(t) Mbit/s,
// share(t) of it on SUP.
func phase(share, rate func(t float64) float64) []Point {
	var pts []Point
	var sout, sup float64
	for i := 0; i <= 80; i++ {
		tt := float64(i) * 0.2
		if i > 0 {
			b := rate(tt-0.1) * 1e6 / 8 * 0.2
			sh := share(tt - 0.1)
			sout, sup = sout+b*(1-sh), sup+b*sh
		}
		pts = append(pts, Point{T: 100 + tt, Sout: uint64(sout), Sup: uint64(sup)})
	}
	return pts
}

// at is the last sample at or before uptime t.
func at(pts []Point, t float64) Point {
	var p Point
	for _, q := range pts {
		if q.T <= t {
			p = q
		}
	}
	return p
}

func step(before, after, from float64) func(float64) float64 {
	return func(t float64) float64 {
		if t < from {
			return before
		}
		return after
	}
}

// TestSplitVerdict: the split judges on synthetic samples (30 Mbit/s, optimum share 2/3).
// SettleSplit: at the optimum or near it settles at once, a slow start when it gets there, a
// runaway or a split off by more than the tolerance never, and a lab that slows down at the
// optimum split still settles. Judge on the phase's last 6 s (no telemetry: the rails' optimum
// unknown) passes what settles by 10 s and holds, fails a runaway, a split off by more than
// the tolerance and one that gets there only at 12 s.
func TestSplitVerdict(t *testing.T) {
	const opt = 2.0 / 3
	steady := func(float64) float64 { return 30 }
	for _, tc := range []struct {
		name                   string
		share, rate            func(t float64) float64
		settledMin, settledMax float64 // settledMax -1: never
		endOK                  bool
	}{
		{"at the optimum", step(opt, opt, 0), steady, 0, 0.2, true},
		{"near it (0.64)", step(0.64, 0.64, 0), steady, 0, 0.2, true},
		{"slow start", step(0.5, opt, 6), steady, 3.8, 6.2, true},
		{"there at 9.8 s", step(1.0/3, opt, 9.8), steady, 6.6, 10, true},
		{"there only at 12 s", step(1.0/3, opt, 12), steady, 8.8, 12.2, false},
		{"runaway", step(opt, 0.9, 6), steady, 0, -1, false},
		{"off by 0.08", step(0.5866, 0.5866, 0), steady, 0, -1, false},
		{"0.05 under (the lab's bias and then some)", step(0.6166, 0.6166, 0), steady, 0, 0.2, true},
		{"the lab slows down, the split holds", step(opt, opt, 0), step(30, 20, 8), 0, 0.2, true},
		{"the lab crawls at the end, the split holds", step(opt, opt, 0), step(30, 3, 10), 0, 0.2, true},
	} {
		pts := phase(tc.share, tc.rate)
		settled, share := SettleSplit(pts, 100, 116, opt)
		if j := Judge(at(pts, 110), at(pts, 116), Marks{}, Marks{}, opt); j.OK != tc.endOK || j.Active != -1 {
			t.Errorf("%s: end share %.3f ok=%t (active %.3f), want ok=%t", tc.name, j.Share, j.OK, j.Active, tc.endOK)
		}
		never := tc.settledMax < 0
		switch {
		case never && settled >= 0:
			t.Errorf("%s: settled at %.1f s (share %.3f), want never", tc.name, settled, share)
		case !never && (settled < tc.settledMin || settled > tc.settledMax):
			t.Errorf("%s: settled at %.1f s (share %.3f), want %.1f..%.1f", tc.name, settled, share, tc.settledMin, tc.settledMax)
		}
	}
	if s, share := SettleSplit(phase(step(opt, opt, 0), steady), 200, 216, opt); s != -1 || share != -1 {
		t.Errorf("no samples in the phase: settled %.1f share %.3f, want -1 -1", s, share)
	}
}

// TestSplitOK: the phase verdict against the rails' active rates and the shaping.
// ActiveOptimum from telemetry marks (a rail that completed nothing: unknown), then SplitOK on
// busy-host runs (a loop at 0.732 where the shaping says 0.667 and SOUT ran at two thirds of
// its rate; one at 0.642 where a stall put the rails' optimum at 0.583) and on loops off both
// optima or off the shaping.
func TestSplitOK(t *testing.T) {
	m := func(soutB, soutNs, supB, supNs uint64) Marks { return Marks{soutB, soutNs, supB, supNs} }
	from := m(1000, 1e9, 5000, 1e9)
	for _, tc := range []struct {
		name string
		to   Marks
		want float64
	}{
		{"SUP twice as fast", m(1000+2e6, 2e9, 5000+4e6, 2e9), 2.0 / 3},
		{"SOUT delivered two thirds of its share", m(1000+1.2e6, 2e9, 5000+3.6e6, 2e9), 0.75},
		{"rates, not bytes: SUP active half the time", m(1000+2e6, 2e9, 5000+2e6, 1.5e9), 2.0 / 3},
		{"SUP completed nothing", m(1000+2e6, 2e9, 5000, 2e9), -1},
		{"SOUT had no active time", m(1000+2e6, 1e9, 5000+2e6, 2e9), -1},
		{"counters went back (a new registration)", m(10, 1e6, 10, 1e6), -1},
	} {
		if got := ActiveOptimum(from, tc.to); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("ActiveOptimum %s: %.4f, want %.4f", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name                 string
		end, nominal, active float64
		want                 bool
	}{
		{"at both optima", 0.667, 0.667, 0.670, true},
		{"busy host: the rails called for 0.73", 0.732, 0.667, 0.725, true},
		{"busy host, judged on the shaping only", 0.732, 0.667, -1, false},
		{"busy host: phase 2 at the rails' 0.410", 0.406, 0.333, 0.410, true},
		{"at the shaping, a stall moved the rails' optimum (0.642, 0.583)", 0.642, 0.667, 0.583, true},
		{"off both by more than the tolerance", 0.74, 0.667, 0.60, false},
		{"between the two, off each by 0.07", 0.737, 0.667, 0.807, false},
		{"follows the counters, not the shaping (phase 2's share in phase 1)", 0.34, 0.667, 0.35, false},
		{"0.15 from the shaping, at the rails' optimum", 0.817, 0.667, 0.80, true},
		{"0.16 from the shaping, at the rails' optimum", 0.827, 0.667, 0.82, false},
		{"no end share", -1, 0.667, 0.667, false},
	} {
		if got := SplitOK(tc.end, tc.nominal, tc.active); got != tc.want {
			t.Errorf("SplitOK %s (end %.3f, shaped %.3f, active %.3f) = %t, want %t", tc.name, tc.end, tc.nominal, tc.active, got, tc.want)
		}
	}
}

// TestSettle: the throughput judge on synthetic samples (best static 60 Mbit/s, a third on
// SOUT): a steady loop settles at once, a slow start settles when it gets there, a short dip
// late in the phase is forgiven but shown, and a loop that drifts away or never gets there
// fails.
func TestSettle(t *testing.T) {
	const best = 60.0
	third := func(float64) float64 { return 2.0 / 3 }
	for _, tc := range []struct {
		name          string
		rate          func(t float64) float64
		settledMin    float64
		settledMax    float64 // -1: never
		lowestBelow95 bool
	}{
		{"steady", func(float64) float64 { return best }, 0, 0.2, false},
		{"slow start", step(30, best, 6), 5.6, 6.2, false},
		{"late dip", func(t float64) float64 {
			if t > 13 && t < 14.5 {
				return 0.8 * best
			}
			return best
		}, 0, 0.2, true},
		{"drift", func(t float64) float64 { return best * (1 - 0.15*t/16) }, 0, -1, false},
		{"never there", func(float64) float64 { return 0.9 * best }, 0, -1, false},
	} {
		v := Settle(phase(third, tc.rate), 100, 116, best)
		never := tc.settledMax < 0
		switch {
		case never && v.Settled >= 0:
			t.Errorf("%s: settled at %.1f s (rate %.1f), want never", tc.name, v.Settled, v.Rate)
		case !never && (v.Settled < tc.settledMin || v.Settled > tc.settledMax):
			t.Errorf("%s: settled at %.1f s, want %.1f..%.1f", tc.name, v.Settled, tc.settledMin, tc.settledMax)
		case !never && v.Rate < MinRatio*best:
			t.Errorf("%s: rate %.1f after settling, want >= %.1f", tc.name, v.Rate, MinRatio*best)
		case !never && (v.Lowest < MinRatio*best) != tc.lowestBelow95:
			t.Errorf("%s: lowest window %.1f, want below 0.95 of best: %t", tc.name, v.Lowest, tc.lowestBelow95)
		case !strings.Contains(v.Windows, "=") || strings.Count(v.Windows, ":") < 50:
			t.Errorf("%s: windows line %q", tc.name, v.Windows)
		}
	}
}

// TestCarryDivisor: the rates' divisor from what the lab carried at full rates (phase 1's
// shaped 75 Mbit/s; CarryHeadroom times it must fit).
func TestCarryDivisor(t *testing.T) {
	for _, tc := range []struct{ carried, want int }{
		{93750, 1}, // 1.25 of the full rates
		{63141, 2}, // an idle 2-core host's lab
		{48813, 2},
		{46875, 2}, // exactly 1.25 of the halved rates
		{46874, 4},
		{34090, 4}, // a host with a core taken by another process
		{23438, 4}, // 1.25 of the quartered rates is 23437.5
		{23437, 8},
		{0, 8},
	} {
		if got := CarryDivisor(tc.carried); got != tc.want {
			t.Errorf("CarryDivisor(%d) = %d, want %d", tc.carried, got, tc.want)
		}
	}
}

// TestOptimum: the shaped optimum of the phases at full rates, of 1024.
func TestOptimum(t *testing.T) {
	for _, tc := range []struct{ sup, sout, want int }{
		{SupKbit, SoutKbit, 683}, {12500, SoutKbit, 341}, {25000, 25000, 512}, {1, 0, 1024},
	} {
		if got := Optimum(tc.sup, tc.sout); got != tc.want {
			t.Errorf("Optimum(%d, %d) = %d, want %d", tc.sup, tc.sout, got, tc.want)
		}
	}
}
