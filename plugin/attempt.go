// attempt.go: NCCL's connect (mpibGoConnect, called by abi_common.c's mpib_connect when C
// cannot answer it alone) and the table of connect attempts. Connection setup runs in
// goroutines so that NCCL's connect/accept calls never block: each call only looks at whether
// the handshake finished, so two peers connecting to each other first cannot deadlock. An
// attempt's result goes to its entry in the C pending table (mpib_pending_*), where connect()
// takes it without calling into Go, or stays here for a connect that polls through Go. Also
// the connect queue's dispatcher (started by init.go's mpibGoInit), which starts the
// handshakes connect() queued in C, and the reclaim of results NCCL never collected
// (lifecycle.go's finalize calls attempt.reclaim). Every goroutine belongs to the netCtx of the
// init that created its attempt (lifecycle.go). The handshake itself starts in dial.go.

package main

/*
#include "mpib.h"
#include "mpib_handoff.h"
*/
import "C"

import (
	"os"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/wire"
)

// result is a finished handshake: its comm, or why it failed.
type result struct {
	comm *C.struct_mpib_comm
	err  error
}

// attempt is one connect. Its result goes to its entry in the C pending table, where
// connect() takes it without calling into Go; without an entry (the table was full) connect
// polls through Go and finds it in res.
type attempt struct {
	owner        *netCtx
	key          wire.Handle // the listener it connects to: a poll must present the same handle
	done         chan struct{}
	res          result
	pend         uint32      // entry in the C pending table (index + 1), 0 = none
	gen          uint32      // the entry's generation
	taken        bool        // without an entry: the result was claimed (registry.mu)
	reclaimTimer *time.Timer // set when the handshake ended (registry.mu)
}

//export mpibGoConnect
func mpibGoConnect(ctxID C.uint64_t, dev C.int, trafficClass C.int, handle unsafe.Pointer, sendComm *unsafe.Pointer) (rc C.int) {
	defer recoverEntry("connect", &rc)
	*sendComm = nil
	hb := unsafe.Slice((*byte)(handle), wire.HandleSize)
	if id := wire.Attempt(hb); id != 0 {
		return pollAttempt(id, hb, sendComm)
	}
	if idx1, _ := wire.Pending(hb); idx1 != 0 {
		warnf("connect: the handle's connection attempt was collected already (or reclaimed)")
		return C.int(resInvalidUsage)
	}
	h, owner, tc, prc := prepareConnect(uint64(ctxID), dev, int(trafficClass), hb)
	d := int(dev)
	if prc != resSuccess {
		return C.int(prc)
	}
	var gen C.uint32_t
	idx1 := C.mpib_pending_acquire(handle, &gen)
	id, ok := startAttempt(owner, h, d, tc, uint32(idx1), uint32(gen))
	if !ok {
		if idx1 != 0 {
			refuseEntry(uint32(idx1), uint32(gen), resInvalidUsage, 0)
		}
		return C.int(resInvalidUsage)
	}
	wire.SetAttempt(hb, id)
	if idx1 != 0 {
		wire.SetPending(hb, uint32(idx1), uint32(gen))
	}
	return C.int(resSuccess)
}

// prepareConnect checks a connect's device, handle and context.
func prepareConnect(ctxID uint64, dev C.int, trafficClass int, hb []byte) (wire.Handle, *netCtx, int, C.ncclResult_t) {
	if rc := checkDevice(dev); rc != C.int(resSuccess) {
		return wire.Handle{}, nil, 0, C.ncclResult_t(rc)
	}
	h, err := wire.DecodeHandle(hb)
	if err != nil {
		warnf("connect: %v", err)
		return wire.Handle{}, nil, 0, resInvalidArgument
	}
	owner := lookupCtx(ctxID)
	if owner == nil {
		warnf("connect: unknown or finalized context")
		return wire.Handle{}, nil, 0, resInvalidUsage
	}
	if trafficClass == tcUndef {
		trafficClass = owner.trafficClass
	}
	return h, owner, trafficClass, resSuccess
}

// startAttempt registers a connect attempt and starts its handshake; pend is its entry in the
// C pending table (0: none, connect then polls through Go).
// It refuses (false) once the context is finalized: the check and wg.Add happen under
// registry.mu, which endNetCtx takes to remove the context before it waits for wg.
func startAttempt(owner *netCtx, h wire.Handle, dev, tc int, pend, gen uint32) (uint64, bool) {
	a := &attempt{owner: owner, key: h, done: make(chan struct{}), pend: pend, gen: gen}
	registry.mu.Lock()
	if registry.ctxs[owner.id] != owner {
		registry.mu.Unlock()
		warnf("connect: the context was finalized before the handshake started")
		return 0, false
	}
	id := newAttemptID()
	registry.attempts[id] = a
	owner.wg.Add(1)
	registry.mu.Unlock()
	go func() {
		defer owner.wg.Done()
		a.res.comm, a.res.err = guardHandshake(func() (*C.struct_mpib_comm, error) { return connectHandshake(owner.ctx, h, dev, tc) })
		close(a.done)
		if a.pend != 0 {
			rc := resSuccess
			if a.res.err != nil {
				warnf("connect: %v", a.res.err) // connect() returns the error without calling into Go
				rc = handshakeResult(a.res.err)
			}
			C.mpib_pending_finish(C.uint32_t(a.pend), C.uint32_t(a.gen), a.res.comm, C.int(rc))
		}
		registry.mu.Lock()
		a.reclaimTimer = time.AfterFunc(2*handshakeTimeout(), func() {
			defer recoverGoroutine("connect: reclaiming an uncollected connection")
			reclaimAttempt(id, a)
		})
		registry.mu.Unlock()
	}()
	return id, true
}

// refuseEntry ends a pending entry whose attempt never started with the error rc, and frees
// it after `keep` (NCCL's next connect() returns the error) or at once (0).
func refuseEntry(pend, gen uint32, rc C.ncclResult_t, keep time.Duration) {
	C.mpib_pending_finish(C.uint32_t(pend), C.uint32_t(gen), nil, C.int(rc))
	free := func() {
		var comm *C.struct_mpib_comm
		var r C.int
		C.mpib_pending_take(C.uint32_t(pend), C.uint32_t(gen), &comm, &r)
	}
	if keep == 0 {
		free()
		return
	}
	time.AfterFunc(keep, free) // NCCL never came back for the error
}

// sweepCollected forgets the attempts whose comm connect() took in C: Go is not told, and
// they would otherwise stay registered (with their timer) until the reclaim, twice the
// handshake timeout later. The dispatcher runs it at most every 100 ms.
func sweepCollected() {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for id, a := range registry.attempts {
		if a.pend != 0 && a.reclaimTimer != nil && C.mpib_pending_collected(C.uint32_t(a.pend), C.uint32_t(a.gen)) == 1 {
			a.reclaimTimer.Stop()
			delete(registry.attempts, id)
		}
	}
}

var dispatcherOnce sync.Once

// startConnectDispatcher starts, once per process, the goroutine that starts the handshakes
// connect() queued in C (mpib_connect_enqueue): NCCL's proxy thread then never waits for the
// Go scheduler, which with hundreds of handshakes running took hundreds of ms to give a
// calling thread its turn. Without the eventfd, connect() calls into Go (mpibGoConnect) instead.
func startConnectDispatcher() {
	dispatcherOnce.Do(func() {
		fd := C.mpib_connect_queue_open()
		if fd < 0 {
			infof("connect: no eventfd for the connect queue: connect() starts handshakes through Go")
			return
		}
		f := os.NewFile(uintptr(fd), "mpib-connect-queue") // non-blocking: read through Go's poller
		go func() {
			var buf [8]byte
			var swept time.Time
			for {
				if _, err := f.Read(buf[:]); err != nil {
					warnf("connect queue: %v (polling it every 10 ms instead)", err)
					time.Sleep(10 * time.Millisecond)
				}
				for dispatchOne() {
				}
				if time.Since(swept) > 100*time.Millisecond {
					sweepCollected()
					swept = time.Now()
				}
			}
		}()
	})
}

// dispatchOne starts the next queued connect, if any (false: the queue is empty). A panic
// fails only that connect (NCCL's next connect() returns ncclInternalError), never the
// dispatcher, or every later connect would wait for it forever.
func dispatchOne() bool {
	var req C.struct_mpib_connect_req
	if C.mpib_connect_dequeue(&req) != 1 {
		return false
	}
	defer func() {
		if r := recover(); r != nil {
			warnf("connect: internal error: Go panic: %v\n%s", r, debug.Stack())
			refuseEntry(uint32(req.idx1), uint32(req.gen), resInternalError, 2*handshakeTimeout())
		}
	}()
	startQueued(&req)
	return true
}

// startQueued starts one queued connect. A refusal becomes the attempt's result: connect()
// returns it on NCCL's next call.
func startQueued(req *C.struct_mpib_connect_req) {
	hb := C.GoBytes(unsafe.Pointer(&req.handle[0]), C.int(len(req.handle)))
	pend, gen := uint32(req.idx1), uint32(req.gen)
	h, owner, tc, rc := prepareConnect(uint64(req.ctx), req.dev, int(req.traffic_class), hb)
	if rc == resSuccess {
		if _, ok := startAttempt(owner, h, int(req.dev), tc, pend, gen); ok {
			return
		}
		rc = resInvalidUsage
	}
	refuseEntry(pend, gen, rc, 2*handshakeTimeout())
}

// newAttemptID names a connect attempt in NCCL's copy of the handle: random, so that a handle
// forged by a peer rank cannot name another connection's attempt by counting (registry.mu).
func newAttemptID() uint64 {
	for {
		if id := randomNonce(); id != 0 && registry.attempts[id] == nil {
			return id
		}
	}
}

// pollAttempt is a repeated connect call that C could not answer: an attempt without an
// entry in the C pending table, or one whose entry was taken already. The handle must name
// the listener the attempt connects to: one that names another (forged, or corrupted) gets
// an error and never the attempt's comm.
func pollAttempt(id uint64, hb []byte, sendComm *unsafe.Pointer) C.int {
	registry.mu.Lock()
	a := registry.attempts[id]
	registry.mu.Unlock()
	if a == nil {
		warnf("connect: unknown connection attempt in the handle (finalized, reclaimed, or a forged handle)")
		return C.int(resInvalidArgument)
	}
	if h, err := wire.DecodeHandle(hb); err != nil || h != a.key {
		warnf("connect: the handle names a connection attempt to another listener (a forged or corrupted handle): refused")
		return C.int(resInvalidArgument)
	}
	select {
	case <-a.done:
	default:
		return C.int(resSuccess) // still in progress: NCCL calls again
	}
	comm, rc, ok := a.take()
	forgetAttempt(id)
	if !ok {
		warnf("connect: the handle's connection attempt was collected already (or reclaimed)")
		return C.int(resInvalidUsage)
	}
	if rc == resSuccess {
		*sendComm = unsafe.Pointer(comm)
	} else if a.pend == 0 {
		warnf("connect: %v", a.res.err)
	}
	return C.int(rc)
}

// take claims a finished attempt's result for whoever asks first (NCCL, or a reclaim):
// through the C entry's compare-and-swap when it has one, else under registry.mu.
func (a *attempt) take() (*C.struct_mpib_comm, C.ncclResult_t, bool) {
	if a.pend != 0 {
		var comm *C.struct_mpib_comm
		var rc C.int
		if C.mpib_pending_take(C.uint32_t(a.pend), C.uint32_t(a.gen), &comm, &rc) == 0 {
			return nil, 0, false
		}
		return comm, C.ncclResult_t(rc), true
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if a.taken {
		return nil, 0, false
	}
	a.taken = true
	if a.res.err != nil {
		return nil, handshakeResult(a.res.err), true
	}
	return a.res.comm, resSuccess, true
}

// forgetAttempt removes an attempt from the table (its result was taken).
func forgetAttempt(id uint64) {
	registry.mu.Lock()
	delete(registry.attempts, id)
	registry.mu.Unlock()
}

// reclaimAttempt destroys a finished connection that NCCL never came back for (it abandoned
// the attempt, e.g. on abort under an ABI without finalize).
func reclaimAttempt(id uint64, a *attempt) {
	registry.mu.Lock()
	if registry.attempts[id] == a {
		delete(registry.attempts, id)
	}
	registry.mu.Unlock()
	if comm := a.reclaim(); comm != nil { // nothing when NCCL, a sweep or finalize took it first
		infof("connect: reclaimed a connection NCCL never collected (attempt %d)", id)
		closeComm(comm, true)
	}
}

// reclaim takes a finished attempt's comm if NCCL never collected it (nil otherwise).
func (a *attempt) reclaim() *C.struct_mpib_comm {
	comm, _, ok := a.take()
	if !ok {
		return nil
	}
	return comm
}
