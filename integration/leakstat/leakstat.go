// Package leakstat holds the leak suite's statistics (integration's TestLeakConnectClose and
// TestLeakFailoverRecovery): how a process's resources grew over many connect/close or
// failover/recovery cycles, read so that the Go runtime's and the kernel's own noise is not
// called a leak and a leak per cycle always is. It needs no lab.
package leakstat

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/mpib/mpib/integration/kv"
)

// Sample is one reading of a process's resources: open fds, OS threads, the node's RDMA QPs
// and MRs, and its resident set.
type Sample struct {
	FDs, Threads, QPs, MRs int
	RSSKiB                 int64
}

func (s Sample) String() string {
	return fmt.Sprintf("fds=%d threads=%d rss_kib=%d qps=%d mrs=%d", s.FDs, s.Threads, s.RSSKiB, s.QPs, s.MRs)
}

// MinSample is each figure's least of a and b (b alone when first): the sample of a few
// probes of a running process, whose figures each move up and down between probes.
func MinSample(a, b Sample, first bool) Sample {
	if first {
		return b
	}
	return Sample{FDs: min(a.FDs, b.FDs), Threads: min(a.Threads, b.Threads), QPs: min(a.QPs, b.QPs),
		MRs: min(a.MRs, b.MRs), RSSKiB: min(a.RSSKiB, b.RSSKiB)}
}

// Growth is the worst (largest) growth over the processes. Threads and RSSKiB are the
// verdict's figures (each test says how it reads them); ThreadsStep and RSSStepKiB are the
// plain differences of the two samples, printed beside them.
type Growth struct {
	FDs, QPs, MRs, Threads, ThreadsStep int
	RSSKiB, RSSStepKiB                  int64
}

// Add takes one process's growth from first to last into g.
func (g *Growth) Add(first, last Sample) {
	g.FDs = max(g.FDs, last.FDs-first.FDs)
	g.QPs = max(g.QPs, last.QPs-first.QPs)
	g.MRs = max(g.MRs, last.MRs-first.MRs)
	g.Threads = max(g.Threads, last.Threads-first.Threads)
	g.ThreadsStep = max(g.ThreadsStep, last.Threads-first.Threads)
	g.RSSKiB = max(g.RSSKiB, last.RSSKiB-first.RSSKiB)
	g.RSSStepKiB = max(g.RSSStepKiB, last.RSSKiB-first.RSSKiB)
}

// Round is a process's thread count at rest after one reported round.
type Round struct{ Round, Threads int }

// RestThreads reads a process's threads at rest over the rounds. atRest is the most in the
// final window (the last reported rounds, as many as the baseline window has). growth is what
// both halves of the measured rounds (the reported rounds after base) added (RecurringGrowth):
// the baseline's level is its window's median (the reported rounds from base/4 to base), each
// half's level its least. The plugin ends its idle threads when it goes idle, and the Go
// runtime may start one again for its own work (a GC cycle, a timer) before the driver reads
// the count, or have ended one more: a round's count at rest is mostly one figure, now and
// then one more or one less, and it may step up once and stay (a thread the runtime keeps).
// A thread leaked per connection, or per round, is in every report after it: it raises both
// halves' least. With one measured report there are no halves: growth is its count minus the
// baseline's level. Both are 0 when either window is empty.
func RestThreads(rs []Round, base int) (atRest, growth int) {
	var baseline, measured []int
	for _, r := range rs {
		if r.Round >= base/4 && r.Round <= base {
			baseline = append(baseline, r.Threads)
		} else if r.Round > base {
			measured = append(measured, r.Threads)
		}
	}
	if len(baseline) == 0 || len(measured) == 0 {
		return 0, 0
	}
	final := measured[max(len(measured)-len(baseline), 0):]
	level := slices.Sorted(slices.Values(baseline))[(len(baseline)-1)/2]
	if len(measured) == 1 {
		return measured[0], measured[0] - level
	}
	half := len(measured) / 2
	return slices.Max(final), RecurringGrowth(level, slices.Min(measured[:half]), slices.Min(measured[half:]))
}

// BurstThreads reads the most threads a process held while its rounds' connections were set
// up (one peak per reported round): the most in any round, and the median round's (the lower
// middle one). A thread per connection, or one that a burst starts and never ends, raises
// every round's peak and so the median; the Go runtime's hand-offs of its processors while
// calls sit in the kernel raise one round now and then (in the lab, one round of a run at 21
// where the others stay at 12-17), which moves the most but not the median. Both are 0
// without rounds.
func BurstThreads(peaks []int) (most, median int) {
	if len(peaks) == 0 {
		return 0, 0
	}
	sorted := slices.Sorted(slices.Values(peaks))
	return sorted[len(sorted)-1], sorted[(len(sorted)-1)/2]
}

// RecurringGrowth is the thread growth the leak verdicts count: what both halves of the
// cycles added (the least of the two steps, 0 when either half added none). A thread
// leaked per cycle, or per few cycles, adds in both halves. The Go runtime's idle pool does
// not: it keeps the threads of its busiest moment so far, so the count steps up once when such
// a moment comes and stays.
func RecurringGrowth(first, middle, last int) int {
	return max(min(middle-first, last-middle), 0)
}

// RecurringRSS is the RSS growth (KiB) the failover/recovery verdict counts: what the
// measured cycles add at the lesser of their two halves' rates (first to middle over n1
// cycles, middle to last over n2), 0 when either half added none. Memory leaked per cycle
// grows both halves at its rate and counts whole. A step once does not: the Go heap touching
// again the pages a trim gave back (plugin/threads.go) or a collection's work buffers, after
// which the heap reuses what it holds.
func RecurringRSS(first, middle, last int64, n1, n2 int) int64 {
	if n1 <= 0 || n2 <= 0 {
		return max(last-first, 0)
	}
	rate := min(float64(middle-first)/float64(n1), float64(last-middle)/float64(n2))
	return max(int64(rate*float64(n1+n2)), 0)
}

var cycleLineRe = regexp.MustCompile(`cycle \d+: down (\d+) failover (\d+) up (\d+) recovery (\d+) ms`)

// CycleSummary condenses the failover cycles script's per-cycle timeline (ms from each link
// command to the next step) to the median and the maximum of each step, plus its last line;
// output with no cycle line passes through, trimmed.
func CycleSummary(out string) string {
	var steps [4][]float64
	for _, m := range cycleLineRe.FindAllStringSubmatch(out, -1) {
		for i := range steps {
			v, _ := strconv.ParseFloat(m[i+1], 64)
			steps[i] = append(steps[i], v)
		}
	}
	if len(steps[0]) == 0 {
		return strings.TrimSpace(out)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ms median/max over %d cycles:", len(steps[0]))
	for i, name := range []string{"link down", "failover", "link up", "recovery"} {
		sorted := slices.Clone(steps[i])
		slices.Sort(sorted)
		fmt.Fprintf(&b, " %s %.0f/%.0f", name, sorted[len(sorted)/2], sorted[len(sorted)-1])
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return b.String() + "; " + lines[len(lines)-1]
}

// FailureLines are a driver's error lines in its stderr: its own (mpib-nettest:), the plugin's
// warnings, dropped TCP clients and anything that failed.
func FailureLines(stderr string) []string {
	return kv.Containing(stderr, "mpib-nettest:", "NCCL WARN", "dropped a TCP client", "failed")
}
