package wire

import (
	"bytes"
	"errors"
	"net/netip"
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
	return m
}

func TestHandleRoundTrip(t *testing.T) {
	h := Handle{Addr: netip.MustParseAddrPort("10.0.1.11:40123"), Nonce: 0xdeadbeef01}
	b := make([]byte, HandleSize)
	EncodeHandle(b, h)
	if b[8] != 10 || b[11] != 11 || b[12] != 0x9c || b[13] != 0xbb {
		t.Fatalf("address bytes % x, want IPv4 at 8..11 and big-endian port at 12..13", b[8:14])
	}
	SetAttempt(b, 7)
	got, err := DecodeHandle(b)
	if err != nil || got != h || Attempt(b) != 7 {
		t.Fatalf("DecodeHandle = %+v, %v, attempt %d", got, err, Attempt(b))
	}
	// connect() in C finds the pending entry at bytes 32..39 (plugin/mpib_handoff.c).
	if idx, gen := Pending(b); idx != 0 || gen != 0 {
		t.Fatalf("a fresh handle names pending entry %d/%d", idx, gen)
	}
	SetPending(b, 0x01020304, 0x0a0b0c0d)
	if idx, gen := Pending(b); idx != 0x01020304 || gen != 0x0a0b0c0d || b[32] != 0x04 || b[39] != 0x0a {
		t.Fatalf("Pending = %#x/%#x, bytes 32..39 % x", idx, gen, b[32:40])
	}
	if got, err := DecodeHandle(b); err != nil || got != h {
		t.Fatalf("DecodeHandle with a pending entry = %+v, %v", got, err)
	}
}

func TestHandleRejects(t *testing.T) {
	good := make([]byte, HandleSize)
	EncodeHandle(good, Handle{Addr: netip.MustParseAddrPort("10.0.1.11:5000"), Nonce: 1})
	tests := []struct {
		name   string
		mutate func([]byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:64] }},
		{"magic", func(b []byte) []byte { b[0] ^= 0xff; return b }},
		{"version", func(b []byte) []byte { b[4] = 9; return b }},
		{"port 0", func(b []byte) []byte { b[12], b[13] = 0, 0; return b }},
		{"addr 0", func(b []byte) []byte { copy(b[8:12], []byte{0, 0, 0, 0}); return b }},
	}
	for _, tt := range tests {
		b := tt.mutate(bytes.Clone(good))
		if _, err := DecodeHandle(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", tt.name, err)
		}
	}
}

func TestHelloAndAck(t *testing.T) {
	n, err := DecodeHello(EncodeHello(42))
	if err != nil || n != 42 {
		t.Fatalf("hello round trip = %d, %v", n, err)
	}
	bad := EncodeHello(42)
	bad[1] ^= 1
	if _, err := DecodeHello(bad); !errors.Is(err, ErrMalformed) {
		t.Errorf("bad hello accepted: %v", err)
	}
	if err := CheckAck(EncodeAck()); err != nil {
		t.Error(err)
	}
	if err := CheckAck([]byte("GET ")); err == nil {
		t.Error("garbage ack accepted")
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

func FuzzDecodeHandle(f *testing.F) {
	b := make([]byte, HandleSize)
	EncodeHandle(b, Handle{Addr: netip.MustParseAddrPort("10.0.2.11:1234"), Nonce: 3})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHandle(b)
		if err != nil {
			return
		}
		out := make([]byte, HandleSize)
		EncodeHandle(out, h)
		if got, err := DecodeHandle(out); err != nil || got != h {
			t.Fatalf("accepted handle %+v does not survive a round trip", h)
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	f.Add(EncodeHello(7))
	f.Add(make([]byte, HelloSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		nonce, err := DecodeHello(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("refusal not marked malformed: %v", err)
			}
			return
		}
		if !bytes.Equal(EncodeHello(nonce), b) {
			t.Fatalf("accepted hello does not re-encode to the same bytes")
		}
	})
}

func FuzzCheckAck(f *testing.F) {
	f.Add(EncodeAck())
	f.Fuzz(func(t *testing.T, b []byte) {
		if CheckAck(b) == nil && !bytes.Equal(b, EncodeAck()) {
			t.Fatalf("accepted % x as an ack", b)
		}
	})
}
