package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// The hello is the connecting side's first message on the control socket: it names the
// listener it expects (the handle's nonce), says the connector's MPIB_SUP_RELAY and the SUP
// pair(s) the connector chose, before either side builds a SUP QP: one pair, or up to
// MaxPairs direct pairs (parallel cables to the peer) that the SUP rail stripes over.
//
// Layout (HelloSize bytes):
//
//	0   magic u32 | version u16 | reserved u16
//	8   listener nonce u64
//	16  flags u8 (bit 0: the connector's MPIB_SUP_RELAY) | pair kind u8 |
//	    connector's prefix length u8 | pairs u8 (1..MaxPairs for PairAddressed, else 0)
//	20  connector's SUP IPv4 [4] | listener's SUP IPv4 [4] (network order)
//	28  pairs 2..MaxPairs: connector's prefix length u8 | reserved [3] |
//	    connector's SUP IPv4 [4] | listener's SUP IPv4 [4] (12 bytes each; zero when absent)
//
// For PairNone and PairUnaddressed the prefix, the count and every address are zero.
const HelloSize = 28 + (MaxPairs-1)*helloPairSize

// MaxPairs is how many SUP pairs one connection stripes over at most.
const MaxPairs = 4

const helloPairSize = 12

// PairKind is what the connector decided for SUP.
type PairKind uint8

const (
	// PairNone: no SUP QP on this connection; SOUT carries data and CTS.
	PairNone PairKind = iota
	// PairAddressed: SUP QPs between the two named addresses (a direct cable, or routed
	// through the fabric with MPIB_SUP_RELAY=1).
	PairAddressed
	// PairUnaddressed: a side's SUP port has no IPv4 address and prefix to name (InfiniBand,
	// an IPv6 GID, an address with no known prefix): SUP QPs on the one SUP port as before
	// version 4, whose metadata rule (gid.SupReachable) may still drop them.
	PairUnaddressed
	maxPairKind = PairUnaddressed
)

func (k PairKind) String() string {
	switch k {
	case PairNone:
		return "none"
	case PairAddressed:
		return "addressed"
	case PairUnaddressed:
		return "unaddressed"
	}
	return fmt.Sprintf("kind %d", uint8(k))
}

// Hello is the connector's first message.
type Hello struct {
	Nonce    uint64 // the listener the connector expects
	SupRelay bool   // the connector's MPIB_SUP_RELAY
	Kind     PairKind
	Local    SupAddr    // PairAddressed: the connector's SUP address and its prefix
	Peer     netip.Addr // PairAddressed: the listener's SUP address, one its handle advertised
	// PairAddressed, striping: pairs 2.. (zero values after the last), each with its own
	// ports on both sides.
	Stripe [MaxPairs - 1]HelloPair
}

// HelloPair is one further SUP pair of a striped connection.
type HelloPair struct {
	Local SupAddr
	Peer  netip.Addr
}

// Pairs is how many SUP pairs the hello names.
func (h Hello) Pairs() int {
	if h.Kind != PairAddressed {
		return 0
	}
	n := 1
	for _, p := range h.Stripe {
		if p == (HelloPair{}) {
			break
		}
		n++
	}
	return n
}

// EncodeHello serializes h; it refuses a hello DecodeHello would refuse.
func EncodeHello(h Hello) ([]byte, error) {
	if err := checkHello(h); err != nil {
		return nil, err
	}
	b := make([]byte, HelloSize)
	binary.LittleEndian.PutUint32(b, helloMagic)
	binary.LittleEndian.PutUint16(b[4:], Version)
	binary.LittleEndian.PutUint64(b[8:], h.Nonce)
	if h.SupRelay {
		b[16] = flagRelay
	}
	b[17] = byte(h.Kind)
	if h.Kind == PairAddressed {
		b[18], b[19] = h.Local.Bits, byte(h.Pairs())
		putPair(b[20:28], h.Local, h.Peer)
		for i, p := range h.Stripe[:h.Pairs()-1] {
			off := 28 + i*helloPairSize
			b[off] = p.Local.Bits
			putPair(b[off+4:off+12], p.Local, p.Peer)
		}
	}
	return b, nil
}

func putPair(b []byte, local SupAddr, peer netip.Addr) {
	l, p := local.Addr.As4(), peer.As4()
	copy(b[0:4], l[:])
	copy(b[4:8], p[:])
}

// DecodeHello validates a hello. The caller checks the nonce, the relay flag against its own
// and that the named listener address is one of its handle's (Handle.HasSupAddr).
func DecodeHello(b []byte) (Hello, error) {
	if len(b) != HelloSize {
		return Hello{}, fmt.Errorf("%w: hello of %d bytes, want %d", ErrMalformed, len(b), HelloSize)
	}
	if m := binary.LittleEndian.Uint32(b); m != helloMagic {
		return Hello{}, fmt.Errorf("%w: hello magic %#08x (the peer is not an MPIB plugin)", ErrMalformed, m)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != Version {
		return Hello{}, fmt.Errorf("%w: peer speaks version %d, this plugin %d (is every rank using the same plugin?)", ErrVersion, v, Version)
	}
	if r := binary.LittleEndian.Uint16(b[6:]); r != 0 {
		return Hello{}, fmt.Errorf("%w: hello with reserved bytes % x (not an MPIB plugin of this version)", ErrMalformed, b[6:8])
	}
	if b[16]&^flagRelay != 0 {
		return Hello{}, fmt.Errorf("%w: hello flags %#02x, unknown bits set", ErrMalformed, b[16])
	}
	h := Hello{Nonce: binary.LittleEndian.Uint64(b[8:]), SupRelay: b[16]&flagRelay != 0, Kind: PairKind(b[17])}
	if h.Kind > maxPairKind {
		return Hello{}, fmt.Errorf("%w: hello SUP pair kind %d", ErrMalformed, b[17])
	}
	if h.Kind != PairAddressed {
		if !allZero(b[18:]) {
			return Hello{}, fmt.Errorf("%w: hello names SUP addresses with pair kind %v", ErrMalformed, h.Kind)
		}
		return h, nil
	}
	n := int(b[19])
	if n < 1 || n > MaxPairs {
		return Hello{}, fmt.Errorf("%w: hello names %d SUP pairs (1..%d)", ErrMalformed, n, MaxPairs)
	}
	h.Local = SupAddr{Addr: netip.AddrFrom4([4]byte(b[20:24])), Bits: b[18]}
	h.Peer = netip.AddrFrom4([4]byte(b[24:28]))
	for i := range h.Stripe {
		off := 28 + i*helloPairSize
		e := b[off : off+helloPairSize]
		if i+1 >= n {
			if !allZero(e) {
				return Hello{}, fmt.Errorf("%w: hello bytes after its %d SUP pairs are not zero: % x", ErrMalformed, n, e)
			}
			continue
		}
		if !allZero(e[1:4]) {
			return Hello{}, fmt.Errorf("%w: hello with reserved bytes % x in SUP pair %d", ErrMalformed, e[1:4], i+2)
		}
		h.Stripe[i] = HelloPair{Local: SupAddr{Addr: netip.AddrFrom4([4]byte(e[4:8])), Bits: e[0]}, Peer: netip.AddrFrom4([4]byte(e[8:12]))}
	}
	if err := checkHello(h); err != nil {
		return Hello{}, fmt.Errorf("%w: hello: %v", ErrMalformed, err)
	}
	return h, nil
}

// checkHello checks a hello's SUP pair: what EncodeHello and DecodeHello share.
func checkHello(h Hello) error {
	if h.Kind > maxPairKind {
		return fmt.Errorf("SUP pair kind %d", uint8(h.Kind))
	}
	if h.Kind != PairAddressed {
		if h.Local != (SupAddr{}) || h.Peer.IsValid() || h.Stripe != [MaxPairs - 1]HelloPair{} {
			return fmt.Errorf("SUP pair kind %v names addresses %v, %v", h.Kind, h.Local, h.Peer)
		}
		return nil
	}
	pairs := []HelloPair{{h.Local, h.Peer}}
	for i, p := range h.Stripe {
		if p == (HelloPair{}) {
			for _, q := range h.Stripe[i:] {
				if q != (HelloPair{}) {
					return fmt.Errorf("SUP pair %d is empty but a later one is not", i+2)
				}
			}
			break
		}
		pairs = append(pairs, p)
	}
	locals, peers := map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for i, p := range pairs {
		if err := checkPair(p); err != nil {
			return fmt.Errorf("SUP pair %d: %w", i+1, err)
		}
		// Each port serves one lane: a striped pair repeating an address would put two lanes
		// on one cable end.
		if locals[p.Local.Addr] || peers[p.Peer] {
			return fmt.Errorf("SUP pair %d (%v - %v) repeats an address of an earlier pair", i+1, p.Local.Addr, p.Peer)
		}
		locals[p.Local.Addr], peers[p.Peer] = true, true
	}
	return nil
}

// checkPair checks one pair's addresses.
func checkPair(p HelloPair) error {
	if err := CheckSupAddr(p.Local); err != nil {
		return fmt.Errorf("connector's %w", err)
	}
	// The listener's prefix is the listener's to know: the address alone is checked here.
	if err := CheckSupHost(p.Peer); err != nil {
		return fmt.Errorf("listener's %w", err)
	}
	if p.Local.Addr == p.Peer {
		return fmt.Errorf("SUP pair names %v on both sides", p.Peer)
	}
	return nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
