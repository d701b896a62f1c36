//go:build linux

package sim

import (
	"sort"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
)

// Scenario is a named simulation: connections, rail events and a length.
type Scenario struct {
	Name     string
	Conns    []Conn
	Events   []Event
	Duration time.Duration
}

// Changes returns the start of each phase: 0 and every distinct event time, in order.
func (sc Scenario) Changes() []time.Duration {
	out := []time.Duration{0}
	ts := make([]time.Duration, 0, len(sc.Events))
	for _, e := range sc.Events {
		ts = append(ts, e.At)
	}
	sort.Slice(ts, func(a, b int) bool { return ts[a] < ts[b] })
	for _, t := range ts {
		if t > out[len(out)-1] && t < sc.Duration {
			out = append(out, t)
		}
	}
	return out
}

// Gbps is a rail capacity in Gbit/s.
func Gbps(g float64, latency time.Duration) Rail { return Rail{Mbps: g * 1000, Latency: latency} }

// Scenarios is the standard table: equal rails, 2:1, 4:1, a rail failing and returning, a
// capacity changing mid-run. The closed-loop tests run every one of them.
func Scenarios() []Scenario {
	us := time.Microsecond
	return []Scenario{
		{
			Name:     "equal",
			Conns:    []Conn{{Rails: [2]Rail{Gbps(100, 5*us), Gbps(100, 5*us)}}},
			Duration: 30 * time.Second,
		},
		{
			Name: "2:1", // two processes: SUP twice SOUT, and the other way; plus a recv connection
			Conns: []Conn{
				{PID: 4242, Rails: [2]Rail{Gbps(100, 5*us), Gbps(200, 5*us)}},
				{PID: 4243, ConnID: 7, PathClass: shm.IntraIsland, Rails: [2]Rail{Gbps(200, 5*us), Gbps(100, 5*us)}},
				{PID: 4243, ConnID: 8, Recv: true, Rails: [2]Rail{Gbps(100, 5*us), Gbps(100, 5*us)}},
			},
			Duration: 30 * time.Second,
		},
		{
			Name: "4:1", // SOUT four times SUP, different latencies, 1 MiB messages
			Conns: []Conn{{MsgBytes: 1 << 20,
				Rails: [2]Rail{Gbps(200, 20*us), Gbps(50, 5*us)}}},
			Duration: 30 * time.Second,
		},
		{
			Name:  "rail fails and returns", // SUP (the faster rail) down at 30 s, back at 45 s
			Conns: []Conn{{Rails: [2]Rail{Gbps(100, 5*us), Gbps(200, 5*us)}}},
			Events: []Event{
				{At: 30 * time.Second, Conn: -1, Rail: 1, Mbps: 0, State: shm.RailDown},
				{At: 45 * time.Second, Conn: -1, Rail: 1, Mbps: 200_000, State: shm.RailUp},
			},
			Duration: 75 * time.Second,
		},
		{
			Name:  "capacity changes", // equal, then SUP drops to a quarter, then SOUT halves
			Conns: []Conn{{Rails: [2]Rail{Gbps(100, 5*us), Gbps(100, 5*us)}}},
			Events: []Event{
				{At: 30 * time.Second, Conn: -1, Rail: 1, Mbps: 25_000},
				{At: 60 * time.Second, Conn: -1, Rail: 0, Mbps: 50_000},
			},
			Duration: 90 * time.Second,
		},
	}
}
