// lifecycle.go: each init's netCtx and its end at finalize (endNetCtx, called by init.go's
// mpibGoFinalize), the registry of contexts, listeners, attempts and live comms, each comm's
// control-socket watcher (adoptComm, from handshake.go) and NCCL's close of a comm
// (mpibGoCloseComm, called by abi_common.c), and closing the devices when nothing needs them.

package main

/*
#include <stdlib.h>
#include "mpib.h"
#include "mpib_comm.h"
#include "mpib_device.h"
#include "mpib_failover.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Lifecycle. NCCL 2.28+ (ABI v11) calls init and finalize once per communicator, and
// ncclCommAbort may finalize while handshakes are still running in goroutines. The rules:
//   - every init creates a netCtx; its listeners and connect attempts belong to it;
//   - finalize(ctx) cancels the context (closing its sockets), WAITS for every goroutine it
//     started, then destroys the comms NCCL never collected;
//   - the devices close only when no context is left AND no comm is alive (NCCL may close a
//     comm after the last finalize), so no verbs call ever runs on a closed device;
//   - verbs-heavy steps take a slot of a bounded pool, so an all-to-all with thousands of
//     peers cannot park thousands of OS threads in cgo calls at once, and the idle trim ends
//     the threads a burst made (threads.go).

// netCtx is one init call's world.
type netCtx struct {
	id           uint64
	trafficClass int // NCCL's per-communicator class, or tcUndef
	ctx          context.Context
	cancel       context.CancelCauseFunc
	wg           sync.WaitGroup // every goroutine started for this context
}

// liveComm is a connected comm and its control socket, kept open after the handshake as a
// liveness signal: a peer process that dies closes it, and the data path then fails
// waiting requests instead of hanging (see mpib_comm_peer_gone).
type liveComm struct {
	comm      *C.struct_mpib_comm
	conn      net.Conn
	closing   atomic.Bool
	watchDone chan struct{}
	standbyMu sync.Mutex // held while its standby rail is built and sent (standby.go): a close waits (stop)
}

var registry struct {
	mu        sync.Mutex
	nextID    uint64
	ctxs      map[uint64]*netCtx
	listeners map[uint64]*listener
	attempts  map[uint64]*attempt
	comms     map[*C.struct_mpib_comm]*liveComm
}

const tcUndef = -1

func init() {
	registry.ctxs = map[uint64]*netCtx{}
	registry.listeners = map[uint64]*listener{}
	registry.attempts = map[uint64]*attempt{}
	registry.comms = map[*C.struct_mpib_comm]*liveComm{}
}

// newID returns a fresh id; registry.mu must be held.
func newID() uint64 {
	registry.nextID++
	return registry.nextID
}

func newNetCtx(trafficClass int) uint64 {
	c := &netCtx{trafficClass: trafficClass}
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	registry.mu.Lock()
	defer registry.mu.Unlock()
	c.id = newID()
	registry.ctxs[c.id] = c
	return c.id
}

func lookupCtx(id uint64) *netCtx {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return registry.ctxs[id]
}

// finalizedError is the cancellation cause of a finalized context.
type finalizedError struct{}

func (finalizedError) Error() string { return "the NCCL communicator was finalized (or aborted)" }

// endNetCtx cancels a context, waits for its goroutines and reclaims what NCCL did not collect.
// It says whether the context was live: a finalize of an unknown one (NCCL 2.28.3 finalizes a
// communicator whose init failed, with no context) ends nothing.
func endNetCtx(id uint64) bool {
	registry.mu.Lock()
	c := registry.ctxs[id]
	delete(registry.ctxs, id)
	registry.mu.Unlock()
	if c == nil {
		return false
	}
	c.cancel(finalizedError{})
	c.wg.Wait()
	reclaimOwnedBy(c)
	return true
}

// reclaimOwnedBy closes the listeners and destroys finished but uncollected attempts of a
// context whose goroutines have all returned.
func reclaimOwnedBy(c *netCtx) {
	registry.mu.Lock()
	var ls []*listener
	// Listeners stay in the registry until NCCL's closeListen, which frees their listen comm:
	// it must find the listener to wait for a close running here (l.mu) before it does.
	for _, l := range registry.listeners {
		if l.owner == c {
			ls = append(ls, l)
		}
	}
	var attempts []*attempt
	for id, a := range registry.attempts {
		if a.owner == c {
			delete(registry.attempts, id)
			attempts = append(attempts, a)
		}
	}
	registry.mu.Unlock()
	for _, l := range ls {
		l.close(false)
	}
	var orphans []*C.struct_mpib_comm
	for _, a := range attempts { // every handshake has ended (c.wg): collected, or not
		if comm := a.reclaim(); comm != nil {
			orphans = append(orphans, comm)
		}
	}
	for _, comm := range orphans {
		closeComm(comm, false)
	}
	if n := len(ls) + len(orphans); n > 0 {
		infof("finalize: reclaimed %d listener(s) and %d connection(s) NCCL never collected", len(ls), len(orphans))
	}
}

// adoptComm registers a freshly connected comm and starts watching its control socket.
func adoptComm(comm *C.struct_mpib_comm, conn net.Conn) *liveComm {
	conn.SetDeadline(time.Time{})
	lc := &liveComm{comm: comm, conn: conn, watchDone: make(chan struct{})}
	registry.mu.Lock()
	registry.comms[comm] = lc
	registry.mu.Unlock()
	// The data path writes one byte on this socket when its side of the connection failed
	// for good (no rail left), so that the peer fails its requests at once instead of
	// waiting for its own timeouts.
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) { C.mpib_comm_set_ctrl_fd(comm, C.int(fd)) })
		}
	}
	go func() {
		defer recoverGoroutine("comm liveness watcher")
		lc.watch()
	}()
	return lc
}

// fenceRecordSize is the size of a receiver's fence record ('R' messages), confirmRecordSize
// of a sender's confirm record ('C').
const (
	fenceRecordSize   = C.sizeof_struct_mpib_fence_rec
	confirmRecordSize = C.sizeof_struct_mpib_confirm_rec
)

// watch reads the control socket after the handshake. The peer's data path writes three kinds
// of messages there: 'N' rail word (a failover notice, 1 + 1 + 8 bytes little-endian, also
// sent by RDMA; see post_notice in mpib_p2p.c), 'R' rail record (the receiver's fence record
// of a rail, 1 + 1 + fenceRecordSize bytes, also sent by RDMA when a rail can carry it; see
// post_record), 'C' rail record (the sender's confirm record of a rail, 1 + 1 +
// confirmRecordSize bytes, likewise; see post_confirm) and 'F' (its side failed for good: fail
// the requests waiting on it now). Its control plane writes two about a standby rail
// (standby.go): 'J' rail info (the sender's QPs, 1 + 1 + joinInfoSize bytes) and 'K' rail (the
// receiver took them).
// Anything else, or the end of the stream, means the peer is gone (or misbehaves).
func (lc *liveComm) watch() {
	defer close(lc.watchDone)
	var b [10]byte
	var rec [max(fenceRecordSize, confirmRecordSize, joinInfoSize)]byte
	var err error
	for {
		if _, err = io.ReadFull(lc.conn, b[:1]); err != nil || !strings.ContainsRune("NRCJK", rune(b[0])) {
			break
		}
		if b[0] == 'J' || b[0] == 'K' {
			if err = lc.watchJoin(b[0], rec[:joinInfoSize]); err != nil {
				break
			}
			continue
		}
		if b[0] == 'R' || b[0] == 'C' {
			size := fenceRecordSize
			if b[0] == 'C' {
				size = confirmRecordSize
			}
			if _, err = io.ReadFull(lc.conn, b[1:2]); err != nil {
				break
			}
			if _, err = io.ReadFull(lc.conn, rec[:size]); err != nil {
				break
			}
			if lc.closing.Load() {
				continue
			}
			if b[0] == 'R' {
				C.mpib_comm_tcp_record(lc.comm, C.int(b[1]), unsafe.Pointer(&rec[0]))
				// A sender NCCL is not calling (every send of it completed) still answers what
				// its acknowledgements show delivered; the data path answers when it runs.
				C.mpib_comm_answer_record(lc.comm, C.int(b[1]), unsafe.Pointer(&rec[0]))
			} else {
				C.mpib_comm_tcp_confirm(lc.comm, C.int(b[1]), unsafe.Pointer(&rec[0]))
			}
			continue
		}
		if _, err = io.ReadFull(lc.conn, b[1:]); err != nil {
			break
		}
		if !lc.closing.Load() {
			word := C.uint64_t(binary.LittleEndian.Uint64(b[2:]))
			C.mpib_comm_tcp_notice(lc.comm, C.int(b[1]), word)
			// A receiver NCCL is not calling (no receive open) still answers a FAIL.
			C.mpib_comm_answer_notice(lc.comm, C.int(b[1]), word)
		}
	}
	if lc.closing.Load() {
		return
	}
	if err == nil && b[0] == 'F' {
		C.mpib_comm_peer_failed(lc.comm)
		warnf("peer %v reported that its side of the connection failed (no rail left): requests waiting on it fail now",
			lc.conn.RemoteAddr())
		return
	}
	C.mpib_comm_peer_gone(lc.comm)
	infof("peer %v closed its control connection (%v): requests still waiting on it will fail",
		lc.conn.RemoteAddr(), err)
}

// watchJoin reads the rest of a 'J' or 'K' message (watch) into buf and hands it to the data
// path: a receiver stages the sender's standby QPs and answers 'K'; a sender records the
// answer. Its sender's recovery then brings the rail up.
func (lc *liveComm) watchJoin(kind byte, buf []byte) error {
	var rail [1]byte
	if _, err := io.ReadFull(lc.conn, rail[:]); err != nil {
		return err
	}
	var info *C.struct_mpib_join_info
	if kind == 'J' {
		if _, err := io.ReadFull(lc.conn, buf); err != nil {
			return err
		}
		info = (*C.struct_mpib_join_info)(unsafe.Pointer(&buf[0]))
	}
	if lc.closing.Load() {
		return nil
	}
	if (kind == 'J') == (lc.comm.is_send != 0) || C.mpib_comm_join_peer(lc.comm, C.int(rail[0]), info) != 0 {
		lc.unexpectedJoin(kind, rail[0])
		return nil
	}
	if kind == 'J' && lc.ctrlSend([]byte{'K', rail[0]}) != 0 {
		warnf("peer %v: answering its standby rail's QPs failed; it will not join", lc.conn.RemoteAddr())
	}
	return nil
}

// unexpectedJoins limits the lines about standby rail messages a peer should not have sent: a
// buggy or hostile peer may send them in a loop, on any number of connections.
var unexpectedJoins burstLog

func (lc *liveComm) unexpectedJoin(kind, rail byte) {
	switch n, total := unexpectedJoins.note(time.Now()); n {
	case 0:
	case 1:
		warnf("peer %v: an unexpected standby rail message %q for rail %d: ignored (%d so far)", lc.conn.RemoteAddr(), kind, rail, total)
	default:
		warnf("%d unexpected standby rail messages from peers in the last second: ignored (%d so far; the last from %v, %q for rail %d)",
			n, total, lc.conn.RemoteAddr(), kind, rail)
	}
}

// closeComm stops a comm's watcher and frees its verbs resources; then, when it was the last
// comm after the last finalize, closes the devices. inGoroutine: called from one of MPIB's
// goroutines, which frees the resources in a verbs slot; NCCL's threads (closeSend/closeRecv,
// closeListen, finalize) free them themselves.
func closeComm(comm *C.struct_mpib_comm, inGoroutine bool) {
	registry.mu.Lock()
	lc := registry.comms[comm]
	delete(registry.comms, comm)
	registry.mu.Unlock()
	if lc != nil {
		lc.stop()
	}
	freeComm(comm, inGoroutine)
	noteActivity() // the watcher's exit may have made the runtime start a thread
}

// stop ends every use of the comm but NCCL's, so that its memory can be freed: its watcher and
// a standby rail being built (standby.go) are finished, and its control socket closed. The
// socket leaves the comm first: a control-plane send on it (a standby's join, an answer) waits
// for a peer that does not read, up to about 2 s per wait (mpib_comm_ctrl_send), and gives up
// at once without the socket; the standby builder, which holds standbyMu through its send,
// then ends at once too. The socket itself closes only after the builder ended: until then its
// send may still poll it.
func (lc *liveComm) stop() {
	lc.closing.Store(true)
	C.mpib_comm_set_ctrl_fd(lc.comm, -1)
	lc.standbyMu.Lock() // the builder uses the comm's memory: it is finished first
	lc.standbyMu.Unlock()
	lc.conn.Close()
	<-lc.watchDone
}

// ctrlSend sends msg whole on the control socket (mpib_comm_ctrl_send): 0 or its -errno.
func (lc *liveComm) ctrlSend(msg []byte) C.int {
	return C.mpib_comm_ctrl_send(lc.comm, unsafe.Pointer(&msg[0]), C.size_t(len(msg)))
}

// closeDevicesIfUnused closes the devices once no context and no comm needs them. Every comm
// counts until its verbs resources are freed, NCCL's and those only MPIB's goroutines hold (a
// handshake's, a listener's spare, one being freed in a verbs slot after a finalize that did
// not wait for it): each path that frees one calls this after, and the last closes them.
func closeDevicesIfUnused() {
	plugin.mu.Lock()
	defer plugin.mu.Unlock()
	if plugin.refs == 0 && C.mpib_comms_alive() == 0 && plugin.devicesOpen {
		closeAgentSegment()
		plugin.warming.Wait()
		C.mpib_nic_close_all()
		forgetGIDTables()
		plugin.devicesOpen = false
		infof("devices closed")
	}
}

//export mpibGoCloseComm
func mpibGoCloseComm(comm unsafe.Pointer) (rc C.int) {
	defer recoverEntry("close", &rc)
	if comm != nil {
		closeComm((*C.struct_mpib_comm)(comm), false)
	}
	return C.int(resSuccess)
}
