package wire

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func supAddr(cidr string) SupAddr {
	p := netip.MustParsePrefix(cidr)
	return SupAddr{Addr: p.Addr(), Bits: uint8(p.Bits())}
}

func sampleHandle(sup ...string) Handle {
	h := Handle{Addr: netip.MustParseAddrPort("10.0.1.11:40123"), Nonce: 0xdeadbeef01}
	addrs := make([]SupAddr, len(sup))
	for i, s := range sup {
		addrs[i] = supAddr(s)
	}
	h.SetSupAddrs(addrs)
	return h
}

func encodeHandle(t *testing.T, h Handle) []byte {
	t.Helper()
	b := make([]byte, HandleSize)
	if err := EncodeHandle(b, h); err != nil {
		t.Fatalf("EncodeHandle(%+v): %v", h, err)
	}
	return b
}

func TestHandleRoundTrip(t *testing.T) {
	full := sampleHandle("10.9.1.1/24", "10.9.13.1/29", "10.9.200.0/31", "10.9.200.3/32", "10.0.0.1/8",
		"10.9.0.255/23", "10.9.2.0/24", "192.168.7.9/30")
	relay := sampleHandle("10.9.112.1/24")
	relay.SupRelay = true
	tests := []struct {
		name string
		h    Handle
	}{
		{"no SUP address", sampleHandle()},
		{"one SUP address (today's device)", sampleHandle("10.9.1.11/24")},
		{"relay", relay},
		{"unaddressed (InfiniBand)", Handle{Addr: netip.MustParseAddrPort("10.0.1.11:5000"), Nonce: 9, SupUnaddressed: true}},
		{"eight addresses: /8 to /32, a network address, a /23's .255", full},
	}
	for _, tt := range tests {
		b := encodeHandle(t, tt.h)
		SetAttempt(b, 7)
		got, err := DecodeHandle(b)
		if err != nil || got != tt.h || Attempt(b) != 7 {
			t.Errorf("%s: DecodeHandle = %+v, %v, attempt %d; want %+v", tt.name, got, err, Attempt(b), tt.h)
		}
	}
}

// The byte positions other code relies on: C's connect() (plugin/mpib_handoff.c) keys on bytes
// 0..23 and keeps its state at 24..39; nettest's hostile modes read 8..13 and 41.
func TestHandleLayout(t *testing.T) {
	h := sampleHandle("10.9.1.11/24", "10.9.13.3/29")
	h.SupRelay = true
	b := encodeHandle(t, h)
	if b[8] != 10 || b[11] != 11 || b[12] != 0x9c || b[13] != 0xbb {
		t.Fatalf("address bytes % x, want IPv4 at 8..11 and big-endian port at 12..13", b[8:14])
	}
	if b[40] != 2 || b[41] != 1 || !bytes.Equal(b[48:53], []byte{10, 9, 1, 11, 24}) || !bytes.Equal(b[56:61], []byte{10, 9, 13, 3, 29}) {
		t.Fatalf("SUP bytes 40..63: % x", b[40:64])
	}
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
	if !h.HasSupAddr(netip.MustParseAddr("10.9.13.3")) || h.HasSupAddr(netip.MustParseAddr("10.9.13.4")) {
		t.Error("HasSupAddr")
	}
}

func TestHandleRejects(t *testing.T) {
	good := encodeHandle(t, sampleHandle("10.9.1.11/24", "10.9.13.3/29"))
	entry := func(i int, cidr string) func([]byte) []byte {
		return func(b []byte) []byte {
			a := supAddr(cidr)
			ip := a.Addr.As4()
			copy(b[48+8*i:], ip[:])
			b[48+8*i+4] = a.Bits
			return b
		}
	}
	set := func(off int, v byte) func([]byte) []byte {
		return func(b []byte) []byte { b[off] = v; return b }
	}
	tests := []struct {
		name, want string // want: a part of the message
		mutate     func([]byte) []byte
	}{
		{"short", "handle of 64 bytes", func(b []byte) []byte { return b[:64] }},
		{"magic", "not an MPIB handle", set(0, 0)},
		{"version 3 (before SUP addresses)", "handle version 3", set(4, 3)},
		{"port 0", "handle address", func(b []byte) []byte { b[12], b[13] = 0, 0; return b }},
		{"addr 0", "handle address", func(b []byte) []byte { copy(b[8:12], []byte{0, 0, 0, 0}); return b }},
		{"reserved after version", "byte 6", set(6, 1)},
		{"reserved after port", "byte 15", set(15, 1)},
		{"reserved after flags", "byte 43", set(43, 1)},
		{"reserved before the entries", "byte 45", set(45, 1)},
		{"reserved tail", "byte 127", set(127, 1)},
		{"count 9", "9 SUP addresses, at most 8", set(40, 9)},
		{"count 255", "255 SUP addresses", set(40, 255)},
		{"unknown flag", "unknown bits", set(41, 4)},
		{"unaddressed with addresses", "unaddressed yet 2", set(41, 2)},
		{"entry beyond the count", "entry 2 beyond the count", entry(2, "10.9.2.1/24")},
		{"count beyond the entries", "SUP entry 2", set(40, 3)},
		{"entry reserved byte", "entry 1 has reserved bytes", set(48+8+6, 1)},
		{"prefix /0", "prefix length 0 is outside /8../32", set(48+4, 0)},
		{"prefix /7", "prefix length 7", set(48+4, 7)},
		{"prefix /33", "prefix length 33", set(48+4, 33)},
		{"unspecified", "not a unicast host address", entry(0, "0.0.0.0/24")},
		{"multicast", "not a unicast host address", entry(0, "224.0.0.5/24")},
		{"limited broadcast", "not a unicast host address", entry(0, "255.255.255.255/32")},
		{"loopback", "not a unicast host address", entry(1, "127.0.0.1/8")},
		{"subnet broadcast /24", "broadcast address", entry(0, "10.9.1.255/24")},
		{"subnet broadcast /29", "broadcast address", entry(1, "10.9.13.7/29")},
		{"subnet broadcast /30", "broadcast address", entry(1, "10.9.13.3/30")},
		{"repeated address", "10.9.1.11 named twice", entry(1, "10.9.1.11/29")},
	}
	for _, tt := range tests {
		b := tt.mutate(bytes.Clone(good))
		_, err := DecodeHandle(b)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want ErrMalformed saying %q", tt.name, err, tt.want)
		}
	}
	// The connector's bookkeeping (bytes 24..39) is never validated.
	b := bytes.Clone(good)
	for i := 24; i < 40; i++ {
		b[i] = 0xff
	}
	if _, err := DecodeHandle(b); err != nil {
		t.Errorf("bookkeeping bytes refused: %v", err)
	}
}

// EncodeHandle refuses what DecodeHandle would: a listener never publishes a handle its
// peers refuse.
func TestEncodeHandleRejects(t *testing.T) {
	unaddressed := sampleHandle("10.9.1.1/24")
	unaddressed.SupUnaddressed = true
	tests := []struct {
		name string
		h    Handle
	}{
		{"IPv6", Handle{NSup: 1, Sup: [MaxSupAddrs]SupAddr{{netip.MustParseAddr("fd00::1"), 64}}}},
		{"prefix /4", sampleHandle("10.9.1.1/4")},
		{"broadcast", sampleHandle("10.9.1.255/24")},
		{"repeated", sampleHandle("10.9.1.1/24", "10.9.1.1/29")},
		{"count beyond the array", Handle{NSup: MaxSupAddrs + 1}},
		{"unaddressed with an address", unaddressed},
	}
	for _, tt := range tests {
		b := make([]byte, HandleSize)
		if err := EncodeHandle(b, tt.h); err == nil {
			t.Errorf("%s: encoded % x", tt.name, b[40:64])
		}
	}
}

func FuzzDecodeHandle(f *testing.F) {
	b := make([]byte, HandleSize)
	EncodeHandle(b, Handle{Addr: netip.MustParseAddrPort("10.0.2.11:1234"), Nonce: 3})
	f.Add(bytes.Clone(b))
	relay := sampleHandle("10.9.1.11/24", "10.9.13.3/29", "10.9.200.1/31")
	relay.SupRelay = true
	EncodeHandle(b, relay)
	f.Add(bytes.Clone(b))
	EncodeHandle(b, Handle{Addr: netip.MustParseAddrPort("10.0.2.11:1234"), Nonce: 3, SupUnaddressed: true})
	f.Add(bytes.Clone(b))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHandle(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("refusal not marked malformed: %v", err)
			}
			return
		}
		// Canonical: everything but the connector's bookkeeping (24..39) re-encodes the same.
		out := make([]byte, HandleSize)
		if err := EncodeHandle(out, h); err != nil {
			t.Fatalf("accepted handle %+v does not encode: %v", h, err)
		}
		copy(out[24:40], b[24:40])
		if !bytes.Equal(out, b[:HandleSize]) {
			t.Fatalf("accepted handle does not re-encode to the same bytes:\n got % x\nwant % x", out, b[:HandleSize])
		}
	})
}
