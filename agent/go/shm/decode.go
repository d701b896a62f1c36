package shm

import (
	"bytes"
	"fmt"
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
	if !bytes.Equal(b[offMagic:offMagic+8], []byte(Magic)) {
		return fail(ErrBadMagic, "not an MPIB hint segment")
	}
	v := view{b: b}
	if ver := v.u32(offVersion); ver != Version {
		return fail(ErrBadVersion, "format version %d, this reader implements %d%s", ver, Version, versionAdvice(ver))
	}
	h := decodeHeader(v)
	hs, ss, ps := v.u32(offHeaderSize), v.u32(offSlotSize), v.u32(offPeerSize)
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

func decodeHeader(v view) Header {
	return Header{
		Version:     v.u32(offVersion),
		TotalSize:   v.u64(offTotalSize),
		NSlots:      v.u32(offNSlots),
		NPeers:      v.u32(offNPeers),
		Flags:       v.u32(offFlags),
		HeartbeatNs: v.u64(offHeartbeat),
		AgentPID:    v.u32(offAgentPID),
		PeersEpoch:  v.u32(offPeersEpoch),
		CreatedNs:   v.u64(offCreated),
	}
}

// Decode validates a segment image and decodes all of it. Hint records are copied raw:
// a record caught mid-write keeps its odd seq.
func Decode(b []byte) (*Snapshot, error) {
	h, err := Validate(b)
	if err != nil {
		return nil, err
	}
	v := view{b: b[:h.TotalSize]}
	return decodeSnapshot(v, h), nil
}

func decodeSnapshot(v view, h Header) *Snapshot {
	s := &Snapshot{Header: h, Peers: []Peer{}, Slots: []Slot{}}
	s.Class[0] = v.rawRecord(classOff(0))
	s.Class[1] = v.rawRecord(classOff(1))
	for j := uint32(0); j < h.NPeers; j++ {
		off := peerOff(h.NSlots, j)
		if !allZero(v.b[off : off+PeerSize]) {
			s.Peers = append(s.Peers, Peer{Index: j, Record: v.rawRecord(off)})
		}
	}
	for i := uint32(0); i < h.NSlots; i++ {
		off := slotOff(i)
		if !allZero(v.b[off : off+SlotSize]) {
			s.Slots = append(s.Slots, decodeSlot(v, i, v.rawRecord(off+slHint)))
		}
	}
	return s
}

func decodeSlot(v view, i uint32, hint Record) Slot {
	off := slotOff(i)
	owner := v.u64(off + slOwner)
	return Slot{
		Index:        i,
		State:        SlotState(uint32(owner)),
		OwnerPID:     uint32(owner >> 32),
		Gen:          v.u32(off + slGen),
		ConnID:       v.u64(off + slConnID),
		LocalSoutIP:  IPv4(v.u32(off + slLocalIP)),
		PeerSoutIP:   IPv4(v.u32(off + slPeerIP)),
		PeerIsland:   IPv4(v.u32(off + slPeerIsland)),
		PathClass:    PathClass(v.u8(off + slPathClass)),
		IsSend:       v.u8(off + slIsSend),
		NQPsSout:     v.u16(off + slNQPsSout),
		NQPsSup:      v.u16(off + slNQPsSup),
		PID:          v.u32(off + slPID),
		RegisteredNs: v.u64(off + slRegistered),
		Dev:          v.u16(off + slDev),
		SoutPort:     v.u8(off + slSoutPort),
		SupPort:      v.u8(off + slSupPort),
		SupPath:      SupPath(v.u8(off + slSupPath)),
		SoutNIC:      NICName(v.bytes(off+slSoutNIC, NICNameSize)),
		SupNIC:       NICName(v.bytes(off+slSupNIC, NICNameSize)),
		Hint:         hint,
		Telemetry:    decodeTelemetry(v, off),
	}
}

func decodeTelemetry(v view, off int) Telemetry {
	return Telemetry{
		SoutBytes:     v.u64(off + slSoutBytes),
		SoutRequests:  v.u64(off + slSoutRequests),
		SupBytes:      v.u64(off + slSupBytes),
		SupRequests:   v.u64(off + slSupRequests),
		ReadsApplied:  v.u64(off + slReadsApplied),
		ReadsFallback: v.u64(off + slReadsFallback),
		ReadsStale:    v.u64(off + slReadsStale),
		Clamped:       v.u64(off + slClamped),
		LastSupBw:     v.u32(off + slLastSupBw),
		LastSource:    v.u32(off + slLastSource),
		LastReadNs:    v.u64(off + slLastReadNs),
		SoutState:     RailState(v.u8(off + slSoutState)),
		SupState:      RailState(v.u8(off + slSupState)),
		Failovers:     v.u32(off + slFailovers),
		Recoveries:    v.u32(off + slRecoveries),
		SoutStateNs:   v.u64(off + slSoutStateNs),
		SupStateNs:    v.u64(off + slSupStateNs),
		AppliedSupBw:  v.u32(off + slAppliedSupBw),
		FlushWallNs:   v.u64(off + slFlushWallNs),

		SoutCompletedBytes:    v.u64(off + slRailDone + rdBytes),
		SoutCompletedRequests: v.u64(off + slRailDone + rdRequests),
		SoutInflightBytes:     v.u64(off + slRailDone + rdInflight),
		SoutBusyNs:            v.u64(off + slRailDone + rdBusyNs),
		SupCompletedBytes:     v.u64(off + slRailDone + rdSize + rdBytes),
		SupCompletedRequests:  v.u64(off + slRailDone + rdSize + rdRequests),
		SupInflightBytes:      v.u64(off + slRailDone + rdSize + rdInflight),
		SupBusyNs:             v.u64(off + slRailDone + rdSize + rdBusyNs),
		SoutActiveNs:          v.u64(off + slActiveNs),
		SupActiveNs:           v.u64(off + slActiveNs + 8),
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
	v := view{b: make([]byte, size)}
	copy(v.b, Magic)
	v.put32(offVersion, h.Version)
	v.put32(offHeaderSize, HeaderSize)
	v.put64(offTotalSize, h.TotalSize)
	v.put32(offNSlots, h.NSlots)
	v.put32(offSlotSize, SlotSize)
	v.put32(offNPeers, h.NPeers)
	v.put32(offPeerSize, PeerSize)
	v.put32(offFlags, h.Flags)
	v.put64(offHeartbeat, h.HeartbeatNs)
	v.put32(offAgentPID, h.AgentPID)
	v.put32(offPeersEpoch, h.PeersEpoch)
	v.put64(offCreated, h.CreatedNs)
	for c := range s.Class {
		putRecord(v, classOff(uint8(c)), s.Class[c])
	}
	for _, p := range s.Peers {
		if p.Index >= h.NPeers {
			return nil, fmt.Errorf("encode: peer index %d: %w", p.Index, ErrSlotRange)
		}
		putRecord(v, peerOff(h.NSlots, p.Index), p.Record)
	}
	for _, sl := range s.Slots {
		if sl.Index >= h.NSlots {
			return nil, fmt.Errorf("encode: slot index %d: %w", sl.Index, ErrSlotRange)
		}
		encodeSlot(v, sl)
	}
	return v.b, nil
}

func putRecord(v view, off int, r Record) {
	v.put32(off+recSeq, r.Seq)
	v.writeRecordFields(off, r)
}

func encodeSlot(v view, s Slot) {
	off := slotOff(s.Index)
	v.put64(off+slOwner, uint64(s.State)|uint64(s.OwnerPID)<<32)
	v.put32(off+slGen, s.Gen)
	v.put64(off+slConnID, s.ConnID)
	v.put32(off+slLocalIP, uint32(s.LocalSoutIP))
	v.put32(off+slPeerIP, uint32(s.PeerSoutIP))
	v.put32(off+slPeerIsland, uint32(s.PeerIsland))
	v.put8(off+slPathClass, uint8(s.PathClass))
	v.put8(off+slIsSend, s.IsSend)
	v.put16(off+slNQPsSout, s.NQPsSout)
	v.put16(off+slNQPsSup, s.NQPsSup)
	v.put32(off+slPID, s.PID)
	v.put64(off+slRegistered, s.RegisteredNs)
	v.put16(off+slDev, s.Dev)
	v.put8(off+slSoutPort, s.SoutPort)
	v.put8(off+slSupPort, s.SupPort)
	v.put8(off+slSupPath, uint8(s.SupPath))
	putNICName(v, off+slSoutNIC, s.SoutNIC)
	putNICName(v, off+slSupNIC, s.SupNIC)
	putRecord(v, off+slHint, s.Hint)
	putTelemetry(v, off, s.Telemetry)
}

func putTelemetry(v view, off int, t Telemetry) {
	v.put64(off+slSoutBytes, t.SoutBytes)
	v.put64(off+slSoutRequests, t.SoutRequests)
	v.put64(off+slSupBytes, t.SupBytes)
	v.put64(off+slSupRequests, t.SupRequests)
	v.put64(off+slReadsApplied, t.ReadsApplied)
	v.put64(off+slReadsFallback, t.ReadsFallback)
	v.put64(off+slReadsStale, t.ReadsStale)
	v.put64(off+slClamped, t.Clamped)
	v.put32(off+slLastSupBw, t.LastSupBw)
	v.put32(off+slLastSource, t.LastSource)
	v.put64(off+slLastReadNs, t.LastReadNs)
	v.put8(off+slSoutState, uint8(t.SoutState))
	v.put8(off+slSupState, uint8(t.SupState))
	v.put32(off+slFailovers, t.Failovers)
	v.put32(off+slRecoveries, t.Recoveries)
	v.put64(off+slSoutStateNs, t.SoutStateNs)
	v.put64(off+slSupStateNs, t.SupStateNs)
	v.put32(off+slAppliedSupBw, t.AppliedSupBw)
	v.put64(off+slFlushWallNs, t.FlushWallNs)
	done := [2][4]uint64{
		{t.SoutCompletedBytes, t.SoutCompletedRequests, t.SoutInflightBytes, t.SoutBusyNs},
		{t.SupCompletedBytes, t.SupCompletedRequests, t.SupInflightBytes, t.SupBusyNs},
	}
	for r, fs := range done { // in the block's order: rdBytes, rdRequests, rdInflight, rdBusyNs
		for k, x := range fs {
			v.put64(off+slRailDone+r*rdSize+k*8, x)
		}
	}
	v.put64(off+slActiveNs, t.SoutActiveNs)
	v.put64(off+slActiveNs+8, t.SupActiveNs)
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

// putNICName writes name into a NIC name field: cut to NICNameSize-1 bytes, NUL-padded.
func putNICName(v view, off int, name string) {
	for i := range NICNameSize {
		var c byte
		if i < len(name) && i < NICNameSize-1 {
			c = name[i]
		}
		v.put8(off+i, c)
	}
}
