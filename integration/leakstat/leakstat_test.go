package leakstat

import (
	"strings"
	"testing"
)

func TestRestThreads(t *testing.T) {
	for _, tc := range []struct {
		name           string
		rs             []Round
		base           int
		atRest, growth int
	}{
		{"a count moving between 8 and 10 around 9",
			[]Round{{1, 12}, {5, 9}, {20, 9}, {40, 8}, {60, 9}, {80, 9}, {85, 9}, {90, 10}, {95, 9}, {100, 9}}, 80, 10, 0},
		{"a count alternating between 9 and 10, a short final window",
			[]Round{{20, 9}, {25, 10}, {30, 9}, {35, 10}, {80, 9}, {85, 10}, {90, 9}}, 80, 10, 0},
		{"a count that stepped up once in the measured rounds and stayed",
			[]Round{{1, 12}, {5, 9}, {20, 9}, {40, 8}, {60, 9}, {80, 9}, {85, 9}, {90, 10}, {95, 9}, {100, 9}, {105, 10}, {110, 11}, {115, 10}, {120, 10}}, 80, 11, 0},
		{"a count that stepped up once in the warm-up and stayed through the measured rounds",
			[]Round{{1, 7}, {5, 7}, {10, 7}, {15, 7}, {20, 7}, {25, 8}, {30, 8}, {35, 8}, {40, 8}, {45, 8}, {50, 8}}, 30, 8, 0},
		{"a thread more every report",
			[]Round{{10, 7}, {15, 7}, {20, 7}, {25, 7}, {30, 7}, {35, 8}, {40, 9}, {45, 10}, {50, 11}}, 30, 11, 1},
		{"a thread more every connection",
			[]Round{{10, 7}, {15, 57}, {20, 107}, {25, 157}, {30, 207}, {35, 257}, {40, 307}, {45, 357}, {50, 407}}, 30, 407, 100},
		{"a count that climbed in the warm-up and again in both halves",
			[]Round{{10, 7}, {20, 8}, {30, 8}, {35, 9}, {40, 9}, {45, 10}, {50, 10}}, 30, 10, 1},
		{"a count that went down", []Round{{80, 9}, {85, 8}}, 80, 8, -1},
		{"rounds before base/4 are not the baseline", []Round{{4, 1}, {20, 9}, {30, 9}}, 20, 9, 0},
		{"no final window", []Round{{20, 9}, {30, 9}}, 30, 0, 0},
		{"no baseline", []Round{{40, 9}}, 30, 0, 0},
	} {
		if atRest, growth := RestThreads(tc.rs, tc.base); atRest != tc.atRest || growth != tc.growth {
			t.Errorf("%s: at rest %d, growth %d; want %d, %d", tc.name, atRest, growth, tc.atRest, tc.growth)
		}
	}
}

func TestBurstThreads(t *testing.T) {
	for _, tc := range []struct {
		name         string
		peaks        []int
		most, median int
	}{
		{"a run with one round the runtime pushed up (the lab's leak run, client)",
			[]int{12, 14, 21, 16, 15, 12, 13, 13, 13, 13, 13}, 21, 13},
		{"a thread per connection: every round 10 higher", []int{22, 24, 31, 26, 25, 22, 23, 23, 23, 23, 23}, 31, 23},
		{"a thread a round that is never ended", []int{12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22}, 22, 17},
		{"an even count takes the lower middle", []int{12, 20, 13, 14}, 20, 13},
		{"one round", []int{15}, 15, 15},
		{"no rounds", nil, 0, 0},
	} {
		if most, median := BurstThreads(tc.peaks); most != tc.most || median != tc.median {
			t.Errorf("%s: most %d, median %d; want %d, %d", tc.name, most, median, tc.most, tc.median)
		}
	}
}

func TestRecurringRSS(t *testing.T) {
	for _, tc := range []struct {
		name                string
		first, middle, last int64
		n1, n2              int
		want                int64
	}{
		{"a step once in the first half (the lab's failover run)", 15980, 16508, 16508, 8, 5, 0},
		{"a step once in the second half", 16000, 16000, 16600, 8, 5, 0},
		{"flat", 16296, 16296, 16296, 8, 5, 0},
		{"100 KiB a cycle", 16000, 16800, 17300, 8, 5, 1300},
		{"a leak at 100 KiB a cycle beside a 600 KiB step", 16000, 17400, 17900, 8, 5, 1300},
		{"shrinking", 16500, 16400, 16300, 8, 5, 0},
		{"no halves", 16000, 16000, 16700, 0, 5, 700},
	} {
		if got := RecurringRSS(tc.first, tc.middle, tc.last, tc.n1, tc.n2); got != tc.want {
			t.Errorf("%s: %d KiB, want %d", tc.name, got, tc.want)
		}
	}
}

func TestMinSample(t *testing.T) {
	probes := []Sample{{FDs: 19, Threads: 10, RSSKiB: 15268, MRs: 2}, {FDs: 19, Threads: 9, RSSKiB: 15300, MRs: 2}, {FDs: 20, Threads: 9, RSSKiB: 15270, MRs: 2}}
	var got Sample
	for n, p := range probes {
		got = MinSample(got, p, n == 0)
	}
	if want := (Sample{FDs: 19, Threads: 9, RSSKiB: 15268, MRs: 2}); got != want {
		t.Errorf("least of each figure: got %v, want %v", got, want)
	}
	if got := MinSample(Sample{}, probes[0], true); got != probes[0] {
		t.Errorf("the first probe alone: got %v, want %v", got, probes[0])
	}
	if s := probes[0].String(); s != "fds=19 threads=10 rss_kib=15268 qps=0 mrs=2" {
		t.Errorf("String() = %q", s)
	}
}

func TestGrowth(t *testing.T) {
	var g Growth
	g.Threads = -1 << 30
	g.Add(Sample{FDs: 20, Threads: 9, QPs: 4, MRs: 8, RSSKiB: 15000}, Sample{FDs: 20, Threads: 10, QPs: 4, MRs: 8, RSSKiB: 15400})
	g.Add(Sample{FDs: 18, Threads: 9, QPs: 4, MRs: 8, RSSKiB: 14000}, Sample{FDs: 19, Threads: 8, QPs: 6, MRs: 7, RSSKiB: 13900})
	if want := (Growth{FDs: 1, QPs: 2, MRs: 0, Threads: 1, ThreadsStep: 1, RSSKiB: 400, RSSStepKiB: 400}); g != want {
		t.Errorf("growth over two processes: %+v, want %+v", g, want)
	}
}

func TestRecurringGrowth(t *testing.T) {
	for _, tc := range []struct {
		name                string
		first, middle, last int
		want                int
	}{
		{"flat", 9, 9, 9, 0},
		{"one step in the first half (the runtime's pool)", 9, 10, 10, 0},
		{"one step in the second half", 9, 9, 10, 0},
		{"a leak: a thread per cycle", 9, 34, 59, 25},
		{"a slow leak: one in each half", 9, 10, 11, 1},
		{"fewer at the end", 10, 9, 9, 0},
	} {
		if got := RecurringGrowth(tc.first, tc.middle, tc.last); got != tc.want {
			t.Errorf("%s: RecurringGrowth(%d, %d, %d) = %d, want %d", tc.name, tc.first, tc.middle, tc.last, got, tc.want)
		}
	}
}

func TestCycleSummary(t *testing.T) {
	out := "cycle 1: down 200 failover 110 up 125 recovery 244 ms\ncycle 2: down 300 failover 90 up 100 recovery 1500 ms\ncycle 3: down 250 failover 100 up 150 recovery 300 ms\nok\n"
	want := "ms median/max over 3 cycles: link down 250/300 failover 100/110 link up 125/150 recovery 300/1500; ok"
	if got := CycleSummary(out); got != want {
		t.Errorf("CycleSummary:\n got %q\nwant %q", got, want)
	}
	if got := CycleSummary("cycle 4: no failover in 5 s\n"); got != "cycle 4: no failover in 5 s" {
		t.Errorf("a failed script's output must pass through, got %q", got)
	}
}

func TestFailureLines(t *testing.T) {
	log := "NCCL INFO NET/MPIB : send comm up\n" +
		"NCCL INFO NET/MPIB : listener 10.0.2.12:1: dropped a TCP client (1 so far): not an MPIB peer\n" +
		"NCCL WARN NET/MPIB : connect: metadata from 10.0.2.12: connection reset by peer\n" +
		"mpib-nettest: connect #2 of 10 failed: rc=6\n" +
		"NCCL INFO NET/MPIB : devices closed\n"
	got := FailureLines(log)
	if len(got) != 3 || !strings.Contains(got[0], "dropped") || !strings.Contains(got[1], "NCCL WARN") || !strings.Contains(got[2], "connect #2") {
		t.Fatalf("FailureLines kept %q", got)
	}
}
