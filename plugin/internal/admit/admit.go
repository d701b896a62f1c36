// Package admit holds the listener's decisions about unproven TCP clients (accepted, hello not
// read yet): which ones a new client displaces, and how long one may stay silent. It does no
// I/O; the listener (plugin/listen.go) asks the sockets and applies the answers.
//
// The contract these decisions keep: a client that has sent any byte (read by the listener, or
// waiting in its socket) is never displaced, so a real peer whose hello arrived cannot be
// closed by newer clients; only silent clients are, oldest first, so a newer client (a real
// peer connecting now) always finds room as long as one silent client is held anywhere.
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
	// One pass per limit, narrowest first: a victim chosen for the listener's limit also counts
	// toward the source's and the process's.
	for _, lim := range []struct {
		max   int
		match func(Client) bool
	}{
		{lim.PerListener, func(c Client) bool { return c.Listener == listener }},
		{lim.PerSource, func(c Client) bool { return c.Src == src }},
		{lim.Process, func(Client) bool { return true }},
	} {
		if lim.max <= 0 {
			continue
		}
		held := 0
		for i, c := range clients {
			if !gone[i] && lim.match(c) {
				held++
			}
		}
		for i := 0; held >= lim.max && i < len(clients); i++ {
			if gone[i] || !lim.match(clients[i]) || !silent(i) {
				continue
			}
			gone[i] = true
			victims = append(victims, i)
			held--
		}
		if held >= lim.max {
			return nil, false
		}
	}
	return victims, true
}

// Deadline is how long after its connection a client may take to finish its hello: grace while
// it has sent nothing (at most full), full once it has sent part of one.
func Deadline(sentBytes int, grace, full time.Duration) time.Duration {
	if sentBytes == 0 {
		return min(grace, full)
	}
	return full
}
