// Package benchstat holds the statistics of the lab benchmarks (integration/bench_test.go):
// the median of paired ratios and a percentile-bootstrap confidence interval for it. Pure Go,
// no lab: its tests run with `go test ./integration/benchstat/`.
package benchstat

import (
	"math"
	"math/rand/v2"
	"sort"
)

// Median returns the median of xs (the mean of the two middle values for an even count),
// NaN for none. xs is not modified.
func Median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return sortedMedian(s)
}

func sortedMedian(s []float64) float64 {
	n := len(s)
	switch {
	case n == 0:
		return math.NaN()
	case n%2 == 1:
		return s[n/2]
	default:
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// quantile returns the q-quantile of sorted s by linear interpolation between order
// statistics (type 7, as numpy's default).
func quantile(s []float64, q float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	h := q * float64(len(s)-1)
	lo := int(math.Floor(h))
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	return s[lo] + (h-float64(lo))*(s[lo+1]-s[lo])
}

// MedianCI returns the median of xs and a percentile-bootstrap confidence interval of the
// median at level conf (0.90 for a 90 % interval): `resamples` resamples of len(xs) values
// drawn with replacement, each one's median, and the (1-conf)/2 and (1+conf)/2 quantiles of
// those medians. The RNG is seeded, so the same input gives the same interval. With one
// value the interval is that value; with none, NaNs.
//
// With few pairs the interval is coarse: it can only fall on medians of resamples, i.e.
// values of xs or midpoints of two of them, and for n = 7 a 90 % interval usually spans
// the 2nd to the 6th smallest value.
func MedianCI(xs []float64, conf float64, resamples int, seed uint64) (median, lo, hi float64) {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	median = sortedMedian(s)
	if len(s) <= 1 {
		return median, median, median
	}
	if resamples < 1 {
		resamples = 1
	}
	rng := rand.New(rand.NewPCG(seed, 0x6d706962)) // "mpib"
	meds := make([]float64, resamples)
	buf := make([]float64, len(s))
	for i := range meds {
		for j := range buf {
			buf[j] = s[rng.IntN(len(s))]
		}
		sort.Float64s(buf)
		meds[i] = sortedMedian(buf)
	}
	sort.Float64s(meds)
	alpha := (1 - conf) / 2
	return median, quantile(meds, alpha), quantile(meds, 1-alpha)
}

// Default settings of the benchmark report: a 90 % interval from 10000 resamples.
const (
	Conf      = 0.90
	Resamples = 10000
	Seed      = 11
)

// Summary is a ratio figure: the median over pairs and its bootstrap interval.
type Summary struct {
	Median, Lo, Hi float64
	N              int
}

// Summarize applies MedianCI with the report's defaults.
func Summarize(xs []float64) Summary {
	m, lo, hi := MedianCI(xs, Conf, Resamples, Seed)
	return Summary{Median: m, Lo: lo, Hi: hi, N: len(xs)}
}

// CallFit is one kind of plugin call split by what it found: First, what the call that does
// the work costs, and Each, what every further call per unit costs (P4: a posting isend and
// each isend that finds no CTS; a completing test and each test that finds nothing).
type CallFit struct{ First, Each float64 }

// FitCalls fits cost = First + (calls - 1) × Each by least squares over runs that made calls[i]
// calls per message at cost[i] per message. How many calls find nothing moves from run to
// run, so runs of one build give the line; false when there are fewer than two runs, the
// slices differ in length, or the calls do not vary.
func FitCalls(calls, cost []float64) (CallFit, bool) {
	n := len(calls)
	if n < 2 || len(cost) != n {
		return CallFit{}, false
	}
	var mx, my float64
	for i := range calls {
		mx += calls[i] - 1
		my += cost[i]
	}
	mx, my = mx/float64(n), my/float64(n)
	var sxx, sxy float64
	for i := range calls {
		dx := calls[i] - 1 - mx
		sxx += dx * dx
		sxy += dx * (cost[i] - my)
	}
	if sxx < 1e-6 {
		return CallFit{}, false
	}
	each := sxy / sxx
	return CallFit{First: my - each*mx, Each: each}, true
}
