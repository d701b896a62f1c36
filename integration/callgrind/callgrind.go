// Package callgrind reads valgrind's callgrind output files, for the lab's instructions-per-
// message benchmark (integration's TestBenchP4InstructionsPerMessage). It needs no lab.
package callgrind

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// CallCost is what callgrind recorded for the calls into one function: how many calls, and
// the instructions executed inside them (inclusive of everything they called).
type CallCost struct {
	Calls int64
	Ir    int64
}

// Arc is one caller-callee pair of the call graph, by function name.
type Arc struct{ Caller, Callee string }

// ParseCalls reads a callgrind output file (events: Ir) and sums, per callee name,
// the call counts and inclusive costs of every call arc (ParseArcs, summed over callers).
func ParseCalls(r io.Reader) (map[string]CallCost, error) {
	arcs, err := ParseArcs(r)
	if err != nil {
		return nil, err
	}
	costs := map[string]CallCost{}
	for arc, cc := range arcs {
		c := costs[arc.Callee]
		c.Calls += cc.Calls
		c.Ir += cc.Ir
		costs[arc.Callee] = c
	}
	return costs, nil
}

// ParseArcs reads a callgrind output file (events: Ir) and sums, per caller and callee, the
// call counts and inclusive costs of its call arcs. Names are decompressed: callgrind writes
// "cfn=(7) name" the first time and "cfn=(7)" afterwards, and fn= and cfn= share the ids. A
// cost line starts with one column per position ("positions: line", or "instr line" with
// --dump-instr=yes).
func ParseArcs(r io.Reader) (map[Arc]CallCost, error) {
	names := map[string]string{} // "(7)" -> name
	costs := map[Arc]CallCost{}
	caller, callee, pendingCalls, npos := "", "", int64(-1), 1
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		switch {
		case strings.HasPrefix(text, "positions:"):
			npos = len(strings.Fields(strings.TrimPrefix(text, "positions:")))
		case strings.HasPrefix(text, "fn="), strings.HasPrefix(text, "cfn="):
			spec := text[strings.IndexByte(text, '=')+1:]
			name := spec
			if strings.HasPrefix(spec, "(") {
				end := strings.IndexByte(spec, ')')
				if end < 0 {
					return nil, fmt.Errorf("line %d: bad name %q", line, text)
				}
				id := spec[:end+1]
				if rest := strings.TrimSpace(spec[end+1:]); rest != "" {
					names[id] = rest
				}
				name = names[id]
			}
			if strings.HasPrefix(text, "cfn=") {
				callee = name
			} else {
				caller = name
			}
		case strings.HasPrefix(text, "calls="):
			fields := strings.Fields(strings.TrimPrefix(text, "calls="))
			if len(fields) == 0 {
				return nil, fmt.Errorf("line %d: bad calls line %q", line, text)
			}
			n, err := strconv.ParseInt(fields[0], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: bad calls line %q", line, text)
			}
			pendingCalls = n
		case pendingCalls >= 0:
			// The line after calls= holds the position and the call's inclusive cost.
			fields := strings.Fields(text)
			if len(fields) < npos+1 {
				return nil, fmt.Errorf("line %d: expected a call cost line, got %q", line, text)
			}
			ir, err := strconv.ParseInt(fields[npos], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: bad call cost %q", line, text)
			}
			arc := Arc{Caller: caller, Callee: callee}
			c := costs[arc]
			c.Calls += pendingCalls
			c.Ir += ir
			costs[arc] = c
			pendingCalls = -1
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(costs) == 0 {
		return nil, fmt.Errorf("no call arcs in the callgrind output (%d lines)", line)
	}
	return costs, nil
}
