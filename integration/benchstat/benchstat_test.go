package benchstat

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := Median(c.xs); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("Median(nil) is not NaN")
	}
	xs := []float64{3, 1, 2}
	Median(xs)
	if xs[0] != 3 {
		t.Error("Median sorted its argument")
	}
}

func TestMedianCIDegenerate(t *testing.T) {
	m, lo, hi := MedianCI([]float64{0.9}, 0.9, 100, 1)
	if m != 0.9 || lo != 0.9 || hi != 0.9 {
		t.Errorf("one value: %v [%v, %v]", m, lo, hi)
	}
	m, lo, hi = MedianCI([]float64{2, 2, 2, 2, 2, 2, 2}, 0.9, 1000, 1)
	if m != 2 || lo != 2 || hi != 2 {
		t.Errorf("constant values: %v [%v, %v]", m, lo, hi)
	}
	m, _, _ = MedianCI(nil, 0.9, 100, 1)
	if !math.IsNaN(m) {
		t.Error("no values: median is not NaN")
	}
}

func TestMedianCISevenPairs(t *testing.T) {
	xs := []float64{0.91, 0.97, 0.88, 1.02, 0.95, 0.93, 0.99}
	m, lo, hi := MedianCI(xs, 0.9, 10000, 11)
	if m != 0.95 {
		t.Fatalf("median %v, want 0.95", m)
	}
	if !(lo < m && m < hi) {
		t.Fatalf("interval [%v, %v] does not hold the median %v strictly", lo, hi, m)
	}
	// For n = 7 the resampled median is the 4th order statistic of the resample; the
	// 5 % / 95 % quantiles of its distribution fall on the 2nd and 6th smallest values.
	if lo < 0.88 || lo > 0.93 || hi < 0.97 || hi > 1.02 {
		t.Fatalf("interval [%v, %v] outside the expected order statistics", lo, hi)
	}
	// Seeded: the same input gives the same interval.
	m2, lo2, hi2 := MedianCI(xs, 0.9, 10000, 11)
	if m2 != m || lo2 != lo || hi2 != hi {
		t.Fatal("not reproducible with the same seed")
	}
	// A wider level gives a wider (or equal) interval.
	_, lo99, hi99 := MedianCI(xs, 0.99, 10000, 11)
	if lo99 > lo || hi99 < hi {
		t.Fatalf("99 %% interval [%v, %v] narrower than 90 %% [%v, %v]", lo99, hi99, lo, hi)
	}
}

// Coverage: over many samples of a known distribution, the 90 % interval holds the true
// median about 90 % of the time (the percentile bootstrap of a median is a little
// conservative at small n because the interval falls on order statistics).
func TestMedianCICoverage(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 7))
	const trials, n = 400, 15
	hits := 0
	for i := 0; i < trials; i++ {
		xs := make([]float64, n)
		for j := range xs {
			xs[j] = 1 + 0.1*rng.NormFloat64() // true median 1
		}
		_, lo, hi := MedianCI(xs, 0.9, 1000, uint64(i))
		if lo <= 1 && 1 <= hi {
			hits++
		}
	}
	cov := float64(hits) / trials
	if cov < 0.82 || cov > 0.98 {
		t.Fatalf("coverage %.3f, want about 0.90", cov)
	}
	t.Logf("coverage of the 90 %% interval over %d samples of %d: %.3f", trials, n, cov)
}

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{1, 2, 3, 4, 5, 6, 7})
	if s.Median != 4 || s.N != 7 || !(s.Lo <= 4 && 4 <= s.Hi) {
		t.Fatalf("%+v", s)
	}
}

func TestFitCalls(t *testing.T) {
	for _, c := range []struct {
		name        string
		calls, cost []float64
		want        CallFit
		ok          bool
	}{
		{"exact line", []float64{1, 2, 3}, []float64{700, 780, 860}, CallFit{700, 80}, true},
		{"one call per message", []float64{1, 1.5}, []float64{900, 950}, CallFit{900, 100}, true},
		// P4's isend, three runs of MPIB vanilla in one boot (calls, instructions per message):
		// the posting call about 909, each call that found no CTS about 50.
		{"lab runs", []float64{2.45, 1.61, 2.06}, []float64{2.45 * 401, 1.61 * 584, 2.06 * 467}, CallFit{909, 50}, true},
		{"one run", []float64{2}, []float64{900}, CallFit{}, false},
		{"calls do not vary", []float64{2, 2, 2}, []float64{900, 910, 890}, CallFit{}, false},
		{"lengths differ", []float64{1, 2}, []float64{900}, CallFit{}, false},
	} {
		got, ok := FitCalls(c.calls, c.cost)
		if ok != c.ok || math.Abs(got.First-c.want.First) > 1 || math.Abs(got.Each-c.want.Each) > 1 {
			t.Errorf("%s: FitCalls = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
