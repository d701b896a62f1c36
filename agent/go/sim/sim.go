//go:build linux

// Package sim is a fake MPIB plugin with a model of the two rails, for testing and trying
// policies without a cluster. It writes a real hint segment (docs/shm-format.md) through
// shm/emulate, the plugin's side of the segment in Go: it registers its connections the way
// the plugin does (spec 5.4), resolves the agent's hints per connection the way the plugin
// does (spec 5.3, with the read telemetry), records rail state changes, and publishes the
// slot telemetry at the modelled rates: per rail the bytes and requests posted and completed,
// busy time, bytes in flight, the split applied and the wall clock (send connections;
// receive connections only their posted bytes). Its clock is virtual and advances only when
// asked (Advance, Run), so a minute of traffic simulates in milliseconds; the segment's
// timestamps (heartbeat, hint reads) use that clock.
//
// Rail model, per connection: a message of MsgBytes is split by w = sup_bw (parts per 1024);
// each rail that carries part of it takes latency + bytes*8/capacity, and the message takes
// the longest of those (the rails run in parallel). Each step multiplies the message rate by a
// seeded log-normal factor exp(Noise*N(0,1) - Noise²/2), whose mean is 1 (the message time is
// divided by it), so a policy at the optimum scores 100 % on average whatever the noise. A
// rail that is down or failed carries nothing: as the plugin fails over, its share goes to the
// live rail whatever the hint says. SUP does not reach another island unless the operator
// declared a relay (Config.SupRelay, the plugin's MPIB_SUP_RELAY=1): an inter-island
// connection without one carries nothing on SUP whatever the hint says, as the plugin's guard
// forces its SUP share to 0, and its optimum is all on SOUT. Capacities and states change at
// given times (Event).
package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand"
	"sort"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/emulate"
)

// Rail is one rail of a connection.
type Rail struct {
	Mbps    float64       // capacity, megabits per second
	Latency time.Duration // per message
}

// Conn describes one simulated connection. Zero values get defaults: PID 4242, ConnID its
// index, peer 10.0.2.(index+2), path class 0 (intra-island: vanilla is all SUP), 4 MiB
// messages, send. (registered_ns is the host's clock, as emulate.Plugin.Register writes it.)
type Conn struct {
	PID        uint32
	ConnID     uint64
	Peer       string        // peer SOUT IPv4
	PathClass  shm.PathClass // 0 intra, 1 inter
	Recv       bool          // a receive connection (reads no hints, uses the vanilla split)
	MsgBytes   float64       // message size S
	Rails      [2]Rail       // 0 SOUT, 1 SUP
	StartAfter time.Duration // registered at this virtual time (0: at New)
}

// Event changes a rail at a virtual time: its capacity and its state. A rail that goes down
// or failed carries nothing until an event sets it up again.
type Event struct {
	At    time.Duration
	Conn  int // index in the connections; -1: every connection
	Rail  int // 0 SOUT, 1 SUP
	Mbps  float64
	State shm.RailState // up, down or failed
}

// Config are the simulator's knobs; zero values get the defaults.
type Config struct {
	Seed    int64
	Noise   float64       // standard deviation of the log of the per-step rate factor (mean 1); default 0.03, <0: none
	Step    time.Duration // simulation step; default 10 ms
	StaleMs uint64        // the plugin's MPIB_AGENT_STALE_MS; default 500
	// SupRelay is the plugin's MPIB_SUP_RELAY=1: SUP reaches other islands. Without it an
	// inter-island connection's SUP carries nothing (the plugin builds no SUP QPs for it).
	SupRelay bool
}

// Sim is one simulated plugin (several connections, any pids) on one segment.
type Sim struct {
	seg    *shm.Segment    // the agent's side: heartbeat and hint resolution
	plug   *emulate.Plugin // the plugin's side: slots, telemetry, hint reads
	cfg    Config
	rng    *rand.Rand
	start  uint64 // virtual CLOCK_MONOTONIC at New
	now    uint64
	conns  []*conn
	events []Event // sorted by At, not yet applied
}

type conn struct {
	spec       Conn
	rails      [2]Rail
	state      [2]shm.RailState
	supReaches bool // SUP reaches the peer: intra-island, or Config.SupRelay
	slot       uint32
	registered bool
	bytes      [2]float64 // posted, not yet written (fractions)
	reqs       [2]float64
	tele       [2][4]float64 // completed bytes, requests, busy and active ns, not yet written
	inflight   [2]float64    // bytes in flight per rail (a gauge)
	delivered  float64       // bytes moved
	optimal    float64       // bytes the best split would have moved (noise-free)
	lastW      uint32
	lastRes    shm.Resolution
}

// realtimeBase is the CLOCK_REALTIME the virtual clock starts at (rail-state change times).
const realtimeBase = 1_763_856_000_000_000_000

// New attaches an emulated plugin to seg, registers conns (those with StartAfter 0) and
// returns the simulator at virtual time 0; Close detaches it. seg's heartbeat is the agent's:
// beat it with Now() (Run does).
func New(seg *shm.Segment, cfg Config, conns []Conn, events []Event) (*Sim, error) {
	if cfg.Noise == 0 {
		cfg.Noise = 0.03
	}
	if cfg.Noise < 0 {
		cfg.Noise = 0
	}
	if cfg.Step <= 0 {
		cfg.Step = 10 * time.Millisecond
	}
	if cfg.StaleMs == 0 {
		cfg.StaleMs = shm.DefaultStaleMs
	}
	for _, e := range events {
		if e.Conn < -1 || e.Conn >= len(conns) || e.Rail < 0 || e.Rail > 1 {
			return nil, fmt.Errorf("sim: event %+v: no such connection or rail", e)
		}
	}
	plug, err := emulate.Attach(seg.Path())
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	s := &Sim{seg: seg, plug: plug, cfg: cfg, rng: rand.New(rand.NewSource(cfg.Seed)), start: 1_000_000_000_000}
	s.now = s.start
	for i, c := range conns {
		if c.PID == 0 {
			c.PID = 4242
		}
		if c.ConnID == 0 {
			c.ConnID = uint64(i)
		}
		if c.Peer == "" {
			c.Peer = fmt.Sprintf("10.0.2.%d", i+2)
		}
		if c.MsgBytes <= 0 {
			c.MsgBytes = 4 << 20
		}
		s.conns = append(s.conns, &conn{spec: c, rails: c.Rails, supReaches: c.PathClass == shm.IntraIsland || cfg.SupRelay})
	}
	s.events = append([]Event(nil), events...)
	sort.SliceStable(s.events, func(a, b int) bool { return s.events[a].At < s.events[b].At })
	if err := s.apply(); err != nil {
		plug.Close()
		return nil, err
	}
	return s, nil
}

// Close detaches the emulated plugin: its slots' leases drop, as when a plugin process exits.
func (s *Sim) Close() error { return s.plug.Close() }

// Now is the virtual CLOCK_MONOTONIC in nanoseconds.
func (s *Sim) Now() uint64 { return s.now }

// Elapsed is the virtual time since New.
func (s *Sim) Elapsed() time.Duration { return time.Duration(s.now - s.start) }

// Segment is the segment the simulator writes.
func (s *Sim) Segment() *shm.Segment { return s.seg }

// Slot is connection i's slot (valid once registered).
func (s *Sim) Slot(i int) uint32 { return s.conns[i].slot }

// Delivered is the bytes connection i has moved so far.
func (s *Sim) Delivered(i int) float64 { return s.conns[i].delivered }

// Optimal is the bytes connection i would have moved so far at the best split in force at
// every step (noise-free), the yardstick of a policy.
func (s *Sim) Optimal(i int) float64 { return s.conns[i].optimal }

// Split is the sup_bw connection i used in the last step (after failover).
func (s *Sim) Split(i int) uint32 { return s.conns[i].lastW }

// Resolution is connection i's last hint read.
func (s *Sim) Resolution(i int) shm.Resolution { return s.conns[i].lastRes }

// Rails is connection i's rails and states now.
func (s *Sim) Rails(i int) ([2]Rail, [2]shm.RailState) { return s.conns[i].rails, s.conns[i].state }

// apply registers due connections and applies due events.
func (s *Sim) apply() error {
	el := s.Elapsed()
	for _, c := range s.conns {
		if c.registered || c.spec.StartAfter > el {
			continue
		}
		ip, err := shm.ParseIPv4(c.spec.Peer)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		local, _ := shm.ParseIPv4("10.0.1.1")
		slot, err := s.plug.Register(emulate.ConnDesc{LocalSoutIP: local, PeerSoutIP: ip, PeerIsland: ip & 0xFFFFFF00,
			PathClass: c.spec.PathClass, IsSend: !c.spec.Recv, NQPsSout: 1, NQPsSup: 1, PID: c.spec.PID, ConnID: c.spec.ConnID})
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		c.slot, c.registered = slot, true
		for r := 0; r < 2; r++ {
			if c.state[r] != shm.RailUp {
				_ = s.plug.SetRailState(slot, r, c.state[r], realtimeBase+s.now-s.start)
			}
		}
	}
	for len(s.events) > 0 && s.events[0].At <= el {
		e := s.events[0]
		s.events = s.events[1:]
		for i, c := range s.conns {
			if e.Conn != -1 && e.Conn != i {
				continue
			}
			c.rails[e.Rail].Mbps = e.Mbps
			if c.state[e.Rail] != e.State {
				c.state[e.Rail] = e.State
				if c.registered {
					if err := s.plug.SetRailState(c.slot, e.Rail, e.State, realtimeBase+s.now-s.start); err != nil {
						return fmt.Errorf("sim: %w", err)
					}
				}
			}
		}
	}
	return nil
}

// MsgTime is the time in seconds a message of msgBytes takes on rails at split w (parts
// per 1024), noise-free; +Inf when the split puts bytes on a rail that cannot carry them.
func MsgTime(rails [2]Rail, up [2]bool, msgBytes float64, w uint32) float64 {
	sup := msgBytes * float64(min(w, shm.SupBwMax)) / shm.SupBwMax
	part := [2]float64{msgBytes - sup, sup}
	t := 0.0
	for r := 0; r < 2; r++ {
		if part[r] <= 0 {
			continue
		}
		if !up[r] || rails[r].Mbps <= 0 {
			return math.Inf(1)
		}
		t = math.Max(t, rails[r].Latency.Seconds()+part[r]*8/(rails[r].Mbps*1e6))
	}
	return t
}

// Optimum is the split (0..1024) at which a message takes the least time on rails, and that
// time in seconds (+Inf when no rail can carry it).
func Optimum(rails [2]Rail, up [2]bool, msgBytes float64) (uint32, float64) {
	best, bestT := uint32(0), math.Inf(1)
	for w := uint32(0); w <= shm.SupBwMax; w++ {
		if t := MsgTime(rails, up, msgBytes, w); t < bestT {
			best, bestT = w, t
		}
	}
	return best, bestT
}

// OptimumOf is connection i's best split now and its throughput in bytes per second.
func (s *Sim) OptimumOf(i int) (uint32, float64) {
	c := s.conns[i]
	w, t := Optimum(c.rails, c.up(), c.spec.MsgBytes)
	if math.IsInf(t, 1) {
		return w, 0
	}
	return w, c.spec.MsgBytes / t
}

// up is whether each rail can carry bytes now: in service, with capacity, and for SUP,
// reaching the peer (a SUP the guard keeps out counts as out of service).
func (c *conn) up() [2]bool {
	return [2]bool{c.state[0] == shm.RailUp && c.rails[0].Mbps > 0,
		c.supReaches && c.state[1] == shm.RailUp && c.rails[1].Mbps > 0}
}

// Advance runs the simulation for d of virtual time, in steps.
func (s *Sim) Advance(d time.Duration) error {
	end := s.now + uint64(d)
	for s.now < end {
		dt := min(uint64(s.cfg.Step), end-s.now)
		if err := s.step(dt); err != nil {
			return err
		}
	}
	return nil
}

func (s *Sim) step(dtNs uint64) error {
	if err := s.apply(); err != nil {
		return err
	}
	dt := float64(dtNs) / 1e9
	stale := s.cfg.StaleMs * 1e6
	for _, c := range s.conns {
		if !c.registered {
			continue
		}
		// The hint the plugin reads for this step's transfers (spec 5.3), else vanilla.
		w := uint32(0)
		if c.spec.PathClass == shm.IntraIsland {
			w = shm.SupBwMax
		}
		if !c.spec.Recv {
			res := s.seg.Resolve(c.slot, s.now, stale)
			if err := s.plug.RecordRead(c.slot, res, s.now); err != nil {
				return fmt.Errorf("sim: %w", err)
			}
			c.lastRes = res
			if res.Applies {
				w = res.SupBw
			}
		}
		up := c.up()
		switch { // the guard and failover: a rail out of service carries nothing
		case !up[0] && up[1]:
			w = shm.SupBwMax
		case up[0] && !up[1]:
			w = 0
		}
		c.lastW = w
		if _, t := Optimum(c.rails, up, c.spec.MsgBytes); !math.IsInf(t, 1) {
			c.optimal += c.spec.MsgBytes / t * dt
		}
		t := MsgTime(c.rails, up, c.spec.MsgBytes, w)
		if math.IsInf(t, 1) || t <= 0 {
			continue
		}
		slowdown := 1 / s.rateFactor()
		t *= slowdown
		sup := c.spec.MsgBytes * float64(w) / shm.SupBwMax
		part := [2]float64{c.spec.MsgBytes - sup, sup}
		if err := s.account(c, part, up, dt/t, slowdown, w); err != nil {
			return err
		}
		c.delivered += c.spec.MsgBytes * dt / t
	}
	s.now += dtNs
	return nil
}

// rateFactor is a step's noise: a log-normal factor on the message rate with mean exactly 1
// (E[exp(sd*Z)] = exp(sd²/2) for Z ~ N(0,1), hence the -sd²/2), so that noise moves a score
// around 100 % of the noise-free optimum, never above it on average.
func (s *Sim) rateFactor() float64 {
	sd := s.cfg.Noise
	if sd <= 0 {
		return 1
	}
	return math.Exp(sd*s.rng.NormFloat64() - sd*sd/2)
}

// account publishes one step of connection c's traffic, msgs messages split into part, as the
// plugin's telemetry flush does: per rail the bytes and requests posted and completed, the
// time each completed request spent on the rail (its latency plus its part at the rail's
// capacity, times the step's slowdown, 1 / its rate factor) and the rail's active time (the
// same: messages follow each other, one request in flight per rail), the bytes in flight (one
// message's part while the rail carries traffic: messages follow each other), the split
// applied and the wall clock. A recv connection, like the plugin's, publishes only its posted
// bytes and requests.
func (s *Sim) account(c *conn, part [2]float64, up [2]bool, msgs, slowdown float64, w uint32) error {
	var b emulate.TelemetryBatch
	for r := 0; r < 2; r++ {
		f := &c.tele[r]
		inflight := 0.0
		if part[r] > 0 {
			inflight = part[r]
			f[0] += msgs * part[r] // completed bytes
			f[1] += msgs           // completed requests
			onRail := msgs * (c.rails[r].Latency.Seconds() + part[r]*8/(c.rails[r].Mbps*1e6)) * slowdown * 1e9
			f[2] += onRail
			f[3] += onRail // one request in flight on the rail at a time: active = busy
		}
		// Posted = completed + what entered the pipe: a part newly in flight is posted before it
		// completes; one that left it (smaller split) completed without a new post, unless the
		// rail left service (failover: those bytes are lost on it).
		grow := inflight - c.inflight[r]
		posted, postedReqs := msgs*part[r]+max(grow, 0), msgs
		if up[r] {
			f[0] += max(-grow, 0)
		}
		if part[r] <= 0 {
			postedReqs = 0
		}
		c.bytes[r] += posted
		c.reqs[r] += postedReqs
		c.inflight[r] = inflight
		rb := &b.Rails[r]
		rb.PostedBytes, rb.PostedRequests = takeWhole(&c.bytes[r]), takeWhole(&c.reqs[r])
		rb.CompletedBytes, rb.CompletedRequests, rb.BusyNs = takeWhole(&f[0]), takeWhole(&f[1]), takeWhole(&f[2])
		rb.ActiveNs = takeWhole(&f[3])
		rb.InflightBytes = uint64(inflight)
	}
	if c.spec.Recv {
		b = emulate.TelemetryBatch{Rails: [2]emulate.RailBatch{
			{PostedBytes: b.Rails[0].PostedBytes, PostedRequests: b.Rails[0].PostedRequests},
			{PostedBytes: b.Rails[1].PostedBytes, PostedRequests: b.Rails[1].PostedRequests}}}
	} else {
		b.AppliedSupBw, b.WallNs = w, realtimeBase+s.now-s.start
	}
	if err := s.plug.FlushTelemetry(c.slot, b); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	return nil
}

// takeWhole removes the whole part of *x and returns it.
func takeWhole(x *float64) uint64 {
	n := math.Floor(*x)
	*x -= n
	return uint64(n)
}

// Run advances the simulation by d, beating the segment's heartbeat at every step (as an
// agent's beater does) and calling tick with the virtual time every interval (first after one
// interval). A tick error stops the run.
func (s *Sim) Run(d, interval time.Duration, tick func(now uint64) error) error {
	if interval <= 0 {
		return errors.New("sim: interval must be above 0")
	}
	end := s.now + uint64(d)
	next := s.now + uint64(interval)
	for s.now < end {
		if err := s.seg.Beat(s.now); err != nil {
			return err
		}
		dt := min(uint64(s.cfg.Step), end-s.now, next-s.now)
		if err := s.step(dt); err != nil {
			return err
		}
		if s.now >= next {
			if err := tick(s.now); err != nil {
				return err
			}
			next += uint64(interval)
		}
	}
	return nil
}
