package shm

import "github.com/mpib/mpib/agent/go/shm/internal/wire"

// readRecord is the seqlock reader of spec 5.1 (Go atomics are sequentially consistent, so
// no explicit fences are needed). A plain view reads the raw fields once, odd seq included.
func readRecord(v wire.View, off int) (Record, error) {
	if !v.Live {
		r := rawRecord(v, off)
		if r.Seq&1 != 0 {
			return r, ErrBusy
		}
		return r, nil
	}
	for i := 0; i < SeqAttempts; i++ {
		s1 := v.U32(off + wire.RecSeq)
		if s1&1 != 0 {
			continue
		}
		r := rawRecord(v, off)
		if v.U32(off+wire.RecSeq) == s1 {
			r.Seq = s1
			return r, nil
		}
	}
	return rawRecord(v, off), ErrBusy
}

func rawRecord(v wire.View, off int) Record {
	return Record{
		Seq:       v.U32(off + wire.RecSeq),
		SupBw:     v.U32(off + wire.RecSupBw),
		Flags:     v.U32(off + wire.RecFlags),
		Gen:       v.U32(off + wire.RecGen),
		SetNs:     v.U64(off + wire.RecSetNs),
		PeerIP:    IPv4(v.U32(off + wire.RecPeerIP)),
		PrefixLen: v.U8(off + wire.RecPrefixLen),
	}
}

// writeRecord is the seqlock writer of spec 5.1; the caller holds the writer lock.
func writeRecord(v wire.View, off int, r Record) {
	w := v.U32(off+wire.RecSeq) | 1
	v.Put32(off+wire.RecSeq, w)
	writeRecordFields(v, off, r)
	v.Put32(off+wire.RecSeq, w+1)
}

func writeRecordFields(v wire.View, off int, r Record) {
	v.Put32(off+wire.RecSupBw, r.SupBw)
	v.Put32(off+wire.RecFlags, r.Flags)
	v.Put32(off+wire.RecGen, r.Gen)
	v.Put64(off+wire.RecSetNs, r.SetNs)
	v.Put32(off+wire.RecPeerIP, uint32(r.PeerIP))
	v.Put8(off+wire.RecPrefixLen, r.PrefixLen)
}

// repairRecord clears the record at off when its seq is odd and reports whether it did. The
// caller holds the writer lock (spec 5.5), so no live writer is mid-write there: an odd seq was
// left by a writer that died between its two seq stores (spec 5.1). Its fields may be a torn
// mix of two records, so it is never made even as it stands: writeRecord reuses the odd seq,
// stores zero into every field (no VALID: no hint), then the even seq.
func repairRecord(v wire.View, off int) bool {
	if v.U32(off+wire.RecSeq)&1 == 0 {
		return false
	}
	writeRecord(v, off, Record{})
	return true
}

// repairRecords repairs every hint record of the segment (spec 5.1: class defaults, slot
// hints, peer entries), bumping peers_epoch when it repaired a peer entry so that readers
// that cached a scan look again; the caller holds the writer lock.
func repairRecords(v wire.View, nslots, npeers uint32) {
	repairRecord(v, wire.ClassOff(0))
	repairRecord(v, wire.ClassOff(1))
	for i := uint32(0); i < nslots; i++ {
		repairRecord(v, wire.SlotOff(i)+wire.SlHint)
	}
	peers := false
	for j := uint32(0); j < npeers; j++ {
		peers = repairRecord(v, wire.PeerOff(nslots, j)) || peers
	}
	if peers {
		v.Add32(wire.OffPeersEpoch, 1)
	}
}
