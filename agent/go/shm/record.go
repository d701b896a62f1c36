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
