package shm

import (
	"os"
	"path/filepath"
	"reflect"
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
		again, err := Decode(enc)
		if err != nil || !reflect.DeepEqual(again, snap) {
			t.Fatalf("decode(encode(decode(b))) differs: %v", err)
		}
		for _, s := range []uint32{slot, slot % snap.Header.NSlots} {
			r, err := Resolve(b, s, now, stale)
			if err != nil || r.SupBw > SupBwMax || (!r.Applies && r.SupBw != 0) {
				t.Fatalf("resolve slot %d: %+v %v", s, r, err)
			}
		}
	})
}
