package perftest

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// Reports as ib_write_bw and ib_write_lat print them in the lab.
const (
	bw64K = ` RDMA_Write BW Test
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      500              21.37              20.00              0.000342
---------------------------------------------------------------------------------------
`
	bw8 = ` #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 8          20000            0.80               0.76               0.099614
`
	lat8 = ` #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
 8       1000          41.12          1013.44      63.27             71.90             40.22           251.96                  1013.44
---------------------------------------------------------------------------------------
`
	latInf = ` #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]
 8       1000          inf            inf          inf               inf
`
)

func TestBWLine(t *testing.T) {
	for _, tc := range []struct {
		name       string
		out        string
		gbps, rate float64
		err        string // "" none
		noFigure   bool
	}{
		{"64 KiB", bw64K, 20 * 1048576 * 8 / 1e9, 342, "", false}, // perftest's MB is 2^20 bytes
		{"8 B", bw8, 0.76 * (1 << 20) * 8 / 1e9, 99614, "", false},
		{"no MsgRate column", " #bytes #iterations BW peak[MB/sec] BW average[MB/sec]\n 65536 500 21.37 20.00\n", 20 * 1048576 * 8 / 1e9, 0, "", false},
		{"Gb/sec report", " #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec]\n 65536 500 0.17 0.17\n", 0, 0, "no BW average[MB/sec]", false},
		{"inf", " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 65536 500 inf inf inf\n", 0, 0, "inf", true},
		{"zero", " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 65536 500 0.00 0.00 0.000\n", 0, 0, "0.00", true},
	} {
		gbps, rate, err := BWLine(tc.out)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.err)
		case errors.Is(err, ErrNoFigure) != tc.noFigure:
			t.Errorf("%s: error %v: ErrNoFigure %t, want %t", tc.name, err, !tc.noFigure, tc.noFigure)
		case math.Abs(gbps-tc.gbps) > 1e-12 || math.Abs(rate-tc.rate) > 1e-6:
			t.Errorf("%s: %v Gbit/s %v msgs/s, want %v %v", tc.name, gbps, rate, tc.gbps, tc.rate)
		}
		if avg, err := BWAverage(tc.out); avg != gbps || (err == nil) != (tc.err == "") {
			t.Errorf("%s: BWAverage %v %v, BWLine %v", tc.name, avg, err, gbps)
		}
	}
}

func TestMsgRate(t *testing.T) {
	for _, tc := range []struct {
		name       string
		gbps, rate float64
		size       int
		want       float64
	}{
		// 8 B: the MsgRate column (six decimals of Mpps) is finer than 0.76 MB/s.
		{"8 B", 0.76 * (1 << 20) * 8 / 1e9, 99614, 8, 99614},
		// 64 KiB: 0.000296 Mpps is coarse; 18.50 MB/s gives the rate.
		{"64 KiB", 18.5 * (1 << 20) * 8 / 1e9, 296, 65536, 18.5 * (1 << 20) / 65536},
		{"no MsgRate column", 18.5 * (1 << 20) * 8 / 1e9, 0, 65536, 18.5 * (1 << 20) / 65536},
	} {
		if got := MsgRate(tc.gbps, tc.rate, tc.size); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: MsgRate = %v, want %v", tc.name, got, tc.want)
		}
	}
	// The figures as BWLine reads them from a report.
	gbps, rate, err := BWLine(bw8)
	if got := MsgRate(gbps, rate, 8); err != nil || got != 99614 {
		t.Errorf("8 B report: MsgRate = %v (%v), want perftest's MsgRate column", got, err)
	}
}

func TestLatTypical(t *testing.T) {
	if v, ok := LatTypical(lat8); !ok || v != 63.27 {
		t.Errorf("LatTypical = %v %v, want 63.27", v, ok)
	}
	if _, ok := LatTypical(latInf); ok {
		t.Error("a report of inf read as a figure")
	}
	if _, ok := LatTypical(strings.Replace(lat8, " 8  ", " 16 ", 1)); ok {
		t.Error("a 16-byte line read as the 8-byte one")
	}
}
