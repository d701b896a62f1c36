package policy

import (
	"math"

	"github.com/mpib/mpib/agent/go/shm"
)

// Proportional sets sup_bw = 1024 * C_sup / (C_sout + C_sup), where C is each rail's
// capacity: configured (CapSout, CapSup > 0), or else measured as the decaying peak of the
// node's total per-rail throughput seen in telemetry. While measuring, the split stays within
// [MinSupBw, MaxSupBw] so that both rails keep carrying traffic and stay observed; with
// configured capacities the full 0..1024 range is used.
//
// Measured peaks only approach capacities when each rail is driven hard at some point; with
// a fixed split the two peaks keep the ratio of that split. Configure capacities when known.
type Proportional struct {
	CapSout, CapSup    float64 // bytes/s (any common unit); 0 = measure
	Decay              float64 // per-Observe factor on the measured peaks, default 0.98
	MinSupBw, MaxSupBw uint32  // measuring bounds, default 64 and 960
	peakSout, peakSup  float64
}

// Observe feeds one interval's per-connection rates.
func (p *Proportional) Observe(rates []shm.ConnRate) {
	decay := p.Decay
	if decay <= 0 || decay > 1 {
		decay = 0.98
	}
	var sout, sup float64
	for _, r := range rates {
		sout += r.SoutBps
		sup += r.SupBps
	}
	p.peakSout = math.Max(p.peakSout*decay, sout)
	p.peakSup = math.Max(p.peakSup*decay, sup)
}

// Measured returns the current per-rail capacity estimates.
func (p *Proportional) Measured() (sout, sup float64) { return p.peakSout, p.peakSup }

// SupBw returns the split to apply now; 512 while nothing is known.
func (p *Proportional) SupBw() uint32 {
	if p.CapSout > 0 || p.CapSup > 0 {
		return share(p.CapSout, p.CapSup)
	}
	lo, hi := p.MinSupBw, p.MaxSupBw
	if lo == 0 && hi == 0 {
		lo, hi = 64, 960
	}
	if p.peakSout+p.peakSup <= 0 {
		return 512
	}
	return min(max(share(p.peakSout, p.peakSup), lo), hi)
}

func share(sout, sup float64) uint32 {
	if sout < 0 {
		sout = 0
	}
	if sup < 0 {
		sup = 0
	}
	if sout+sup == 0 {
		return 512
	}
	return uint32(math.Round(shm.SupBwMax * sup / (sout + sup)))
}
