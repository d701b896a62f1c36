//go:build linux

package shm_test

import (
	"encoding/binary"
	"os"
	"testing"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// poke32 stores a u32 into the segment file as another process would (the file is mapped
// shared, so the Segment sees it).
func poke32(t *testing.T, s *shm.Segment, off int, v uint32) {
	t.Helper()
	f, err := os.OpenFile(s.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	if _, err := f.WriteAt(b[:], int64(off)); err != nil {
		t.Fatal(err)
	}
}

// A hint writer that dies between its two seq stores leaves the record odd: every reader finds
// it busy, for every registration of the slot, until an agent repairs it (spec 5.1): GC clears
// every odd record (class, slot hint, peer entry), and a peer write clears the odd entries its
// scan meets, never writing a second entry with the same key. The C test agent's rule
// (plugin/ctest/shm_odd_repair_test.c).
func TestOddRecordRepaired(t *testing.T) {
	s, p := newSeg(t, 1, 2)
	stale := uint64(shm.DefaultStaleMs) * 1e6
	resolve := func() shm.Resolution { now := shm.Now(); _ = s.Beat(now); return s.Resolve(0, now, stale) }
	if err := s.SetClassHint(shm.IntraIsland, 300, true); err != nil {
		t.Fatal(err)
	}
	slot, err := p.Register(desc(1, "10.0.2.7", shm.IntraIsland))
	if err != nil {
		t.Fatal(err)
	}
	classDefault := shm.Resolution{Applies: true, SupBw: 300, Source: shm.SourceClass}
	if got := resolve(); got != classDefault {
		t.Fatalf("before: %+v", got)
	}
	hint := wire.SlotOff(slot) + wire.SlHint
	poke32(t, s, hint+wire.RecSeq, 1) // a writer of the slot's hint dies after its first seq store
	poke32(t, s, hint+wire.RecSupBw, 900)
	if got := resolve(); got.Source != shm.SourceBusy {
		t.Fatalf("odd slot hint: %+v, want busy", got)
	}
	if _, err := s.GC(); err != nil {
		t.Fatal(err)
	}
	if sl, _ := s.Slot(slot); sl.Hint.Seq != 2 || sl.Hint.Flags != 0 || sl.Hint.SupBw != 0 {
		t.Fatalf("after GC the slot hint is %+v, want cleared with seq 2", sl.Hint)
	}
	if got := resolve(); got != classDefault {
		t.Fatalf("after GC: %+v, want the class default", got)
	}

	// An odd class default: GC repairs it too.
	poke32(t, s, wire.ClassOff(0)+wire.RecSeq, 3)
	if got := resolve(); got.Source != shm.SourceBusy {
		t.Fatalf("odd class record: %+v, want busy", got)
	}
	if _, err := s.GC(); err != nil {
		t.Fatal(err)
	}
	if got := resolve(); got.Source != shm.SourceNoHint {
		t.Fatalf("after GC of the class record: %+v, want no_hint (cleared)", got)
	}

	// A peer entry's writer dies mid-write: the next peer write repairs it and bumps the epoch.
	peer := ip("10.0.2.7")
	if err := s.SetPeerHint(peer, 32, 700, true); err != nil {
		t.Fatal(err)
	}
	e0 := wire.PeerOff(1, 0)
	poke32(t, s, e0+wire.RecSeq, 5) // odd
	poke32(t, s, e0+wire.RecSupBw, 9999)
	epoch := s.Header().PeersEpoch
	if err := s.SetPeerHint(peer, 32, 800, true); err != nil {
		t.Fatal(err)
	}
	if s.Header().PeersEpoch == epoch {
		t.Error("peers_epoch not bumped")
	}
	snap, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	keyed := 0
	for _, e := range snap.Peers {
		if e.Record.PeerIP == peer && e.Record.Valid() {
			keyed++
		}
	}
	if keyed != 1 {
		t.Errorf("%d valid entries with the key, want 1: %+v", keyed, snap.Peers)
	}
	if got := resolve(); got != (shm.Resolution{Applies: true, SupBw: 800, Source: shm.SourcePeer}) {
		t.Fatalf("after the peer write: %+v, want peer 800", got)
	}

	// An odd entry met by a clear of a key that is not there: repaired, the epoch bumped.
	poke32(t, s, e0+wire.RecSeq, 7)
	epoch = s.Header().PeersEpoch
	if err := s.SetPeerHint(ip("10.9.9.9"), 32, 0, false); err != nil {
		t.Fatal(err)
	}
	if s.Header().PeersEpoch == epoch {
		t.Error("peers_epoch not bumped by a clear that repaired an entry")
	}
	// GC repairs a peer entry and bumps the epoch.
	poke32(t, s, e0+wire.RecSeq, 9)
	epoch = s.Header().PeersEpoch
	if _, err := s.GC(); err != nil {
		t.Fatal(err)
	}
	if s.Header().PeersEpoch == epoch {
		t.Error("peers_epoch not bumped by GC's repair of a peer entry")
	}
	if got := resolve(); got.Source != shm.SourceNoHint {
		t.Fatalf("after GC of the peer entry: %+v, want no_hint (every default cleared)", got)
	}
}
