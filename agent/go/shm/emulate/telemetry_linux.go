//go:build linux

package emulate

import (
	"fmt"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// RailBatch is one rail's part of a telemetry batch: counters to add, and InflightBytes, a
// gauge that replaces the stored value.
type RailBatch struct {
	PostedBytes, PostedRequests       uint64
	CompletedBytes, CompletedRequests uint64
	BusyNs                            uint64 // sum of completion - post time over CompletedRequests
	ActiveNs                          uint64 // time with at least one request in flight on the rail
	InflightBytes                     uint64
}

// TelemetryBatch is what the plugin publishes to a slot at one flush (mpib_shm_flush_telemetry).
type TelemetryBatch struct {
	Rails        [2]RailBatch // 0 SOUT, 1 SUP
	AppliedSupBw uint32       // split of the last posted message, after the guard and failover
	WallNs       uint64       // CLOCK_REALTIME ns of the flush
}

// railCounters are a rail's posted-bytes and posted-requests offsets in a slot.
func railCounters(rail int) (bytes, requests int) {
	if rail == 1 {
		return wire.SlSupBytes, wire.SlSupRequests
	}
	return wire.SlSoutBytes, wire.SlSoutRequests
}

// AddTelemetry counts bytes and one request posted on a rail (0 SOUT, 1 SUP).
func (p *Plugin) AddTelemetry(slot uint32, rail int, bytes uint64) error {
	return p.AddTelemetryN(slot, rail, bytes, 1)
}

// AddTelemetryN counts bytes carried by requests requests posted on a rail (0 SOUT, 1 SUP),
// as mpib_shm_add_telemetry does: the posted part of a batch, without the rest of a flush.
func (p *Plugin) AddTelemetryN(slot uint32, rail int, bytes, requests uint64) error {
	if slot >= p.nslots || rail < 0 || rail > 1 {
		return fmt.Errorf("telemetry slot %d rail %d: %w", slot, rail, shm.ErrSlotRange)
	}
	return p.do(func(v wire.View) error {
		off := wire.SlotOff(slot)
		b, r := railCounters(rail)
		v.Add64(off+b, bytes)
		v.Add64(off+r, requests)
		return nil
	})
}

// SetRailState records a rail's (0 SOUT, 1 SUP) state change at realtimeNs as the plugin
// does (mpib_shm_set_rail_state): failovers counts a rail leaving service (up -> not up),
// recoveries its return (not up -> up).
func (p *Plugin) SetRailState(slot uint32, rail int, state shm.RailState, realtimeNs uint64) error {
	if slot >= p.nslots || rail < 0 || rail > 1 {
		return fmt.Errorf("rail state slot %d rail %d: %w", slot, rail, shm.ErrSlotRange)
	}
	return p.do(func(v wire.View) error {
		off := wire.SlotOff(slot)
		st, ns := wire.SlSoutState, wire.SlSoutStateNs
		if rail == 1 {
			st, ns = wire.SlSupState, wire.SlSupStateNs
		}
		wasUp := shm.RailState(v.U8(off+st)) == shm.RailUp
		if state != shm.RailUp && wasUp {
			v.Add32(off+wire.SlFailovers, 1)
		} else if state == shm.RailUp && !wasUp {
			v.Add32(off+wire.SlRecoveries, 1)
		}
		v.Put64(off+ns, realtimeNs)
		v.Put8(off+st, uint8(state))
		return nil
	})
}

// FlushTelemetry publishes a batch as the plugin does at a telemetry flush (spec 4.3):
// relaxed adds of the counters, stores of the gauges, the applied split and the wall-clock
// stamp.
func (p *Plugin) FlushTelemetry(slot uint32, b TelemetryBatch) error {
	if slot >= p.nslots {
		return fmt.Errorf("telemetry slot %d: %w", slot, shm.ErrSlotRange)
	}
	return p.do(func(v wire.View) error {
		off := wire.SlotOff(slot)
		for r, rb := range b.Rails {
			bytes, reqs := railCounters(r)
			v.Add64(off+bytes, rb.PostedBytes)
			v.Add64(off+reqs, rb.PostedRequests)
			blk := off + wire.SlRailDone + r*wire.RdSize
			v.Add64(blk+wire.RdBytes, rb.CompletedBytes)
			v.Add64(blk+wire.RdRequests, rb.CompletedRequests)
			v.Add64(blk+wire.RdBusyNs, rb.BusyNs)
			v.Add64(off+wire.SlActiveNs+r*8, rb.ActiveNs)
			v.Put64(blk+wire.RdInflight, rb.InflightBytes)
		}
		v.Put32(off+wire.SlAppliedSupBw, b.AppliedSupBw)
		v.Put64(off+wire.SlFlushWallNs, b.WallNs)
		return nil
	})
}

// RecordRead updates a slot's read telemetry after a hint read that returned res at now, as
// the plugin does (spec 5.3, end): reads_applied or reads_fallback (+reads_stale), clamped,
// last_sup_bw (applied reads), last_source, last_read_ns. A slot that is not active is left
// alone.
func (p *Plugin) RecordRead(slot uint32, res shm.Resolution, now uint64) error {
	if slot >= p.nslots {
		return fmt.Errorf("record read slot %d: %w", slot, shm.ErrSlotRange)
	}
	return p.do(func(v wire.View) error {
		off := wire.SlotOff(slot)
		if shm.SlotState(uint32(v.U64(off+wire.SlOwner))) != shm.StateActive {
			return nil
		}
		if res.Applies {
			v.Add64(off+wire.SlReadsApplied, 1)
			v.Put32(off+wire.SlLastSupBw, res.SupBw)
		} else {
			v.Add64(off+wire.SlReadsFallback, 1)
			if res.Source == shm.SourceStale {
				v.Add64(off+wire.SlReadsStale, 1)
			}
		}
		if res.Clamped {
			v.Add64(off+wire.SlClamped, 1)
		}
		v.Put32(off+wire.SlLastSource, uint32(res.Source))
		v.Put64(off+wire.SlLastReadNs, now)
		return nil
	})
}
