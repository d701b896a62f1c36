package policy

import (
	"fmt"
	"math"
	"sort"

	"github.com/mpib/mpib/agent/go/shm"
)

// Closed-loop defaults and limits (the Python agent's closed-loop policy uses the same).
const (
	ClosedLoopStep     = 64  // default largest move of the split per interval, parts per 1024
	ClosedLoopMaxStep  = 256 // largest --step
	ClosedLoopStart    = 512 // split a new connection starts from
	ClosedLoopMinShare = 8   // each rail keeps at least this share while both are up
	ClosedLoopGain     = 0.5 // fraction of the way to the estimated best split taken per interval
	ClosedLoopNoteMove = 8   // moves of at least this much are noted for the operator
	ClosedLoopSmooth   = 0.4 // weight of the newest measurement in a rail's smoothed bytes and active time
	closedLoopNoFailed = -1
)

// ClosedLoop steers every send connection (is_send=1) to the split at which its transfers
// finish fastest, without knowing the rails' capacities, and follows the rails when they
// change. Per connection and interval it measures each rail's active rate: the bytes the
// rail completed over the time it had at least one of the connection's requests in flight
// (Δ*_completed_bytes / Δ*_active_ns, format version 3). That rate does not depend on the
// split: a rail that is the bottleneck never idles, so its active rate is its capacity; a
// rail that is not finishes each part at its capacity plus its latency. The best split gives
// each rail a share proportional to its active rate, so that both parts of a message finish
// together:
//
//   - target = 1024 * rate_SUP / (rate_SOUT + rate_SUP), kept within
//     [ClosedLoopMinShare, 1024-ClosedLoopMinShare] so that both rails stay measured;
//   - each rail's rate is the ratio of its smoothed completed bytes and active time (each an
//     exponential average over measurements, ClosedLoopSmooth): one interval of a rail
//     shaped by a queue carries a few messages, and their count jitters;
//   - w moves ClosedLoopGain of the way to the target, by at most Step per interval;
//   - a rail that completed nothing in an interval keeps its last rate and adds the
//     interval's active time to its next measurement (a stalled rail's rate falls);
//   - a new registration (gen) starts again at 512 (ClosedLoopStart) with no rates;
//   - when telemetry shows a rail down or failed, everything goes to the live rail (0 or
//     1024); once both are up again the loop resumes from the previous w with fresh rates.
//
// Steering on posted bytes (what an earlier version did, by probing w±step) fails behind a
// queue: posting goes on into a shaped rail's queue, so a probe looks good until the queue
// fills. Completed bytes over active time see the queue's drain rate, which is the capacity.
//
// Hints are written for the gen the decision was computed on (a connection that closed in
// between is skipped). The Python agent (mpib_agent._closedloop) implements the same algorithm.
type ClosedLoop struct {
	Step uint32  // largest move of the split per interval in parts per 1024 (1..256); 0 = 64
	Gain float64 // fraction of the way to the target per interval (0..1]; 0 = 0.5

	conns map[uint32]*clConn
}

// railMark is a rail's completed bytes and active time at its last rate measurement.
type railMark struct{ bytes, activeNs uint64 }

// clConn is the loop's state for one send connection (one slot registration).
type clConn struct {
	gen      uint32
	mark     [2]railMark
	rate     [2]float64 // active rate per rail, bytes per second; 0 = not measured yet
	avgBytes [2]float64 // smoothed completed bytes and active ns per measurement
	avgNs    [2]float64
	w        int // the split in force
	savedW   int // w before a failover (closedLoopNoFailed: no failover in force)
	written  uint32
	hasWrite bool
}

// ClosedLoopConn is one connection's state, for display and tests.
type ClosedLoopConn struct {
	Slot, Gen   uint32
	W           int        // the split in force
	RateBps     [2]float64 // active rate of SOUT and SUP, bytes per second (0: not measured)
	Failover    bool       // a rail is down: everything on the live rail
	Applied     uint32
	HasApplied  bool
	TargetKnown bool // both rails measured
}

func (p *ClosedLoop) maxStep() int {
	if p.Step == 0 {
		return ClosedLoopStep
	}
	return int(min(p.Step, ClosedLoopMaxStep))
}

func (p *ClosedLoop) gain() float64 {
	if p.Gain <= 0 || p.Gain > 1 {
		return ClosedLoopGain
	}
	return p.Gain
}

func clampW(w int) int { return min(max(w, 0), shm.SupBwMax) }

// ClosedLoopTarget is the split that gives each rail a share of the bytes proportional to
// its active rate, kept within [ClosedLoopMinShare, 1024-ClosedLoopMinShare]; ok is false
// until both rates are known.
func ClosedLoopTarget(soutBps, supBps float64) (w int, ok bool) {
	if !(soutBps > 0) || !(supBps > 0) || math.IsInf(soutBps+supBps, 0) {
		return 0, false
	}
	x := int(math.Round(shm.SupBwMax * supBps / (soutBps + supBps)))
	return min(max(x, ClosedLoopMinShare), shm.SupBwMax-ClosedLoopMinShare), true
}

// ClosedLoopMove is the next split from w toward target: gain of the way, rounded, at most
// maxStep, and at least 1 while w differs from target (so that w reaches it).
func ClosedLoopMove(w, target int, gain float64, maxStep int) int {
	d := float64(target-w) * gain
	m := int(math.Round(d))
	if m == 0 && target != w {
		m = 1
		if target < w {
			m = -1
		}
	}
	return clampW(w + min(max(m, -maxStep), maxStep))
}

// SegmentReplaced tells the loop that its HintWriter now writes another segment (a
// re-created one: Segment.Attachment changed). Its connections registered again there, in
// new slots with new generations, and nothing it wrote is there: it forgets every
// connection, so that the next Tick starts each one as a new registration and writes it.
func (p *ClosedLoop) SegmentReplaced() { clear(p.conns) }

// State returns the loop's per-connection state, by slot.
func (p *ClosedLoop) State() []ClosedLoopConn {
	out := make([]ClosedLoopConn, 0, len(p.conns))
	for i, c := range p.conns {
		_, known := ClosedLoopTarget(c.rate[0], c.rate[1])
		out = append(out, ClosedLoopConn{Slot: i, Gen: c.gen, W: c.w, RateBps: c.rate,
			Failover: c.savedW != closedLoopNoFailed, Applied: c.written, HasApplied: c.hasWrite, TargetKnown: known})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Slot < out[b].Slot })
	return out
}

// Tick takes one measurement per send connection in conns (the active slots read at nowNs,
// CLOCK_MONOTONIC ns or a simulator's clock) and writes the split for the next interval.
// Notes are lines for the operator (w moved, failover); err stops the policy.
func (p *ClosedLoop) Tick(hw HintWriter, nowNs uint64, conns []shm.Slot) (notes []string, err error) {
	if p.conns == nil {
		p.conns = map[uint32]*clConn{}
	}
	seen := make(map[uint32]bool, len(conns))
	for _, s := range conns {
		if s.IsSend != 1 {
			continue
		}
		seen[s.Index] = true
		c := p.conns[s.Index]
		if c == nil || c.gen != s.Gen {
			c = &clConn{gen: s.Gen, w: ClosedLoopStart, savedW: closedLoopNoFailed}
			c.remark(s.Telemetry)
			p.conns[s.Index] = c
			notes = append(notes, fmt.Sprintf("closed-loop: slot %d (gen %d) peer %v: start at sup_bw=%d",
				s.Index, s.Gen, s.PeerSoutIP, c.w))
		} else {
			notes = append(notes, p.measure(c, s)...)
		}
		if c.hasWrite && c.written == uint32(c.w) {
			continue
		}
		err := hw.SetSlotHint(s.Index, s.Gen, uint32(c.w), true)
		if Gone(err) {
			delete(p.conns, s.Index) // closed since conns was read: the next tick sees what replaced it
			continue
		}
		if err != nil {
			return notes, fmt.Errorf("slot %d: %w", s.Index, err)
		}
		c.written, c.hasWrite = uint32(c.w), true
	}
	for i := range p.conns {
		if !seen[i] {
			delete(p.conns, i)
		}
	}
	return notes, nil
}

// railTelemetry is rail r's completed bytes and active time.
func railTelemetry(t shm.Telemetry, r int) railMark {
	if r == 0 {
		return railMark{t.SoutCompletedBytes, t.SoutActiveNs}
	}
	return railMark{t.SupCompletedBytes, t.SupActiveNs}
}

// remark starts both rails' next measurement at the telemetry t, forgetting their rates.
func (c *clConn) remark(t shm.Telemetry) {
	for r := range c.mark {
		c.mark[r], c.rate[r] = railTelemetry(t, r), 0
		c.avgBytes[r], c.avgNs[r] = 0, 0
	}
}

// measureRates updates each rail's active rate from what it completed since its mark.
func (c *clConn) measureRates(t shm.Telemetry) {
	for r := range c.mark {
		cur, m := railTelemetry(t, r), c.mark[r]
		if cur.bytes < m.bytes || cur.activeNs < m.activeNs { // counters went back: start again
			c.mark[r], c.rate[r], c.avgBytes[r], c.avgNs[r] = cur, 0, 0, 0
			continue
		}
		if cur.bytes == m.bytes || cur.activeNs == m.activeNs {
			continue // nothing completed: the active time counts toward the next measurement
		}
		b, ns := float64(cur.bytes-m.bytes), float64(cur.activeNs-m.activeNs)
		if c.rate[r] > 0 {
			b = ClosedLoopSmooth*b + (1-ClosedLoopSmooth)*c.avgBytes[r]
			ns = ClosedLoopSmooth*ns + (1-ClosedLoopSmooth)*c.avgNs[r]
		}
		c.avgBytes[r], c.avgNs[r] = b, ns
		c.rate[r] = b / (ns / 1e9)
		c.mark[r] = cur
	}
}

// measure folds one interval of connection s into its state and moves w.
func (p *ClosedLoop) measure(c *clConn, s shm.Slot) (notes []string) {
	sout, sup := s.Telemetry.SoutState, s.Telemetry.SupState
	live := -1 // the split the live rail takes when one rail is out of service
	switch {
	case sout != shm.RailUp && sup == shm.RailUp:
		live = shm.SupBwMax
	case sup != shm.RailUp && sout == shm.RailUp:
		live = 0
	case sout != shm.RailUp && sup != shm.RailUp:
		return nil // nothing to steer: keep the hint in force
	}
	if live >= 0 {
		if c.savedW == closedLoopNoFailed {
			c.savedW = c.w
			notes = append(notes, fmt.Sprintf("closed-loop: slot %d (gen %d): rails %v/%v: sup_bw=%d until both are up",
				s.Index, s.Gen, sout, sup, live))
		}
		c.w = live
		return notes
	}
	if c.savedW != closedLoopNoFailed { // both rails up again: resume where it was, measure afresh
		c.w, c.savedW = c.savedW, closedLoopNoFailed
		c.remark(s.Telemetry)
		return append(notes, fmt.Sprintf("closed-loop: slot %d (gen %d): rails up: resume at sup_bw=%d",
			s.Index, s.Gen, c.w))
	}
	c.measureRates(s.Telemetry)
	target, ok := ClosedLoopTarget(c.rate[0], c.rate[1])
	if !ok {
		return nil
	}
	next := ClosedLoopMove(c.w, target, p.gain(), p.maxStep())
	if abs(next-c.w) >= ClosedLoopNoteMove {
		notes = append(notes, fmt.Sprintf("closed-loop: slot %d (gen %d): sup_bw %d -> %d (target %d: SOUT %.1f, SUP %.1f Mbit/s while active)",
			s.Index, s.Gen, c.w, next, target, c.rate[0]*8/1e6, c.rate[1]*8/1e6))
	}
	c.w = next
	return notes
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
