package main

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mpib/mpib/agent/go/policy"
	"github.com/mpib/mpib/agent/go/shm"
)

// lockedWriter serialises the loop's and the beater's lines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format, args...)
}

// agentLoop is the one beating agent of the segment (spec 5.2, 5.7): it takes the agent lock
// (a second loop, Go or Python, is refused), beats every MPIB_AGENT_STALE_MS/4 from its own
// goroutine (a slow tick never lets the heartbeat go stale), follows the segment when it is
// replaced or truncated, and calls tick every interval until SIGINT/SIGTERM. A tick never
// overlaps a re-attachment: what it reads and what it writes belong to one segment, and a tick
// that finds s.Attachment changed knows its policy's memory of what it wrote is void. On the
// way out it clears the heartbeat only if it is still its own. A SIGKILL leaves the heartbeat
// to go stale after MPIB_AGENT_STALE_MS.
func agentLoop(s *shm.Segment, out *lockedWriter, interval time.Duration, tick func() error) error {
	if err := s.AcquireAgent(); err != nil {
		return err
	}
	defer s.ReleaseAgent()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	stop, beaterDone := make(chan struct{}), make(chan struct{})
	var ticking sync.Mutex // held by a tick, and by the beater while it re-attaches
	_ = s.Beat(shm.Now())
	go beater(s, out, &ticking, shm.BeatPeriod(shm.StaleFromEnv()), stop, beaterDone)
	defer func() {
		close(stop)
		<-beaterDone
		s.StopBeat()
	}()
	next := time.Now()
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		ticking.Lock()
		err := s.Err()
		if err == nil {
			err = tick()
		}
		ticking.Unlock()
		if err != nil && !errors.Is(err, shm.ErrSegmentGone) {
			return err
		}
		next = nextTick(next, time.Now(), interval)
		t.Reset(time.Until(next))
		select {
		case <-sig:
			return nil
		case <-t.C:
		}
	}
}

// nextTick is when the tick after one due at `due` runs, it having ended at `now`: an interval
// after `due`, or an interval after `now` for a tick that overran its interval, as the Python
// agent does. Ticks back to back would leave the beater no moment to take `ticking` and follow a
// replaced segment.
func nextTick(due, now time.Time, interval time.Duration) time.Time {
	next := due.Add(interval)
	if next.Before(now) {
		next = now.Add(interval)
	}
	return next
}

// beater beats every period and, every 250 ms, follows a replaced or truncated segment. It
// moves only while it holds ticking, so that no tick runs across the move, and never waits for
// it: while a tick runs it looks again at the next beat.
func beater(s *shm.Segment, out *lockedWriter, ticking *sync.Mutex, period time.Duration, stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(period)
	defer t.Stop()
	var lastCheck time.Time
	lastWarn := ""
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		_ = s.Beat(shm.Now())
		if time.Since(lastCheck) < 250*time.Millisecond || !ticking.TryLock() {
			continue
		}
		lastCheck = time.Now()
		moved, err := s.Reattach()
		ticking.Unlock()
		switch {
		case moved:
			_ = s.Beat(shm.Now())
			out.printf("segment %s replaced: re-attached\n", s.Path())
			lastWarn = ""
		case err != nil && err.Error() != lastWarn:
			lastWarn = err.Error()
			warn(fmt.Errorf("segment %s replaced or truncated, the new one is unusable: %v", s.Path(), err))
		case err == nil && s.Err() != nil && lastWarn != "gone":
			lastWarn = "gone"
			warn(fmt.Errorf("%v: waiting for a new segment at the path", s.Err()))
		}
	}
}

func cmdHeartbeat(args []string, w io.Writer) error {
	fs, path := newFlags("heartbeat")
	s, err := parseAndOpen(fs, args, path)
	if err != nil {
		return err
	}
	defer s.Close()
	out := &lockedWriter{w: w}
	if err := s.AcquireAgent(); err != nil {
		return err
	}
	out.printf("heartbeat: pid %d beating %s every %s (stop with SIGINT/SIGTERM)\n", os.Getpid(), *path,
		fmtDur(shm.BeatPeriod(shm.StaleFromEnv())))
	return agentLoop(s, out, 5*time.Second, func() error {
		_, err := s.GC()
		return err
	})
}

var numRe = regexp.MustCompile(`^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)$`)

// parseCapacity reads sout=X,sup=Y (both rails; X, Y >= 0), "" for none (measure). One rail
// alone is refused: the other would be taken as 0 and get no traffic.
func parseCapacity(v string) (sout, sup float64, err error) {
	if v == "" {
		return 0, 0, nil
	}
	seen := map[string]bool{}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		f, perr := strconv.ParseFloat(val, 64)
		if !ok || perr != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || !numRe.MatchString(val) {
			return 0, 0, usagef("--capacity %q: want sout=X,sup=Y with numbers >= 0", v)
		}
		if seen[k] {
			return 0, 0, usagef("--capacity %q: rail %q given twice", v, k)
		}
		seen[k] = true
		switch k {
		case "sout":
			sout = f
		case "sup":
			sup = f
		default:
			return 0, 0, usagef("--capacity %q: unknown rail %q (sout, sup)", v, k)
		}
	}
	for _, rail := range []string{"sout", "sup"} {
		if !seen[rail] {
			return 0, 0, usagef("--capacity %q: rail %q missing: give both, sout=X,sup=Y (or neither, to measure)", v, rail)
		}
	}
	return sout, sup, nil
}

func cmdRun(args []string, w io.Writer) error {
	fs, path := newFlags("run")
	pol := fs.String("policy", "static", "static | proportional | closed-loop")
	file := fs.String("file", "", "static: weights JSON (re-read when it changes)")
	capacity := fs.String("capacity", "", "proportional: rail capacities, e.g. sout=100,sup=200 (default: measure)")
	stepS := fs.String("step", strconv.Itoa(policy.ClosedLoopStep), "closed-loop: largest move of the split per interval, parts per 1024 (1..256)")
	intervalS := fs.String("interval", "", "policy interval (default 1 s; closed-loop 0.5 s)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *intervalS == "" {
		*intervalS = "1"
		if *pol == "closed-loop" {
			*intervalS = "0.5"
		}
	}
	interval, err := parseDuration("interval", *intervalS)
	if err != nil {
		return err
	}
	var cs, cp float64
	var step int64
	switch *pol {
	case "static":
		if *file == "" {
			return usagef("--policy static needs --file weights.json")
		}
	case "proportional":
		if cs, cp, err = parseCapacity(*capacity); err != nil {
			return err
		}
	case "closed-loop":
		if step, err = parseInt("step", *stepS); err != nil {
			return err
		}
		if step < 1 || step > policy.ClosedLoopMaxStep {
			return usagef("--step %d: want an integer 1..%d", step, policy.ClosedLoopMaxStep)
		}
	default:
		return usagef("--policy %q: want static, proportional or closed-loop", *pol)
	}
	s, err := shm.Open(*path)
	if err != nil {
		return err
	}
	defer s.Close()
	out := &lockedWriter{w: w}
	if err := s.AcquireAgent(); err != nil {
		return err
	}
	var tick func() error
	switch *pol {
	case "static":
		tick = staticTick(s, &policy.Static{File: *file}, out)
	case "proportional":
		tick = proportionalTick(s, &policy.Proportional{CapSout: cs, CapSup: cp}, out)
	default:
		tick = closedLoopTick(s, &policy.ClosedLoop{Step: uint32(step)}, out)
	}
	out.printf("run: pid %d, policy %s, interval %s, segment %s, beat every %s\n", os.Getpid(), *pol,
		fmtDur(interval), *path, fmtDur(shm.BeatPeriod(shm.StaleFromEnv())))
	var lastGC time.Time
	return agentLoop(s, out, interval, func() error {
		if err := tick(); err != nil {
			return err
		}
		if now := time.Now(); reclaimDue(lastGC, now) {
			lastGC = now
			_, err := s.GC()
			return err
		}
		return nil
	})
}

// reclaimPeriod is how often a beating agent runs a reclaim pass at most apart (spec 5.7):
// slots of dead plugins come back and records a dead writer left half-written are repaired.
const reclaimPeriod = 5 * time.Second

// reclaimDue says whether a policy loop's tick at now runs the reclaim pass, the last one having
// run at last (zero: none yet, so the first tick runs one): every tick of a loop slower than
// reclaimPeriod, about every reclaimPeriod of a faster one.
func reclaimDue(last, now time.Time) bool { return last.IsZero() || now.Sub(last) >= reclaimPeriod }

// replacementWatch returns a function that reports whether s moved to another file
// (Reattach) since its previous call.
func replacementWatch(s *shm.Segment) func() bool {
	seen := s.Attachment()
	return func() bool {
		a := s.Attachment()
		moved := a != seen
		seen = a
		return moved
	}
}

func closedLoopTick(s *shm.Segment, p *policy.ClosedLoop, out *lockedWriter) func() error {
	replaced := replacementWatch(s)
	return func() error {
		if replaced() {
			p.SegmentReplaced()
		}
		now := shm.Now()
		conns, err := s.Connections()
		if err != nil {
			return err
		}
		notes, err := p.Tick(s, now, conns)
		for _, n := range notes {
			out.printf("%s\n", n)
		}
		return err
	}
}

func staticTick(s *shm.Segment, p *policy.Static, out *lockedWriter) func() error {
	replaced := replacementWatch(s)
	return func() error {
		if replaced() {
			p.SegmentReplaced()
		}
		conns, err := s.Connections()
		if err != nil {
			return err
		}
		notes, warnings, err := p.Tick(s, conns)
		for _, n := range notes {
			out.printf("%s\n", n)
		}
		for _, w := range warnings {
			warn(w)
		}
		return err
	}
}

func proportionalTick(s *shm.Segment, p *policy.Proportional, out *lockedWriter) func() error {
	conns, _ := s.Connections()
	prev := shm.NewSample(shm.Now(), conns)
	type written struct{ gen, bw uint32 }
	last := map[uint32]written{}
	replaced := replacementWatch(s)
	return func() error {
		if replaced() { // nothing written is in the new segment; its counters are not prev's
			clear(last)
			prev = shm.NewSample(shm.Now(), nil)
		}
		conns, err := s.Connections()
		if err != nil {
			return err
		}
		cur := shm.NewSample(shm.Now(), conns)
		p.Observe(shm.Rates(prev, cur))
		prev = cur
		bw := p.SupBw()
		for _, c := range conns {
			if c.IsSend != 1 || last[c.Index] == (written{c.Gen, bw}) {
				continue
			}
			err := reportClamp(s.SetSlotHint(c.Index, c.Gen, bw, true))
			if policy.Gone(err) {
				continue // closed since the sample: the next tick sees what replaced it
			}
			if err != nil {
				return err
			}
			last[c.Index] = written{c.Gen, bw}
			out.printf("policy: slot %d (gen %d) peer %v sup_bw=%d\n", c.Index, c.Gen, c.PeerSoutIP, bw)
		}
		return nil
	}
}

const topFmt = "%5s %3s %15s %7s %5s %8s %10s %10s %9s\n"

func cmdTop(args []string, out io.Writer) error {
	fs, path := newFlags("top")
	intervalS := fs.String("interval", "1", "refresh interval")
	countS := fs.String("count", "0", "refreshes before exiting (0: until interrupted)")
	plain := fs.Bool("plain", false, "append frames instead of refreshing in place")
	asJSON := fs.Bool("json", false, "print one JSON object per line per interval instead of frames")
	devs := devFlag(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	interval, count, err := parseIntervalCount(*intervalS, *countS)
	if err != nil {
		return err
	}
	s, err := shm.Open(*path)
	if err != nil {
		return err
	}
	defer s.Close()
	return sampleLoop(s, interval, count, devs, func(rates []shm.ConnRate, now uint64, wall time.Time) error {
		if *asJSON {
			b, err := json.Marshal(newTopSample(wall, rates))
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(out, "%s\n", b)
			return err
		}
		frame(out, s, rates, now, !*plain)
		return nil
	})
}

// parseIntervalCount reads top's and record's --interval and --count.
func parseIntervalCount(intervalS, countS string) (time.Duration, int64, error) {
	interval, err := parseDuration("interval", intervalS)
	if err != nil {
		return 0, 0, err
	}
	count, err := parseInt("count", countS)
	if err != nil {
		return 0, 0, err
	}
	if count < 0 {
		return 0, 0, usagef("--count %d: want 0 (forever) or more", count)
	}
	return interval, count, nil
}

// sampleLoop calls fn every interval with the rates since the previous sample of the
// connections devs keeps, count times (0: until SIGINT/SIGTERM).
func sampleLoop(s *shm.Segment, interval time.Duration, count int64, devs *devList,
	fn func(rates []shm.ConnRate, now uint64, wall time.Time) error) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	conns, err := s.Connections()
	if err != nil {
		return err
	}
	prev := shm.NewSample(shm.Now(), conns)
	t := time.NewTicker(interval)
	defer t.Stop()
	for i := int64(0); count == 0 || i < count; i++ {
		select {
		case <-sig:
			return nil
		case <-t.C:
		}
		now, wall := shm.Now(), time.Now()
		conns, err := s.Connections()
		if err != nil {
			return err
		}
		cur := shm.NewSample(now, conns)
		if err := fn(devs.filter(shm.Rates(prev, cur)), now, wall); err != nil {
			return err
		}
		prev = cur
	}
	return nil
}

// topConn is one connection of a `top --json` line or a `record` row; mpib-agent-py prints
// the same fields in the same order (path_class and is_send as numbers, as in list --json;
// rail states as strings).
type topConn struct {
	Slot      uint32        `json:"slot"`
	Gen       uint32        `json:"gen"`
	PID       uint32        `json:"pid"`
	ConnID    uint64        `json:"conn_id"`
	IsSend    uint8         `json:"is_send"`
	PathClass shm.PathClass `json:"path_class"`
	SoutMbps  float64       `json:"sout_mbps"`
	SupMbps   float64       `json:"sup_mbps"`
	LastSupBw uint32        `json:"last_sup_bw"`
	SoutState shm.RailState `json:"sout_state"`
	SupState  shm.RailState `json:"sup_state"`
	// Completion telemetry (format version 3): per rail the completed throughput and the mean
	// completion latency over the interval, the bytes in flight now; the split the plugin
	// applied; its last flush, CLOCK_REALTIME ns (to correlate nodes, and see a stale batch).
	SoutCompletedMbps float64 `json:"sout_completed_mbps"`
	SupCompletedMbps  float64 `json:"sup_completed_mbps"`
	SoutLatencyUs     float64 `json:"sout_latency_us"`
	SupLatencyUs      float64 `json:"sup_latency_us"`
	SoutInflightBytes uint64  `json:"sout_inflight_bytes"`
	SupInflightBytes  uint64  `json:"sup_inflight_bytes"`
	AppliedSupBw      uint32  `json:"applied_sup_bw"`
	FlushWallNs       uint64  `json:"flush_wall_ns"`
	// The fused device and its NICs (format version 4).
	Dev     uint16 `json:"dev"`
	SoutNIC string `json:"sout_nic"`
	SupNIC  string `json:"sup_nic"`
}

// topSample is one `top --json` line: {"t": unix seconds, "conns": [...]}.
type topSample struct {
	T     float64   `json:"t"`
	Conns []topConn `json:"conns"`
}

// csvHeader is record --format csv's header: t, then topConn's fields.
var csvHeader = []string{"t", "slot", "gen", "pid", "conn_id", "is_send", "path_class", "sout_mbps", "sup_mbps",
	"last_sup_bw", "sout_state", "sup_state", "sout_completed_mbps", "sup_completed_mbps", "sout_latency_us", "sup_latency_us",
	"sout_inflight_bytes", "sup_inflight_bytes", "applied_sup_bw", "flush_wall_ns", "dev", "sout_nic", "sup_nic"}

// mbps is bytes per second in megabits per second, to 3 decimals.
func mbps(bps float64) float64 { return math.Round(bps*8/1e6*1e3) / 1e3 }

// micros is nanoseconds in microseconds, to 3 decimals.
func micros(ns float64) float64 { return math.Round(ns) / 1e3 }

func newTopSample(wall time.Time, rates []shm.ConnRate) topSample {
	ts := topSample{T: float64(wall.UnixMicro()) / 1e6, Conns: make([]topConn, 0, len(rates))}
	for _, r := range rates {
		sl, tel := r.Slot, r.Slot.Telemetry
		ts.Conns = append(ts.Conns, topConn{Slot: sl.Index, Gen: sl.Gen, PID: sl.PID, ConnID: sl.ConnID,
			IsSend: sl.IsSend, PathClass: sl.PathClass, SoutMbps: mbps(r.SoutBps), SupMbps: mbps(r.SupBps),
			LastSupBw: tel.LastSupBw, SoutState: tel.SoutState, SupState: tel.SupState,
			SoutCompletedMbps: mbps(r.SoutCompletedBps), SupCompletedMbps: mbps(r.SupCompletedBps),
			SoutLatencyUs: micros(r.SoutLatencyNs), SupLatencyUs: micros(r.SupLatencyNs),
			SoutInflightBytes: tel.SoutInflightBytes, SupInflightBytes: tel.SupInflightBytes,
			AppliedSupBw: tel.AppliedSupBw, FlushWallNs: tel.FlushWallNs, Dev: sl.Dev, SoutNIC: sl.SoutNIC, SupNIC: sl.SupNIC})
	}
	return ts
}

func ffmt(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// csvRows is a sample as record --format csv rows (one per connection).
func (ts topSample) csvRows() [][]string {
	rows := make([][]string, 0, len(ts.Conns))
	t := strconv.FormatFloat(ts.T, 'f', 6, 64)
	for _, c := range ts.Conns {
		u := func(v uint64) string { return strconv.FormatUint(v, 10) }
		rows = append(rows, []string{t, u(uint64(c.Slot)), u(uint64(c.Gen)), u(uint64(c.PID)), u(c.ConnID),
			u(uint64(c.IsSend)), u(uint64(c.PathClass)), ffmt(c.SoutMbps), ffmt(c.SupMbps), u(uint64(c.LastSupBw)),
			c.SoutState.String(), c.SupState.String(), ffmt(c.SoutCompletedMbps), ffmt(c.SupCompletedMbps),
			ffmt(c.SoutLatencyUs), ffmt(c.SupLatencyUs), u(c.SoutInflightBytes), u(c.SupInflightBytes),
			u(uint64(c.AppliedSupBw)), u(c.FlushWallNs), u(uint64(c.Dev)), c.SoutNIC, c.SupNIC})
	}
	return rows
}

func cmdRecord(args []string, out io.Writer) error {
	fs, path := newFlags("record")
	outFile := fs.String("out", "", "file to write the samples to (replaced)")
	format := fs.String("format", "jsonl", "jsonl (one top --json object per line) or csv (one row per connection per sample)")
	intervalS := fs.String("interval", "1", "sampling interval")
	countS := fs.String("count", "0", "samples before exiting (0: until interrupted)")
	devs := devFlag(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *outFile == "" {
		return usagef("record needs --out FILE")
	}
	if *format != "jsonl" && *format != "csv" {
		return usagef("--format %q: want jsonl or csv", *format)
	}
	interval, count, err := parseIntervalCount(*intervalS, *countS)
	if err != nil {
		return err
	}
	s, err := shm.Open(*path)
	if err != nil {
		return err
	}
	defer s.Close()
	f, err := os.Create(*outFile)
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	defer f.Close()
	bw := bufio.NewWriter(f)
	cw := csv.NewWriter(bw)
	if *format == "csv" {
		if err := cw.Write(csvHeader); err != nil {
			return fmt.Errorf("record %s: %w", *outFile, err)
		}
		cw.Flush()
	}
	n := 0
	err = sampleLoop(s, interval, count, devs, func(rates []shm.ConnRate, _ uint64, wall time.Time) error {
		ts := newTopSample(wall, rates)
		if *format == "csv" {
			if err := cw.WriteAll(ts.csvRows()); err != nil { // WriteAll flushes into bw
				return fmt.Errorf("record %s: %w", *outFile, err)
			}
		} else {
			b, err := json.Marshal(ts)
			if err != nil {
				return err
			}
			bw.Write(append(b, '\n'))
		}
		n++
		if err := bw.Flush(); err != nil { // every sample reaches the file at once
			return fmt.Errorf("record %s: %w", *outFile, err)
		}
		return nil
	})
	if ferr := bw.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("record %s: %w", *outFile, ferr)
	}
	fmt.Fprintf(out, "recorded %d sample(s) to %s\n", n, *outFile)
	return err
}

func gbps(bps float64) string { return strconv.FormatFloat(bps*8/1e9, 'f', 2, 64) }

func frame(out io.Writer, s *shm.Segment, rates []shm.ConnRate, now uint64, clear bool) {
	if clear {
		fmt.Fprint(out, "\x1b[H\x1b[2J")
	}
	fmt.Fprintf(out, "%s top  %s  %s\n", prog, s.Path(), agentStatus(s.Header(), now))
	fmt.Fprintf(out, topFmt, "SLOT", "DEV", "PEER", "CLASS", "HINT", "SOURCE", "SOUT Gb/s", "SUP Gb/s", "SUP share")
	var ts, tp float64
	perDev := map[uint16][2]float64{}
	for _, r := range rates {
		res := s.Resolve(r.Slot.Index, now, staleNs())
		hint := "-"
		if res.Applies {
			hint = strconv.Itoa(int(res.SupBw))
		}
		ts, tp = ts+r.SoutBps, tp+r.SupBps
		d := perDev[r.Slot.Dev]
		perDev[r.Slot.Dev] = [2]float64{d[0] + r.SoutBps, d[1] + r.SupBps}
		fmt.Fprintf(out, topFmt, strconv.Itoa(int(r.Slot.Index)), strconv.Itoa(int(r.Slot.Dev)), r.Slot.PeerSoutIP.String(), r.Slot.PathClass.String(),
			hint, res.Source.String(), gbps(r.SoutBps), gbps(r.SupBps), strconv.FormatFloat(r.SupShare(), 'f', 3, 64))
	}
	share := 0.0
	if ts+tp > 0 {
		share = tp / (ts + tp)
	}
	if len(perDev) > 1 { // per device and rail
		for _, d := range slices.Sorted(maps.Keys(perDev)) {
			r := perDev[d]
			fmt.Fprintf(out, topFmt, "dev", strconv.Itoa(int(d)), "", "", "", "", gbps(r[0]), gbps(r[1]), strconv.FormatFloat(shareOf(r[0], r[1]), 'f', 3, 64))
		}
	}
	fmt.Fprintf(out, topFmt, "total", "", "", "", "", "", gbps(ts), gbps(tp), strconv.FormatFloat(share, 'f', 3, 64))
}

// shareOf is SUP's share of the bytes (0 when there are none).
func shareOf(sout, sup float64) float64 {
	if sout+sup <= 0 {
		return 0
	}
	return sup / (sout + sup)
}
