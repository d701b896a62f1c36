package integration

import (
	"fmt"
	"strings"
)

// evidence prints one evidence line on stdout: head (a word and a colon, "fault:", or a
// bench figure's name, "P1"), a space, then format's k=v fields and a newline, in one write
// (go test -v keeps a package's stdout in order, and concurrent cases do not interleave inside
// a line). The lines are what the lab's logs are read for: a line's head and fields are its
// contract with the readers (docs, CI summaries, benchstat), so a change of form is a change of
// evidence. kv reads them back.
func evidence(head, format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	fmt.Print(head + " " + line + "\n")
}

// tail returns the last n bytes of s, marked "..." when cut.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// linesContaining returns the lines of log that contain any of markers, trimmed.
func linesContaining(log string, markers ...string) []string {
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

// hasLine returns the first line of out starting with prefix ("": none).
func hasLine(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
