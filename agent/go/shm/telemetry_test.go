package shm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

func TestRates(t *testing.T) {
	sl := func(i, gen uint32, sout, sup uint64) Slot {
		return Slot{Index: i, Gen: gen, Telemetry: Telemetry{SoutBytes: sout, SupBytes: sup, SoutRequests: sout / 100, SupRequests: sup / 100}}
	}
	a := NewSample(1e9, []Slot{sl(0, 1, 0, 0), sl(1, 1, 1000, 0), sl(2, 1, 0, 0)})
	b := NewSample(3e9, []Slot{sl(0, 1, 2000, 6000), sl(1, 2, 10, 10), sl(3, 1, 5, 5)})
	got := Rates(a, b)
	if len(got) != 1 || got[0].Slot.Index != 0 {
		t.Fatalf("expected only slot 0 (same gen in both samples) but got %+v", got)
	}
	r := got[0]
	if r.SoutBps != 1000 || r.SupBps != 3000 || r.SupShare() != 0.75 || r.SupReqPerSec != 30 {
		t.Fatalf("rates: %+v share %v", r, r.SupShare())
	}
	if Rates(b, a) != nil {
		t.Fatal("reversed samples must give nothing")
	}
}

// TestRailStateDecode sets the rail-state bytes of a slot at the spec's offsets (4.3:
// +208 sout_state u8, +209 sup_state u8, +212 failovers u32, +216 sout_state_ns u64,
// +224 sup_state_ns u64) by hand and checks the decoding, the JSON (strings for the states,
// "unknown(N)" for values the spec does not name) and the re-encoding.
func TestRailStateDecode(t *testing.T) {
	b, err := Encode(base())
	if err != nil {
		t.Fatal(err)
	}
	put := func(slot uint32, rel int, v uint64, size int) {
		for k := 0; k < size; k++ {
			b[HeaderSize+int(slot)*SlotSize+rel+k] = byte(v >> (8 * k))
		}
	}
	put(1, 0, uint64(StateActive)|4242<<32, 8)
	put(1, 208, 1, 1) // sout down
	put(1, 209, 2, 1) // sup failed
	put(1, 212, 5, 4)
	put(1, 216, 1_763_856_000_000_000_001, 8)
	put(1, 224, 0xFFFFFFFFFFFFFFFE, 8)
	put(2, 208, 3, 1)   // unknown
	put(2, 209, 255, 1) // unknown
	put(2, 212, 0xFFFFFFFF, 4)
	snap, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Slots) != 2 {
		t.Fatalf("expected slots 1 and 2 but got %+v", snap.Slots)
	}
	want1 := Telemetry{SoutState: RailDown, SupState: RailFailed, Failovers: 5,
		SoutStateNs: 1_763_856_000_000_000_001, SupStateNs: 0xFFFFFFFFFFFFFFFE}
	want2 := Telemetry{SoutState: RailState(3), SupState: RailState(255), Failovers: 0xFFFFFFFF}
	if snap.Slots[0].Telemetry != want1 || snap.Slots[1].Telemetry != want2 {
		t.Fatalf("expected %+v and %+v but got %+v and %+v", want1, want2, snap.Slots[0].Telemetry, snap.Slots[1].Telemetry)
	}
	js, err := json.Marshal(snap.Slots[1].Telemetry)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`"sout_state":"unknown(3)"`, `"sup_state":"unknown(255)"`, `"failovers":4294967295`,
		`"sout_state_ns":0`, `"sup_state_ns":0`} {
		if !strings.Contains(string(js), f) {
			t.Errorf("JSON lacks %s: %s", f, js)
		}
	}
	js, _ = json.Marshal(snap.Slots[0].Telemetry)
	for _, f := range []string{`"sout_state":"down"`, `"sup_state":"failed"`, `"failovers":5`,
		`"sout_state_ns":1763856000000000001`, `"sup_state_ns":18446744073709551614`} {
		if !strings.Contains(string(js), f) {
			t.Errorf("JSON lacks %s: %s", f, js)
		}
	}
	var back Snapshot
	js, _ = json.Marshal(snap)
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	enc, err := Encode(&back)
	if err != nil || !bytes.Equal(enc, b) {
		t.Fatalf("JSON round trip does not re-encode the image (err %v)", err)
	}
}

func TestRailStateNames(t *testing.T) {
	for v := 0; v < 256; v++ {
		r := RailState(v)
		got, err := ParseRailState(r.String())
		if err != nil || got != r {
			t.Fatalf("%d: %q parses to %v, %v", v, r.String(), got, err)
		}
	}
	if RailUp.String() != "up" || RailDown.String() != "down" || RailFailed.String() != "failed" ||
		RailState(9).String() != "unknown(9)" {
		t.Fatal("rail state names")
	}
	for _, s := range []string{"", "UP", "unknown(1)", "unknown(256)", "unknown(07)", "unknown(-1)", "unknown(9", "unknown()"} {
		if _, err := ParseRailState(s); err == nil {
			t.Errorf("%q must be refused", s)
		}
	}
	var r RailState
	if err := json.Unmarshal([]byte(`"sideways"`), &r); err == nil {
		t.Error("an unknown rail state name must not unmarshal")
	}
}

// TestCompletionDecode writes the completion telemetry at the spec's offsets (4.3: +232
// applied_sup_bw u32, +240 flush_wall_ns u64, +256.. SOUT then +288.. SUP: completed_bytes,
// completed_requests, inflight_bytes, busy_ns, u64 each) by hand and checks the decoding, the
// JSON names and the re-encoding.
func TestCompletionDecode(t *testing.T) {
	b, err := Encode(base())
	if err != nil {
		t.Fatal(err)
	}
	put := func(rel int, v uint64, size int) {
		for k := 0; k < size; k++ {
			b[HeaderSize+2*SlotSize+rel+k] = byte(v >> (8 * k))
		}
	}
	put(232, 700, 4)
	put(240, 1_763_856_000_000_000_003, 8)
	for i, v := range []uint64{11, 12, 13, 14, 21, 22, 23, 0xFFFFFFFFFFFFFFFF} {
		put(256+8*i, v, 8)
	}
	put(SlotSize-1, 0, 1) // the last byte of the slot is inside the segment
	snap, err := Decode(b)
	if err != nil || len(snap.Slots) != 1 || snap.Slots[0].Index != 2 {
		t.Fatalf("expected slot 2 but got %+v (%v)", snap, err)
	}
	want := Telemetry{AppliedSupBw: 700, FlushWallNs: 1_763_856_000_000_000_003,
		SoutCompletedBytes: 11, SoutCompletedRequests: 12, SoutInflightBytes: 13, SoutBusyNs: 14,
		SupCompletedBytes: 21, SupCompletedRequests: 22, SupInflightBytes: 23, SupBusyNs: 0xFFFFFFFFFFFFFFFF}
	if got := snap.Slots[0].Telemetry; got != want {
		t.Fatalf("expected %+v but got %+v", want, got)
	}
	js, _ := json.Marshal(want)
	for _, f := range []string{`"applied_sup_bw":700`, `"flush_wall_ns":1763856000000000003`, `"sout_completed_bytes":11`,
		`"sout_completed_requests":12`, `"sout_inflight_bytes":13`, `"sout_busy_ns":14`, `"sup_completed_bytes":21`,
		`"sup_completed_requests":22`, `"sup_inflight_bytes":23`, `"sup_busy_ns":18446744073709551615`} {
		if !strings.Contains(string(js), f) {
			t.Errorf("JSON lacks %s: %s", f, js)
		}
	}
	enc, err := Encode(snap)
	if err != nil || !bytes.Equal(enc, b) {
		t.Fatalf("re-encoding differs (err %v)", err)
	}
}

// TestCompletionRates derives per-rail completed throughput and mean completion latency from
// two samples: Δcompleted_bytes/Δt and Δbusy_ns/Δcompleted_requests.
func TestCompletionRates(t *testing.T) {
	sl := func(done, reqs, busy uint64) Slot {
		return Slot{Index: 0, Gen: 1, Telemetry: Telemetry{SupCompletedBytes: done, SupCompletedRequests: reqs, SupBusyNs: busy,
			SoutCompletedBytes: done / 2}}
	}
	a := NewSample(1e9, []Slot{sl(1000, 10, 50_000)})
	b := NewSample(3e9, []Slot{sl(9000, 14, 90_000)})
	r := Rates(a, b)
	if len(r) != 1 || r[0].SupCompletedBps != 4000 || r[0].SoutCompletedBps != 2000 || r[0].SupLatencyNs != 10_000 ||
		r[0].SoutLatencyNs != 0 {
		t.Fatalf("completion rates: %+v", r)
	}
}

// TestVersionMessage: a segment of another version is refused with a message that says
// which side is older (versions 2 and 3 predate this reader; 5 comes from a newer agent).
func TestVersionMessage(t *testing.T) {
	for ver, want := range map[uint32]string{2: "older agent", Version - 1: "older agent", Version + 1: "newer agent"} {
		b, _ := Encode(base())
		wire.View{B: b}.Put32(wire.OffVersion, ver)
		_, err := Decode(b)
		if Code(err) != "bad_version" || !strings.Contains(err.Error(), want) ||
			!strings.Contains(err.Error(), fmt.Sprintf("implements %d", Version)) {
			t.Errorf("version %d: %v, want bad_version saying %q", ver, err, want)
		}
	}
}

// TestNICName: the name rule of spec 4.3 (the vectors carry only names that round-trip).
func TestNICName(t *testing.T) {
	pad := func(s string) []byte { b := make([]byte, NICNameSize); copy(b, s); return b }
	full := bytes.Repeat([]byte{'a'}, NICNameSize)
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"plain", pad("mlx5_0"), "mlx5_0"},
		{"23 bytes", pad("rocep65s0f0_long_name_x"), "rocep65s0f0_long_name_x"},
		{"24 bytes, no NUL", full, string(full)},
		{"bytes after the NUL are ignored", append(pad("ib0")[:4], pad("junk")[:20]...), "ib0"},
		{"control, space, DEL and non-ASCII bytes", pad("a\nb c\x7f\xffd\""), "a?b?c??d\""},
		{"empty", pad(""), ""},
	} {
		if got := NICName(tc.in); got != tc.want {
			t.Errorf("%s: NICName(%q) = %q, want %q", tc.name, tc.in, got, tc.want)
		}
	}
	b := make([]byte, NICNameSize+2)
	b[NICNameSize] = 0x55
	wire.View{B: b}.PutNICName(0, "a_name_longer_than_the_24_byte_field")
	if got := NICName(b[:NICNameSize]); got != "a_name_longer_than_the_" || b[NICNameSize-1] != 0 || b[NICNameSize] != 0x55 {
		t.Errorf("a long name is cut to %d bytes and NUL-ended inside its field: %q % x", NICNameSize-1, got, b)
	}
}
