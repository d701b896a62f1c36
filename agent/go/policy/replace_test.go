//go:build linux

package policy

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/emulate"
)

// replaceBench is a segment with one send connection (pid 4242, conn 7) in slot Slot, and
// the means to replace the segment as `create --force` does.
type replaceBench struct {
	t    *testing.T
	seg  *shm.Segment
	plug *emulate.Plugin
	Slot uint32
}

func newReplaceBench(t *testing.T, nslots uint32) *replaceBench {
	t.Helper()
	seg, err := shm.Create(filepath.Join(t.TempDir(), "hints"), nslots, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	b := &replaceBench{t: t, seg: seg}
	b.register()
	return b
}

// register attaches a plugin to the segment at the path and registers the connection there.
func (b *replaceBench) register() {
	b.t.Helper()
	p, err := emulate.Attach(b.seg.Path())
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { p.Close() })
	peer, _ := shm.ParseIPv4("10.0.1.2")
	b.plug = p
	b.Slot, err = p.Register(emulate.ConnDesc{PeerSoutIP: peer, PathClass: shm.IntraIsland, IsSend: true, PID: 4242, ConnID: 7})
	if err != nil {
		b.t.Fatal(err)
	}
}

// replace re-creates the segment with nslots slots and moves seg to it; with register, the
// plugin registers the connection there again (gen 1, as in the old segment).
func (b *replaceBench) replace(nslots uint32, register bool) {
	b.t.Helper()
	n, err := shm.Create(b.seg.Path(), nslots, 4, true)
	if err != nil {
		b.t.Fatal(err)
	}
	n.Close()
	if moved, err := b.seg.Reattach(); !moved || err != nil {
		b.t.Fatalf("reattach: %v %v", moved, err)
	}
	if register {
		b.register()
	}
}

func (b *replaceBench) conns() []shm.Slot {
	b.t.Helper()
	c, err := b.seg.Connections()
	if err != nil {
		b.t.Fatal(err)
	}
	return c
}

// wantSlotHint requires the connection's hint to be bw, written for its gen.
func (b *replaceBench) wantSlotHint(bw uint32) {
	b.t.Helper()
	sl, err := b.seg.Slot(b.Slot)
	if err != nil {
		b.t.Fatal(err)
	}
	if !sl.Hint.Valid() || sl.Hint.SupBw != bw || sl.Hint.Gen != sl.Gen {
		b.t.Fatalf("slot %d (gen %d): expected hint %d but got %+v", b.Slot, sl.Gen, bw, sl.Hint)
	}
}

// TestStaticAfterSegmentReplaced: after SegmentReplaced the next Tick writes the class and
// peer defaults and the conns entry into the new segment, where the connection has the same
// slot and gen it had in the old one.
func TestStaticAfterSegmentReplaced(t *testing.T) {
	b := newReplaceBench(t, 16)
	wf := filepath.Join(t.TempDir(), "w.json")
	if err := os.WriteFile(wf, []byte(`{"class":{"intra":300},"peers":{"10.0.1.0/24":200},"conns":{"4242:7":700}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &Static{File: wf}
	if _, _, err := p.Tick(b.seg, b.conns()); err != nil {
		t.Fatal(err)
	}
	b.wantSlotHint(700)
	old := b.Slot
	b.replace(16, true)
	if b.Slot != old {
		t.Fatalf("the connection moved from slot %d to %d: the test needs the same slot and gen", old, b.Slot)
	}
	p.SegmentReplaced()
	if _, _, err := p.Tick(b.seg, b.conns()); err != nil {
		t.Fatal(err)
	}
	b.wantSlotHint(700)
	snap, err := b.seg.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if r := snap.Class[shm.IntraIsland]; !r.Valid() || r.SupBw != 300 {
		t.Errorf("class intra default not written again: %+v", r)
	}
	if len(snap.Peers) != 1 || !snap.Peers[0].Record.Valid() || snap.Peers[0].Record.SupBw != 200 {
		t.Errorf("peer default not written again: %+v", snap.Peers)
	}
}

// TestClosedLoopAfterSegmentReplaced: after SegmentReplaced the next Tick starts the
// connection again and writes its split into the new segment.
func TestClosedLoopAfterSegmentReplaced(t *testing.T) {
	b := newReplaceBench(t, 16)
	p := &ClosedLoop{}
	if _, err := p.Tick(b.seg, shm.Now(), b.conns()); err != nil {
		t.Fatal(err)
	}
	b.wantSlotHint(ClosedLoopStart)
	b.replace(16, true)
	p.SegmentReplaced()
	if _, err := p.Tick(b.seg, shm.Now(), b.conns()); err != nil {
		t.Fatal(err)
	}
	b.wantSlotHint(ClosedLoopStart)
}

// TestSlotBeyondReplacedSegmentIsGone: connections read from a segment that a smaller one
// replaced before the write name slots beyond it: the policies skip them (ErrSlotRange is
// Gone), they do not stop.
func TestSlotBeyondReplacedSegmentIsGone(t *testing.T) {
	b := newReplaceBench(t, 64)
	if b.Slot == 0 {
		t.Fatal("the test needs the connection beyond slot 0")
	}
	wf := filepath.Join(t.TempDir(), "w.json")
	if err := os.WriteFile(wf, []byte(`{"conns":{"4242:7":700}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	conns := b.conns()
	b.replace(1, false)
	if _, _, err := (&Static{File: wf}).Tick(b.seg, conns); err != nil {
		t.Errorf("static: %v", err)
	}
	if _, err := (&ClosedLoop{}).Tick(b.seg, shm.Now(), conns); err != nil {
		t.Errorf("closed-loop: %v", err)
	}
}
