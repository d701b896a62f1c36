package shmfuzz

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/mpib/mpib/agent/go/shm"
)

const (
	hb    = 5_000_000_000
	stale = 500_000_000
)

// FuzzCReader: the C reader never crashes or reads outside the image on any bytes, and
// agrees with the Go decoder on every verdict: the same validation code, the same header and
// slot fields, the same resolution of any slot at any time. Seeds: every testdata/shm vector
// (plus testdata/fuzz/FuzzCReader). `go test` runs the seeds; `go run mage.go agent:fuzz` (part
// of test:unit) fuzzes briefly.
func FuzzCReader(f *testing.F) {
	bins, _ := filepath.Glob("../../../testdata/shm/*.bin")
	if len(bins) == 0 {
		f.Fatal("no vectors in testdata/shm")
	}
	for _, b := range bins {
		if data, err := os.ReadFile(b); err == nil {
			f.Add(data, uint32(0), uint64(hb), uint64(stale))
			f.Add(data, uint32(2), uint64(hb+stale+1), uint64(stale))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, slot uint32, now, staleNs uint64) {
		if got, want := ValidateCode(b), shm.Code(validateErr(b)); got != want {
			t.Fatalf("validate: C says %q, Go says %q", got, want)
		}
		im := Attach(b)
		defer im.Close()
		snap, err := shm.Decode(b)
		if got, want := im.Code(), shm.Code(err); got != want {
			t.Fatalf("attach: C says %q (%s), Go says %q", got, im.Err, want)
		}
		if err != nil {
			return
		}
		h, ok := im.DecodeHeader()
		gh := snap.Header
		if !ok || h != (Header{gh.Version, gh.NSlots, gh.NPeers, gh.Flags, gh.AgentPID, gh.PeersEpoch, gh.TotalSize,
			gh.HeartbeatNs, gh.CreatedNs}) {
			t.Fatalf("header: C %+v, Go %+v", h, gh)
		}
		for _, s := range snap.Slots {
			c, ok := im.DecodeSlot(s.Index)
			want := SlotFields{uint32(s.State), s.OwnerPID, s.Gen, uint32(s.PeerSoutIP), s.PID, s.Hint.Seq, s.Hint.SupBw,
				s.Hint.Flags, s.Hint.Gen, s.ConnID, s.Telemetry.SoutBytes, s.Telemetry.SupBytes, s.Telemetry.LastReadNs,
				uint8(s.PathClass), s.IsSend, s.Telemetry.AppliedSupBw, s.Telemetry.FlushWallNs, s.Telemetry.SoutCompletedBytes,
				s.Telemetry.SoutBusyNs, s.Telemetry.SupCompletedRequests, s.Telemetry.SupInflightBytes, s.Telemetry.SupActiveNs}
			if !ok || c != want {
				t.Fatalf("slot %d: C %+v, Go %+v", s.Index, c, want)
			}
		}
		if _, ok := im.DecodeSlot(gh.NSlots); ok {
			t.Fatalf("slot %d of %d decoded", gh.NSlots, gh.NSlots)
		}
		for _, s := range []uint32{slot, slot % gh.NSlots} {
			c := im.Resolve(s, now, staleNs)
			g, _ := shm.Resolve(b, s, now, staleNs)
			if c != (Resolution{g.Applies, g.SupBw, uint8(g.Source), g.Clamped}) {
				t.Fatalf("resolve slot %d now %d stale %d: C %+v, Go %+v", s, now, staleNs, c, g)
			}
			if c.SupBw > shm.SupBwMax || (!c.Applies && c.SupBw != 0) {
				t.Fatalf("resolve slot %d: %+v", s, c)
			}
		}
		if ok, bw := im.Exercise(uint64(slot), staleNs); ok == 1 && bw > shm.SupBwMax {
			t.Fatalf("read_hint: %d", bw)
		}
	})
}

func validateErr(b []byte) error {
	_, err := shm.Validate(b)
	return err
}

// TestVectorsThroughC is the seed run as a plain test: every vector through the C reader.
func TestVectorsThroughC(t *testing.T) {
	bins, _ := filepath.Glob("../../../testdata/shm/*.bin")
	valid := 0
	for _, p := range bins {
		b, _ := os.ReadFile(p)
		im := Attach(b)
		if im.Err == "" {
			valid++
		}
		im.Close()
	}
	if len(bins) < 10 || valid < 5 {
		t.Fatalf("%d vectors, %d valid", len(bins), valid)
	}
}
