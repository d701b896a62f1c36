// Package admit holds the listener's decisions about unproven TCP clients (accepted, hello not
// read yet): which ones a new client displaces, and how long one may stay silent; and the
// connector's answer when a listener dropped it that way: when to dial again. It does no I/O;
// the listener (plugin/listen.go, gate.go) and the connector (plugin/dial.go) ask the sockets
// and the clock and apply the answers.
//
// The contract these decisions keep: a client that has sent any byte (read by the listener, or
// waiting in its socket) is not displaced, so a real peer whose hello arrived cannot be closed
// by newer clients; silent clients are, oldest first, so a newer client (a real peer
// connecting now) finds room as long as one silent client is held anywhere. One exception: a
// source that holds more than PerSourceListener clients with bytes on one listener loses its
// oldest of them when that listener is full. A real peer connects once per listener, so this
// only ever hits a client that is not one; without it one address could fill a listener with
// partial hellos for their whole deadline and refuse the real peer until NCCL gives up.
package admit

import (
	"net/netip"
	"time"
)

// Limits bound the unproven clients a process holds.
type Limits struct {
	Process     int // all listeners together: the descriptors spent on unproven clients
	PerSource   int // from one source address, all listeners together
	PerListener int // on one listener
	// PerSourceListener: the clients with bytes one source keeps on a full listener (above,
	// its oldest are displaced too); 0 for no such bound.
	PerSourceListener int
}

// Client is one unproven client as the decisions see it.
type Client struct {
	Src      netip.Addr
	Listener uint64
}

// Displace returns the clients (indexes into clients, which is oldest first) that a new client
// from src on listener must displace for every limit to hold with it admitted, and false when
// that cannot be done: a limit is reached and every client that would free room under it has
// sent bytes. The new client is then closed and nothing is displaced. sent(i) says whether
// clients[i] has sent any byte; it is asked lazily, oldest first, at most once per client.
func Displace(clients []Client, src netip.Addr, listener uint64, lim Limits, sent func(i int) bool) ([]int, bool) {
	gone := make([]bool, len(clients))
	asked := make(map[int]bool)
	silent := func(i int) bool {
		s, ok := asked[i]
		if !ok {
			s = sent(i)
			asked[i] = s
		}
		return !s
	}
	var victims []int
	evict := func(i int) {
		gone[i] = true
		victims = append(victims, i)
	}
	// One pass per limit, narrowest first: a victim chosen for the listener's limit also counts
	// toward the source's and the process's.
	for pass, l := range []struct {
		max   int
		match func(Client) bool
	}{
		{lim.PerListener, func(c Client) bool { return c.Listener == listener }},
		{lim.PerSource, func(c Client) bool { return c.Src == src }},
		{lim.Process, func(Client) bool { return true }},
	} {
		if l.max <= 0 {
			continue
		}
		held := 0
		for i, c := range clients {
			if !gone[i] && l.match(c) {
				held++
			}
		}
		for i := 0; held >= l.max && i < len(clients); i++ {
			if gone[i] || !l.match(clients[i]) || !silent(i) {
				continue
			}
			evict(i)
			held--
		}
		if pass == 0 && held >= l.max && lim.PerSourceListener > 0 {
			held -= displaceCrowding(clients, gone, listener, held-l.max+1, lim.PerSourceListener, evict)
		}
		if held >= l.max {
			return nil, false
		}
	}
	return victims, true
}

// displaceCrowding evicts, oldest first, up to need clients of a full listener whose source
// holds more than keep of the clients left there (all of which have sent bytes: the silent ones
// went first), and says how many it evicted.
func displaceCrowding(clients []Client, gone []bool, listener uint64, need, keep int, evict func(int)) int {
	held := map[netip.Addr]int{}
	for i, c := range clients {
		if !gone[i] && c.Listener == listener {
			held[c.Src]++
		}
	}
	n := 0
	for i, c := range clients {
		if n == need {
			break
		}
		if !gone[i] && c.Listener == listener && held[c.Src] > keep {
			evict(i)
			held[c.Src]--
			n++
		}
	}
	return n
}

// Deadline is how long after its connection a client may take to finish its hello: grace while
// it has sent nothing (at most full), full once it has sent part of one.
func Deadline(sentBytes int, grace, full time.Duration) time.Duration {
	if sentBytes == 0 {
		return min(grace, full)
	}
	return full
}

// Redials bound how a connector dials again after a listener closed its control connection
// before any metadata.
type Redials struct {
	Step time.Duration // the pause before the n-th redial is about n × Step
	Max  int           // redials per connection
}

// Redial says whether a connector dials again after the n-th close before any metadata of its
// connection (n >= 1), with left until its handshake's deadline, and after what pause: n × Step
// scaled by 0.5 + jitter/2 (jitter in [0, 1), clamped), so that connectors the listener dropped
// together do not come back together. false after Max redials, or when the pause would reach
// the deadline. A listener drops an honest client when its process is too busy to read the
// hellos it already holds (a limit reached with every client having sent bytes), or a client
// that was still silent when newer ones came; both pass as the listener catches up, so the
// answer is NCCL's to a refused connect: try again, pausing longer each time, a bounded number
// of times.
func Redial(n int, left time.Duration, jitter float64, r Redials) (time.Duration, bool) {
	n = max(n, 1)
	if n > r.Max {
		return 0, false
	}
	jitter = min(max(jitter, 0), 1)
	wait := time.Duration(float64(time.Duration(n)*r.Step) * (0.5 + jitter/2))
	if wait >= left {
		return 0, false
	}
	return wait, true
}
