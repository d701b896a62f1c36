package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// The NCCL connection handle. NCCL moves it from the listening rank to the connecting one
// over its own bootstrap; the connecting side also keeps its own state in it between
// non-blocking connect() calls (bytes 24..39).
//
// Layout (128 bytes):
//
//	0   magic u32 | version u16 | reserved u16
//	8   listener IPv4 [4] (network order) | port u16 big-endian | reserved u16
//	16  listener nonce u64
//	24  connect attempt u64                       (connector's bookkeeping, never validated)
//	32  pending entry u32 + generation u32         (connector's bookkeeping, never validated)
//	40  SUP address count u8 (0..MaxSupAddrs) | flags u8 | reserved u16
//	44  reserved u32
//	48  SUP addresses: MaxSupAddrs x {IPv4 [4] (network order), prefix length u8, reserved [3]}
//	112 reserved [16]
//
// Flags: bit 0 the listener's MPIB_SUP_RELAY; bit 1 "SUP unaddressed" (count 0): the
// listener's SUP port has no address the handle can carry (see Handle.SupUnaddressed).
// Every reserved byte and every entry beyond the count is zero.
const (
	HandleSize    = 128 // NCCL_NET_HANDLE_MAXSIZE
	MaxSupAddrs   = 8   // topo.MaxSupPorts: SUP ports of one fused device
	attemptOffset = 24
	pendingOffset = 32
	supOffset     = 40
	supAddrOffset = 48
	supAddrSize   = 8
	supAddrEnd    = supAddrOffset + MaxSupAddrs*supAddrSize

	flagRelay          = 1 << 0
	flagSupUnaddressed = 1 << 1
	handleFlags        = flagRelay | flagSupUnaddressed

	// MinSupPrefixLen and MaxSupPrefixLen bound a SUP address's prefix length: a direct-attach
	// link's subnet is /8 at the widest and /31 (a point-to-point link) at the narrowest. A /32
	// is carried too, but its subnet holds no peer: its port is in no direct pair, only in a
	// routed one (MPIB_SUP_RELAY=1, a route through a gateway on it).
	MinSupPrefixLen = 8
	MaxSupPrefixLen = 32
)

// SupAddr is one SUP port address with its real prefix length on its netdev.
type SupAddr struct {
	Addr netip.Addr // IPv4
	Bits uint8      // MinSupPrefixLen..MaxSupPrefixLen
}

func (a SupAddr) String() string { return fmt.Sprintf("%v/%d", a.Addr, a.Bits) }

// Handle is what listen() gives NCCL and NCCL gives the peer's connect().
//
// SupUnaddressed says the listener's SUP port cannot be described by an IPv4 address and a
// prefix: InfiniBand, an IPv6 GID, an address on no netdev of its namespace (prefix unknown),
// or a GID it could not read. The connection then decides SUP as before version 4 (from both
// ends' metadata). Comparable, so that a poll can check it presents the attempt's handle.
type Handle struct {
	Addr           netip.AddrPort
	Nonce          uint64
	SupRelay       bool // the listener's MPIB_SUP_RELAY
	SupUnaddressed bool
	NSup           int // entries of Sup in use
	Sup            [MaxSupAddrs]SupAddr
}

// SupAddrs is the listener's SUP address list.
func (h *Handle) SupAddrs() []SupAddr { return h.Sup[:h.NSup] }

// SetSupAddrs fills the SUP address list (at most MaxSupAddrs; EncodeHandle checks them).
func (h *Handle) SetSupAddrs(addrs []SupAddr) {
	h.Sup = [MaxSupAddrs]SupAddr{}
	h.NSup = copy(h.Sup[:], addrs)
}

// HasSupAddr tells whether the handle advertises a.
func (h *Handle) HasSupAddr(a netip.Addr) bool {
	for _, s := range h.SupAddrs() {
		if s.Addr == a {
			return true
		}
	}
	return false
}

// CheckSupAddr refuses what no SUP port can have: anything but an IPv4 host address (see
// CheckSupHost) with a prefix length of /8../32, or its subnet's broadcast address. A listener
// describes only ports that pass, so a handle it writes always decodes.
func CheckSupAddr(a SupAddr) error {
	if err := CheckSupHost(a.Addr); err != nil {
		return err
	}
	if a.Bits < MinSupPrefixLen || a.Bits > MaxSupPrefixLen {
		return fmt.Errorf("SUP address %s: prefix length %d is outside /%d../%d", a, a.Bits, MinSupPrefixLen, MaxSupPrefixLen)
	}
	if a.Bits <= 30 && isSubnetBroadcast(a) { // /31 and /32 have no broadcast address
		return fmt.Errorf("SUP address %s is its subnet's broadcast address", a)
	}
	return nil
}

// CheckSupHost refuses an address no host's SUP port can have: not IPv4, unspecified,
// loopback, multicast or the limited broadcast.
func CheckSupHost(a netip.Addr) error {
	if !a.Is4() {
		return fmt.Errorf("SUP address %v is not IPv4", a)
	}
	if a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return fmt.Errorf("SUP address %v is not a unicast host address", a)
	}
	return nil
}

func isSubnetBroadcast(a SupAddr) bool {
	v := binary.BigEndian.Uint32(a.Addr.AsSlice())
	host := uint32(1)<<(32-a.Bits) - 1
	return v&host == host
}

// EncodeHandle writes h into a NCCL handle buffer (at least HandleSize bytes); it refuses a
// handle DecodeHandle would refuse.
func EncodeHandle(b []byte, h Handle) error {
	if err := checkHandleSup(h); err != nil {
		return err
	}
	clear(b[:HandleSize])
	binary.LittleEndian.PutUint32(b[0:], handleMagic)
	binary.LittleEndian.PutUint16(b[4:], Version)
	ip := h.Addr.Addr().As4()
	copy(b[8:12], ip[:])
	binary.BigEndian.PutUint16(b[12:], h.Addr.Port())
	binary.LittleEndian.PutUint64(b[16:], h.Nonce)
	b[supOffset] = byte(h.NSup)
	if h.SupRelay {
		b[supOffset+1] |= flagRelay
	}
	if h.SupUnaddressed {
		b[supOffset+1] |= flagSupUnaddressed
	}
	for i, s := range h.SupAddrs() {
		e := b[supAddrOffset+i*supAddrSize:]
		a := s.Addr.As4()
		copy(e[:4], a[:])
		e[4] = s.Bits
	}
	return nil
}

// DecodeHandle validates and reads a handle.
func DecodeHandle(b []byte) (Handle, error) {
	if len(b) < HandleSize {
		return Handle{}, fmt.Errorf("%w: handle of %d bytes", ErrMalformed, len(b))
	}
	if m := binary.LittleEndian.Uint32(b); m != handleMagic {
		return Handle{}, fmt.Errorf("%w: handle magic %#08x (not an MPIB handle; is every rank using the same plugin?)", ErrMalformed, m)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != Version {
		return Handle{}, fmt.Errorf("%w: handle version %d, this plugin speaks %d (is every rank using the same plugin?)", ErrVersion, v, Version)
	}
	addr := netip.AddrFrom4([4]byte(b[8:12]))
	port := binary.BigEndian.Uint16(b[12:])
	if port == 0 || addr.IsUnspecified() {
		return Handle{}, fmt.Errorf("%w: handle address %v:%d", ErrMalformed, addr, port)
	}
	if err := handleReservedZero(b); err != nil {
		return Handle{}, err
	}
	h := Handle{Addr: netip.AddrPortFrom(addr, port), Nonce: binary.LittleEndian.Uint64(b[16:])}
	if err := decodeHandleSup(b, &h); err != nil {
		return Handle{}, err
	}
	return h, nil
}

// handleReservedZero refuses a handle with a reserved byte set: no MPIB of this version
// writes one, and a later version that gives them a meaning bumps Version.
func handleReservedZero(b []byte) error {
	for _, r := range [][2]int{{6, 8}, {14, 16}, {supOffset + 2, supAddrOffset}, {supAddrEnd, HandleSize}} {
		for i := r[0]; i < r[1]; i++ {
			if b[i] != 0 {
				return fmt.Errorf("%w: handle byte %d is %#02x, reserved (not an MPIB handle of version %d)", ErrMalformed, i, b[i], Version)
			}
		}
	}
	return nil
}

// decodeHandleSup reads and checks the SUP fields (bytes 40..111).
func decodeHandleSup(b []byte, h *Handle) error {
	n, flags := int(b[supOffset]), b[supOffset+1]
	if n > MaxSupAddrs {
		return fmt.Errorf("%w: handle names %d SUP addresses, at most %d", ErrMalformed, n, MaxSupAddrs)
	}
	if flags&^handleFlags != 0 {
		return fmt.Errorf("%w: handle flags %#02x, unknown bits set", ErrMalformed, flags)
	}
	h.SupRelay, h.SupUnaddressed, h.NSup = flags&flagRelay != 0, flags&flagSupUnaddressed != 0, n
	for i := range MaxSupAddrs {
		e := b[supAddrOffset+i*supAddrSize : supAddrOffset+(i+1)*supAddrSize]
		if i >= n {
			if binary.LittleEndian.Uint64(e) != 0 {
				return fmt.Errorf("%w: handle SUP entry %d beyond the count %d is not zero", ErrMalformed, i, n)
			}
			continue
		}
		if e[5] != 0 || e[6] != 0 || e[7] != 0 {
			return fmt.Errorf("%w: handle SUP entry %d has reserved bytes % x", ErrMalformed, i, e[5:8])
		}
		h.Sup[i] = SupAddr{Addr: netip.AddrFrom4([4]byte(e[:4])), Bits: e[4]}
	}
	if err := checkHandleSup(*h); err != nil {
		return fmt.Errorf("%w: handle: %v", ErrMalformed, err)
	}
	return nil
}

// checkHandleSup checks the SUP fields' meaning: what EncodeHandle and DecodeHandle share.
func checkHandleSup(h Handle) error {
	if h.NSup < 0 || h.NSup > MaxSupAddrs {
		return fmt.Errorf("%d SUP addresses, at most %d", h.NSup, MaxSupAddrs)
	}
	if h.SupUnaddressed && h.NSup > 0 {
		return fmt.Errorf("SUP marked unaddressed yet %d SUP addresses named", h.NSup)
	}
	for i, s := range h.SupAddrs() {
		if err := CheckSupAddr(s); err != nil {
			return fmt.Errorf("SUP entry %d: %w", i, err)
		}
		for _, o := range h.Sup[:i] {
			if o.Addr == s.Addr {
				return fmt.Errorf("SUP address %v named twice", s.Addr)
			}
		}
	}
	return nil
}

// Attempt reads and SetAttempt writes the connect-attempt id that connect() keeps in NCCL's
// handle buffer between its non-blocking calls (as net_ib keeps its stage there).
func Attempt(b []byte) uint64        { return binary.LittleEndian.Uint64(b[attemptOffset:]) }
func SetAttempt(b []byte, id uint64) { binary.LittleEndian.PutUint64(b[attemptOffset:], id) }

// Pending reads what SetPending wrote (zeros in a handle no connect() has used).
func Pending(b []byte) (index1, gen uint32) {
	return binary.LittleEndian.Uint32(b[pendingOffset:]), binary.LittleEndian.Uint32(b[pendingOffset+4:])
}

// SetPending writes the connect attempt's entry in the plugin's C table of pending attempts
// (index + 1 and generation, bytes 32..39), which connect() polls without calling into Go.
func SetPending(b []byte, index1, gen uint32) {
	binary.LittleEndian.PutUint32(b[pendingOffset:], index1)
	binary.LittleEndian.PutUint32(b[pendingOffset+4:], gen)
}
