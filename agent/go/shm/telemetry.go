package shm

import "slices"

// Sample is the telemetry of every active slot at one instant.
type Sample struct {
	AtNs  uint64
	Slots map[uint32]Slot
}

// NewSample indexes slots (e.g. Segment.Connections()) taken at atNs.
func NewSample(atNs uint64, slots []Slot) Sample {
	m := make(map[uint32]Slot, len(slots))
	for _, s := range slots {
		m[s.Index] = s
	}
	return Sample{AtNs: atNs, Slots: m}
}

// ConnRate is one connection's per-rail throughput between two samples.
type ConnRate struct {
	Slot          Slot    // as of the later sample
	SoutBps       float64 // bytes per second on SOUT
	SupBps        float64 // bytes per second on SUP
	SoutReqPerSec float64
	SupReqPerSec  float64
	// From the completion telemetry: bytes per second whose completion the
	// sender saw, and the mean completion latency of the requests completed in the interval
	// (0 when none completed).
	SoutCompletedBps float64
	SupCompletedBps  float64
	SoutLatencyNs    float64
	SupLatencyNs     float64
	// Bytes completed per second of the rail's active time (time with a request in flight on
	// it; 0 when it completed nothing): what the rail delivers while it has work, i.e. its
	// capacity for this connection while it is the bottleneck.
	SoutActiveBps float64
	SupActiveBps  float64
}

// SupShare is SUP's share of the bytes moved (0 when nothing moved).
func (r ConnRate) SupShare() float64 {
	if t := r.SoutBps + r.SupBps; t > 0 {
		return r.SupBps / t
	}
	return 0
}

// Rates returns the throughput of every slot active in both samples with the same gen
// (a slot re-registered in between restarts its counters and is skipped).
func Rates(a, b Sample) []ConnRate {
	if b.AtNs <= a.AtNs {
		return nil
	}
	dt := float64(b.AtNs-a.AtNs) / 1e9
	idx := make([]uint32, 0, len(b.Slots))
	for i := range b.Slots {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	var out []ConnRate
	for _, i := range idx {
		cur := b.Slots[i]
		prev, ok := a.Slots[i]
		if !ok || prev.Gen != cur.Gen {
			continue
		}
		d := func(x, y uint64) float64 {
			if y < x {
				return 0
			}
			return float64(y-x) / dt
		}
		p, c := prev.Telemetry, cur.Telemetry
		out = append(out, ConnRate{
			Slot:             cur,
			SoutBps:          d(p.SoutBytes, c.SoutBytes),
			SupBps:           d(p.SupBytes, c.SupBytes),
			SoutReqPerSec:    d(p.SoutRequests, c.SoutRequests),
			SupReqPerSec:     d(p.SupRequests, c.SupRequests),
			SoutCompletedBps: d(p.SoutCompletedBytes, c.SoutCompletedBytes),
			SupCompletedBps:  d(p.SupCompletedBytes, c.SupCompletedBytes),
			SoutLatencyNs:    meanLatency(p.SoutBusyNs, c.SoutBusyNs, p.SoutCompletedRequests, c.SoutCompletedRequests),
			SupLatencyNs:     meanLatency(p.SupBusyNs, c.SupBusyNs, p.SupCompletedRequests, c.SupCompletedRequests),
			SoutActiveBps:    activeRate(p.SoutCompletedBytes, c.SoutCompletedBytes, p.SoutActiveNs, c.SoutActiveNs),
			SupActiveBps:     activeRate(p.SupCompletedBytes, c.SupCompletedBytes, p.SupActiveNs, c.SupActiveNs),
		})
	}
	return out
}

// meanLatency is the mean completion latency in ns of the requests completed between two
// samples: the busy time they added over their number (0 when none completed).
func meanLatency(busy0, busy1, req0, req1 uint64) float64 {
	if req1 <= req0 || busy1 < busy0 {
		return 0
	}
	return float64(busy1-busy0) / float64(req1-req0)
}

// activeRate is the bytes completed between two samples per second of the rail's active time
// in between (0 when nothing completed or no active time was recorded).
func activeRate(bytes0, bytes1, active0, active1 uint64) float64 {
	if bytes1 <= bytes0 || active1 <= active0 {
		return 0
	}
	return float64(bytes1-bytes0) / (float64(active1-active0) / 1e9)
}
