package policy

import (
	"fmt"
	"math"
	"sort"

	"github.com/mpib/mpib/agent/go/shm"
)

// Closed-loop defaults and limits (the Python agent's closed-loop policy uses the same).
const (
	ClosedLoopStep     = 64   // default initial probe step, parts per 1024
	ClosedLoopMaxStep  = 256  // largest --step
	ClosedLoopMinStep  = 8    // halving stops here
	ClosedLoopStart    = 512  // split a new connection starts from
	ClosedLoopGain     = 0.02 // a probe must beat the rate at w by more than this to move w
	ClosedLoopDrift    = 0.15 // the rate at an unchanged w moving by more than this resets the step
	closedLoopCenter   = 0
	closedLoopPlus     = 1
	closedLoopMinus    = 2
	closedLoopNoFailed = -1
)

// ClosedLoop steers every send connection (is_send=1) to the split at which its transfers
// finish fastest, without knowing the rails' capacities, and follows the rails when they
// change. It is extremum seeking on w (sup_bw) over the connection's total posted rate
// r = Δ(sout_bytes + sup_bytes) / Δt, one measurement per Tick:
//
//   - a cycle measures r at w, then at the probe w+step, then at w-step (clamped to
//     0..1024), one interval each;
//   - w moves to the best of the three; when neither probe beats w by more than 2 %
//     (ClosedLoopGain), the step halves (not below 8, ClosedLoopMinStep);
//   - when r at an unchanged w differs from its last measurement by more than 15 %
//     (ClosedLoopDrift) a rail's capacity changed: the step returns to the initial step;
//   - an interval is skipped when the slot's gen changed (a new connection starts again at
//     512, ClosedLoopStart) or no bytes moved;
//   - when telemetry shows a rail down or failed, everything goes to the live rail (0 or
//     1024) and, once both rails are up again, the loop resumes from the previous w with the
//     initial step.
//
// Hints are written for the gen the decision was computed on (a connection that closed in
// between is skipped). The Python agent (mpib_agent._policy) implements the same algorithm.
// DefaultReprobe is the CLI's ClosedLoop.Reprobe (and the Python API's default reprobe).
const DefaultReprobe = 4

type ClosedLoop struct {
	Step uint32 // initial probe step in parts per 1024 (1..256); 0 = 64

	// Reprobe, when > 0, returns the step to the initial step after that many cycles in a row
	// at the smallest step without a move (0: never). Without it a capacity *rise* is
	// invisible at the balance point (the rate at w does not change, so the step is not
	// reset) and, once the rail taking the larger share binds, a probe of 8 gains less than
	// 2 %, so w never moves (the sim's TestClosedLoopCapacityRise: stuck at about 0.64 of the
	// optimum). Both agents' CLIs use DefaultReprobe, as the Python API does by default; it
	// costs about 1.5 % in steady state (a periodic larger probe).
	Reprobe int

	conns map[uint32]*clConn
}

// clConn is the loop's state for one send connection (one slot registration).
type clConn struct {
	gen       uint32
	prevBytes uint64 // sout_bytes + sup_bytes at prevNs
	prevNs    uint64
	w, step   int // the split the search is centred on, the probe step
	phase     int // what the interval now running measures: centre, w+step, w-step
	rateW     float64
	rateP     float64
	base      float64 // the last rate measured at w (0: none since w moved)
	savedW    int     // w before a failover (closedLoopNoFailed: no failover in force)
	still     int     // cycles in a row at the smallest step without a move (Reprobe)
	written   uint32
	hasWrite  bool
}

// ClosedLoopConn is one connection's state, for display and tests.
type ClosedLoopConn struct {
	Slot, Gen  uint32
	W, Step    int  // the split searched around, the probe step
	Phase      int  // 0 measuring w, 1 probing w+step, 2 probing w-step
	Failover   bool // a rail is down: everything on the live rail
	Applied    uint32
	HasApplied bool
}

func (p *ClosedLoop) initStep() int {
	if p.Step == 0 {
		return ClosedLoopStep
	}
	return int(min(p.Step, ClosedLoopMaxStep))
}

func clampW(w int) int { return min(max(w, 0), shm.SupBwMax) }

// target is the split the coming interval runs at.
func (c *clConn) target() int {
	switch c.phase {
	case closedLoopPlus:
		return clampW(c.w + c.step)
	case closedLoopMinus:
		return clampW(c.w - c.step)
	}
	return c.w
}

// State returns the loop's per-connection state, by slot.
func (p *ClosedLoop) State() []ClosedLoopConn {
	out := make([]ClosedLoopConn, 0, len(p.conns))
	for i, c := range p.conns {
		out = append(out, ClosedLoopConn{Slot: i, Gen: c.gen, W: c.w, Step: c.step, Phase: c.phase,
			Failover: c.savedW != closedLoopNoFailed, Applied: c.written, HasApplied: c.hasWrite})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Slot < out[b].Slot })
	return out
}

// Tick takes one measurement per send connection in conns (the active slots read at nowNs,
// CLOCK_MONOTONIC ns or a simulator's clock) and writes the split for the next interval.
// Notes are lines for the operator (w moved, failover, step reset); err stops the policy.
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
		bytes := s.Telemetry.SoutBytes + s.Telemetry.SupBytes
		if c == nil || c.gen != s.Gen {
			c = &clConn{gen: s.Gen, w: ClosedLoopStart, step: p.initStep(), savedW: closedLoopNoFailed}
			p.conns[s.Index] = c
			c.prevBytes, c.prevNs = bytes, nowNs
			notes = append(notes, fmt.Sprintf("closed-loop: slot %d (gen %d) peer %v: start at sup_bw=%d, step %d",
				s.Index, s.Gen, s.PeerSoutIP, c.w, c.step))
		} else {
			notes = append(notes, p.measure(c, s, bytes, nowNs)...)
		}
		v := c.target()
		if c.savedW != closedLoopNoFailed {
			v = c.w // during a failover w holds the live rail's 0 or 1024
		}
		if c.hasWrite && c.written == uint32(v) {
			continue
		}
		err := hw.SetSlotHint(s.Index, s.Gen, uint32(v), true)
		if Gone(err) {
			delete(p.conns, s.Index) // closed since conns was read: the next tick sees what replaced it
			continue
		}
		if err != nil {
			return notes, fmt.Errorf("slot %d: %w", s.Index, err)
		}
		c.written, c.hasWrite = uint32(v), true
	}
	for i := range p.conns {
		if !seen[i] {
			delete(p.conns, i)
		}
	}
	return notes, nil
}

// measure folds one interval of connection s into its state.
func (p *ClosedLoop) measure(c *clConn, s shm.Slot, bytes, nowNs uint64) (notes []string) {
	prevBytes, prevNs := c.prevBytes, c.prevNs
	c.prevBytes, c.prevNs = bytes, nowNs
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
	if c.savedW != closedLoopNoFailed { // both rails up again: resume where the search was
		c.w, c.savedW = c.savedW, closedLoopNoFailed
		c.step, c.phase, c.base = p.initStep(), closedLoopCenter, 0
		return append(notes, fmt.Sprintf("closed-loop: slot %d (gen %d): rails up: resume at sup_bw=%d, step %d",
			s.Index, s.Gen, c.w, c.step))
	}
	if nowNs <= prevNs || bytes <= prevBytes {
		return nil // nothing moved (or the clock did not): measure this phase again
	}
	rate := float64(bytes-prevBytes) / (float64(nowNs-prevNs) / 1e9)
	switch c.phase {
	case closedLoopCenter:
		if c.base > 0 && math.Abs(rate/c.base-1) > ClosedLoopDrift && c.step != p.initStep() {
			c.step = p.initStep()
			notes = append(notes, fmt.Sprintf("closed-loop: slot %d (gen %d): rate at sup_bw=%d changed %+.0f%%: step %d",
				s.Index, s.Gen, c.w, 100*(rate/c.base-1), c.step))
		}
		c.rateW, c.base, c.phase = rate, rate, closedLoopPlus
	case closedLoopPlus:
		c.rateP, c.phase = rate, closedLoopMinus
	case closedLoopMinus:
		c.phase = closedLoopCenter
		bestW, bestRate := clampW(c.w+c.step), c.rateP
		if rate > bestRate {
			bestW, bestRate = clampW(c.w-c.step), rate
		}
		if bestRate > c.rateW*(1+ClosedLoopGain) && bestW != c.w {
			notes = append(notes, fmt.Sprintf("closed-loop: slot %d (gen %d): sup_bw %d -> %d (%+.1f%%), step %d",
				s.Index, s.Gen, c.w, bestW, 100*(bestRate/c.rateW-1), c.step))
			c.w, c.base, c.still = bestW, bestRate, 0
		} else if half := max(c.step/2, min(ClosedLoopMinStep, c.step)); half != c.step {
			c.step, c.still = half, 0
		} else if c.still++; p.Reprobe > 0 && c.still >= p.Reprobe {
			c.step, c.still = p.initStep(), 0
		}
	}
	return notes
}
