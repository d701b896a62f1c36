package wire

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func addressedHello() Hello {
	return Hello{Nonce: 42, SupRelay: true, Kind: PairAddressed, Local: supAddr("10.9.13.1/29"), Peer: netip.MustParseAddr("10.9.13.3")}
}

// stripedHello: the lab's a2 -> a3 over both cables (docs/mesh.md).
func stripedHello() Hello {
	h := Hello{Nonce: 9, Kind: PairAddressed, Local: supAddr("10.9.23.2/24"), Peer: netip.MustParseAddr("10.9.23.3")}
	h.Stripe[0] = HelloPair{Local: supAddr("10.9.13.9/29"), Peer: netip.MustParseAddr("10.9.13.10")}
	return h
}

func encodeHello(t *testing.T, h Hello) []byte {
	t.Helper()
	b, err := EncodeHello(h)
	if err != nil {
		t.Fatalf("EncodeHello(%+v): %v", h, err)
	}
	return b
}

func TestHelloRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		h    Hello
	}{
		{"none", Hello{Nonce: 42}},
		{"none, relay", Hello{Nonce: 42, SupRelay: true}},
		{"unaddressed", Hello{Nonce: 1 << 63, Kind: PairUnaddressed}},
		{"addressed", addressedHello()},
		{"addressed /31", Hello{Nonce: 3, Kind: PairAddressed, Local: supAddr("10.9.200.0/31"), Peer: netip.MustParseAddr("10.9.200.1")}},
		{"striped, 2 pairs", stripedHello()},
		{"striped, 4 pairs", func() Hello {
			h := stripedHello()
			h.Stripe[1] = HelloPair{Local: supAddr("10.9.30.1/30"), Peer: netip.MustParseAddr("10.9.30.2")}
			h.Stripe[2] = HelloPair{Local: supAddr("10.9.31.1/31"), Peer: netip.MustParseAddr("10.9.31.0")}
			return h
		}()},
	}
	for _, tt := range tests {
		b := encodeHello(t, tt.h)
		if len(b) != HelloSize {
			t.Fatalf("%s: %d bytes, want %d", tt.name, len(b), HelloSize)
		}
		got, err := DecodeHello(b)
		if err != nil || got != tt.h {
			t.Errorf("%s: DecodeHello = %+v, %v; want %+v", tt.name, got, err, tt.h)
		}
	}
	b := encodeHello(t, addressedHello())
	if b[16] != 1 || b[17] != 1 || b[18] != 29 || b[19] != 1 || !bytes.Equal(b[20:28], []byte{10, 9, 13, 1, 10, 9, 13, 3}) || !allZero(b[28:]) {
		t.Errorf("layout: bytes 16.. % x", b[16:])
	}
	b = encodeHello(t, stripedHello())
	if b[19] != 2 || !bytes.Equal(b[28:40], []byte{29, 0, 0, 0, 10, 9, 13, 9, 10, 9, 13, 10}) || !allZero(b[40:]) {
		t.Errorf("striped layout: bytes 16.. % x", b[16:])
	}
	if n := stripedHello().Pairs(); n != 2 {
		t.Errorf("stripedHello().Pairs() = %d, want 2", n)
	}
}

func TestHelloRejects(t *testing.T) {
	good := encodeHello(t, addressedHello())
	striped := encodeHello(t, stripedHello())
	none := encodeHello(t, Hello{Nonce: 42})
	set := func(off int, v byte) func([]byte) []byte {
		return func(b []byte) []byte { b[off] = v; return b }
	}
	ip := func(off int, a string) func([]byte) []byte {
		return func(b []byte) []byte { x := netip.MustParseAddr(a).As4(); copy(b[off:], x[:]); return b }
	}
	tests := []struct {
		name, want string
		base       []byte
		mutate     func([]byte) []byte
	}{
		{"short (a version 3 hello)", "hello of 16 bytes", good, func(b []byte) []byte { return b[:16] }},
		{"long", "hello of 65 bytes", good, func(b []byte) []byte { return append(b, 0) }},
		{"a version 4 hello's size", "hello of 28 bytes", good, func(b []byte) []byte { return b[:28] }},
		{"magic", "not an MPIB plugin", good, set(0, 'X')},
		{"version", "peer speaks version 3", good, set(4, 3)},
		{"reserved 6", "reserved bytes", good, set(6, 1)},
		{"no pairs", "names 0 SUP pairs", good, set(19, 0)},
		{"5 pairs", "names 5 SUP pairs", good, set(19, 5)},
		{"a pair past the count", "after its 1 SUP pairs", good, set(32, 10)},
		{"count past the pairs", "SUP pair 2", good, set(19, 2)},
		{"striped reserved", "reserved bytes", striped, set(29, 1)},
		{"striped prefix /33", "SUP pair 2: connector's", striped, set(28, 33)},
		{"striped repeats the listener", "repeats an address", striped, ip(36, "10.9.23.3")},
		{"striped repeats the connector", "repeats an address", striped, ip(32, "10.9.23.2")},
		{"striped same address both sides", "on both sides", striped, ip(36, "10.9.13.9")},
		{"none with a count", "with pair kind none", none, set(19, 1)},
		{"none with a second pair", "with pair kind none", none, set(40, 1)},
		{"unknown flag", "unknown bits", good, set(16, 2)},
		{"pair kind 3", "pair kind 3", good, set(17, 3)},
		{"none with a prefix", "with pair kind none", none, set(18, 24)},
		{"none with an address", "with pair kind none", none, set(27, 1)},
		{"unaddressed with an address", "with pair kind unaddressed", set(17, 2)(bytes.Clone(none)), set(20, 10)},
		{"prefix /7", "prefix length 7", good, set(18, 7)},
		{"prefix /33", "prefix length 33", good, set(18, 33)},
		{"prefix /0", "prefix length 0", good, set(18, 0)},
		{"connector unspecified", "connector's SUP address 0.0.0.0", good, ip(20, "0.0.0.0")},
		{"connector multicast", "connector's", good, ip(20, "239.1.1.1")},
		{"connector subnet broadcast", "broadcast address", good, ip(20, "10.9.13.7")},
		{"listener unspecified", "listener's SUP address 0.0.0.0", good, ip(24, "0.0.0.0")},
		{"listener broadcast", "listener's", good, ip(24, "255.255.255.255")},
		{"listener loopback", "listener's", good, ip(24, "127.0.0.2")},
		{"same address both sides", "on both sides", good, ip(24, "10.9.13.1")},
	}
	for _, tt := range tests {
		b := tt.mutate(bytes.Clone(tt.base))
		_, err := DecodeHello(b)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want ErrMalformed saying %q", tt.name, err, tt.want)
		}
	}
}

func TestEncodeHelloRejects(t *testing.T) {
	bad := []Hello{
		{Kind: PairNone, Peer: netip.MustParseAddr("10.9.1.1")},
		{Kind: PairUnaddressed, Local: supAddr("10.9.1.1/24")},
		{Kind: PairAddressed, Local: supAddr("10.9.1.1/24")}, // no listener address
		{Kind: PairAddressed, Local: SupAddr{netip.MustParseAddr("fd00::1"), 64}, Peer: netip.MustParseAddr("10.9.1.2")},
		{Kind: 7},
		{Kind: PairNone, Stripe: stripedHello().Stripe},
		func() Hello { h := stripedHello(); h.Stripe[1] = h.Stripe[0]; return h }(),                           // a repeated pair
		func() Hello { h := stripedHello(); h.Stripe[1], h.Stripe[0] = h.Stripe[0], HelloPair{}; return h }(), // a gap
	}
	for _, h := range bad {
		if b, err := EncodeHello(h); err == nil {
			t.Errorf("EncodeHello(%+v) = % x", h, b)
		}
	}
}

func FuzzDecodeHello(f *testing.F) {
	for _, h := range []Hello{{Nonce: 7}, {Nonce: 7, Kind: PairUnaddressed}, addressedHello(), stripedHello()} {
		b, _ := EncodeHello(h)
		f.Add(b)
	}
	f.Add(make([]byte, HelloSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHello(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("refusal not marked malformed: %v", err)
			}
			return
		}
		out, err := EncodeHello(h)
		if err != nil || !bytes.Equal(out, b) {
			t.Fatalf("accepted hello does not re-encode to the same bytes (%v)", err)
		}
	})
}
