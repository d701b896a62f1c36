package shm

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// view reads and writes little-endian fields of a segment image. A live view (an mmap shared
// with other processes) uses single aligned atomic accesses for 32- and 64-bit fields, as the
// spec requires; a plain view (a file image) uses ordinary loads.
type view struct {
	b    []byte
	live bool
}

func (v view) u8(off int) uint8 { return v.b[off] }

func (v view) u16(off int) uint16 { return binary.LittleEndian.Uint16(v.b[off:]) }

func (v view) u32(off int) uint32 {
	if v.live {
		return atomic.LoadUint32((*uint32)(unsafe.Pointer(&v.b[off])))
	}
	return binary.LittleEndian.Uint32(v.b[off:])
}

func (v view) u64(off int) uint64 {
	if v.live {
		return atomic.LoadUint64((*uint64)(unsafe.Pointer(&v.b[off])))
	}
	return binary.LittleEndian.Uint64(v.b[off:])
}

func (v view) put8(off int, x uint8) { v.b[off] = x }

func (v view) put16(off int, x uint16) { binary.LittleEndian.PutUint16(v.b[off:], x) }

func (v view) put32(off int, x uint32) {
	if v.live {
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&v.b[off])), x)
		return
	}
	binary.LittleEndian.PutUint32(v.b[off:], x)
}

func (v view) put64(off int, x uint64) {
	if v.live {
		atomic.StoreUint64((*uint64)(unsafe.Pointer(&v.b[off])), x)
		return
	}
	binary.LittleEndian.PutUint64(v.b[off:], x)
}

func (v view) cas64(off int, old, new uint64) bool {
	if v.live {
		return atomic.CompareAndSwapUint64((*uint64)(unsafe.Pointer(&v.b[off])), old, new)
	}
	if v.u64(off) != old {
		return false
	}
	v.put64(off, new)
	return true
}

func (v view) add64(off int, d uint64) {
	if v.live {
		atomic.AddUint64((*uint64)(unsafe.Pointer(&v.b[off])), d)
		return
	}
	v.put64(off, v.u64(off)+d)
}

func (v view) add32(off int, d uint32) {
	if v.live {
		atomic.AddUint32((*uint32)(unsafe.Pointer(&v.b[off])), d)
		return
	}
	v.put32(off, v.u32(off)+d)
}

// readRecord is the seqlock reader of spec 5.1 (Go atomics are sequentially consistent, so
// no explicit fences are needed). A plain view reads the raw fields once, odd seq included.
func (v view) readRecord(off int) (Record, error) {
	if !v.live {
		r := v.rawRecord(off)
		if r.Seq&1 != 0 {
			return r, ErrBusy
		}
		return r, nil
	}
	for i := 0; i < SeqAttempts; i++ {
		s1 := v.u32(off + recSeq)
		if s1&1 != 0 {
			continue
		}
		r := v.rawRecord(off)
		if v.u32(off+recSeq) == s1 {
			r.Seq = s1
			return r, nil
		}
	}
	return v.rawRecord(off), ErrBusy
}

func (v view) rawRecord(off int) Record {
	return Record{
		Seq:       v.u32(off + recSeq),
		SupBw:     v.u32(off + recSupBw),
		Flags:     v.u32(off + recFlags),
		Gen:       v.u32(off + recGen),
		SetNs:     v.u64(off + recSetNs),
		PeerIP:    IPv4(v.u32(off + recPeerIP)),
		PrefixLen: v.u8(off + recPrefixLen),
	}
}

// writeRecord is the seqlock writer of spec 5.1; the caller holds the writer lock.
func (v view) writeRecord(off int, r Record) {
	w := v.u32(off+recSeq) | 1
	v.put32(off+recSeq, w)
	v.writeRecordFields(off, r)
	v.put32(off+recSeq, w+1)
}

func (v view) writeRecordFields(off int, r Record) {
	v.put32(off+recSupBw, r.SupBw)
	v.put32(off+recFlags, r.Flags)
	v.put32(off+recGen, r.Gen)
	v.put64(off+recSetNs, r.SetNs)
	v.put32(off+recPeerIP, uint32(r.PeerIP))
	v.put8(off+recPrefixLen, r.PrefixLen)
}

// bytes copies n bytes at off.
func (v view) bytes(off, n int) []byte { return append([]byte(nil), v.b[off:off+n]...) }
