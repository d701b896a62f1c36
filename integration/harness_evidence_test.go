package integration

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/mpib/mpib/integration/kv"
)

// Evidence: evidence prints the lines the lab's logs are read for; the parsers read the
// plugin's and the driver's lines (failover and recovery events, the driver's gaps and plugin
// errors). Package kv parses key=value lines.

// evidence prints one evidence line (kv.Line) on stdout: head (a word and a colon, "fault:",
// or a bench figure's name, "P1"), a space, then format's k=v fields and a newline, in one write
// (go test -v keeps a package's stdout in order, and concurrent cases do not interleave inside
// a line). The lines are what the lab's logs are read for: a line's head and fields are its
// contract with the readers (docs, CI summaries, benchstat), so a change of form is a change of
// evidence. kv reads them back.
func evidence(head, format string, args ...any) {
	fmt.Print(kv.Line(head, format, args...))
}

// tail returns the last n bytes of s, marked "..." when cut.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// linesContaining returns the lines of log that contain any of markers, trimmed (kv.Containing).
func linesContaining(log string, markers ...string) []string { return kv.Containing(log, markers...) }

// hasLine returns the first line of out starting with prefix ("": none).
func hasLine(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

type railEvent struct {
	node      string // who printed it
	kind      string // failover or recovery
	rail      Rail
	side      string // send or recv
	ms        int64  // decided_ms or restored_ms
	reason    string
	continued string
	line      string
}

var (
	failoverRe = regexp.MustCompile(`failover: rail=(\w+) side=(\w+) decided_ms=(\d+) reason=(\S+) continued_on=(\w+)`)
	recoveryRe = regexp.MustCompile(`recovery: rail=(\w+) side=(\w+) restored_ms=(\d+)`)
)

func parseRailEvents(node, log string) []railEvent {
	var evs []railEvent
	for _, l := range strings.Split(log, "\n") {
		if m := failoverRe.FindStringSubmatch(l); m != nil {
			ms, _ := strconv.ParseInt(m[3], 10, 64)
			evs = append(evs, railEvent{node, "failover", Rail(m[1]), m[2], ms, m[4], m[5], strings.TrimSpace(l)})
		} else if m := recoveryRe.FindStringSubmatch(l); m != nil {
			ms, _ := strconv.ParseInt(m[3], 10, 64)
			evs = append(evs, railEvent{node, "recovery", Rail(m[1]), m[2], ms, "", "", strings.TrimSpace(l)})
		}
	}
	return evs
}

type gap struct{ from, to, ms int64 }

var gapRe = regexp.MustCompile(`nettest-gap: side=\w+ from_ms=(\d+) to_ms=(\d+) gap_ms=(\d+)`)

func parseGaps(outs ...string) []gap {
	var gs []gap
	for _, out := range outs {
		for _, m := range gapRe.FindAllStringSubmatch(out, -1) {
			f, _ := strconv.ParseInt(m[1], 10, 64)
			to, _ := strconv.ParseInt(m[2], 10, 64)
			ms, _ := strconv.ParseInt(m[3], 10, 64)
			gs = append(gs, gap{f, to, ms})
		}
	}
	return gs
}

// stallIn is the longest gap overlapping [from, to] (0: none of at least faultGapMS).
func stallIn(gs []gap, from, to int64) int64 {
	var worst int64
	for _, g := range gs {
		if g.from < to && g.to > from && g.ms > worst {
			worst = g.ms
		}
	}
	return worst
}

// ncclErrors counts the plugin calls that returned an error on both sides.
func ncclErrors(outs ...string) int {
	n := 0
	for _, out := range outs {
		n += strings.Count(out, "nettest-error:")
	}
	return n
}

var errorAtRe = regexp.MustCompile(`nettest-error: side=\w+ call=\w+ rc=-?\d+ at_ms=(\d+)`)

// firstErrorMS is the first plugin error's time relative to ref (-1: none).
func firstErrorMS(out string, ref int64) int64 {
	m := errorAtRe.FindStringSubmatch(out)
	if m == nil {
		return -1
	}
	at, _ := strconv.ParseInt(m[1], 10, 64)
	return at - ref
}

func atoiOr(s string, def int) int {
	if n, err := strconv.Atoi(s); err == nil {
		return n
	}
	return def
}
