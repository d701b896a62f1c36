package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// The hello is the connecting side's first message on the control socket: it names the
// listener it expects (the handle's nonce), says the connector's MPIB_SUP_RELAY and the SUP
// pair the connector chose, before either side builds a SUP QP.
//
// Layout (HelloSize bytes):
//
//	0   magic u32 | version u16 | reserved u16
//	8   listener nonce u64
//	16  flags u8 (bit 0: the connector's MPIB_SUP_RELAY) | pair kind u8 |
//	    connector's prefix length u8 | reserved u8
//	20  connector's SUP IPv4 [4] | listener's SUP IPv4 [4] (network order)
//
// For PairNone and PairUnaddressed the prefix and both addresses are zero.
const HelloSize = 28

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
		b[18] = h.Local.Bits
		l, p := h.Local.Addr.As4(), h.Peer.As4()
		copy(b[20:24], l[:])
		copy(b[24:28], p[:])
	}
	return b, nil
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
		return Hello{}, fmt.Errorf("%w: peer speaks version %d, this plugin %d", ErrMalformed, v, Version)
	}
	if r := binary.LittleEndian.Uint16(b[6:]); r != 0 || b[19] != 0 {
		return Hello{}, fmt.Errorf("%w: hello with reserved bytes % x, % x (not an MPIB plugin of this version)", ErrMalformed, b[6:8], b[19:20])
	}
	if b[16]&^flagRelay != 0 {
		return Hello{}, fmt.Errorf("%w: hello flags %#02x, unknown bits set", ErrMalformed, b[16])
	}
	h := Hello{Nonce: binary.LittleEndian.Uint64(b[8:]), SupRelay: b[16]&flagRelay != 0, Kind: PairKind(b[17])}
	if h.Kind > maxPairKind {
		return Hello{}, fmt.Errorf("%w: hello SUP pair kind %d", ErrMalformed, b[17])
	}
	if h.Kind != PairAddressed {
		if b[18] != 0 || binary.LittleEndian.Uint64(b[20:]) != 0 {
			return Hello{}, fmt.Errorf("%w: hello names SUP addresses with pair kind %v", ErrMalformed, h.Kind)
		}
		return h, nil
	}
	h.Local = SupAddr{Addr: netip.AddrFrom4([4]byte(b[20:24])), Bits: b[18]}
	h.Peer = netip.AddrFrom4([4]byte(b[24:28]))
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
		if h.Local != (SupAddr{}) || h.Peer.IsValid() {
			return fmt.Errorf("SUP pair kind %v names addresses %v, %v", h.Kind, h.Local, h.Peer)
		}
		return nil
	}
	if err := CheckSupAddr(h.Local); err != nil {
		return fmt.Errorf("connector's %w", err)
	}
	// The listener's prefix is the listener's to know: the address alone is checked here.
	if err := CheckSupHost(h.Peer); err != nil {
		return fmt.Errorf("listener's %w", err)
	}
	if h.Local.Addr == h.Peer {
		return fmt.Errorf("SUP pair names %v on both sides", h.Peer)
	}
	return nil
}
