package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRecordLabTrace records a trace of the lab's closed loop for the Python agent's replay
// and plot (docs/agent.md, "Traces"): TestClosedLoop's transfer and shaping schedule at halved
// rates (SOUT 12.5 Mbit/s; SUP 25, 6.25, 25 Mbit/s, 16 s each), the Python agent's closed loop
// steering it, and `mpib-agent-py record --raw` on a1 writing every counter twice a second.
// The written trace is a header, the shaping as capacity points (the lab's ground truth:
// netem's rates, on a1's clock) and the records between the first and the last change.
//
// It runs only when MPIB_RECORD_TRACE names the output file (it takes about 3 minutes of lab
// time and is no check): MPIB_RECORD_TRACE=$PWD/testdata/traces/closedloop-lab.jsonl
// go test ./integration/ -run '^TestRecordLabTrace$' -v
func TestRecordLabTrace(t *testing.T) {
	out := os.Getenv("MPIB_RECORD_TRACE")
	if out == "" {
		t.Skip("MPIB_RECORD_TRACE is not set: set it to the output file to record the lab's closed-loop trace")
	}
	lab := labOrSkip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r := startClosedLoopRun(ctx, t, lab)
	r.div = 2 // the halved rates: what a slow host's lab carries (see TestClosedLoop)
	r.shape(ctx, t, SOUT, r.kbit(clSoutKbit))
	const remote = "/tmp/mpib-trace.jsonl"
	rec, err := r.a1.Start(ctx, pythonAgent.env, append(pythonAgent.cmd, "record", "--raw", "--out", remote,
		"--interval", "0.5", "--path", segPath)...)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Kill(context.Background())
	ph, loopOut := r.runAgent(ctx, t, pythonAgent)
	t.Log(loopOut)
	rec.Kill(ctx) // each record is one flushed line; a torn last one is dropped below
	r.samp.stop(ctx, t)
	raw, errOut, code, err := r.a1.Exec(ctx, nil, "cat", remote)
	if err != nil || code != 0 {
		t.Fatalf("reading %s on a1: exit %d %v %s", remote, code, err, errOut)
	}
	offset := unixMinusUptime(ctx, t, r.a1)
	trace := labTrace(t, r, ph, offset, raw)
	if err := os.WriteFile(out, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, rl := range Rails {
		lab.Shape(ctx, r.a1, rl, "")
	}
	lab.Node("a2").Exec(ctx, nil, "touch", clStopFile) // the transfer ends (see clTransfer)
	r.cli.Wait(ctx)
	r.srv.Wait(ctx)
	evidence("tracerecord:", "out=%s lines=%d lab_s=%.1f", out, strings.Count(trace, "\n"), time.Since(r.start).Seconds())
}

// unixMinusUptime is a1's CLOCK_REALTIME minus its /proc/uptime: the records' t is the
// former, the phases' starts (nodeSh) the latter.
func unixMinusUptime(ctx context.Context, t *testing.T, n *Node) float64 {
	t.Helper()
	out, errOut, code, err := n.Exec(ctx, nil, "sh", "-c", "read u x </proc/uptime; echo $u $(date +%s.%N)")
	f := strings.Fields(out)
	if err != nil || code != 0 || len(f) != 2 {
		t.Fatalf("clocks of %s: exit %d %v %q %q", n.Name(), code, err, out, errOut)
	}
	up, err1 := strconv.ParseFloat(f[0], 64)
	unix, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("clocks of %s: %q", n.Name(), out)
	}
	return unix - up
}

// traceLine is one line of the trace with its time, for sorting.
type traceLine struct {
	t    float64
	line string
}

// labTrace builds the trace: a header, one capacity point per phase (the shaping in force,
// Mbit/s), the records from the first phase's start to the last one's end, and the end.
func labTrace(t *testing.T, r *clRun, ph clPhases, offset float64, records string) string {
	t.Helper()
	end := ph.starts[len(ph.starts)-1] + clPhase.Seconds() + offset
	var lines []traceLine
	for n, full := range clPhaseSup {
		at := ph.starts[n] + offset
		p, _ := json.Marshal(map[string]any{"t": at, "sout_mbps": float64(r.kbit(clSoutKbit)) / 1000,
			"sup_mbps": float64(r.kbit(full)) / 1000})
		lines = append(lines, traceLine{at, string(p)})
	}
	kept := 0
	for _, l := range strings.Split(records, "\n") {
		var rec struct {
			T *float64 `json:"t"`
		}
		if json.Unmarshal([]byte(l), &rec) != nil || rec.T == nil || *rec.T < lines[0].t || *rec.T > end {
			continue
		}
		lines = append(lines, traceLine{*rec.T, l})
		kept++
	}
	if kept < 20 {
		t.Fatalf("only %d records within the phases:\n%s", kept, tail(records, 2000))
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].t < lines[j].t })
	head, _ := json.Marshal(map[string]any{
		"comment": fmt.Sprintf("recorded in the lab by TestRecordLabTrace on %s: TestClosedLoop's shaping at halved rates "+
			"(netem, a1's rails), the Python closed loop (run --policy closed-loop --interval 0.5), record --raw every 0.5 s",
			time.Now().UTC().Format("2006-01-02")),
		"msg_bytes": 512 << 10,
	})
	var b strings.Builder
	b.WriteString(string(head) + "\n")
	for _, l := range lines {
		b.WriteString(l.line + "\n")
	}
	fmt.Fprintf(&b, "{\"t\": %.6f}\n", end)
	return b.String()
}
