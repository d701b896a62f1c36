package main

import (
	"bufio"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// The Prometheus text exposition format (version 0.0.4), written by hand: the exporter needs
// gauges and counters with labels and nothing else, and a few lines here keep the static
// mpib-agent free of client_golang and its dependencies. The tests lint the output with
// client_golang's promlint, which is what `promtool check metrics` runs.

// textContentType is the Content-Type of the text format.
const textContentType = "text/plain; version=0.0.4; charset=utf-8"

type label struct{ name, value string }

type sample struct {
	labels []label
	value  float64
}

// family is one metric: its HELP and TYPE lines and every sample of it.
type family struct {
	name, help, typ string
	samples         []sample
}

func gaugeFamily(name, help string) *family   { return &family{name: name, help: help, typ: "gauge"} }
func counterFamily(name, help string) *family { return &family{name: name, help: help, typ: "counter"} }

// add appends a sample; kv are label names and values, alternating.
func (f *family) add(v float64, kv ...string) {
	ls := make([]label, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		ls = append(ls, label{kv[i], kv[i+1]})
	}
	f.samples = append(f.samples, sample{ls, v})
}

// sortSamples orders samples by their label values, so that a scrape reads the same from one
// time to the next (maps feed most families).
func (f *family) sortSamples() {
	key := func(s sample) string {
		var b strings.Builder
		for _, l := range s.labels {
			b.WriteString(l.value)
			b.WriteByte(0)
		}
		return b.String()
	}
	slices.SortStableFunc(f.samples, func(a, b sample) int { return strings.Compare(key(a), key(b)) })
}

// writeText writes the families in the text format. A family without samples is left out
// (a TYPE line without samples says nothing and some parsers refuse it).
func writeText(w io.Writer, fams []*family) error {
	bw := bufio.NewWriter(w)
	for _, f := range fams {
		if len(f.samples) == 0 {
			continue
		}
		f.sortSamples()
		bw.WriteString("# HELP " + f.name + " " + escapeHelp(f.help) + "\n")
		bw.WriteString("# TYPE " + f.name + " " + f.typ + "\n")
		for _, s := range f.samples {
			bw.WriteString(f.name)
			if len(s.labels) > 0 {
				bw.WriteByte('{')
				for i, l := range s.labels {
					if i > 0 {
						bw.WriteByte(',')
					}
					bw.WriteString(l.name + `="` + escapeLabel(l.value) + `"`)
				}
				bw.WriteByte('}')
			}
			bw.WriteString(" " + formatValue(s.value) + "\n")
		}
	}
	return bw.Flush()
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }

// formatValue writes integers (counters of bytes: most values) in full, others in the
// shortest form that reads back to the same float64.
func formatValue(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
