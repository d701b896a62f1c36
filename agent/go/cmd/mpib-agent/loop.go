package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/mpib/mpib/agent/go/policy"
	"github.com/mpib/mpib/agent/go/shm"
)

const beatEvery = 100 * time.Millisecond

// beatLoop beats every 100 ms and calls tick every interval until SIGINT/SIGTERM; then it
// clears the heartbeat so plugins fall back at once. A SIGKILL leaves the heartbeat to go
// stale after MPIB_AGENT_STALE_MS.
func beatLoop(s *shm.Segment, interval time.Duration, tick func() error) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	defer s.StopBeat()
	s.Beat(shm.Now())
	beat := time.NewTicker(beatEvery)
	defer beat.Stop()
	var ticks <-chan time.Time
	if tick != nil {
		t := time.NewTicker(interval)
		defer t.Stop()
		ticks = t.C
		if err := tick(); err != nil {
			return err
		}
	}
	for {
		select {
		case <-sig:
			return nil
		case <-beat.C:
			s.Beat(shm.Now())
		case <-ticks:
			if err := tick(); err != nil {
				return err
			}
		}
	}
}

func cmdHeartbeat(args []string, out io.Writer) error {
	fs, path := newFlags("heartbeat")
	s, err := parseAndOpen(fs, args, path)
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(out, "heartbeat: pid %d beating %s every %v (stop with SIGINT/SIGTERM)\n", os.Getpid(), *path, beatEvery)
	return beatLoop(s, 5*time.Second, func() error {
		_, err := s.GC(nil)
		return err
	})
}

func parseCapacity(v string) (sout, sup float64, err error) {
	if v == "" {
		return 0, 0, nil
	}
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		f, perr := strconv.ParseFloat(val, 64)
		if !ok || perr != nil || f < 0 {
			return 0, 0, fmt.Errorf("--capacity: want sout=X,sup=Y, got %q", v)
		}
		switch k {
		case "sout":
			sout = f
		case "sup":
			sup = f
		default:
			return 0, 0, fmt.Errorf("--capacity: unknown rail %q", k)
		}
	}
	return sout, sup, nil
}

func cmdRun(args []string, out io.Writer) error {
	fs, path := newFlags("run")
	pol := fs.String("policy", "static", "static | proportional")
	file := fs.String("file", "", "static: weights JSON (re-read when it changes)")
	capacity := fs.String("capacity", "", "proportional: rail capacities, e.g. sout=100,sup=200 (default: measure)")
	interval := fs.Duration("interval", time.Second, "policy interval")
	s, err := parseAndOpen(fs, args, path)
	if err != nil {
		return err
	}
	defer s.Close()
	var tick func() error
	switch *pol {
	case "static":
		if *file == "" {
			return fmt.Errorf("--policy static needs --file weights.json")
		}
		tick = staticTick(s, *file, out)
	case "proportional":
		cs, cp, err := parseCapacity(*capacity)
		if err != nil {
			return err
		}
		tick = proportionalTick(s, &policy.Proportional{CapSout: cs, CapSup: cp}, out)
	default:
		return fmt.Errorf("unknown policy %q (static, proportional)", *pol)
	}
	fmt.Fprintf(out, "run: pid %d, policy %s, interval %v, segment %s\n", os.Getpid(), *pol, *interval, *path)
	return beatLoop(s, *interval, tick)
}

func staticTick(s *shm.Segment, file string, out io.Writer) func() error {
	var lastMod time.Time
	seen := map[uint64]bool{} // slot<<32|gen already written
	var w *policy.Weights
	return func() error {
		st, err := os.Stat(file)
		if err != nil {
			return err
		}
		changed := !st.ModTime().Equal(lastMod)
		if changed {
			nw, err := policy.LoadWeights(file)
			if err != nil {
				if w == nil {
					return err
				}
				warn(err) // keep the last good weights
			} else {
				w, lastMod, seen = nw, st.ModTime(), map[uint64]bool{}
			}
		}
		conns := s.Connections()
		fresh := changed
		for _, c := range conns {
			if k := uint64(c.Index)<<32 | uint64(c.Gen); !seen[k] {
				seen[k], fresh = true, true
			}
		}
		if !fresh {
			return nil
		}
		warnings, err := w.Apply(s, conns)
		for _, wn := range warnings {
			warn(wn)
		}
		if err == nil {
			fmt.Fprintf(out, "policy: static weights applied to %d connection(s)\n", len(conns))
		}
		return err
	}
}

func proportionalTick(s *shm.Segment, p *policy.Proportional, out io.Writer) func() error {
	prev := shm.NewSample(shm.Now(), s.Connections())
	last := map[uint32]uint32{}
	n := 0
	return func() error {
		cur := shm.NewSample(shm.Now(), s.Connections())
		p.Observe(shm.Rates(prev, cur))
		prev = cur
		bw := p.SupBw()
		for _, c := range cur.Slots {
			if c.IsSend != 1 {
				continue
			}
			if old, ok := last[c.Index]; ok && old == bw && c.Hint.Valid() && c.Hint.Gen == c.Gen {
				continue
			}
			if err := report(s.SetSlotHint(c.Index, bw, true)); err != nil {
				warn(err) // the slot may have been released meanwhile
				continue
			}
			last[c.Index] = bw
			fmt.Fprintf(out, "policy: slot %d peer %v sup_bw=%d\n", c.Index, c.PeerSoutIP, bw)
		}
		if n++; n%5 == 0 {
			if _, err := s.GC(nil); err != nil {
				return err
			}
		}
		return nil
	}
}

func cmdTop(args []string, out io.Writer) error {
	fs, path := newFlags("top")
	interval := fs.Duration("interval", time.Second, "refresh interval")
	count := fs.Int("count", 0, "refreshes before exiting (0: until interrupted)")
	plain := fs.Bool("plain", false, "append frames instead of refreshing in place")
	s, err := parseAndOpen(fs, args, path)
	if err != nil {
		return err
	}
	defer s.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	prev := shm.NewSample(shm.Now(), s.Connections())
	t := time.NewTicker(*interval)
	defer t.Stop()
	for i := 0; *count == 0 || i < *count; i++ {
		select {
		case <-sig:
			return nil
		case <-t.C:
		}
		now := shm.Now()
		cur := shm.NewSample(now, s.Connections())
		frame(out, s, shm.Rates(prev, cur), now, !*plain)
		prev = cur
	}
	return nil
}

func gbps(bps float64) float64 { return bps * 8 / 1e9 }

func frame(out io.Writer, s *shm.Segment, rates []shm.ConnRate, now uint64, clear bool) {
	if clear {
		fmt.Fprint(out, "\x1b[H\x1b[2J")
	}
	fmt.Fprintf(out, "mpib-agent top  %s  %s\n", s.Path(), agentStatus(s.Header(), now))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SLOT\tPEER\tCLASS\tHINT\tSOURCE\tSOUT Gb/s\tSUP Gb/s\tSUP share\t")
	var ts, tp float64
	for _, r := range rates {
		res := s.Resolve(r.Slot.Index, now, staleNs())
		hint := "-"
		if res.Applies {
			hint = strconv.Itoa(int(res.SupBw))
		}
		ts, tp = ts+r.SoutBps, tp+r.SupBps
		fmt.Fprintf(tw, "%d\t%v\t%v\t%s\t%v\t%.2f\t%.2f\t%.3f\t\n", r.Slot.Index, r.Slot.PeerSoutIP,
			r.Slot.PathClass, hint, res.Source, gbps(r.SoutBps), gbps(r.SupBps), r.SupShare())
	}
	share := 0.0
	if ts+tp > 0 {
		share = tp / (ts + tp)
	}
	fmt.Fprintf(tw, "total\t\t\t\t\t%.2f\t%.2f\t%.3f\t\n", gbps(ts), gbps(tp), share)
	tw.Flush()
}
