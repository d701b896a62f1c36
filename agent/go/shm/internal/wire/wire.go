// Package wire is the byte layout of the hint segment (docs/shm-format.md, section 4) and the
// accessor that reads and writes its fields. It is shared by package shm (the agent's side)
// and package shm/emulate (the plugin's side, for simulators and tests), so that both use
// one copy of every offset.
package wire

import (
	"encoding/binary"
	"runtime/debug"
	"sync/atomic"
	"unsafe"
)

// Sizes of the segment's parts.
const (
	HeaderSize  = 256
	SlotSize    = 384
	PeerSize    = 64
	NICNameSize = 24 // a NIC name field: char[24], NUL-padded
)

// Lock bytes (spec 5.7): file offsets used as OFD lock keys, never as data.
const (
	LockAttach = 0 // shared: a plugin process has the segment attached
	LockAgent  = 1 // exclusive: the one agent that beats the heartbeat
)

// Header field offsets.
const (
	OffMagic       = 0
	OffVersion     = 8
	OffHeaderSize  = 12
	OffTotalSize   = 16
	OffNSlots      = 24
	OffSlotSize    = 28
	OffNPeers      = 32
	OffPeerSize    = 36
	OffFlags       = 40
	OffHeartbeat   = 64
	OffAgentPID    = 72
	OffPeersEpoch  = 76
	OffCreated     = 80
	OffClassRecord = 128 // two hint records, 64 bytes each
)

// Hint record field offsets (relative to the record).
const (
	RecSeq       = 0
	RecSupBw     = 4
	RecFlags     = 8
	RecGen       = 12
	RecSetNs     = 16
	RecPeerIP    = 24
	RecPrefixLen = 28
	RecSize      = 64
)

// Slot field offsets (relative to the slot).
const (
	SlOwner         = 0
	SlGen           = 8
	SlConnID        = 16
	SlLocalIP       = 24
	SlPeerIP        = 28
	SlPeerIsland    = 32
	SlPathClass     = 36
	SlIsSend        = 37
	SlNQPsSout      = 38
	SlNQPsSup       = 40
	SlDev           = 42 // the fused device
	SlPID           = 44
	SlRegistered    = 48
	SlSoutPort      = 56 // the NICs' ports, u8 each
	SlSupPort       = 57
	SlSupPath       = 58 // how SUP reaches the peer
	SlHint          = 64
	SlSoutBytes     = 128
	SlSoutRequests  = 136
	SlSupBytes      = 144
	SlSupRequests   = 152
	SlReadsApplied  = 160
	SlReadsFallback = 168
	SlReadsStale    = 176
	SlClamped       = 184
	SlLastSupBw     = 192
	SlLastSource    = 196
	SlLastReadNs    = 200
	SlSoutState     = 208
	SlSupState      = 209
	SlFailovers     = 212
	SlSoutStateNs   = 216
	SlSupStateNs    = 224
	SlAppliedSupBw  = 232
	SlRecoveries    = 236 // times a rail came back into service
	SlFlushWallNs   = 240
	// Per-rail completion telemetry: one 32-byte block per rail, SOUT then SUP.
	SlRailDone = 256
	RdBytes    = 0  // completed_bytes
	RdRequests = 8  // completed_requests
	RdInflight = 16 // inflight_bytes (a gauge)
	RdBusyNs   = 24 // busy_ns: sum of completion - post time over completed requests
	RdSize     = 32
	// Per-rail active time: u64 SOUT, then u64 SUP.
	SlActiveNs = 320
	// The NICs' names: char[NICNameSize] SOUT, then SUP.
	SlSoutNIC   = 336
	SlSupNIC    = 360
	SlTelemetry = 128 // telemetry spans [128, SlotSize)
)

// SlotOff is the offset of slot i.
func SlotOff(i uint32) int { return HeaderSize + int(i)*SlotSize }

// PeerOff is the offset of peer entry j in a segment of nslots slots.
func PeerOff(nslots, j uint32) int { return HeaderSize + int(nslots)*SlotSize + int(j)*PeerSize }

// ClassOff is the offset of path class c's hint record.
func ClassOff(c uint8) int { return OffClassRecord + int(c)*RecSize }

// SlotLockOff is the lock byte of slot i's lease: the slot's first byte.
func SlotLockOff(i uint32) int64 { return int64(SlotOff(i)) }

// View reads and writes little-endian fields of a segment image. A live view (an mmap shared
// with other processes) uses single aligned atomic accesses for 32- and 64-bit fields, as the
// spec requires; a plain view (a file image) uses ordinary loads.
type View struct {
	B    []byte
	Live bool
}

func (v View) U8(off int) uint8 { return v.B[off] }

func (v View) U16(off int) uint16 { return binary.LittleEndian.Uint16(v.B[off:]) }

func (v View) U32(off int) uint32 {
	if v.Live {
		return atomic.LoadUint32((*uint32)(unsafe.Pointer(&v.B[off])))
	}
	return binary.LittleEndian.Uint32(v.B[off:])
}

func (v View) U64(off int) uint64 {
	if v.Live {
		return atomic.LoadUint64((*uint64)(unsafe.Pointer(&v.B[off])))
	}
	return binary.LittleEndian.Uint64(v.B[off:])
}

func (v View) Put8(off int, x uint8) { v.B[off] = x }

func (v View) Put16(off int, x uint16) { binary.LittleEndian.PutUint16(v.B[off:], x) }

func (v View) Put32(off int, x uint32) {
	if v.Live {
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&v.B[off])), x)
		return
	}
	binary.LittleEndian.PutUint32(v.B[off:], x)
}

func (v View) Put64(off int, x uint64) {
	if v.Live {
		atomic.StoreUint64((*uint64)(unsafe.Pointer(&v.B[off])), x)
		return
	}
	binary.LittleEndian.PutUint64(v.B[off:], x)
}

func (v View) CAS64(off int, old, new uint64) bool {
	if v.Live {
		return atomic.CompareAndSwapUint64((*uint64)(unsafe.Pointer(&v.B[off])), old, new)
	}
	if v.U64(off) != old {
		return false
	}
	v.Put64(off, new)
	return true
}

func (v View) Add64(off int, d uint64) {
	if v.Live {
		atomic.AddUint64((*uint64)(unsafe.Pointer(&v.B[off])), d)
		return
	}
	v.Put64(off, v.U64(off)+d)
}

func (v View) Add32(off int, d uint32) {
	if v.Live {
		atomic.AddUint32((*uint32)(unsafe.Pointer(&v.B[off])), d)
		return
	}
	v.Put32(off, v.U32(off)+d)
}

// Bytes copies n bytes at off.
func (v View) Bytes(off, n int) []byte { return append([]byte(nil), v.B[off:off+n]...) }

// PutNICName writes name into a NIC name field: cut to NICNameSize-1 bytes, NUL-padded.
func (v View) PutNICName(off int, name string) {
	for i := range NICNameSize {
		var c byte
		if i < len(name) && i < NICNameSize-1 {
			c = name[i]
		}
		v.Put8(off+i, c)
	}
}

// Guarded runs fn on v with a memory fault inside v's bytes (a segment truncated or unmapped
// under the mapping: SIGBUS) turned into faulted = true instead of a crash (spec 5.9). A fault
// anywhere else is not the segment's and panics on as it came.
func Guarded(v View, fn func(View) error) (faulted bool, err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			fa, ok := r.(interface{ Addr() uintptr })
			base := uintptr(unsafe.Pointer(unsafe.SliceData(v.B)))
			if !ok || fa.Addr()-base >= uintptr(len(v.B)) {
				panic(r)
			}
			faulted = true
		}
	}()
	return false, fn(v)
}
