package main

import (
	"strconv"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
)

// The exporter's counters are per series key (dev, peer, dir), not per slot: a slot and its
// connection are ephemeral (every NCCL communicator registers new ones, pid and conn_id
// change with every job), while the device and the peer NIC are what an operator knows and
// what alerts name. Summing connections makes the counters' monotonicity the exporter's job:
// a connection that closes takes its counters with it when its slot is claimed again (spec
// 4.3: they restart at 0 with each gen). So the exporter remembers the last counters it saw
// of each (slot, gen) and, once that gen is gone, adds them to its key's retired total. A
// series then only falls when the exporter restarts, which Prometheus's rate() and
// increase() handle as any counter reset.

// Per-rail counter indexes.
const (
	postedBytes = iota
	postedRequests
	completedBytes
	completedRequests
	busyNs
	nRailCounters
)

// counts are one connection's (or one key's summed) monotonic telemetry counters.
type counts struct {
	rail       [2][nRailCounters]uint64 // 0 SOUT, 1 SUP
	failovers  uint64
	recoveries uint64
}

func countsOf(t shm.Telemetry) counts {
	return counts{
		rail: [2][nRailCounters]uint64{
			{t.SoutBytes, t.SoutRequests, t.SoutCompletedBytes, t.SoutCompletedRequests, t.SoutBusyNs},
			{t.SupBytes, t.SupRequests, t.SupCompletedBytes, t.SupCompletedRequests, t.SupBusyNs},
		},
		failovers:  uint64(t.Failovers),
		recoveries: uint64(t.Recoveries),
	}
}

func (c *counts) add(o counts) {
	for r := range c.rail {
		for i := range c.rail[r] {
			c.rail[r][i] += o.rail[r][i]
		}
	}
	c.failovers += o.failovers
	c.recoveries += o.recoveries
}

// raise keeps the larger of each field. Within one gen the segment's counters only grow, but a
// reader may catch a slot being claimed again (its counters zeroed before the new gen shows):
// raise keeps such a read from making a series fall.
func (c *counts) raise(o counts) {
	for r := range c.rail {
		for i := range c.rail[r] {
			c.rail[r][i] = max(c.rail[r][i], o.rail[r][i])
		}
	}
	c.failovers = max(c.failovers, o.failovers)
	c.recoveries = max(c.recoveries, o.recoveries)
}

// seriesKey is the label set of a connection's series (without rail, state or source).
type seriesKey struct{ dev, peer, dir string }

// otherLabel stands for the peers past --max-peers, and for a device index beyond the spec's
// 0..15 in their key.
const otherLabel = "other"

// maxDevLabel is the largest fused-device index the spec allows (4.3: NCCL's device, 0..15).
const maxDevLabel = 15

// pairIdle is how long a (dev, peer) pair keeps its series once it has no active connection.
// Jobs come and go and talk to other peers: without it, the first --max-peers pairs a node
// ever saw would keep their series for the exporter's life and every later peer would land
// in peer="other". Longer than any rate() window a dashboard uses, so a job's last bytes
// still show; a pair that comes back after it starts new series at 0 (for Prometheus, a
// series that ended and a new one).
const pairIdle = 15 * time.Minute

// connMemo is what the exporter remembers of a slot's registration.
type connMemo struct {
	gen  uint32
	key  seriesKey
	last counts
}

// liveConn is an ACTIVE connection of the latest snapshot and its key.
type liveConn struct {
	slot shm.Slot
	key  seriesKey
}

// accounts keeps every key's counters monotonic across scrapes (see the top of the file).
type accounts struct {
	maxPeers int
	created  uint64                // CreatedNs of the segment the memos belong to
	conns    map[uint32]*connMemo  // by slot index
	retired  map[seriesKey]*counts // counters of registrations that are gone
	pairs    map[[2]string]uint64  // (dev, peer) pairs with series of their own: when last active (ns)
}

func newAccounts(maxPeers int) *accounts {
	return &accounts{maxPeers: maxPeers, conns: map[uint32]*connMemo{},
		retired: map[seriesKey]*counts{}, pairs: map[[2]string]uint64{}}
}

// keyOf names a connection's series. Up to maxPeers (dev, peer) pairs have series of their own,
// kept while they are active and pairIdle after (so a connection's series never moves); pairs
// beyond share peer="other".
func (a *accounts) keyOf(s shm.Slot, now uint64) seriesKey {
	dir := "recv"
	if s.IsSend == 1 {
		dir = "send"
	}
	pair := pairOf(s)
	if _, ok := a.pairs[pair]; !ok {
		if len(a.pairs) >= a.maxPeers {
			dev := pair[0]
			if s.Dev > maxDevLabel {
				dev = otherLabel
			}
			return seriesKey{dev, otherLabel, dir}
		}
		a.pairs[pair] = now
	}
	return seriesKey{pair[0], pair[1], dir}
}

func pairOf(s shm.Slot) [2]string { return [2]string{strconv.Itoa(int(s.Dev)), s.PeerSoutIP.String()} }

// retire moves slot i's remembered counters into its key's retired total.
func (a *accounts) retire(i uint32) {
	m := a.conns[i]
	r := a.retired[m.key]
	if r == nil {
		r = &counts{}
		a.retired[m.key] = r
	}
	r.add(m.last)
	delete(a.conns, i)
}

// update folds a snapshot in and returns its ACTIVE connections. A FREE slot still holding a
// remembered gen keeps counting: its last telemetry stays until the slot is claimed again,
// so bytes a connection moved after the previous scrape and before it closed are not lost.
// A CLAIMING slot is being (re)initialised and is skipped until the next scrape.
// now is CLOCK_MONOTONIC ns, for pairIdle.
func (a *accounts) update(snap *shm.Snapshot, now uint64) []liveConn {
	if snap.Header.CreatedNs != a.created { // a new segment at the path: every slot is new
		for i := range a.conns {
			a.retire(i)
		}
		a.created = snap.Header.CreatedNs
	}
	for _, s := range snap.Slots { // pairs with an active connection are not idle
		if _, ok := a.pairs[pairOf(s)]; ok && s.State == shm.StateActive {
			a.pairs[pairOf(s)] = now
		}
	}
	a.dropIdlePairs(now) // before naming new connections: a new peer may take a dropped pair's place
	var live []liveConn
	present := map[uint32]bool{}
	for _, s := range snap.Slots {
		present[s.Index] = true
		m := a.conns[s.Index]
		if m != nil && m.gen != s.Gen {
			a.retire(s.Index)
			m = nil
		}
		switch {
		case s.State == shm.StateActive:
			if m == nil {
				m = &connMemo{gen: s.Gen, key: a.keyOf(s, now)}
				a.conns[s.Index] = m
			}
			m.last.raise(countsOf(s.Telemetry))
			live = append(live, liveConn{s, m.key})
		case s.State == shm.StateFree && m != nil:
			m.last.raise(countsOf(s.Telemetry))
		}
	}
	for i := range a.conns {
		if !present[i] { // an all-zero slot: not a valid successor of what we saw
			a.retire(i)
		}
	}
	return live
}

// dropIdlePairs forgets the pairs without an active connection for pairIdle: their series
// leave the output and their place under --max-peers is free again.
func (a *accounts) dropIdlePairs(now uint64) {
	for pair, last := range a.pairs {
		if int64(now-last) < int64(pairIdle) { // signed: a clock read before last is not idle
			continue
		}
		for i, m := range a.conns { // closed connections whose slots were not claimed again
			if m.key.dev == pair[0] && m.key.peer == pair[1] {
				delete(a.conns, i)
			}
		}
		for _, dir := range []string{"send", "recv"} {
			delete(a.retired, seriesKey{pair[0], pair[1], dir})
		}
		delete(a.pairs, pair)
	}
}

// totals returns every key's counters: retired plus remembered registrations.
func (a *accounts) totals() map[seriesKey]counts {
	out := make(map[seriesKey]counts, len(a.retired))
	for k, r := range a.retired {
		out[k] = *r
	}
	for _, m := range a.conns {
		c := out[m.key]
		c.add(m.last)
		out[m.key] = c
	}
	return out
}
