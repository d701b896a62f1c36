package shm

import (
	"bytes"
	"fmt"

	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// Validate runs checks 5..9 of the spec's validation table on a segment image and returns
// its header. b may be longer than the segment.
func Validate(b []byte) (Header, error) {
	return validate(b, int64(len(b)), "")
}

// validate checks the header in b (at least its first 256 bytes when size allows) for a
// file of size bytes.
func validate(b []byte, size int64, path string) (Header, error) {
	fail := func(code error, format string, args ...any) (Header, error) {
		return Header{}, &ValidationError{Path: path, Code: code, Detail: fmt.Sprintf(format, args...)}
	}
	if size < HeaderSize || len(b) < HeaderSize {
		return fail(ErrTooSmall, "%d bytes, a header needs %d", size, HeaderSize)
	}
	if !bytes.Equal(b[wire.OffMagic:wire.OffMagic+8], []byte(Magic)) {
		return fail(ErrBadMagic, "not an MPIB hint segment")
	}
	v := wire.View{B: b}
	if ver := v.U32(wire.OffVersion); ver != Version {
		return fail(ErrBadVersion, "format version %d, this reader implements %d%s", ver, Version, versionAdvice(ver))
	}
	h := decodeHeader(v)
	hs, ss, ps := v.U32(wire.OffHeaderSize), v.U32(wire.OffSlotSize), v.U32(wire.OffPeerSize)
	if hs != HeaderSize || ss != SlotSize || ps != PeerSize || h.NSlots < 1 ||
		h.NSlots > MaxSlots || h.NPeers > MaxPeers || h.TotalSize != TotalSize(h.NSlots, h.NPeers) {
		return fail(ErrBadGeometry, "header_size=%d slot_size=%d peer_size=%d nslots=%d npeers=%d total_size=%d",
			hs, ss, ps, h.NSlots, h.NPeers, h.TotalSize)
	}
	if uint64(size) < h.TotalSize {
		return fail(ErrTooSmall, "%d bytes, the header declares %d", size, h.TotalSize)
	}
	return h, nil
}

// versionAdvice says what to do about a segment of another format version.
func versionAdvice(ver uint32) string {
	if ver < Version {
		return " (a segment made by an older agent: re-create it with the current agent)"
	}
	return " (a segment made by a newer agent: upgrade the plugin and agents)"
}

func decodeHeader(v wire.View) Header {
	return Header{
		Version:     v.U32(wire.OffVersion),
		TotalSize:   v.U64(wire.OffTotalSize),
		NSlots:      v.U32(wire.OffNSlots),
		NPeers:      v.U32(wire.OffNPeers),
		Flags:       v.U32(wire.OffFlags),
		HeartbeatNs: v.U64(wire.OffHeartbeat),
		AgentPID:    v.U32(wire.OffAgentPID),
		PeersEpoch:  v.U32(wire.OffPeersEpoch),
		CreatedNs:   v.U64(wire.OffCreated),
	}
}

// Decode validates a segment image and decodes all of it. Hint records are copied raw:
// a record caught mid-write keeps its odd seq.
func Decode(b []byte) (*Snapshot, error) {
	h, err := Validate(b)
	if err != nil {
		return nil, err
	}
	v := wire.View{B: b[:h.TotalSize]}
	return decodeSnapshot(v, h), nil
}

func decodeSnapshot(v wire.View, h Header) *Snapshot {
	s := &Snapshot{Header: h, Peers: []Peer{}, Slots: []Slot{}}
	s.Class[0] = rawRecord(v, wire.ClassOff(0))
	s.Class[1] = rawRecord(v, wire.ClassOff(1))
	for j := uint32(0); j < h.NPeers; j++ {
		off := wire.PeerOff(h.NSlots, j)
		if !allZero(v.B[off : off+PeerSize]) {
			s.Peers = append(s.Peers, Peer{Index: j, Record: rawRecord(v, off)})
		}
	}
	for i := uint32(0); i < h.NSlots; i++ {
		off := wire.SlotOff(i)
		if !allZero(v.B[off : off+SlotSize]) {
			s.Slots = append(s.Slots, decodeSlot(v, i, rawRecord(v, off+wire.SlHint)))
		}
	}
	return s
}

func decodeSlot(v wire.View, i uint32, hint Record) Slot {
	off := wire.SlotOff(i)
	owner := v.U64(off + wire.SlOwner)
	return Slot{
		Index:        i,
		State:        SlotState(uint32(owner)),
		OwnerPID:     uint32(owner >> 32),
		Gen:          v.U32(off + wire.SlGen),
		ConnID:       v.U64(off + wire.SlConnID),
		LocalSoutIP:  IPv4(v.U32(off + wire.SlLocalIP)),
		PeerSoutIP:   IPv4(v.U32(off + wire.SlPeerIP)),
		PeerIsland:   IPv4(v.U32(off + wire.SlPeerIsland)),
		PathClass:    PathClass(v.U8(off + wire.SlPathClass)),
		IsSend:       v.U8(off + wire.SlIsSend),
		NQPsSout:     v.U16(off + wire.SlNQPsSout),
		NQPsSup:      v.U16(off + wire.SlNQPsSup),
		PID:          v.U32(off + wire.SlPID),
		RegisteredNs: v.U64(off + wire.SlRegistered),
		Dev:          v.U16(off + wire.SlDev),
		SoutPort:     v.U8(off + wire.SlSoutPort),
		SupPort:      v.U8(off + wire.SlSupPort),
		SupPath:      SupPath(v.U8(off + wire.SlSupPath)),
		SoutNIC:      NICName(v.Bytes(off+wire.SlSoutNIC, NICNameSize)),
		SupNIC:       NICName(v.Bytes(off+wire.SlSupNIC, NICNameSize)),
		Hint:         hint,
		Telemetry:    decodeTelemetry(v, off),
	}
}

func decodeTelemetry(v wire.View, off int) Telemetry {
	return Telemetry{
		SoutBytes:     v.U64(off + wire.SlSoutBytes),
		SoutRequests:  v.U64(off + wire.SlSoutRequests),
		SupBytes:      v.U64(off + wire.SlSupBytes),
		SupRequests:   v.U64(off + wire.SlSupRequests),
		ReadsApplied:  v.U64(off + wire.SlReadsApplied),
		ReadsFallback: v.U64(off + wire.SlReadsFallback),
		ReadsStale:    v.U64(off + wire.SlReadsStale),
		Clamped:       v.U64(off + wire.SlClamped),
		LastSupBw:     v.U32(off + wire.SlLastSupBw),
		LastSource:    v.U32(off + wire.SlLastSource),
		LastReadNs:    v.U64(off + wire.SlLastReadNs),
		SoutState:     RailState(v.U8(off + wire.SlSoutState)),
		SupState:      RailState(v.U8(off + wire.SlSupState)),
		Failovers:     v.U32(off + wire.SlFailovers),
		Recoveries:    v.U32(off + wire.SlRecoveries),
		SoutStateNs:   v.U64(off + wire.SlSoutStateNs),
		SupStateNs:    v.U64(off + wire.SlSupStateNs),
		AppliedSupBw:  v.U32(off + wire.SlAppliedSupBw),
		FlushWallNs:   v.U64(off + wire.SlFlushWallNs),

		SoutCompletedBytes:    v.U64(off + wire.SlRailDone + wire.RdBytes),
		SoutCompletedRequests: v.U64(off + wire.SlRailDone + wire.RdRequests),
		SoutInflightBytes:     v.U64(off + wire.SlRailDone + wire.RdInflight),
		SoutBusyNs:            v.U64(off + wire.SlRailDone + wire.RdBusyNs),
		SupCompletedBytes:     v.U64(off + wire.SlRailDone + wire.RdSize + wire.RdBytes),
		SupCompletedRequests:  v.U64(off + wire.SlRailDone + wire.RdSize + wire.RdRequests),
		SupInflightBytes:      v.U64(off + wire.SlRailDone + wire.RdSize + wire.RdInflight),
		SupBusyNs:             v.U64(off + wire.SlRailDone + wire.RdSize + wire.RdBusyNs),
		SoutActiveNs:          v.U64(off + wire.SlActiveNs),
		SupActiveNs:           v.U64(off + wire.SlActiveNs + 8),
	}
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// Encode writes the segment image of s: every byte the snapshot does not describe is zero.
// Encode(Decode(b)) == b for any valid b whose reserved bytes are zero.
func Encode(s *Snapshot) ([]byte, error) {
	h := s.Header
	if h.NSlots < 1 || h.NSlots > MaxSlots || h.NPeers > MaxPeers {
		return nil, fmt.Errorf("encode: %w: nslots=%d npeers=%d", ErrBadGeometry, h.NSlots, h.NPeers)
	}
	size := TotalSize(h.NSlots, h.NPeers)
	v := wire.View{B: make([]byte, size)}
	copy(v.B, Magic)
	v.Put32(wire.OffVersion, h.Version)
	v.Put32(wire.OffHeaderSize, HeaderSize)
	v.Put64(wire.OffTotalSize, h.TotalSize)
	v.Put32(wire.OffNSlots, h.NSlots)
	v.Put32(wire.OffSlotSize, SlotSize)
	v.Put32(wire.OffNPeers, h.NPeers)
	v.Put32(wire.OffPeerSize, PeerSize)
	v.Put32(wire.OffFlags, h.Flags)
	v.Put64(wire.OffHeartbeat, h.HeartbeatNs)
	v.Put32(wire.OffAgentPID, h.AgentPID)
	v.Put32(wire.OffPeersEpoch, h.PeersEpoch)
	v.Put64(wire.OffCreated, h.CreatedNs)
	for c := range s.Class {
		putRecord(v, wire.ClassOff(uint8(c)), s.Class[c])
	}
	for _, p := range s.Peers {
		if p.Index >= h.NPeers {
			return nil, fmt.Errorf("encode: peer index %d: %w", p.Index, ErrSlotRange)
		}
		putRecord(v, wire.PeerOff(h.NSlots, p.Index), p.Record)
	}
	for _, sl := range s.Slots {
		if sl.Index >= h.NSlots {
			return nil, fmt.Errorf("encode: slot index %d: %w", sl.Index, ErrSlotRange)
		}
		encodeSlot(v, sl)
	}
	return v.B, nil
}

func putRecord(v wire.View, off int, r Record) {
	v.Put32(off+wire.RecSeq, r.Seq)
	writeRecordFields(v, off, r)
}

func encodeSlot(v wire.View, s Slot) {
	off := wire.SlotOff(s.Index)
	v.Put64(off+wire.SlOwner, uint64(s.State)|uint64(s.OwnerPID)<<32)
	v.Put32(off+wire.SlGen, s.Gen)
	v.Put64(off+wire.SlConnID, s.ConnID)
	v.Put32(off+wire.SlLocalIP, uint32(s.LocalSoutIP))
	v.Put32(off+wire.SlPeerIP, uint32(s.PeerSoutIP))
	v.Put32(off+wire.SlPeerIsland, uint32(s.PeerIsland))
	v.Put8(off+wire.SlPathClass, uint8(s.PathClass))
	v.Put8(off+wire.SlIsSend, s.IsSend)
	v.Put16(off+wire.SlNQPsSout, s.NQPsSout)
	v.Put16(off+wire.SlNQPsSup, s.NQPsSup)
	v.Put32(off+wire.SlPID, s.PID)
	v.Put64(off+wire.SlRegistered, s.RegisteredNs)
	v.Put16(off+wire.SlDev, s.Dev)
	v.Put8(off+wire.SlSoutPort, s.SoutPort)
	v.Put8(off+wire.SlSupPort, s.SupPort)
	v.Put8(off+wire.SlSupPath, uint8(s.SupPath))
	v.PutNICName(off+wire.SlSoutNIC, s.SoutNIC)
	v.PutNICName(off+wire.SlSupNIC, s.SupNIC)
	putRecord(v, off+wire.SlHint, s.Hint)
	putTelemetry(v, off, s.Telemetry)
}

func putTelemetry(v wire.View, off int, t Telemetry) {
	v.Put64(off+wire.SlSoutBytes, t.SoutBytes)
	v.Put64(off+wire.SlSoutRequests, t.SoutRequests)
	v.Put64(off+wire.SlSupBytes, t.SupBytes)
	v.Put64(off+wire.SlSupRequests, t.SupRequests)
	v.Put64(off+wire.SlReadsApplied, t.ReadsApplied)
	v.Put64(off+wire.SlReadsFallback, t.ReadsFallback)
	v.Put64(off+wire.SlReadsStale, t.ReadsStale)
	v.Put64(off+wire.SlClamped, t.Clamped)
	v.Put32(off+wire.SlLastSupBw, t.LastSupBw)
	v.Put32(off+wire.SlLastSource, t.LastSource)
	v.Put64(off+wire.SlLastReadNs, t.LastReadNs)
	v.Put8(off+wire.SlSoutState, uint8(t.SoutState))
	v.Put8(off+wire.SlSupState, uint8(t.SupState))
	v.Put32(off+wire.SlFailovers, t.Failovers)
	v.Put32(off+wire.SlRecoveries, t.Recoveries)
	v.Put64(off+wire.SlSoutStateNs, t.SoutStateNs)
	v.Put64(off+wire.SlSupStateNs, t.SupStateNs)
	v.Put32(off+wire.SlAppliedSupBw, t.AppliedSupBw)
	v.Put64(off+wire.SlFlushWallNs, t.FlushWallNs)
	done := [2][4]uint64{
		{t.SoutCompletedBytes, t.SoutCompletedRequests, t.SoutInflightBytes, t.SoutBusyNs},
		{t.SupCompletedBytes, t.SupCompletedRequests, t.SupInflightBytes, t.SupBusyNs},
	}
	for r, fs := range done { // in the block's order: wire.RdBytes, wire.RdRequests, wire.RdInflight, wire.RdBusyNs
		for k, x := range fs {
			v.Put64(off+wire.SlRailDone+r*wire.RdSize+k*8, x)
		}
	}
	v.Put64(off+wire.SlActiveNs, t.SoutActiveNs)
	v.Put64(off+wire.SlActiveNs+8, t.SupActiveNs)
}

// NICName is how a slot's NIC name field shows (spec 4.3): the bytes before the first NUL (all
// of them when there is none), each byte outside 0x21..0x7e as '?', so that a garbage name can
// break neither a table line nor a JSON document.
func NICName(b []byte) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		if c < 0x21 || c > 0x7e {
			c = '?'
		}
		out = append(out, c)
	}
	return string(out)
}
