//go:build linux

package shm

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func newSeg(t *testing.T, nslots, npeers uint32) *Segment {
	t.Helper()
	s, err := Create(filepath.Join(t.TempDir(), "hints"), nslots, npeers, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func desc(conn uint64, peer string, class PathClass) ConnDesc {
	return ConnDesc{LocalSoutIP: ip("10.0.1.1"), PeerSoutIP: ip(peer), PathClass: class, IsSend: true,
		NQPsSout: 2, NQPsSup: 4, PID: uint32(os.Getpid()), ConnID: conn}
}

func gen(t *testing.T, s *Segment, slot uint32) uint32 {
	t.Helper()
	sl, err := s.Slot(slot)
	if err != nil {
		t.Fatal(err)
	}
	return sl.Gen
}

func conns(t *testing.T, s *Segment) []Slot {
	t.Helper()
	c, err := s.Connections()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCreateMode(t *testing.T) {
	s := newSeg(t, 8, 4)
	st, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode: expected 0600 but got %o", st.Mode().Perm())
	}
	if st.Size() != int64(TotalSize(8, 4)) {
		t.Fatalf("size: expected %d but got %d", TotalSize(8, 4), st.Size())
	}
	if h := s.Header(); h.NSlots != 8 || h.NPeers != 4 || h.Version != Version || h.CreatedNs == 0 {
		t.Fatalf("header: %+v", h)
	}
	if _, err := Create(filepath.Join(t.TempDir(), "x"), 0, 1, false); !errors.Is(err, ErrBadGeometry) {
		t.Fatalf("zero slots: expected ErrBadGeometry but got %v", err)
	}
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	s, err := Create(good, 4, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	write := func(name string, b []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	img, _ := os.ReadFile(good)
	bad := append([]byte(nil), img...)
	bad[0] = 'X'
	tests := []struct {
		name string
		path string
		want error
	}{
		{"world writable", write("ww", img, 0o666), ErrBadMode},
		{"group writable", write("gw", img, 0o620), ErrBadMode},
		{"world readable", write("wr", img, 0o644), ErrBadMode}, // others would see peers and rates
		{"group readable", write("gr", img, 0o640), ErrBadMode},
		{"other executable", write("ox", img, 0o601), ErrBadMode},
		{"directory", dir, nil},
		{"too small", write("small", img[:10], 0o600), ErrTooSmall},
		{"truncated", write("trunc", img[:300], 0o600), ErrTooSmall},
		{"bad magic", write("magic", bad, 0o600), ErrBadMagic},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(tc.path)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("expected %v but got %v", tc.want, err)
			}
		})
	}
	if os.Geteuid() == 0 {
		p := write("owner", img, 0o600)
		os.Chown(p, 65534, 65534)
		if _, err := Open(p); !errors.Is(err, ErrBadOwner) {
			t.Fatalf("other owner: expected ErrBadOwner but got %v", err)
		}
	}
	if s, err := Open(write("ok600", img, 0o600)); err != nil {
		t.Fatalf("0600 must open: %v", err)
	} else {
		s.Close()
	}
}

func TestHintsResolve(t *testing.T) {
	s := newSeg(t, 8, 4)
	a, err := s.Register(desc(1, "10.0.2.7", InterIsland))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := s.Register(desc(2, "10.0.2.8", InterIsland))
	now := Now()
	stale := uint64(DefaultStaleMs) * 1e6
	type step struct {
		name string
		do   func() error
		slot uint32
		want Resolution
	}
	steps := []step{
		{"no agent", func() error { return nil }, a, Resolution{Source: SourceStale}},
		{"beat, no hint", func() error { return s.Beat(now) }, a, Resolution{Source: SourceNoHint}},
		{"class", func() error { return s.SetClassHint(InterIsland, 100, true) }, a, Resolution{true, 100, SourceClass, false}},
		{"island", func() error { return s.SetPeerHint(ip("10.0.2.0"), 24, 200, true) }, b, Resolution{true, 200, SourcePeer, false}},
		{"peer", func() error { return s.SetPeerHint(ip("10.0.2.7"), 32, 300, true) }, a, Resolution{true, 300, SourcePeer, false}},
		{"slot", func() error { return s.SetSlotHint(a, gen(t, s, a), 512, true) }, a, Resolution{true, 512, SourceSlot, false}},
		{"slot cleared", func() error { return s.SetSlotHint(a, gen(t, s, a), 0, false) }, a, Resolution{true, 300, SourcePeer, false}},
		{"peer cleared", func() error { return s.SetPeerHint(ip("10.0.2.7"), 32, 0, false) }, a, Resolution{true, 200, SourcePeer, false}},
		{"released", func() error { return s.Release(b) }, b, Resolution{Source: SourceInactive}},
		{"stop beat", func() error { s.StopBeat(); return nil }, a, Resolution{Source: SourceStale}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := s.Resolve(st.slot, now, stale); got != st.want {
			t.Errorf("%s: expected %+v but got %+v", st.name, st.want, got)
		}
	}
}

func TestClampReported(t *testing.T) {
	s := newSeg(t, 2, 2)
	slot, _ := s.Register(desc(1, "10.0.1.2", IntraIsland))
	err := s.SetSlotHint(slot, gen(t, s, slot), 5000, true)
	var ce *ClampedError
	if !errors.Is(err, ErrHintClamped) || !errors.As(err, &ce) || ce.Requested != 5000 || ce.Applied != 1024 {
		t.Fatalf("expected a ClampedError 5000->1024 but got %v", err)
	}
	sl, _ := s.Slot(slot)
	if sl.Hint.SupBw != 1024 || !sl.Hint.Valid() {
		t.Fatalf("stored hint: %+v", sl.Hint)
	}
	if err := s.SetClassHint(PathClass(2), 1, true); !errors.Is(err, ErrBadClass) {
		t.Fatalf("class 2: %v", err)
	}
	if err := s.SetPeerHint(0, 33, 1, true); !errors.Is(err, ErrBadPrefix) {
		t.Fatalf("prefix 33: %v", err)
	}
	if err := s.SetSlotHint(1-slot, 0, 1, true); !errors.Is(err, ErrSlotInactive) {
		t.Fatalf("free slot: %v", err)
	}
	if err := s.SetSlotHint(7, 1, 1, true); !errors.Is(err, ErrSlotRange) {
		t.Fatalf("slot 7 of 2: %v", err)
	}
	s.SetPeerHint(ip("1.1.1.1"), 32, 1, true)
	s.SetPeerHint(ip("1.1.1.2"), 32, 1, true)
	if err := s.SetPeerHint(ip("1.1.1.3"), 32, 1, true); !errors.Is(err, ErrPeerTableFull) {
		t.Fatalf("third peer of 2: %v", err)
	}
}

func TestGenBindsHint(t *testing.T) {
	s := newSeg(t, 1, 0)
	s.Beat(Now())
	slot, _ := s.Register(desc(1, "10.0.1.2", IntraIsland))
	s.SetSlotHint(slot, gen(t, s, slot), 700, true)
	s.Release(slot)
	again, _ := s.Register(desc(2, "10.0.1.2", IntraIsland))
	if again != slot {
		t.Fatalf("expected slot %d again but got %d", slot, again)
	}
	if r := s.Resolve(slot, Now(), 1e9); r.Applies {
		t.Fatalf("a hint for the previous registration applied: %+v", r)
	}
	if _, err := s.Register(desc(3, "10.0.1.2", IntraIsland)); !errors.Is(err, ErrSlotsFull) {
		t.Fatalf("full: %v", err)
	}
}

func TestConcurrentRegister(t *testing.T) {
	s := newSeg(t, 64, 0)
	var wg sync.WaitGroup
	got := make(chan uint32, 128)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for k := 0; k < 16; k++ {
				if slot, err := s.Register(desc(uint64(g*100+k), "10.0.1.2", IntraIsland)); err == nil {
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
	if len(seen) != 64 || len(conns(t, s)) != 64 {
		t.Fatalf("expected 64 distinct slots but got %d", len(seen))
	}
}

func TestTelemetry(t *testing.T) {
	s := newSeg(t, 2, 0)
	slot, _ := s.Register(desc(1, "10.0.1.2", IntraIsland))
	s.AddTelemetry(slot, 0, 100)
	s.AddTelemetry(slot, 1, 300)
	s.AddTelemetry(slot, 1, 300)
	if err := s.AddTelemetry(slot, 2, 1); !errors.Is(err, ErrSlotRange) {
		t.Fatalf("rail 2: %v", err)
	}
	sl, _ := s.Slot(slot)
	want := Telemetry{SoutBytes: 100, SoutRequests: 1, SupBytes: 600, SupRequests: 2}
	if sl.Telemetry != want {
		t.Fatalf("expected %+v but got %+v", want, sl.Telemetry)
	}
}

// TestFlushTelemetry publishes two batches as the plugin does: counters add up, the
// in-flight gauges, the applied split and the wall-clock stamp are replaced.
func TestFlushTelemetry(t *testing.T) {
	s := newSeg(t, 2, 0)
	slot, _ := s.Register(desc(1, "10.0.1.2", IntraIsland))
	b := TelemetryBatch{AppliedSupBw: 600, WallNs: 10, Rails: [2]RailBatch{
		{PostedBytes: 100, PostedRequests: 2, CompletedBytes: 50, CompletedRequests: 1, BusyNs: 7000, InflightBytes: 50},
		{PostedBytes: 300, PostedRequests: 2, CompletedBytes: 300, CompletedRequests: 2, BusyNs: 9000}}}
	s.FlushTelemetry(slot, b)
	b.AppliedSupBw, b.WallNs, b.Rails[0].InflightBytes = 400, 20, 0
	s.FlushTelemetry(slot, b)
	if err := s.FlushTelemetry(2, b); !errors.Is(err, ErrSlotRange) {
		t.Fatalf("slot 2: %v", err)
	}
	sl, _ := s.Slot(slot)
	want := Telemetry{SoutBytes: 200, SoutRequests: 4, SupBytes: 600, SupRequests: 4, AppliedSupBw: 400, FlushWallNs: 20,
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
	s := newSeg(t, 2, 0)
	slot, _ := s.Register(desc(1, "10.0.1.2", IntraIsland))
	s.SetRailState(slot, 1, RailDown, 100)
	s.SetRailState(slot, 1, RailFailed, 200) // still out of service: no new failover
	s.SetRailState(slot, 0, RailDown, 300)
	s.SetRailState(slot, 0, RailUp, 400) // rejoined: a recovery
	s.SetRailState(slot, 0, RailUp, 500) // still up: nothing
	if err := s.SetRailState(slot, 2, RailDown, 1); !errors.Is(err, ErrSlotRange) {
		t.Fatalf("rail 2: %v", err)
	}
	if err := s.SetRailState(2, 0, RailDown, 1); !errors.Is(err, ErrSlotRange) {
		t.Fatalf("slot 2: %v", err)
	}
	sl, _ := s.Slot(slot)
	want := Telemetry{SoutState: RailUp, SupState: RailFailed, Failovers: 2, Recoveries: 1, SoutStateNs: 500, SupStateNs: 200}
	if sl.Telemetry != want {
		t.Fatalf("expected %+v but got %+v", want, sl.Telemetry)
	}
	s.Release(slot)
	slot2, _ := s.Register(desc(1, "10.0.1.2", IntraIsland)) // same pid and conn: same slot
	if sl, _ := s.Slot(slot2); slot2 != slot || sl.Telemetry != (Telemetry{}) {
		t.Fatalf("a new claim must zero the rail states: %+v", sl.Telemetry)
	}
}
