//go:build linux

// Tests of the agent's side that need registered connections: the plugin's side is played by
// package emulate, which this external test package may import.
package shm_test

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/emulate"
	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// newSeg creates a segment and attaches an emulated plugin to it; both close at cleanup.
func newSeg(t *testing.T, nslots, npeers uint32) (*shm.Segment, *emulate.Plugin) {
	t.Helper()
	s, err := shm.Create(filepath.Join(t.TempDir(), "hints"), nslots, npeers, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, attach(t, s)
}

func attach(t *testing.T, s *shm.Segment) *emulate.Plugin {
	t.Helper()
	p, err := emulate.Attach(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func ip(s string) shm.IPv4 {
	v, err := shm.ParseIPv4(s)
	if err != nil {
		panic(err)
	}
	return v
}

func desc(conn uint64, peer string, class shm.PathClass) emulate.ConnDesc {
	return emulate.ConnDesc{LocalSoutIP: ip("10.0.1.1"), PeerSoutIP: ip(peer), PathClass: class, IsSend: true,
		NQPsSout: 2, NQPsSup: 4, PID: uint32(os.Getpid()), ConnID: conn}
}

func gen(t *testing.T, s *shm.Segment, slot uint32) uint32 {
	t.Helper()
	sl, err := s.Slot(slot)
	if err != nil {
		t.Fatal(err)
	}
	return sl.Gen
}

func conns(t *testing.T, s *shm.Segment) []shm.Slot {
	t.Helper()
	c, err := s.Connections()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestHintsResolve(t *testing.T) {
	s, p := newSeg(t, 8, 4)
	a, err := p.Register(desc(1, "10.0.2.7", shm.InterIsland))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := p.Register(desc(2, "10.0.2.8", shm.InterIsland))
	now := shm.Now()
	stale := uint64(shm.DefaultStaleMs) * 1e6
	type step struct {
		name string
		do   func() error
		slot uint32
		want shm.Resolution
	}
	steps := []step{
		{"no agent", func() error { return nil }, a, shm.Resolution{Source: shm.SourceStale}},
		{"beat, no hint", func() error { return s.Beat(now) }, a, shm.Resolution{Source: shm.SourceNoHint}},
		{"class", func() error { return s.SetClassHint(shm.InterIsland, 100, true) }, a, shm.Resolution{true, 100, shm.SourceClass, false}},
		{"island", func() error { return s.SetPeerHint(ip("10.0.2.0"), 24, 200, true) }, b, shm.Resolution{true, 200, shm.SourcePeer, false}},
		{"peer", func() error { return s.SetPeerHint(ip("10.0.2.7"), 32, 300, true) }, a, shm.Resolution{true, 300, shm.SourcePeer, false}},
		{"slot", func() error { return s.SetSlotHint(a, gen(t, s, a), 512, true) }, a, shm.Resolution{true, 512, shm.SourceSlot, false}},
		{"slot cleared", func() error { return s.SetSlotHint(a, gen(t, s, a), 0, false) }, a, shm.Resolution{true, 300, shm.SourcePeer, false}},
		{"peer cleared", func() error { return s.SetPeerHint(ip("10.0.2.7"), 32, 0, false) }, a, shm.Resolution{true, 200, shm.SourcePeer, false}},
		{"released", func() error { return p.Release(b) }, b, shm.Resolution{Source: shm.SourceInactive}},
		{"stop beat", func() error { s.StopBeat(); return nil }, a, shm.Resolution{Source: shm.SourceStale}},
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
	s, p := newSeg(t, 2, 2)
	slot, _ := p.Register(desc(1, "10.0.1.2", shm.IntraIsland))
	err := s.SetSlotHint(slot, gen(t, s, slot), 5000, true)
	var ce *shm.ClampedError
	if !errors.Is(err, shm.ErrHintClamped) || !errors.As(err, &ce) || ce.Requested != 5000 || ce.Applied != 1024 {
		t.Fatalf("expected a shm.ClampedError 5000->1024 but got %v", err)
	}
	sl, _ := s.Slot(slot)
	if sl.Hint.SupBw != 1024 || !sl.Hint.Valid() {
		t.Fatalf("stored hint: %+v", sl.Hint)
	}
	if err := s.SetClassHint(shm.PathClass(2), 1, true); !errors.Is(err, shm.ErrBadClass) {
		t.Fatalf("class 2: %v", err)
	}
	if err := s.SetPeerHint(0, 33, 1, true); !errors.Is(err, shm.ErrBadPrefix) {
		t.Fatalf("prefix 33: %v", err)
	}
	if err := s.SetSlotHint(1-slot, 0, 1, true); !errors.Is(err, shm.ErrSlotInactive) {
		t.Fatalf("free slot: %v", err)
	}
	if err := s.SetSlotHint(7, 1, 1, true); !errors.Is(err, shm.ErrSlotRange) {
		t.Fatalf("slot 7 of 2: %v", err)
	}
	s.SetPeerHint(ip("1.1.1.1"), 32, 1, true)
	s.SetPeerHint(ip("1.1.1.2"), 32, 1, true)
	if err := s.SetPeerHint(ip("1.1.1.3"), 32, 1, true); !errors.Is(err, shm.ErrPeerTableFull) {
		t.Fatalf("third peer of 2: %v", err)
	}
}

func TestGenBindsHint(t *testing.T) {
	s, p := newSeg(t, 1, 0)
	s.Beat(shm.Now())
	slot, _ := p.Register(desc(1, "10.0.1.2", shm.IntraIsland))
	s.SetSlotHint(slot, gen(t, s, slot), 700, true)
	p.Release(slot)
	again, _ := p.Register(desc(2, "10.0.1.2", shm.IntraIsland))
	if again != slot {
		t.Fatalf("expected slot %d again but got %d", slot, again)
	}
	if r := s.Resolve(slot, shm.Now(), 1e9); r.Applies {
		t.Fatalf("a hint for the previous registration applied: %+v", r)
	}
	if _, err := p.Register(desc(3, "10.0.1.2", shm.IntraIsland)); !errors.Is(err, shm.ErrSlotsFull) {
		t.Fatalf("full: %v", err)
	}
}

// TestGCLeaseNotPID: a slot lives as long as its owner's lease (an OFD lock) is held, whatever
// pid it registered with: a plugin in a container (its own PID namespace) registers with a
// pid that does not exist here, and GC must keep its slot until the plugin goes.
func TestGCLeaseNotPID(t *testing.T) {
	s, p := newSeg(t, 4, 0)
	plugin, err := emulate.Attach(s.Path()) // another process: its own open file description
	if err != nil {
		t.Fatal(err)
	}
	d := desc(1, "10.0.1.2", shm.IntraIsland)
	d.PID = 4000001 // a pid from another PID namespace: no such process here
	slot, err := plugin.Register(d)
	if err != nil {
		t.Fatal(err)
	}
	if held, err := s.LeaseHeld(slot); err != nil || !held {
		t.Fatalf("lease of a live registration: held=%v %v", held, err)
	}
	freed, err := s.GC()
	if err != nil || len(freed) != 0 {
		t.Fatalf("shm.GC reclaimed a live connection: %v %v", freed, err)
	}
	if c := conns(t, s); len(c) != 1 {
		t.Fatalf("after GC: %+v", c)
	}
	plugin.Close() // the plugin process dies: the kernel drops its locks
	freed, err = s.GC()
	if err != nil || len(freed) != 1 || freed[0] != slot {
		t.Fatalf("shm.GC after the owner died: expected [%d] but got %v (%v)", slot, freed, err)
	}
	// A released slot is free and has no lease; the next claim gets a fresh lease.
	again, err := p.Register(desc(2, "10.0.1.2", shm.IntraIsland))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := shm.Open(s.Path())
	defer other.Close()
	if held, _ := other.LeaseHeld(again); !held {
		t.Fatal("Register did not lease its slot")
	}
	p.Release(again)
	if held, _ := other.LeaseHeld(again); held {
		t.Fatal("Release kept the lease")
	}
}

// TestSetSlotHintGenChanged: a hint carries the generation the writer read; a slot registered
// again in between refuses it.
func TestSetSlotHintGenChanged(t *testing.T) {
	s, p := newSeg(t, 1, 0)
	s.Beat(shm.Now())
	slot, _ := p.Register(desc(1, "10.0.1.2", shm.IntraIsland))
	g := gen(t, s, slot)
	p.Release(slot) // the connection closes while the policy computes...
	again, _ := p.Register(desc(2, "10.0.1.9", shm.IntraIsland))
	if again != slot {
		t.Fatalf("expected slot %d again but got %d", slot, again)
	}
	err := s.SetSlotHint(slot, g, 900, true) // ...and writes for the one it saw
	var ge *shm.GenChangedError
	if !errors.Is(err, shm.ErrGenChanged) || !errors.As(err, &ge) || ge.Expected != g || ge.Current != g+1 {
		t.Fatalf("expected shm.ErrGenChanged (%d -> %d) but got %v", g, g+1, err)
	}
	if shm.Code(err) != "gen_changed" {
		t.Fatalf("code: %q", shm.Code(err))
	}
	if r := s.Resolve(slot, shm.Now(), 1e9); r.Applies {
		t.Fatalf("the hint landed on the new connection: %+v", r)
	}
	if err := s.SetSlotHint(slot, g+1, 900, true); err != nil {
		t.Fatal(err)
	}
}

// TestTruncateUnderReaders: truncating the segment under a reader (same user, `: > file`)
// must not crash the agent: every access returns ErrSegmentGone, and Reattach follows a
// re-created segment.
func TestTruncateUnderReaders(t *testing.T) {
	s, p := newSeg(t, 64, 16)
	slot, _ := p.Register(desc(1, "10.0.2.7", shm.InterIsland))
	var stop atomic.Bool
	var wg sync.WaitGroup
	var goneSeen atomic.Int64
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				_ = s.Beat(shm.Now())
				_, err1 := s.Connections()
				s.Resolve(slot, shm.Now(), 1e9)
				_, err2 := s.Snapshot()
				err3 := s.SetClassHint(shm.InterIsland, 100, true)
				for _, err := range []error{err1, err2, err3} {
					if errors.Is(err, shm.ErrSegmentGone) {
						goneSeen.Add(1)
					} else if err != nil {
						t.Errorf("unexpected error: %v", err)
					}
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	if err := os.Truncate(s.Path(), 0); err != nil { // what `: > file` does
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if goneSeen.Load() == 0 || !errors.Is(s.Err(), shm.ErrSegmentGone) || shm.Code(s.Err()) != "segment_gone" {
		t.Fatalf("no shm.ErrSegmentGone after truncation (%d, %v)", goneSeen.Load(), s.Err())
	}
	if !s.Replaced() {
		t.Fatal("shm.Replaced must report a truncated segment")
	}
	if _, err := shm.Create(s.Path(), 8, 4, false); !errors.Is(err, shm.ErrSegmentLive) {
		t.Fatalf("this process still leases slots of the truncated file: expected shm.ErrSegmentLive but got %v", err)
	}
	n, err := shm.Create(s.Path(), 8, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	if moved, err := s.Reattach(); !moved || err != nil {
		t.Fatalf("reattach: %v %v", moved, err)
	}
	if h := s.Header(); h.NSlots != 8 || s.Err() != nil {
		t.Fatalf("after reattach: %+v %v", h, s.Err())
	}
	if moved, err := s.Reattach(); moved || err != nil {
		t.Fatalf("reattach without a change: %v %v", moved, err)
	}
}

// TestGeometryChangedSinceOpen: a process writing garbage into the header of an open segment
// (nslots, npeers, total_size, the sizes, the version) makes Snapshot and Connections return a
// bad_geometry error saying so, never panic (the mapping is never sliced by the header's
// nslots); the validated geometry stays in use and the segment works again once the header
// is restored.
func TestGeometryChangedSinceOpen(t *testing.T) {
	type field struct {
		off  int
		val  uint64
		size int
	}
	cases := []struct {
		name   string
		writes []field
	}{
		{"nslots", []field{{wire.OffNSlots, 65536, 4}}},
		{"nslots and total_size", []field{{wire.OffNSlots, 20, 4}, {wire.OffTotalSize, shm.TotalSize(20, 2), 8}}},
		{"npeers", []field{{wire.OffNPeers, 4096, 4}}},
		{"total_size", []field{{wire.OffTotalSize, 1 << 40, 8}}},
		{"slot_size", []field{{wire.OffSlotSize, 256, 4}}},
		{"version", []field{{wire.OffVersion, shm.Version + 1, 4}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, p := newSeg(t, 4, 2)
			if _, err := p.Register(desc(1, "10.0.2.7", shm.InterIsland)); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(s.Path(), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			orig := make([]byte, shm.HeaderSize)
			f.ReadAt(orig, 0)
			for _, w := range tc.writes {
				b := binary.LittleEndian.AppendUint64(nil, w.val)
				f.WriteAt(b[:w.size], int64(w.off))
			}
			snap, err := s.Snapshot()
			if !errors.Is(err, shm.ErrBadGeometry) || snap != nil || !strings.Contains(err.Error(), "changed since open") {
				t.Fatalf("Snapshot: expected a bad_geometry error but got %v (%v)", err, snap)
			}
			if c, err := s.Connections(); !errors.Is(err, shm.ErrBadGeometry) {
				t.Fatalf("Connections: expected a bad_geometry error but got %v (%d slots)", err, len(c))
			}
			f.WriteAt(orig, 0)
			if snap, err := s.Snapshot(); err != nil || snap.Header.NSlots != 4 || len(snap.Slots) != 1 {
				t.Fatalf("restored header: %v %+v", err, snap)
			}
		})
	}
}

// A peer key is stored masked to its prefix (spec 5.6): 10.0.2.7/24 and 10.0.2.0/24 name one
// island, so a write or a clear under either spelling updates the one entry (resolution masks
// both keys, and a second entry for the island would lose every tie to the first).
func TestPeerKeyMasked(t *testing.T) {
	s, p := newSeg(t, 2, 4)
	a, err := p.Register(desc(1, "10.0.2.9", shm.InterIsland))
	if err != nil {
		t.Fatal(err)
	}
	stale := uint64(shm.DefaultStaleMs) * 1e6
	steps := []struct {
		name string
		do   func() error
		want shm.Resolution
	}{
		{"set by a host of the island", func() error { return s.SetPeerHint(ip("10.0.2.7"), 24, 100, true) }, shm.Resolution{true, 100, shm.SourcePeer, false}},
		{"set by the network", func() error { return s.SetPeerHint(ip("10.0.2.0"), 24, 900, true) }, shm.Resolution{true, 900, shm.SourcePeer, false}},
		{"cleared by another host", func() error { return s.SetPeerHint(ip("10.0.2.200"), 24, 0, false) }, shm.Resolution{Source: shm.SourceNoHint}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		now := shm.Now()
		_ = s.Beat(now)
		if got := s.Resolve(a, now, stale); got != st.want {
			t.Errorf("%s: expected %+v but got %+v", st.name, st.want, got)
		}
	}
	if err := s.SetPeerHint(ip("10.0.2.7"), 24, 300, true); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if e := snap.Peers[0].Record; e.PeerIP != ip("10.0.2.0") || e.PrefixLen != 24 {
		t.Errorf("stored key %v/%d, want 10.0.2.0/24", e.PeerIP, e.PrefixLen)
	}
	// An entry whose key has host bits (an older writer's) is still the island's entry.
	f, err := os.OpenFile(s.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(ip("10.0.2.7")))
	if _, err := f.WriteAt(b[:], int64(wire.PeerOff(2, 0)+wire.RecPeerIP)); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPeerHint(ip("10.0.2.0"), 24, 0, false); err != nil {
		t.Fatal(err)
	}
	now := shm.Now()
	_ = s.Beat(now)
	if got := s.Resolve(a, now, stale); got.Source != shm.SourceNoHint {
		t.Errorf("clearing an entry keyed 10.0.2.7/24 by 10.0.2.0/24: %+v, want no_hint", got)
	}
}
