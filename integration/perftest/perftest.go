// Package perftest reads the reports of perftest's ib_write_bw and ib_write_lat, which the lab
// runs as the reference for the plugin's figures. It needs no lab.
package perftest

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// ErrNoFigure: perftest finished but printed inf or nan, so the run measured nothing (its
// CPU-frequency estimate failed); run it again.
var ErrNoFigure = errors.New("not a measurement (perftest's CPU-frequency estimate failed)")

// BWAverage reads the "BW average[MB/sec]" column of ib_write_bw's report and returns Gbit/s.
// perftest's MB is 2^20 bytes; its --report_gbits figure has only two decimals (10 Mbit/s
// steps), too coarse for ratios on rails of a few hundred Mbit/s.
func BWAverage(out string) (float64, error) {
	gbps, _, err := BWLine(out)
	return gbps, err
}

// BWLine reads the "BW average[MB/sec]" column (returned in Gbit/s, as BWAverage) and the
// "MsgRate[Mpps]" column (returned in messages per second; 0 when absent) of the first report
// line after the header.
func BWLine(out string) (gbps, msgsPerSec float64, err error) {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if !strings.Contains(l, "BW average[MB/sec]") {
			continue
		}
		for _, d := range lines[i+1:] {
			f := strings.Fields(d)
			if len(f) >= 4 {
				mbytes, err := strconv.ParseFloat(f[3], 64)
				if err != nil || math.IsInf(mbytes, 0) || math.IsNaN(mbytes) || mbytes <= 0 {
					// inf / nan: perftest's CPU-frequency estimate failed, not a figure.
					return 0, 0, fmt.Errorf("perftest BW average %q: %w", f[3], ErrNoFigure)
				}
				if len(f) >= 5 {
					if mpps, err := strconv.ParseFloat(f[4], 64); err == nil && !math.IsInf(mpps, 0) && !math.IsNaN(mpps) {
						msgsPerSec = mpps * 1e6
					}
				}
				return mbytes * (1 << 20) * 8 / 1e9, msgsPerSec, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("no BW average[MB/sec] in perftest output")
}

// MsgRate is ib_write_bw's message rate for messages of size bytes, from whichever of its two
// report columns is the finer figure: "BW average[MB/sec]" (gbps, as BWLine returns it) has two
// decimals, coarse for small messages; "MsgRate[Mpps]" (msgsPerSec, as BWLine returns it; 0
// when absent) six, coarse for large ones.
func MsgRate(gbps, msgsPerSec float64, size int) float64 {
	fromBW := gbps * 1e9 / 8 / float64(size)
	mbytes := gbps * 1e9 / 8 / (1 << 20)
	if msgsPerSec <= 0 || 0.005/mbytes < 0.5/msgsPerSec {
		return fromBW
	}
	return msgsPerSec
}

// latLineRe is ib_write_lat's report line for 8-byte messages: #bytes #iterations t_min t_max
// t_typical t_avg ...
var latLineRe = regexp.MustCompile(`(?m)^\s*8\s+\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)`)

// LatTypical reads t_typical (us) of ib_write_lat's 8-byte report line; false when there is
// none (perftest printed inf for every column: it measured nothing).
func LatTypical(out string) (float64, bool) {
	m := latLineRe.FindStringSubmatch(out)
	if m == nil {
		return 0, false
	}
	typical, _ := strconv.ParseFloat(m[3], 64)
	return typical, true
}
