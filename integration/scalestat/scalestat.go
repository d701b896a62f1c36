// Package scalestat summarises the plugin's lines for the scale suite (integration's
// TestScaleConnect and TestBenchScale512). It needs no lab.
package scalestat

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

var setupRe = regexp.MustCompile(`setup ms: (.*)$`)

// SetupSteps sums the plugin's per-comm setup breakdown ("setup ms: params=.. create=.. ..."
// at the end of each comm's INFO line) over one process's comms: "comms=N params_ms=mean/max
// ... (mean/max per comm)", the steps in the order the first comm names them.
func SetupSteps(stderr string) string {
	var keys []string
	sum, worst := map[string]float64{}, map[string]float64{}
	n := 0
	for _, l := range strings.Split(stderr, "\n") {
		m := setupRe.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		n++
		for _, f := range strings.Fields(m[1]) {
			k, v, ok := strings.Cut(f, "=")
			x, err := strconv.ParseFloat(v, 64)
			if !ok || err != nil {
				continue
			}
			if _, seen := sum[k]; !seen {
				keys = append(keys, k)
			}
			sum[k] += x
			worst[k] = math.Max(worst[k], x)
		}
	}
	out := fmt.Sprintf("comms=%d", n)
	for _, k := range keys {
		out += fmt.Sprintf(" %s_ms=%.1f/%.1f", k, sum[k]/float64(n), worst[k])
	}
	return out + " (mean/max per comm)"
}
