package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpib/mpib/integration/benchstat"
)

// The benchmarks' shared parts: the gate (benchOrSkip, MPIB_BENCH=1) and pair count, a figure
// (a ratio of plugin to reference with its confidence interval) and the JSON file that keeps
// a run's figures, the per-benchmark clock, nettest's bandwidth line, and the lab VM's CPU split
// over a run.

func benchOrSkip(t *testing.T) *Topology {
	t.Helper()
	if os.Getenv("MPIB_BENCH") != "1" {
		t.Skip("benchmarks run with MPIB_BENCH=1 (go run mage.go bench)")
	}
	return labOrSkip(t)
}

// figure is one measured line of the benchmark report.
type figure struct {
	Name   string    `json:"name"` // P1..P5, connect, resources
	Key    string    `json:"key"`  // size=N or split=...
	Ratio  float64   `json:"ratio"`
	CILow  float64   `json:"ci_low"`
	CIHigh float64   `json:"ci_high"`
	Pairs  int       `json:"pairs"`
	Plugin float64   `json:"plugin"`
	Ref    float64   `json:"ref"`
	Unit   string    `json:"unit"`
	Ratios []float64 `json:"ratios"` // every pair, in the order measured
	// A second reference for the same plugin runs (P1: ib_write_bw at NCCL's depth of 8;
	// P2: both rails' ib_write_bw at once; P5: ib_write_bw's message rate), with its own
	// per-pair ratios and interval.
	AltLabel  string    `json:"alt_label,omitempty"`
	AltRef    float64   `json:"alt_ref,omitempty"`
	AltRatio  float64   `json:"alt_ratio,omitempty"`
	AltCILow  float64   `json:"alt_ci_low,omitempty"`
	AltCIHigh float64   `json:"alt_ci_high,omitempty"`
	AltRatios []float64 `json:"alt_ratios,omitempty"`
	SupShare  float64   `json:"sup_share,omitempty"`
	// P2 only: the sum of both rails' ib_write_bw run at the same time.
	ConcurrentRef float64 `json:"concurrent_ref,omitempty"`
	Preposted     *bool   `json:"preposted,omitempty"` // P3
	Mode          string  `json:"mode,omitempty"`      // P4: vanilla or advanced
	Note          string  `json:"note,omitempty"`      // what else the run measured, for the table
}

func median(xs []float64) float64 { return benchstat.Median(xs) }

// ratioFigure fills the ratio, its interval and the medians of both sides from per-pair values.
func ratioFigure(name, key, unit string, plugin, ref []float64) figure {
	ratios := make([]float64, len(plugin))
	for i := range plugin {
		ratios[i] = plugin[i] / ref[i]
	}
	s := benchstat.Summarize(ratios)
	return figure{Name: name, Key: key, Ratio: s.Median, CILow: s.Lo, CIHigh: s.Hi, Pairs: s.N,
		Plugin: median(plugin), Ref: median(ref), Unit: unit, Ratios: ratios}
}

// withAlt adds a second reference measured in the same pairs.
func (f figure) withAlt(label string, plugin, ref []float64) figure {
	g := ratioFigure("", "", "", plugin, ref)
	f.AltLabel, f.AltRef, f.AltRatio, f.AltCILow, f.AltCIHigh, f.AltRatios = label, g.Ref, g.Ratio, g.CILow, g.CIHigh, g.Ratios
	return f
}

func saveFigures(t *testing.T, name string, figs []figure) {
	dir := os.Getenv("MPIB_BENCH_OUT")
	if dir == "" {
		return
	}
	b, _ := json.MarshalIndent(figs, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o644); err != nil {
		t.Error(err)
	}
}

// benchClock prints how long each benchmark took, for the report's time budget.
func benchClock(t *testing.T) func() { return benchClockPairs(t, benchPairs()) }

// benchClockPairs is benchClock for a benchmark that runs its own number of pairs.
func benchClockPairs(t *testing.T, pairs int) func() {
	start := time.Now()
	return func() {
		evidence("bench:", "%s took %.0f s (%d pairs)", t.Name(), time.Since(start).Seconds(), pairs)
	}
}

var bwLineRe = regexp.MustCompile(`nettest-bw: size=(\d+) iters=(\d+) seconds=([\d.]+) mbps=([\d.]+) role=server`)

// vmCPU is the lab VM's CPU time so far by kind, in clock ticks: the first line of /proc/stat,
// which containers share with the VM (user, nice, system, idle, iowait, irq, softirq, ...).
type vmCPU [7]uint64

func readVMCPU(t *testing.T, n *Node) vmCPU {
	t.Helper()
	out, err := n.output(context.Background(), "head", "-1", "/proc/stat")
	f := strings.Fields(out)
	if err != nil || len(f) < 8 || f[0] != "cpu" {
		t.Fatalf("/proc/stat in %s: %q %v", n.Name(), out, err)
	}
	var c vmCPU
	for i := range c {
		c[i], _ = strconv.ParseUint(f[i+1], 10, 64)
	}
	return c
}

// cpuSplit is where the VM's CPU time went over some runs: user (the drivers' polling and
// the plugin's C), system and softirq (rxe's packet work runs in the kernel), idle.
type cpuSplit struct{ user, system, softirq, idle, total float64 }

func (s *cpuSplit) add(before, after vmCPU) {
	d := func(i int) float64 { return float64(after[i] - before[i]) }
	s.user += d(0) + d(1)
	s.system += d(2) + d(5)
	s.idle += d(3) + d(4)
	s.softirq += d(6)
	s.total += d(0) + d(1) + d(2) + d(3) + d(4) + d(5) + d(6)
}

func (s cpuSplit) String() string {
	if s.total == 0 {
		return "no samples"
	}
	return fmt.Sprintf("user %.0f %%, system %.0f %%, softirq %.0f %%, idle %.0f %%", 100*s.user/s.total,
		100*s.system/s.total, 100*s.softirq/s.total, 100*s.idle/s.total)
}

// benchPairs is how many interleaved (plugin, reference) pairs each ratio gets:
// MPIB_BENCH_PAIRS, else the older MPIB_BENCH_REPS, else 7.
func benchPairs() int { return benchPairsOr(7) }

// benchPairsOr is benchPairs with another default, for a benchmark whose pairs take long.
func benchPairsOr(def int) int {
	for _, k := range []string{"MPIB_BENCH_PAIRS", "MPIB_BENCH_REPS"} {
		if n, err := strconv.Atoi(os.Getenv(k)); err == nil && n > 0 {
			return n
		}
	}
	return def
}
