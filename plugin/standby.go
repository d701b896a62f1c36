// standby.go: the standby rail that joins a connection after its handshake (docs/failover.md,
// "The standby rail"). A vanilla intra-island sender builds its SOUT rail, which carries
// nothing while SUP works, only once the process's connection setups are done
// (queueStandby: no handshake running for standbyQuiet, or standbyMaxWait after the
// connection was made), one connection at a time in a verbs slot, and sends its QPs on the
// control socket ('J'); the receiver's watcher stages them and answers ('K', watchJoin in
// lifecycle.go); the sender's recovery then brings the rail up as it does any rail out of
// service. A connection none of whose rails came up at connect joins it in the handshake
// instead (joinStandbyNow).

package main

/*
#include "mpib.h"
#include "mpib_comm.h"
#include "mpib_failover.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// standbyQuiet is how long no handshake may have run before the standby rails are built: a
// burst's connections arrive milliseconds apart (NCCL connects every channel's peers at once),
// and its last ones wait for the peer's too. standbyMaxWait bounds the wait behind a stream of
// handshakes that never pauses. Until its standby joins, a connection whose SUP fails rides
// through (docs/failover.md).
const (
	standbyQuiet   = 100 * time.Millisecond
	standbyMaxWait = 2 * time.Second
)

// joinInfoSize is a 'J' message's payload: the sender's struct mpib_join_info (both ends run
// the same plugin version on the same architecture, as for the fence records).
const joinInfoSize = C.sizeof_struct_mpib_join_info

var standby struct {
	mu      sync.Mutex
	queue   []standbyJob
	running bool
}

type standbyJob struct {
	lc     *liveComm
	queued time.Time
}

// lastHandshakeEnd is when the last handshake ended (unix nanoseconds; handshakeEnds).
var lastHandshakeEnd atomic.Int64

// queueStandby has the standby builder join lc's standby rail once the setups are done.
func queueStandby(lc *liveComm) {
	standby.mu.Lock()
	standby.queue = append(standby.queue, standbyJob{lc: lc, queued: time.Now()})
	start := !standby.running
	standby.running = true
	standby.mu.Unlock()
	if start {
		startStandby()
	}
}

// startStandby runs the builder; one that ends by a panic hands the queue left to a new one,
// so later connections still get their standby.
func startStandby() {
	go func() {
		ended := false
		defer func() {
			if ended {
				return
			}
			standby.mu.Lock()
			restart := len(standby.queue) > 0
			standby.running = restart
			standby.mu.Unlock()
			if restart {
				startStandby()
			}
		}()
		defer recoverGoroutine("standby rails")
		runStandby()
		ended = true
	}()
}

// runStandby builds the queued standby rails, oldest first, and ends with the queue.
func runStandby() {
	for {
		standby.mu.Lock()
		if len(standby.queue) == 0 {
			standby.running = false
			standby.mu.Unlock()
			return
		}
		job := standby.queue[0]
		standby.queue = standby.queue[1:]
		standby.mu.Unlock()
		waitSetupsDone(job.queued)
		if err := job.lc.buildStandby(); err != nil {
			warnf("connection to %v: its standby SOUT rail could not be built: %v; a SUP failure rides through until SUP is back", job.lc.conn.RemoteAddr(), err)
		}
	}
}

// waitSetupsDone returns once no handshake has run for standbyQuiet, or standbyMaxWait after
// queued. It sleeps until the quiet period could end, a whole one while handshakes run: it
// wakes a few times per burst, not every millisecond of it.
func waitSetupsDone(queued time.Time) {
	for {
		now := time.Now()
		idle := now.Sub(time.Unix(0, lastHandshakeEnd.Load()))
		running := handshakesInFlight.Load() > 0
		left := standbyMaxWait - now.Sub(queued)
		if (!running && idle >= standbyQuiet) || left <= 0 {
			return
		}
		wait := standbyQuiet - idle
		if running {
			wait = standbyQuiet
		}
		time.Sleep(min(max(wait, time.Millisecond), left))
	}
}

// buildStandby builds lc's standby rail and sends its QPs to the receiver ('J'); the
// receiver's 'K' (watchJoin) completes the join. Nothing happens once NCCL closed the comm,
// and a close during the send ends it (stop): no error then. It waits for its verbs slot
// before it takes standbyMu, on which a close waits: a close must not wait behind other
// connections' setups queued for the slots; in the slot it looks at closing again, under
// standbyMu, so that no QPs are built for a comm already closing.
func (lc *liveComm) buildStandby() error {
	if lc.closing.Load() {
		return nil
	}
	locked, closed := false, false
	defer func() {
		if locked {
			lc.standbyMu.Unlock()
		}
	}()
	rc, err := withVerbsSlot(context.Background(), func() C.int {
		lc.standbyMu.Lock()
		locked = true
		if closed = lc.closing.Load(); closed {
			return 0
		}
		return C.mpib_comm_build_deferred(lc.comm, 0)
	})
	if err == nil && rc != 0 {
		err = fmt.Errorf("building its QPs failed (%d)", int(rc))
	}
	if err != nil || closed {
		return err
	}
	if rc := lc.ctrlSend(joinMessage(lc.comm, 0)); rc != 0 {
		if lc.closing.Load() { // NCCL closed the comm meanwhile: its socket left first (stop)
			return nil
		}
		return fmt.Errorf("sending its QPs on the control socket failed (%d)", int(rc))
	}
	return nil
}

// joinMessage is rail r's 'J' message: the kind, the rail and the sender's join info.
func joinMessage(comm *C.struct_mpib_comm, r int) []byte {
	var info C.struct_mpib_join_info
	C.mpib_comm_join_info(comm, C.int(r), &info)
	msg := []byte{'J', byte(r)}
	return append(msg, unsafe.Slice((*byte)(unsafe.Pointer(&info)), joinInfoSize)...)
}

// joinStandbyNow joins the standby rail in the handshake, on its socket, when no rail came up
// at connect on one end or both (the ack's flag): the sender builds its QPs and sends them
// ('J'), the receiver brings its QPs up against them and answers ('K'), the sender brings its
// own up and says how that went ('R', or 'F' with the errno). The receiver returns its comm to
// NCCL only on 'R': its first receive posts a CTS on this rail, which a sender QP not yet at
// RTR would drop. The comm then starts on the standby rail, the other one out of service
// (docs/failover.md, degraded start). The caller's deadline on c bounds every read.
func joinStandbyNow(ctx context.Context, c net.Conn, comm *C.struct_mpib_comm, isSend bool, peer netip.Addr) error {
	const r = 0
	if comm.rail[r].join_wait == 0 {
		return fmt.Errorf("no rail to %v came up, and none waits to join", peer)
	}
	inSlot := func(fn func() C.int) error {
		rc, err := withVerbsSlot(ctx, fn)
		if err == nil && rc != 0 {
			err = syscall.Errno(-rc)
		}
		return err
	}
	ops := joinOps{
		build: func() error { return inSlot(func() C.int { return C.mpib_comm_build_deferred(comm, r) }) },
		info:  func() []byte { return joinMessage(comm, r) },
		stage: func(info []byte) error {
			var in *C.struct_mpib_join_info
			if info != nil {
				in = (*C.struct_mpib_join_info)(unsafe.Pointer(&info[0]))
			}
			if rc := C.mpib_comm_join_peer(comm, r, in); rc != 0 {
				return syscall.Errno(-rc)
			}
			return nil
		},
		now: func() error { return inSlot(func() C.int { return C.mpib_comm_join_now(comm, r) }) },
	}
	if err := runJoinNow(c, r, isSend, ops, peer); err != nil {
		return err
	}
	if isSend {
		warnf("send comm to %v: no rail came up at connect; its standby SOUT rail joined in the handshake", peer)
	}
	return nil
}

// joinOps are the verbs steps of an in-handshake join, which runJoinNow sequences with the
// peer: build the sender's QPs, its 'J' message, stage the peer's QPs (the receiver's the
// 'J' payload, the sender's nil: the 'K' only says they are staged) and bring this end's up.
type joinOps struct {
	build func() error
	info  func() []byte
	stage func(info []byte) error
	now   func() error
}

// runJoinNow is joinStandbyNow's exchange on c for rail r.
func runJoinNow(c net.Conn, r byte, isSend bool, ops joinOps, peer netip.Addr) error {
	if !isSend {
		msg := make([]byte, 2+joinInfoSize)
		if _, err := io.ReadFull(c, msg); err != nil {
			return fmt.Errorf("standby rail's QPs from %v: %w", peer, err)
		}
		if msg[0] != 'J' || msg[1] != r || ops.stage(msg[2:]) != nil {
			return fmt.Errorf("peer %v: not a standby rail's QPs (% x...)", peer, msg[:2])
		}
		if err := ops.now(); err != nil {
			return onThisHost(fmt.Errorf("bringing the standby SOUT rail to %v up failed: %w", peer, err))
		}
		if _, err := c.Write([]byte{'K', r}); err != nil {
			return err
		}
		done := make([]byte, joinDoneSize)
		if _, err := io.ReadFull(c, done); err != nil {
			return fmt.Errorf("peer %v: its end of the standby SOUT rail: %w", peer, err)
		}
		return joinDoneErr(done, r, peer)
	}
	if err := ops.build(); err != nil {
		return onThisHost(fmt.Errorf("building the standby SOUT rail for %v failed: %w", peer, err))
	}
	if _, err := c.Write(ops.info()); err != nil {
		return fmt.Errorf("standby rail's QPs to %v: %w", peer, err)
	}
	ack := make([]byte, 2)
	if _, err := io.ReadFull(c, ack); err != nil || ack[0] != 'K' || ack[1] != r {
		return errors.Join(err, fmt.Errorf("peer %v did not take the standby rail's QPs (% x)", peer, ack))
	}
	ops.stage(nil)
	err := ops.now()
	if _, werr := c.Write(joinDoneMessage(r, err)); err == nil && werr != nil {
		return fmt.Errorf("standby rail's readiness to %v: %w", peer, werr)
	}
	if err != nil {
		return onThisHost(fmt.Errorf("bringing the standby SOUT rail to %v up failed: %w", peer, err))
	}
	return nil
}

// joinDoneSize is the sender's last message of an in-handshake join: kind ('R' ready, 'F'
// failed) | rail | errno (the failure's, 0 when it has none, e.g. the slot's wait ended).
const joinDoneSize = 3

// joinDoneMessage is the sender's last word of an in-handshake join of rail r: 'R' when its
// QPs are up (err nil), else 'F' with err's errno.
func joinDoneMessage(r byte, err error) []byte {
	if err == nil {
		return []byte{'R', r, 0}
	}
	var errno syscall.Errno
	code := byte(0)
	if errors.As(err, &errno) && errno < 256 {
		code = byte(errno)
	}
	return []byte{'F', r, code}
}

// joinDoneErr reads the sender's last word of the join of rail r: nil for 'R' only.
func joinDoneErr(b []byte, r byte, peer netip.Addr) error {
	switch {
	case len(b) != joinDoneSize || b[1] != r || (b[0] != 'R' && b[0] != 'F') || (b[0] == 'R' && b[2] != 0):
		return fmt.Errorf("peer %v: not the end of a standby rail's join (% x)", peer, b)
	case b[0] == 'F' && b[2] != 0:
		return fmt.Errorf("peer %v could not bring its end of the standby SOUT rail up: %w", peer, syscall.Errno(b[2]))
	case b[0] == 'F':
		return fmt.Errorf("peer %v could not bring its end of the standby SOUT rail up", peer)
	}
	return nil
}
