// Package closedloop judges the lab's closed-loop test (integration's TestClosedLoop): an agent
// steers the split of a transfer a1 -> a2 between SOUT and SUP, each shaped by netem, through
// phases of different shaping. Its inputs are samples of a1's rail byte counters on the node's
// clock and the connection's per-rail telemetry; it needs no lab.
package closedloop

import (
	"fmt"
	"math"
	"time"
)

const (
	// RateWindow is the window rates and shares are judged over.
	RateWindow = 3 * time.Second
	// MinRatio is the throughput rule printed as settled_s (the loop is judged on the
	// simulator by it): a window at MinRatio of the best static rate, and the rest of the
	// phase too.
	MinRatio = 0.95
	// ShareTol is how far the loop's split may sit from the optimum, as SUP's share of the
	// bytes: 61/1024; at phase 1's shaping the throughput that far off is 0.85-0.92 of the
	// best. Both loops settle 0.02-0.03 under the optimum share in the lab (the VM, not the
	// rails, caps the total there, which flattens the optimum): 61/1024 leaves them a margin.
	// An oscillating loop is caught on the simulator (its throughput), not here.
	ShareTol = 61.0 / 1024
	// ShapedTol is how far the end share may sit from the shaped optimum, whatever the rails
	// really delivered: a check that the loop follows the shaping at all (phase 1's and 2's
	// optima are 0.333 apart, more than twice this). The tight check is against the shaping or
	// the rails' active rates (SplitOK): on a busy host the agent's own CPU in the lab VM can
	// hold a1's SOUT well under its shaped rate for whole windows, and the loop rightly
	// follows the rails there.
	ShapedTol = 0.15
	// SoutKbit and SupKbit are the rails' shaped rates of phase 1 at full rates.
	SoutKbit = 25000
	SupKbit  = 50000
	// CarryHeadroom: what the lab carried at the probe must be this many times phase 1's
	// shaped rate at the rates chosen. The probe runs with the reference heartbeat only; then
	// the agents take some of the VM's CPU and a busy host may get busier, and a lab that
	// carries the shaped rate with no headroom crawls while an agent runs: the VM, not the
	// rails, would set the split.
	CarryHeadroom = 1.25
)

// Point is one sample of a1's rails: the node's /proc/uptime (s) and the bytes each rail
// has sent.
type Point struct {
	T         float64
	Sout, Sup uint64
}

// Between returns the samples taken from from to to, both included.
func Between(pts []Point, from, to float64) []Point {
	var out []Point
	for _, p := range pts {
		if p.T >= from && p.T <= to {
			out = append(out, p)
		}
	}
	return out
}

// Mbps is both rails' rate between two samples.
func Mbps(a, b Point) float64 {
	sout, sup := RailMbps(a, b)
	return sout + sup
}

// RailMbps is SOUT's and SUP's rates between two samples: which rail limits a window (the one
// at its shaped rate) tells a split that moved from a lab that slowed down.
func RailMbps(a, b Point) (sout, sup float64) {
	d := (b.T - a.T) * 1e6 / 8
	return float64(b.Sout-a.Sout) / d, float64(b.Sup-a.Sup) / d
}

// ShareOf is SUP's share of the bytes a1 sent between two samples (-1: none).
func ShareOf(a, b Point) float64 {
	so, su := float64(b.Sout-a.Sout), float64(b.Sup-a.Sup)
	if so+su <= 0 {
		return -1
	}
	return su / (so + su)
}

// Span is a RateWindow-long stretch of samples: its first and last.
type Span struct{ I, J int }

// Spans is, for each sample, the span starting there (while one fits before the end).
func Spans(p []Point) []Span {
	var ws []Span
	for i := range p {
		for j := i + 1; j < len(p); j++ {
			if p[j].T-p[i].T >= RateWindow.Seconds() {
				ws = append(ws, Span{i, j})
				break
			}
		}
	}
	return ws
}

// SettleSplit judges one phase, from its change at t0 to end, on the loop's split, which the
// rails' byte shares show whatever the lab's speed (the sender posts each message's bytes per
// rail as the split says; a slow lab slows both rails, not the share): the phase settles at the
// first span whose SUP share is within ShareTol of opt and from whose start to the phase's end
// the share is too. It returns the settle time (s after t0, -1: never) and the share from then
// to the end (when never: over the phase's second half; -1 with fewer than two samples).
func SettleSplit(pts []Point, t0, end, opt float64) (settled, share float64) {
	p := Between(pts, t0, end)
	if len(p) < 2 {
		return -1, -1
	}
	near := func(x float64) bool { return x >= 0 && math.Abs(x-opt) <= ShareTol }
	for _, w := range Spans(p) {
		if toEnd := ShareOf(p[w.I], p[len(p)-1]); near(ShareOf(p[w.I], p[w.J])) && near(toEnd) {
			return p[w.I].T - t0, toEnd
		}
	}
	return -1, ShareOf(p[len(p)/2], p[len(p)-1])
}

// Verdict is one phase judged on throughput: Settled (s after the change, -1: never), the
// average rate from then to the phase's end, the lowest span from then on, and every span as
// " start_s:mbps=sout+sup".
type Verdict struct {
	Settled, Rate, Lowest float64
	Windows               string
}

// Settle judges one phase from its change at t0 to end against the best static rate: it
// settles at the first span of at least MinRatio of best from whose start to the phase's end
// the average rate is also at least MinRatio of best. Never settled, Rate is the second half's.
func Settle(pts []Point, t0, end float64, best float64) Verdict {
	p := Between(pts, t0, end)
	v := Verdict{Settled: -1}
	for _, w := range Spans(p) {
		start, rate := p[w.I].T-t0, Mbps(p[w.I], p[w.J])
		so, su := RailMbps(p[w.I], p[w.J])
		v.Windows += fmt.Sprintf(" %.1f:%.1f=%.1f+%.1f", start, rate, so, su)
		if v.Settled >= 0 {
			v.Lowest = min(v.Lowest, rate)
		} else if toEnd := Mbps(p[w.I], p[len(p)-1]); rate >= MinRatio*best && toEnd >= MinRatio*best {
			v.Settled, v.Rate, v.Lowest = start, toEnd, rate
		}
	}
	if v.Settled < 0 && len(p) >= 2 {
		v.Rate = Mbps(p[len(p)/2], p[len(p)-1])
	}
	return v
}

// Optimum is the theoretical best split (of 1024) for SUP shaped to supKbit and SOUT to
// soutKbit.
func Optimum(supKbit, soutKbit int) int {
	return int(math.Round(1024 * float64(supKbit) / float64(supKbit+soutKbit)))
}

// Marks are a connection's per-rail completed bytes and active time (ns with requests in
// flight) at one moment, from the plugin's telemetry.
type Marks struct{ SoutBytes, SoutNs, SupBytes, SupNs uint64 }

// ActiveOptimum is the split the rails' active rates between two marks call for: SUP's rate
// over the sum, each rate the bytes a rail completed over the time it had the connection's
// requests in flight (what it delivers while it has work: its capacity, as the lab's rails
// really ran, not as they were shaped). -1 when a rail completed nothing in between.
func ActiveOptimum(from, to Marks) float64 {
	if to.SoutBytes <= from.SoutBytes || to.SoutNs <= from.SoutNs || to.SupBytes <= from.SupBytes || to.SupNs <= from.SupNs {
		return -1
	}
	sout := float64(to.SoutBytes-from.SoutBytes) / float64(to.SoutNs-from.SoutNs)
	sup := float64(to.SupBytes-from.SupBytes) / float64(to.SupNs-from.SupNs)
	return sup / (sout + sup)
}

// SplitOK is a phase's verdict on its end share: within ShareTol of the shaped optimum
// (nominal: right when the rails deliver their shaping) or of the optimum of the rails' active
// rates over the phase's end (active, -1 when not measured: right when they deliver less,
// unevenly), and within ShapedTol of the shaped optimum whatever the rails did. Either optimum
// alone flips with the host: the active one moves with every stall of a rail (a lost last
// packet waits out the RC timeout with requests in flight and nothing completing), which the
// loop's smoothed rates ride out.
func SplitOK(end, nominal, active float64) bool {
	if end < 0 || math.Abs(end-nominal) > ShapedTol {
		return false
	}
	return math.Abs(end-nominal) <= ShareTol || (active >= 0 && math.Abs(end-active) <= ShareTol)
}

// Judged is the verdict on the stretch a phase is judged on: SUP's share of a1's bytes over
// it, the optimum of the rails' active rates over it (-1: unknown), and SplitOK's verdict.
type Judged struct {
	Share, Active float64
	OK            bool
}

// Judge is the verdict on the stretch between two readings of a1's rails (from, to) and of the
// connection's telemetry (fromM, toM), for the shaped optimum opt.
func Judge(from, to Point, fromM, toM Marks, opt float64) Judged {
	j := Judged{Share: ShareOf(from, to), Active: ActiveOptimum(fromM, toM)}
	j.OK = SplitOK(j.Share, opt, j.Active)
	return j
}

// CarryDivisor is what every rate is divided by when the lab carried `carried` kbit/s at full
// rates: the least of 1, 2, 4 and 8 at which that is CarryHeadroom times phase 1's shaped rate
// (what it carried at full rates is what it can carry: the VM was the limit).
func CarryDivisor(carried int) int {
	for _, div := range []int{1, 2, 4} {
		if CarryHeadroom*float64(SoutKbit+SupKbit)/float64(div) <= float64(carried) {
			return div
		}
	}
	return 8
}
