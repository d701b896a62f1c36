//go:build linux

package emulate_test

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/emulate"
)

// newSeg creates a segment (the agent's view of it) and attaches an emulated plugin to it;
// both close at cleanup.
func newSeg(t *testing.T, nslots, npeers uint32) (*shm.Segment, *emulate.Plugin) {
	t.Helper()
	s, err := shm.Create(filepath.Join(t.TempDir(), "hints"), nslots, npeers, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p, err := emulate.Attach(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return s, p
}

func desc(conn uint64) emulate.ConnDesc {
	return emulate.ConnDesc{LocalSoutIP: 0x0A000101, PeerSoutIP: 0x0A000102, PathClass: shm.IntraIsland, IsSend: true,
		NQPsSout: 2, NQPsSup: 4, PID: uint32(os.Getpid()), ConnID: conn}
}

func TestConcurrentRegister(t *testing.T) {
	s, p := newSeg(t, 64, 0)
	var wg sync.WaitGroup
	got := make(chan uint32, 128)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := 0; k < 16; k++ {
				if slot, err := p.Register(desc(uint64(g*100 + k))); err == nil {
					got <- slot
				}
			}
		}(g)
	}
	wg.Wait()
	close(got)
	seen := map[uint32]bool{}
	for slot := range got {
		if seen[slot] {
			t.Fatalf("slot %d handed out twice", slot)
		}
		seen[slot] = true
	}
	if len(seen) != 64 || len(mustConns(t, s)) != 64 {
		t.Fatalf("expected 64 distinct slots but got %d", len(seen))
	}
}

func TestTelemetry(t *testing.T) {
	s, p := newSeg(t, 2, 0)
	slot, _ := p.Register(desc(1))
	p.AddTelemetry(slot, 0, 100)
	p.AddTelemetry(slot, 1, 300)
	p.AddTelemetry(slot, 1, 300)
	if err := p.AddTelemetry(slot, 2, 1); !errors.Is(err, shm.ErrSlotRange) {
		t.Fatalf("rail 2: %v", err)
	}
	sl, _ := s.Slot(slot)
	want := shm.Telemetry{SoutBytes: 100, SoutRequests: 1, SupBytes: 600, SupRequests: 2}
	if sl.Telemetry != want {
		t.Fatalf("expected %+v but got %+v", want, sl.Telemetry)
	}
}

// TestFlushTelemetry publishes two batches as the plugin does: counters add up, the
// in-flight gauges, the applied split and the wall-clock stamp are replaced.
func TestFlushTelemetry(t *testing.T) {
	s, p := newSeg(t, 2, 0)
	slot, _ := p.Register(desc(1))
	b := emulate.TelemetryBatch{AppliedSupBw: 600, WallNs: 10, Rails: [2]emulate.RailBatch{
		{PostedBytes: 100, PostedRequests: 2, CompletedBytes: 50, CompletedRequests: 1, BusyNs: 7000, InflightBytes: 50},
		{PostedBytes: 300, PostedRequests: 2, CompletedBytes: 300, CompletedRequests: 2, BusyNs: 9000}}}
	p.FlushTelemetry(slot, b)
	b.AppliedSupBw, b.WallNs, b.Rails[0].InflightBytes = 400, 20, 0
	p.FlushTelemetry(slot, b)
	if err := p.FlushTelemetry(2, b); !errors.Is(err, shm.ErrSlotRange) {
		t.Fatalf("slot 2: %v", err)
	}
	sl, _ := s.Slot(slot)
	want := shm.Telemetry{SoutBytes: 200, SoutRequests: 4, SupBytes: 600, SupRequests: 4, AppliedSupBw: 400, FlushWallNs: 20,
		SoutCompletedBytes: 100, SoutCompletedRequests: 2, SoutBusyNs: 14000,
		SupCompletedBytes: 600, SupCompletedRequests: 4, SupBusyNs: 18000}
	if sl.Telemetry != want {
		t.Fatalf("expected %+v but got %+v", want, sl.Telemetry)
	}
}

// TestRailState records rail state changes as the plugin does: a rail leaving service counts
// a failover, coming back counts a recovery, a further change while out counts nothing; a
// new claim zeroes all.
func TestRailState(t *testing.T) {
	s, p := newSeg(t, 2, 0)
	slot, _ := p.Register(desc(1))
	p.SetRailState(slot, 1, shm.RailDown, 100)
	p.SetRailState(slot, 1, shm.RailFailed, 200) // still out of service: no new failover
	p.SetRailState(slot, 0, shm.RailDown, 300)
	p.SetRailState(slot, 0, shm.RailUp, 400) // rejoined: a recovery
	p.SetRailState(slot, 0, shm.RailUp, 500) // still up: nothing
	if err := p.SetRailState(slot, 2, shm.RailDown, 1); !errors.Is(err, shm.ErrSlotRange) {
		t.Fatalf("rail 2: %v", err)
	}
	if err := p.SetRailState(2, 0, shm.RailDown, 1); !errors.Is(err, shm.ErrSlotRange) {
		t.Fatalf("slot 2: %v", err)
	}
	sl, _ := s.Slot(slot)
	want := shm.Telemetry{SoutState: shm.RailUp, SupState: shm.RailFailed, Failovers: 2, Recoveries: 1, SoutStateNs: 500, SupStateNs: 200}
	if sl.Telemetry != want {
		t.Fatalf("expected %+v but got %+v", want, sl.Telemetry)
	}
	p.Release(slot)
	slot2, _ := p.Register(desc(1)) // same pid and conn: same slot
	if sl, _ := s.Slot(slot2); slot2 != slot || sl.Telemetry != (shm.Telemetry{}) {
		t.Fatalf("a new claim must zero the rail states: %+v", sl.Telemetry)
	}
}

func mustConns(t *testing.T, s *shm.Segment) []shm.Slot {
	t.Helper()
	c, err := s.Connections()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRecordRead counts reads as the plugin does: an applied read sets last_sup_bw, a stale
// fallback counts as fallback and stale, a clamped read counts as clamped, and a slot that is
// not active is left alone.
func TestRecordRead(t *testing.T) {
	s, p := newSeg(t, 2, 0)
	slot, _ := p.Register(desc(1))
	p.RecordRead(slot, shm.Resolution{Applies: true, SupBw: 700, Source: shm.SourceSlot}, 10)
	p.RecordRead(slot, shm.Resolution{Applies: true, SupBw: 1024, Source: shm.SourceClass, Clamped: true}, 20)
	p.RecordRead(slot, shm.Resolution{Source: shm.SourceStale}, 30)
	if err := p.RecordRead(2, shm.Resolution{}, 1); !errors.Is(err, shm.ErrSlotRange) {
		t.Fatalf("slot 2: %v", err)
	}
	sl, _ := s.Slot(slot)
	want := shm.Telemetry{ReadsApplied: 2, ReadsFallback: 1, ReadsStale: 1, Clamped: 1, LastSupBw: 1024,
		LastSource: uint32(shm.SourceStale), LastReadNs: 30}
	if sl.Telemetry != want {
		t.Fatalf("expected %+v but got %+v", want, sl.Telemetry)
	}
	p.Release(slot)
	p.RecordRead(slot, shm.Resolution{Applies: true, SupBw: 1, Source: shm.SourceSlot}, 40)
	if sl, _ := s.Slot(slot); sl.Telemetry != want {
		t.Fatalf("a released slot's telemetry changed: %+v", sl.Telemetry)
	}
}

// TestCloseDropsLeases: the leases live as long as the Plugin, as a plugin process's do; a
// closed Plugin refuses further calls.
func TestCloseDropsLeases(t *testing.T) {
	s, p := newSeg(t, 2, 0)
	slot, _ := p.Register(desc(1))
	if held, err := s.LeaseHeld(slot); err != nil || !held {
		t.Fatalf("lease of a registered slot: held=%v %v", held, err)
	}
	p.Close()
	if held, _ := s.LeaseHeld(slot); held {
		t.Fatal("a closed Plugin still holds its lease")
	}
	if freed, err := s.GC(); err != nil || len(freed) != 1 || freed[0] != slot {
		t.Fatalf("GC after Close: expected [%d] but got %v (%v)", slot, freed, err)
	}
	if _, err := p.Register(desc(2)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Register after Close: %v", err)
	}
}

// TestAttachRefuses: a file that is not a valid segment is refused.
func TestAttachRefuses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if p, err := emulate.Attach(path); !errors.Is(err, shm.ErrBadMagic) {
		t.Fatalf("a zeroed file: expected bad_magic but got %v (%v)", err, p)
	}
	if _, err := emulate.Attach(filepath.Join(t.TempDir(), "none")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a missing file: %v", err)
	}
}
