// Package kv writes and reads the lab's evidence lines: "prefix: k=v k=v ..." as printed by
// mpib-nettest, the plugin and the lab tests themselves.
package kv

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Line is one evidence line: head (a word and a colon, "fault:", or a figure's name, "P1"), a
// space, format's fields and a newline.
func Line(head, format string, args ...any) string {
	return head + " " + fmt.Sprintf(format, args...) + "\n"
}

// Containing returns the lines of log that contain any of markers, trimmed, in order.
func Containing(log string, markers ...string) []string {
	var lines []string
	for _, l := range strings.Split(log, "\n") {
		for _, m := range markers {
			if strings.Contains(l, m) {
				lines = append(lines, strings.TrimSpace(l))
				break
			}
		}
	}
	return lines
}

// Record is the fields of one line. A field is a whitespace-free word holding "=": its key
// is what precedes the first "=", its value the rest. Words without "=" are not fields. When
// a key repeats, its first value holds.
type Record map[string]string

// Parse reads the fields of s.
func Parse(s string) Record {
	r := Record{}
	for _, f := range strings.Fields(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			if _, dup := r[k]; !dup {
				r[k] = v
			}
		}
	}
	return r
}

// Lines returns the fields after prefix of every line of out that starts with prefix, in
// order. A prefix may itself name fields ("nettest-lifecycle: case=x role=server"): they
// select lines and are not part of the records.
func Lines(out, prefix string) []Record {
	var rs []Record
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			rs = append(rs, Parse(rest))
		}
	}
	return rs
}

// First returns the fields of the first line of out starting with prefix (nil: none).
func First(out, prefix string) Record {
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			return Parse(rest)
		}
	}
	return nil
}

// Field returns the value of key in the first line of out starting with prefix ("": no such
// line, or no such field in it).
func Field(out, prefix, key string) string { return First(out, prefix)[key] }

// Float is Field as a number (false: missing or not a number).
func Float(out, prefix, key string) (float64, bool) {
	v, err := strconv.ParseFloat(Field(out, prefix, key), 64)
	return v, err == nil
}

// Float returns r[key] as a number (NaN: missing or not a number).
func (r Record) Float(key string) float64 {
	v, err := strconv.ParseFloat(r[key], 64)
	if err != nil {
		return math.NaN()
	}
	return v
}
