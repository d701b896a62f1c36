package wire

import (
	"bytes"
	"errors"
	"testing"
)

func sampleMetadata() Metadata {
	m := Metadata{Mode: 1, PathClass: 0, TC: 106, SL: 3, NQPs: [2]uint32{2, 3}, BufAddr: 0x7f0012345000}
	for r := range m.Rail {
		m.Rail[r].GID[10], m.Rail[r].GID[11], m.Rail[r].GID[15] = 0xff, 0xff, byte(r+1)
		m.Rail[r].MTU = 3
		m.Rail[r].RKey = 0x1000 + uint32(r)
		m.Rail[r].LID = uint16(0x20 + r)
		m.Rail[r].LinkLayer = LinkLayerEthernet - uint8(r) // SOUT RoCE, SUP InfiniBand
		m.Rail[r].PrefixLen = 24
		m.Rail[r].ECE = ECE{Valid: r == 0, VendorID: 0x15b3, Options: 0x10000000, CompMask: 1}
		for q := 0; q < int(m.NQPs[r]); q++ {
			m.Rail[r].QPN[q] = uint32(100*r + q + 17)
		}
	}
	// SUP striped over two cables: the second lane's facts.
	m.SupLanes = 2
	m.Lane[0] = LaneInfo{MTU: 3, RKey: 0x2002, LinkLayer: LinkLayerEthernet, PrefixLen: 29}
	m.Lane[0].GID[10], m.Lane[0].GID[11], m.Lane[0].GID[15] = 0xff, 0xff, 9
	return m
}

// laneOff is where the striped lanes start in the encoding.
const laneOff = 28 + Rails*railSize + 4

func TestAck(t *testing.T) {
	for _, joinNow := range []bool{false, true} {
		got, err := CheckAck(EncodeAck(joinNow))
		if err != nil || got != joinNow {
			t.Errorf("EncodeAck(%v) read back as %v, %v", joinNow, got, err)
		}
	}
	bad := map[string][]byte{
		"garbage":       []byte("GET HTTP"),
		"version 5 ack": EncodeAck(false)[:4],
		"unknown flag":  append(EncodeAck(false)[:4], 2, 0, 0, 0),
		"reserved byte": append(EncodeAck(true)[:5], 0, 1, 0),
	}
	for name, b := range bad {
		if _, err := CheckAck(b); err == nil {
			t.Errorf("%s (% x) accepted as an ack", name, b)
		}
	}
}

func TestMetadataDeferred(t *testing.T) {
	m := sampleMetadata()
	m.Deferred = 1
	got, err := DecodeMetadata(EncodeMetadata(m))
	if err != nil || got.Deferred != 1 {
		t.Fatalf("a deferred SOUT rail read back as %d, %v", got.Deferred, err)
	}
	for name, mut := range map[string]func(*Metadata){
		"SUP deferred":              func(m *Metadata) { m.Deferred = 2 },
		"SOUT deferred without SUP": func(m *Metadata) { m.NQPs[1], m.SupLanes, m.Lane = 0, 0, [MaxPairs - 1]LaneInfo{} },
	} {
		bad := sampleMetadata()
		bad.Deferred = 1
		mut(&bad)
		if _, err := DecodeMetadata(EncodeMetadata(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	m := sampleMetadata()
	b := EncodeMetadata(m)
	if len(b) != MetadataSize {
		t.Fatalf("encoded %d bytes, want %d", len(b), MetadataSize)
	}
	got, err := DecodeMetadata(b)
	if err != nil || got != m {
		t.Fatalf("round trip:\n got %+v %v\nwant %+v", got, err, m)
	}
}

func TestMetadataRejects(t *testing.T) {
	good := EncodeMetadata(sampleMetadata())
	tests := []struct {
		name string
		off  int
		val  byte
	}{
		{"magic", 0, 0}, {"version", 4, 1}, {"size", 6, 1}, {"mode", 8, 2}, {"path", 9, 7},
		{"service level", 11, 16}, {"too many SOUT QPs", 12, 17}, {"too many SUP QPs", 16, 200},
		{"no SOUT QPs", 12, 0}, {"MTU code", 28 + 16, 9}, {"link layer", 28 + 26, 3},
		{"ECE flag", 28 + 28, 2}, {"prefix length", 28 + 27, 129},
		{"no SUP lanes with SUP QPs", laneOff - 4, 0}, {"5 SUP lanes", laneOff - 4, 5},
		{"more lanes than SUP QPs", laneOff - 4, 4}, {"reserved after the rails", laneOff - 2, 1}, {"SUP deferred", laneOff - 3, 2},
		{"lane MTU code", laneOff + 16, 9}, {"lane link layer", laneOff + 26, 0}, {"lane prefix", laneOff + 27, 129},
		{"a lane past the count", laneOff + laneSize + 20, 1},
	}
	for _, tt := range tests {
		b := bytes.Clone(good)
		b[tt.off] = tt.val
		if _, err := DecodeMetadata(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", tt.name, err)
		}
	}
	if _, err := DecodeMetadata(good[:100]); !errors.Is(err, ErrMalformed) {
		t.Errorf("short metadata: %v", err)
	}
	noSup := sampleMetadata()
	noSup.NQPs[1], noSup.Rail[1], noSup.Lane, noSup.SupLanes = 0, RailInfo{}, [MaxPairs - 1]LaneInfo{}, 1
	if _, err := DecodeMetadata(EncodeMetadata(noSup)); !errors.Is(err, ErrMalformed) {
		t.Errorf("a SUP lane without SUP QPs: %v", err)
	}
	noSup.SupLanes = 0
	if _, err := DecodeMetadata(EncodeMetadata(noSup)); err != nil {
		t.Errorf("no SUP at all: %v", err)
	}
}

func FuzzDecodeMetadata(f *testing.F) {
	f.Add(EncodeMetadata(sampleMetadata()))
	f.Add(make([]byte, MetadataSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMetadata(b)
		if err != nil {
			return
		}
		if !bytes.Equal(EncodeMetadata(m), b) {
			t.Fatalf("accepted metadata does not re-encode to the same bytes")
		}
	})
}

func FuzzCheckAck(f *testing.F) {
	f.Add(EncodeAck(false))
	f.Add(EncodeAck(true))
	f.Fuzz(func(t *testing.T, b []byte) {
		if joinNow, err := CheckAck(b); err == nil && !bytes.Equal(b, EncodeAck(joinNow)) {
			t.Fatalf("accepted % x as an ack", b)
		}
	})
}
