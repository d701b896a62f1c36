package shm

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode: any byte string decodes or is refused with a validation code, never panics;
// a decoded segment re-encodes to an image that decodes to the same snapshot; resolution of
// any slot never panics.
func FuzzDecode(f *testing.F) {
	bins, _ := filepath.Glob(filepath.Join(vectorsDir, "*.bin"))
	for _, b := range bins {
		if data, err := os.ReadFile(b); err == nil {
			f.Add(data, uint32(0), uint64(hb))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, slot uint32, now uint64) {
		snap, err := Decode(b)
		if err != nil {
			if Code(err) == "" {
				t.Fatalf("error without a validation code: %v", err)
			}
			return
		}
		enc, err := Encode(snap)
		if err != nil {
			t.Fatalf("encode of a decoded segment: %v", err)
		}
		// Encoding drops reserved bytes, so an entry whose only non-zero bytes were reserved
		// disappears: decode(encode(x)) is a projection, and encoding it again is stable.
		again, err := Decode(enc)
		if err != nil {
			t.Fatalf("decode(encode(decode(b))): %v", err)
		}
		if enc2, err := Encode(again); err != nil || !bytes.Equal(enc2, enc) {
			t.Fatalf("encode(decode(encode(decode(b)))) differs from encode(decode(b)): %v", err)
		}
		if again.Header != snap.Header || again.Class != snap.Class || len(again.Slots) > len(snap.Slots) ||
			len(again.Peers) > len(snap.Peers) {
			t.Fatalf("decode(encode(decode(b))) lost more than reserved bytes")
		}
		for _, s := range []uint32{slot, slot % snap.Header.NSlots} {
			r, err := Resolve(b, s, now, stale)
			if err != nil || r.SupBw > SupBwMax || (!r.Applies && r.SupBw != 0) {
				t.Fatalf("resolve slot %d: %+v %v", s, r, err)
			}
		}
	})
}
