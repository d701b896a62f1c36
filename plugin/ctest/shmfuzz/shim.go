package shmfuzz

/*
#cgo CFLAGS: -std=gnu11 -D_GNU_SOURCE -I${SRCDIR}/../..
#cgo LDFLAGS: -lpthread
#include <stdlib.h>
#include <string.h>
// The plugin's segment reader (every plugin/mpib_shm_*.c) and the C tests' decoders, as one
// translation unit: their file-local names are distinct.
#include "../../mpib_shm_guard.c"
#include "../../mpib_shm_map.c"
#include "../../mpib_shm_hint.c"
#include "../../mpib_shm_conn.c"
#include "../../mpib_shm_watch.c"
#include "../shm_decode.c"
*/
import "C"

import (
	"strings"
	"unsafe"
)

// Image is a segment image held in C memory (aligned for the reader's atomics).
type Image struct {
	buf unsafe.Pointer
	n   int
	shm *C.mpib_shm
	// Err is the reader's message when it refused the image ("" when attached).
	Err string
}

// Attach copies b into C memory and attaches the C reader to it.
func Attach(b []byte) *Image {
	im := &Image{n: len(b), buf: C.calloc(C.size_t(len(b)+8), 1)}
	if len(b) > 0 {
		C.memcpy(im.buf, unsafe.Pointer(&b[0]), C.size_t(len(b)))
	}
	var errbuf [512]C.char
	if C.mpib_shm_attach_image(im.buf, C.size_t(len(b)), &im.shm, &errbuf[0], C.size_t(len(errbuf))) != 0 {
		im.Err = C.GoString(&errbuf[0])
	}
	return im
}

// ValidateCode runs mpib_shm_validate and returns the spec's code from its message ("" when
// the image is valid).
func ValidateCode(b []byte) string {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	var errbuf [512]C.char
	if C.mpib_shm_validate(p, C.size_t(len(b)), &errbuf[0], C.size_t(len(errbuf))) == 0 {
		return ""
	}
	return codeOf(C.GoString(&errbuf[0]))
}

func codeOf(msg string) string {
	// "mpib shm PATH: CODE: detail"
	parts := strings.SplitN(msg, ": ", 3)
	if len(parts) < 2 {
		return msg
	}
	return parts[1]
}

// Code is the code of the reader's refusal ("" when attached).
func (im *Image) Code() string {
	if im.Err == "" {
		return ""
	}
	return codeOf(im.Err)
}

// Close detaches and frees the C memory.
func (im *Image) Close() {
	if im.shm != nil {
		C.mpib_shm_close(im.shm)
	}
	C.free(im.buf)
}

// Resolution is mpib_shm_hint.
type Resolution struct {
	Applies bool
	SupBw   uint32
	Source  uint8
	Clamped bool
}

// Resolve runs mpib_shm_resolve on segment slot `slot`.
func (im *Image) Resolve(slot uint32, now, stale uint64) Resolution {
	var h C.mpib_shm_hint
	ok := C.mpib_shm_resolve(im.shm, C.uint32_t(slot), C.uint64_t(now), C.uint64_t(stale), &h)
	return Resolution{ok == 1, uint32(h.sup_bw), uint8(h.source), h.clamped != 0}
}

// Header is mpib_shm_header_info.
type Header struct {
	Version, NSlots, NPeers, Flags, AgentPID, PeersEpoch uint32
	TotalSize, HeartbeatNs, CreatedNs                    uint64
}

// DecodeHeader runs mpib_shm_decode_header.
func (im *Image) DecodeHeader() (Header, bool) {
	var h C.mpib_shm_header_info
	if C.mpib_shm_decode_header(im.shm, &h) != 0 {
		return Header{}, false
	}
	return Header{uint32(h.version), uint32(h.nslots), uint32(h.npeers), uint32(h.flags), uint32(h.agent_pid),
		uint32(h.peers_epoch), uint64(h.total_size), uint64(h.heartbeat_ns), uint64(h.created_ns)}, true
}

// SlotFields are the decoded descriptor fields, the raw hint and telemetry of a slot.
type SlotFields struct {
	State, OwnerPID, Gen, PeerIP, PID, HintSeq, HintSupBw, HintFlags, HintGen uint32
	ConnID, SoutBytes, SupBytes, LastReadNs                                   uint64
	PathClass, IsSend                                                         uint8
	// Version 3 completion telemetry (a sample of its fields: one per offset group).
	AppliedSupBw                                                      uint32
	FlushWallNs, SoutCompletedBytes, SoutBusyNs, SupCompletedRequests uint64
	SupInflightBytes, SupActiveNs                                     uint64
}

// DecodeSlot runs mpib_shm_decode_slot.
func (im *Image) DecodeSlot(i uint32) (SlotFields, bool) {
	var s C.mpib_shm_slot_info
	if C.mpib_shm_decode_slot(im.shm, C.uint32_t(i), &s) != 0 {
		return SlotFields{}, false
	}
	return SlotFields{uint32(s.state), uint32(s.owner_pid), uint32(s.gen), uint32(s.peer_sout_ip), uint32(s.pid),
		uint32(s.hint.seq), uint32(s.hint.sup_bw), uint32(s.hint.flags), uint32(s.hint.gen),
		uint64(s.conn_id), uint64(s.sout_bytes), uint64(s.sup_bytes), uint64(s.last_read_ns),
		uint8(s.path_class), uint8(s.is_send), uint32(s.applied_sup_bw), uint64(s.flush_wall_ns),
		uint64(s.completed_bytes[0]), uint64(s.busy_ns[0]), uint64(s.completed_requests[1]), uint64(s.inflight_bytes[1]),
		uint64(s.active_ns[1])}, true
}

// Exercise runs the plugin's per-connection calls on the image: register (claims a free slot
// or waits), read_hint, add_telemetry, flush_telemetry, release. It returns read_hint's result.
func (im *Image) Exercise(connID uint64, stale uint64) (int, uint32) {
	d := C.mpib_conn_desc{peer_sout_ip: C.uint32_t(connID), path_class: C.uint8_t(connID % 3), is_send: 1,
		pid: 4242, conn_id: C.uint64_t(connID)}
	var id C.uint32_t
	if C.mpib_shm_register(im.shm, &d, &id) != 0 {
		return -1, 0
	}
	var bw C.uint32_t
	ok := C.mpib_shm_read_hint(im.shm, id, C.uint64_t(stale), &bw)
	C.mpib_shm_add_telemetry(im.shm, id, 1, 4096)
	var b C.mpib_shm_tele_batch
	b.rail[0].completed_bytes, b.rail[0].completed_requests, b.rail[0].busy_ns = 4096, 1, 1000
	b.rail[1].inflight_bytes, b.applied_sup_bw, b.wall_ns = 4096, 512, 1
	C.mpib_shm_flush_telemetry(im.shm, id, &b)
	C.mpib_shm_release(im.shm, id)
	return int(ok), uint32(bw)
}
