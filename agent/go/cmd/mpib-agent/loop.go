package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"regexp"
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
// replaced or truncated, and calls tick every interval until SIGINT/SIGTERM. On the way out
// it clears the heartbeat only if it is still its own. A SIGKILL leaves the heartbeat to go
// stale after MPIB_AGENT_STALE_MS.
func agentLoop(s *shm.Segment, out *lockedWriter, interval time.Duration, tick func() error) error {
	if err := s.AcquireAgent(); err != nil {
		return err
	}
	defer s.ReleaseAgent()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	stop, beaterDone := make(chan struct{}), make(chan struct{})
	_ = s.Beat(shm.Now())
	go beater(s, out, shm.BeatPeriod(shm.StaleFromEnv()), stop, beaterDone)
	defer func() {
		close(stop)
		<-beaterDone
		s.StopBeat()
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if s.Err() == nil {
			if err := tick(); err != nil && !errors.Is(err, shm.ErrSegmentGone) {
				return err
			}
		}
		select {
		case <-sig:
			return nil
		case <-t.C:
		}
	}
}

// beater beats every period and, every 250 ms, follows a replaced or truncated segment.
func beater(s *shm.Segment, out *lockedWriter, period time.Duration, stop, done chan struct{}) {
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
		if time.Since(lastCheck) < 250*time.Millisecond {
			continue
		}
		lastCheck = time.Now()
		moved, err := s.Reattach()
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

// parseCapacity reads sout=X,sup=Y (either or both; X, Y >= 0).
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
	return sout, sup, nil
}

func cmdRun(args []string, w io.Writer) error {
	fs, path := newFlags("run")
	pol := fs.String("policy", "static", "static | proportional")
	file := fs.String("file", "", "static: weights JSON (re-read when it changes)")
	capacity := fs.String("capacity", "", "proportional: rail capacities, e.g. sout=100,sup=200 (default: measure)")
	intervalS := fs.String("interval", "1", "policy interval")
	if err := parse(fs, args); err != nil {
		return err
	}
	interval, err := parseDuration("interval", *intervalS)
	if err != nil {
		return err
	}
	var cs, cp float64
	switch *pol {
	case "static":
		if *file == "" {
			return usagef("--policy static needs --file weights.json")
		}
	case "proportional":
		if cs, cp, err = parseCapacity(*capacity); err != nil {
			return err
		}
	default:
		return usagef("--policy %q: want static or proportional", *pol)
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
	if *pol == "static" {
		tick = staticTick(s, &policy.Static{File: *file}, out)
	} else {
		tick = proportionalTick(s, &policy.Proportional{CapSout: cs, CapSup: cp}, out)
	}
	out.printf("run: pid %d, policy %s, interval %s, segment %s, beat every %s\n", os.Getpid(), *pol,
		fmtDur(interval), *path, fmtDur(shm.BeatPeriod(shm.StaleFromEnv())))
	n := 0
	return agentLoop(s, out, interval, func() error {
		if err := tick(); err != nil {
			return err
		}
		if n++; n%5 == 0 {
			_, err := s.GC()
			return err
		}
		return nil
	})
}

func staticTick(s *shm.Segment, p *policy.Static, out *lockedWriter) func() error {
	return func() error {
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
	return func() error {
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

const topFmt = "%5s %15s %7s %5s %8s %10s %10s %9s\n"

func cmdTop(args []string, out io.Writer) error {
	fs, path := newFlags("top")
	intervalS := fs.String("interval", "1", "refresh interval")
	countS := fs.String("count", "0", "refreshes before exiting (0: until interrupted)")
	plain := fs.Bool("plain", false, "append frames instead of refreshing in place")
	if err := parse(fs, args); err != nil {
		return err
	}
	interval, err := parseDuration("interval", *intervalS)
	if err != nil {
		return err
	}
	count, err := parseInt("count", *countS)
	if err != nil {
		return err
	}
	if count < 0 {
		return usagef("--count %d: want 0 (forever) or more", count)
	}
	s, err := shm.Open(*path)
	if err != nil {
		return err
	}
	defer s.Close()
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
		now := shm.Now()
		conns, err := s.Connections()
		if err != nil {
			return err
		}
		cur := shm.NewSample(now, conns)
		frame(out, s, shm.Rates(prev, cur), now, !*plain)
		prev = cur
	}
	return nil
}

func gbps(bps float64) string { return strconv.FormatFloat(bps*8/1e9, 'f', 2, 64) }

func frame(out io.Writer, s *shm.Segment, rates []shm.ConnRate, now uint64, clear bool) {
	if clear {
		fmt.Fprint(out, "\x1b[H\x1b[2J")
	}
	fmt.Fprintf(out, "%s top  %s  %s\n", prog, s.Path(), agentStatus(s.Header(), now))
	fmt.Fprintf(out, topFmt, "SLOT", "PEER", "CLASS", "HINT", "SOURCE", "SOUT Gb/s", "SUP Gb/s", "SUP share")
	var ts, tp float64
	for _, r := range rates {
		res := s.Resolve(r.Slot.Index, now, staleNs())
		hint := "-"
		if res.Applies {
			hint = strconv.Itoa(int(res.SupBw))
		}
		ts, tp = ts+r.SoutBps, tp+r.SupBps
		fmt.Fprintf(out, topFmt, strconv.Itoa(int(r.Slot.Index)), r.Slot.PeerSoutIP.String(), r.Slot.PathClass.String(),
			hint, res.Source.String(), gbps(r.SoutBps), gbps(r.SupBps), strconv.FormatFloat(r.SupShare(), 'f', 3, 64))
	}
	share := 0.0
	if ts+tp > 0 {
		share = tp / (ts + tp)
	}
	fmt.Fprintf(out, topFmt, "total", "", "", "", "", gbps(ts), gbps(tp), strconv.FormatFloat(share, 'f', 3, 64))
}
