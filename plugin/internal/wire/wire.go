// Package wire encodes what crosses between two MPIB peers before any RDMA happens: the
// NCCL connection handle, the hello and the connection metadata on the TCP control socket.
// All integers are little-endian unless noted; every decoder validates before trusting.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrMalformed marks bytes that cannot come from a compatible MPIB peer.
var ErrMalformed = errors.New("malformed MPIB control message")

// ErrVersion marks a peer that speaks another version of the wire protocol (another MPIB
// build on that host): a job's configuration to fix, not a fault of the network. It is also
// ErrMalformed.
var ErrVersion = fmt.Errorf("%w: another version of MPIB", ErrMalformed)

const (
	// Version is every message's: 7: an in-handshake standby join ends with the sender's
	// word on its QPs ('R' up, 'F' errno: the receiver returns its comm on 'R' alone), and a
	// listener that turns a connection down after its hello says why (refusal.go);
	// 6: a sender's standby rail joins after the handshake
	// (Metadata.Deferred, the ack's flag, 'J'/'K' on the control socket); 5: up to MaxPairs
	// SUP pairs in the hello (striping); 4: SUP
	// port addresses and the relay flag in the handle, the SUP pair in the hello; 3: rail failover (replay immediates, fence records, notices);
	// 2: traffic class/SL, LID, link layer, SUP prefix and ECE.
	Version       = 7
	handleMagic   = 0x4849504D // "MPIH"
	helloMagic    = 0x4C49504D // "MPIL"
	metadataMagic = 0x4D49504D // "MPIM"
	ackMagic      = 0x4149504D // "MPIA"
	AckSize       = 8
	MaxQPsPerRail = 16
	Rails         = 2
	laneSize      = 16 + 4 + 4 + 2 + 1 + 1
	railSize      = laneSize + 16 + 4*MaxQPsPerRail
	MetadataSize  = 28 + Rails*railSize + 4 + (MaxPairs-1)*laneSize
	maxIBMTUEnum  = 5 // IBV_MTU_4096
)

// ackJoinNow is the ack's flag for a side none of whose rails came up while a standby rail
// waits for its join (Metadata.Deferred): both ends then join it before the comm goes to NCCL.
const ackJoinNow = 1

// EncodeAck is sent once a side's QPs are ready to receive. Layout: magic u32 | flags u8 |
// reserved [3].
func EncodeAck(joinNow bool) []byte {
	b := binary.LittleEndian.AppendUint32(nil, ackMagic)
	flags := byte(0)
	if joinNow {
		flags = ackJoinNow
	}
	return append(b, flags, 0, 0, 0)
}

// CheckAck validates an ack and returns its join-now flag.
func CheckAck(b []byte) (joinNow bool, err error) {
	if len(b) != AckSize || binary.LittleEndian.Uint32(b) != ackMagic || b[4]&^ackJoinNow != 0 || b[5]|b[6]|b[7] != 0 {
		return false, fmt.Errorf("%w: bad ready acknowledgement % x", ErrMalformed, b)
	}
	return b[4] == ackJoinNow, nil
}

// Link layers as libibverbs numbers them (IBV_LINK_LAYER_*).
const (
	LinkLayerInfiniBand = 1
	LinkLayerEthernet   = 2
)

// ECE is a rail's Enhanced Connection Establishment options (struct ibv_ece); Valid is false
// when the device or libibverbs does not support ECE or NCCL_IB_ECE_ENABLE=0.
type ECE struct {
	Valid                       bool
	VendorID, Options, CompMask uint32
}

// LaneInfo is one lane's connection facts: the NIC port a rail's QPs live on. A rail's first
// lane is in its RailInfo; a striped SUP rail's further lanes (2..: one per further SUP pair of
// the hello) are in Metadata.Lane, and the rail's QP numbers stay in its RailInfo (QP i sits on
// lane i mod SupLanes).
type LaneInfo struct {
	GID       [16]byte
	MTU       uint32 // enum ibv_mtu
	RKey      uint32 // the lane's registration of the advertised buffer
	LID       uint16 // InfiniBand local identifier (0 on RoCE)
	LinkLayer uint8  // LinkLayerInfiniBand or LinkLayerEthernet
	PrefixLen uint8  // prefix length of the IP subnet holding the GID's address; 0 = unknown
}

// RailInfo is one rail's connection facts: its first lane's, its ECE options and its QPs.
type RailInfo struct {
	LaneInfo
	ECE ECE
	QPN [MaxQPsPerRail]uint32
}

// Metadata is exchanged by both sides after the hello.
// Layout: magic u32 | version u16 | size u16 | mode u8 | path class u8 | traffic class u8 |
// service level u8 | nqps [2]u32 | buffer address u64 | rails [2]{gid [16], mtu u32,
// rkey u32, lid u16, link layer u8, prefix length u8, ece {valid u32, vendor u32, options u32,
// comp mask u32}, qpn [16]u32} | SUP lanes u8 | deferred u8 | reserved [2] | lanes [MaxPairs-1]{gid [16],
// mtu u32, rkey u32, lid u16, link layer u8, prefix length u8}. The traffic class and service
// level are the sending side's: both ends of a connection use the sender's (as net_ib does).
// SupLanes is 0 without SUP QPs, else the SUP pairs (1 without striping); lanes past
// SupLanes - 1 are zero. Deferred (bit 0: SOUT, the only rail that may) says that the
// sender builds that rail's QPs after the handshake (its standby rail: rkey, ECE and QPNs are
// zero here and come in a 'J' message); it needs SUP QPs beside it.
type Metadata struct {
	Mode      uint8
	PathClass uint8
	TC, SL    uint8
	NQPs      [Rails]uint32
	BufAddr   uint64
	Rail      [Rails]RailInfo
	SupLanes  uint8
	Deferred  uint8
	Lane      [MaxPairs - 1]LaneInfo
}

// EncodeMetadata serializes m into MetadataSize bytes.
func EncodeMetadata(m Metadata) []byte {
	b := make([]byte, 0, MetadataSize)
	b = binary.LittleEndian.AppendUint32(b, metadataMagic)
	b = binary.LittleEndian.AppendUint16(b, Version)
	b = binary.LittleEndian.AppendUint16(b, MetadataSize)
	b = append(b, m.Mode, m.PathClass, m.TC, m.SL)
	for _, n := range m.NQPs {
		b = binary.LittleEndian.AppendUint32(b, n)
	}
	b = binary.LittleEndian.AppendUint64(b, m.BufAddr)
	for _, r := range m.Rail {
		b = appendLane(b, r.LaneInfo)
		valid := uint32(0)
		if r.ECE.Valid {
			valid = 1
		}
		for _, v := range []uint32{valid, r.ECE.VendorID, r.ECE.Options, r.ECE.CompMask} {
			b = binary.LittleEndian.AppendUint32(b, v)
		}
		for _, q := range r.QPN {
			b = binary.LittleEndian.AppendUint32(b, q)
		}
	}
	b = append(b, m.SupLanes, m.Deferred, 0, 0)
	for _, l := range m.Lane {
		b = appendLane(b, l)
	}
	return b
}

// appendLane and readLane are a lane's laneSize bytes: gid [16] | mtu u32 | rkey u32 | lid u16
// | link layer u8 | prefix length u8.
func appendLane(b []byte, l LaneInfo) []byte {
	b = append(b, l.GID[:]...)
	b = binary.LittleEndian.AppendUint32(b, l.MTU)
	b = binary.LittleEndian.AppendUint32(b, l.RKey)
	b = binary.LittleEndian.AppendUint16(b, l.LID)
	return append(b, l.LinkLayer, l.PrefixLen)
}

func readLane(b []byte) LaneInfo {
	le := binary.LittleEndian
	l := LaneInfo{MTU: le.Uint32(b[16:]), RKey: le.Uint32(b[20:]), LID: le.Uint16(b[24:]), LinkLayer: b[26], PrefixLen: b[27]}
	copy(l.GID[:], b[:16])
	return l
}

// DecodeMetadata validates and reads metadata from a peer.
func DecodeMetadata(b []byte) (Metadata, error) {
	var m Metadata
	if len(b) != MetadataSize {
		return m, fmt.Errorf("%w: metadata of %d bytes, want %d", ErrMalformed, len(b), MetadataSize)
	}
	le := binary.LittleEndian
	if x := le.Uint32(b); x != metadataMagic {
		return m, fmt.Errorf("%w: metadata magic %#08x", ErrMalformed, x)
	}
	if v := le.Uint16(b[4:]); v != Version {
		return m, fmt.Errorf("%w: metadata version %d, want %d (is every rank using the same plugin?)", ErrVersion, v, Version)
	}
	if s := le.Uint16(b[6:]); s != MetadataSize {
		return m, fmt.Errorf("%w: metadata declares %d bytes, want %d", ErrMalformed, s, MetadataSize)
	}
	m.Mode, m.PathClass, m.TC, m.SL = b[8], b[9], b[10], b[11]
	if m.Mode > 1 || m.PathClass > 1 || m.SL > 15 {
		return m, fmt.Errorf("%w: mode %d, path class %d, service level %d", ErrMalformed, m.Mode, m.PathClass, m.SL)
	}
	off := 12
	for i := range m.NQPs {
		m.NQPs[i] = le.Uint32(b[off:])
		off += 4
		if m.NQPs[i] > MaxQPsPerRail {
			return m, fmt.Errorf("%w: %d QPs on rail %d (max %d)", ErrMalformed, m.NQPs[i], i, MaxQPsPerRail)
		}
	}
	if m.NQPs[0] == 0 {
		return m, fmt.Errorf("%w: no SOUT QPs", ErrMalformed)
	}
	m.BufAddr = le.Uint64(b[off:])
	off += 8
	for i := range m.Rail {
		r := &m.Rail[i]
		r.LaneInfo = readLane(b[off:])
		off += laneSize
		valid := le.Uint32(b[off:])
		r.ECE = ECE{Valid: valid == 1, VendorID: le.Uint32(b[off+4:]), Options: le.Uint32(b[off+8:]), CompMask: le.Uint32(b[off+12:])}
		off += 16
		if valid > 1 || r.PrefixLen > 128 {
			return m, fmt.Errorf("%w: rail %d ECE flag %d, prefix length %d", ErrMalformed, i, valid, r.PrefixLen)
		}
		for q := range r.QPN {
			r.QPN[q] = le.Uint32(b[off:])
			off += 4
		}
		if m.NQPs[i] > 0 && (r.MTU < 1 || r.MTU > maxIBMTUEnum) {
			return m, fmt.Errorf("%w: rail %d MTU code %d", ErrMalformed, i, r.MTU)
		}
		if m.NQPs[i] > 0 && r.LinkLayer != LinkLayerInfiniBand && r.LinkLayer != LinkLayerEthernet {
			return m, fmt.Errorf("%w: rail %d link layer %d", ErrMalformed, i, r.LinkLayer)
		}
	}
	return m, decodeLanes(&m, b[off:])
}

// decodeLanes reads and checks the striped lanes that end the metadata.
func decodeLanes(m *Metadata, b []byte) error {
	m.SupLanes, m.Deferred = b[0], b[1]
	if b[2]|b[3] != 0 {
		return fmt.Errorf("%w: metadata reserved bytes % x after the rails", ErrMalformed, b[2:4])
	}
	switch {
	case m.Deferred&^1 != 0 || (m.Deferred != 0 && m.NQPs[1] == 0):
		return fmt.Errorf("%w: deferred rails %#x with %d SUP QPs (only SOUT may be, beside SUP)", ErrMalformed, m.Deferred, m.NQPs[1])
	case m.NQPs[1] == 0 && m.SupLanes != 0:
		return fmt.Errorf("%w: %d SUP lanes without SUP QPs", ErrMalformed, m.SupLanes)
	case m.NQPs[1] > 0 && (m.SupLanes < 1 || m.SupLanes > MaxPairs || uint32(m.SupLanes) > m.NQPs[1]):
		return fmt.Errorf("%w: %d SUP lanes for %d SUP QPs (1..%d, at most one a QP)", ErrMalformed, m.SupLanes, m.NQPs[1], MaxPairs)
	}
	off := 4
	for i := range m.Lane {
		l := &m.Lane[i]
		*l = readLane(b[off:])
		off += laneSize
		if i+2 > int(m.SupLanes) {
			if *l != (LaneInfo{}) {
				return fmt.Errorf("%w: SUP lane %d filled in, with %d lanes", ErrMalformed, i+2, m.SupLanes)
			}
			continue
		}
		if l.MTU < 1 || l.MTU > maxIBMTUEnum || (l.LinkLayer != LinkLayerInfiniBand && l.LinkLayer != LinkLayerEthernet) || l.PrefixLen > 128 {
			return fmt.Errorf("%w: SUP lane %d MTU code %d, link layer %d, prefix length %d", ErrMalformed, i+2, l.MTU, l.LinkLayer, l.PrefixLen)
		}
	}
	return nil
}
