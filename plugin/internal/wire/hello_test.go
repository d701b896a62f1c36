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
	if b[16] != 1 || b[17] != 1 || b[18] != 29 || !bytes.Equal(b[20:28], []byte{10, 9, 13, 1, 10, 9, 13, 3}) {
		t.Errorf("layout: bytes 16..27 % x", b[16:28])
	}
}

func TestHelloRejects(t *testing.T) {
	good := encodeHello(t, addressedHello())
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
		{"long", "hello of 29 bytes", good, func(b []byte) []byte { return append(b, 0) }},
		{"magic", "not an MPIB plugin", good, set(0, 'X')},
		{"version", "peer speaks version 3", good, set(4, 3)},
		{"reserved 6", "reserved bytes", good, set(6, 1)},
		{"reserved 19", "reserved bytes", good, set(19, 1)},
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
	}
	for _, h := range bad {
		if b, err := EncodeHello(h); err == nil {
			t.Errorf("EncodeHello(%+v) = % x", h, b)
		}
	}
}

func FuzzDecodeHello(f *testing.F) {
	for _, h := range []Hello{{Nonce: 7}, {Nonce: 7, Kind: PairUnaddressed}, addressedHello()} {
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
