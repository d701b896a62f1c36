package main

/*
#include <stdlib.h>
#include "mpib.h"
#include "mpib_comm.h"
#include "mpib_device.h"
#include "mpib_handoff.h"
#include "mpib_shm.h"
*/
import "C"

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/config"
	"github.com/mpib/mpib/plugin/internal/gid"
	"github.com/mpib/mpib/plugin/internal/suppair"
	"github.com/mpib/mpib/plugin/internal/topo"
	"github.com/mpib/mpib/plugin/internal/wire"
)

// Connection setup runs in goroutines so that NCCL's connect/accept calls never block: each
// call only looks at whether the handshake finished. Two peers connecting to each other
// first therefore cannot deadlock. Every goroutine belongs to the netCtx of the init that
// created its listener or attempt (lifecycle.go).

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

func randomNonce() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func handshakeTimeout() time.Duration {
	return time.Duration(plugin.cfg.HandshakeTimeoutMS) * time.Millisecond
}

func checkDevice(dev C.int) C.int {
	n := int(C.mpib_g.nfdevs)
	if n == 0 {
		warnf("called before a successful init")
		return C.int(resInternalError)
	}
	if dev < 0 || int(dev) >= n {
		warnf("device %d does not exist: MPIB has %d fused device%s (0..%d)", int(dev), n, map[bool]string{true: "", false: "s"}[n == 1], n-1)
		return C.int(resInvalidArgument)
	}
	return C.int(resSuccess)
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
// calling thread its turn. Without the eventfd, connect() calls into Go as before.
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

// connectHandshake is the sending side: decide the SUP pair, dial, hello, metadata, QPs to
// RTS, ready. The sender builds its verbs resources while it dials: both ends of the control
// connection are known from the handle (the dial binds to the OOB address), and so is the SUP
// pair, so nothing waits for the socket, and the resources are ready when the peer's metadata
// arrives. (net_ib creates them after its socket connects.)
func connectHandshake(ctx context.Context, h wire.Handle, dev, trafficClass int) (*C.struct_mpib_comm, error) {
	peer := h.Addr.Addr().Unmap()
	path, err := topo.Classify(plugin.oobAddr, peer, plugin.cfg.IslandPrefixLen)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(handshakeTimeout())
	plan, supAt, err := connectPlan(dev, h, path)
	if err != nil {
		// A relay mismatch: the hello still goes (naming no pair), so that the listener fails
		// with the same message instead of waiting for a peer that never comes.
		if c, derr := dialHello(ctx, h, plan, deadline); derr == nil {
			c.Close()
		}
		return nil, fmt.Errorf("peer %v: %w", h.Addr, err)
	}
	ready := make(chan prepared, 1)
	go func() {
		p := prepared{err: errors.New("building the connection's resources failed (see the panic above)")}
		defer func() { ready <- p }()
		defer recoverGoroutine("connect: building the sender")
		p = prepare(ctx, dev, plugin.oobAddr, peer, path, true, trafficClass, plan, supAt)
	}()
	dialStart := time.Now()
	redialed := false
	redial := func(why error) (net.Conn, error) {
		if redialed {
			return nil, why
		}
		redialed = true
		infof("connect to %v: the listener closed our control connection before any metadata (%v): dialing it once more", h.Addr, why)
		return dialHello(ctx, h, plan, deadline)
	}
	c, err := dialHello(ctx, h, plan, deadline)
	if errors.Is(err, errClosedEarly) {
		c, err = redial(err)
	}
	helloSent := time.Now()
	p := <-ready
	p.redial = redial
	if err != nil {
		destroyInGoroutine(p.comm)
		return nil, err
	}
	p.st.dial = helloSent.Sub(dialStart)
	if p.st.last.Before(helloSent) { // the exchange starts when both are done
		p.st.last = helloSent
	}
	return handshake(ctx, c, p)
}

// dialHello opens the control connection and names the listener it expects, our
// MPIB_SUP_RELAY and the SUP pair we chose; deadline is the whole handshake's.
func dialHello(ctx context.Context, h wire.Handle, plan suppair.Plan, deadline time.Time) (net.Conn, error) {
	hello, err := wire.EncodeHello(plan.Hello(h.Nonce, plugin.cfg.SupRelay))
	if err != nil {
		return nil, fmt.Errorf("hello to %v: %w", h.Addr, err)
	}
	c, err := dialControl(ctx, h.Addr, deadline)
	if err != nil {
		return nil, fmt.Errorf("control connection to %v from %v: %w", h.Addr, plugin.oobAddr, err)
	}
	c.SetDeadline(deadline)
	if _, err := c.Write(hello); err != nil {
		c.Close()
		return nil, fmt.Errorf("hello to %v: %w", h.Addr, closedEarly(err))
	}
	return c, nil
}

// errClosedEarly marks a control connection the listener closed before sending any metadata.
// The listener does so when it refuses our hello, but also when it evicted us to make room
// for newer clients before our hello arrived (a connector descheduled between connect and its
// hello write, on a listener flooded with silent clients: gate.go): the connector then dials
// once more within its handshake's deadline. A refused hello is refused again (the listener
// logs the second one, a served listener as "used already").
var errClosedEarly = errors.New("closed before any metadata")

// closedEarly wraps err in errClosedEarly when it says the peer closed or reset the socket.
func closedEarly(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("%w: %w", errClosedEarly, err)
	}
	return err
}

// dialControl opens the control connection. A process briefly out of descriptors (EMFILE,
// ENFILE: a flood of TCP clients on one of its listeners, which the accept loop sheds within
// a second) dials again with a backoff of up to 200 ms until the handshake's deadline, as the
// accept loop does, instead of failing the connection at once: a CI run's flood test failed
// the real peer's own connect so ("socket: too many open files").
func dialControl(ctx context.Context, addr netip.AddrPort, deadline time.Time) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: plugin.oobAddr.AsSlice()}, Deadline: deadline}
	for backoff := 5 * time.Millisecond; ; backoff = min(2*backoff, 200*time.Millisecond) {
		c, err := d.DialContext(ctx, "tcp4", addr.String())
		if err == nil || !isFDShortage(err) || time.Now().Add(backoff).After(deadline) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff):
		}
	}
}

// handshake classifies the connection, builds the comm and its QPs, exchanges metadata with
// the peer and brings every QP to RTS. Both sides compute the path class from the two ends
// of the same TCP socket, so their QP counts agree; the metadata exchange verifies it. It owns
// c: closed on failure, kept on success as the comm's liveness signal (adoptComm). The
// connector's c may be replaced once by a new dial (prepared.redial).
func handshake(ctx context.Context, c net.Conn, p prepared) (*C.struct_mpib_comm, error) {
	cc := &ctrlConn{c: c}
	stop := context.AfterFunc(ctx, cc.close)
	comm, err := guardedSteps(ctx, cc, p)
	c = cc.get()
	if !stop() || err != nil {
		c.Close()
		destroyInGoroutine(comm)
		if err == nil {
			err = context.Cause(ctx)
		}
		return nil, err
	}
	adoptComm(comm, c)
	return comm, nil
}

// guardedSteps runs handshakeSteps and turns a panic in them into their error, with the comm
// they were given, so that handshake frees it and the socket (guard.go).
func guardedSteps(ctx context.Context, c *ctrlConn, p prepared) (comm *C.struct_mpib_comm, err error) {
	defer func() {
		if r := recover(); r != nil {
			warnf("handshake with %v: Go panic: %v\n%s", p.peer, r, debug.Stack())
			comm, err = p.comm, &panicError{where: "connection setup with " + p.peer.String(), value: r}
		}
	}()
	return handshakeSteps(ctx, c, p)
}

// prepared is a comm's verbs resources before its handshake: the path between the control
// connection's two ends decides its QPs (both ends classify the same two addresses, so their
// QP counts agree; the metadata exchange verifies it).
type prepared struct {
	dev    int // the fused device
	comm   *C.struct_mpib_comm
	isSend bool
	path   topo.PathClass
	sup    suppair.Plan // the SUP pair both ends agreed on in the hello
	prefix [2]uint8
	local  netip.Addr
	peer   netip.Addr
	st     setupTimes
	err    error
	gen    [2]uint32 // its device's GID change counts its GIDs were chosen under (a listener's spare)
	// redial (connector only) dials the listener again, once: see errClosedEarly.
	redial func(why error) (net.Conn, error)
}

// ctrlConn is a handshake's control connection, which the connector may replace once while
// a context's end may close it from another goroutine.
type ctrlConn struct {
	mu     sync.Mutex
	c      net.Conn
	closed bool
}

func (h *ctrlConn) get() net.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.c
}

func (h *ctrlConn) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	h.c.Close()
}

// swap closes the old connection and makes c the handshake's; false (c closed) when the
// context ended meanwhile.
func (h *ctrlConn) swap(c net.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.c.Close()
	if h.closed {
		c.Close()
		return false
	}
	h.c = c
	return true
}

// gidGens is a device's GID change counts: SOUT's, and the sum of its SUP ports'.
func gidGens(dev int) [2]uint32 {
	f := &C.mpib_g.fdev[dev]
	gens := [2]uint32{uint32(C.mpib_gid_gen(f.sout_nic)), 0}
	for i := range int(f.nsup) {
		gens[1] += uint32(C.mpib_gid_gen(f.sup_nic[i]))
	}
	return gens
}

// allGIDGens sums every open NIC's GID change count: it moves when any address came or went.
func allGIDGens() uint32 {
	var sum uint32
	for n := range int(C.mpib_g.nnics) {
		sum += uint32(C.mpib_gid_gen(C.int(n)))
	}
	return sum
}

// prepareSpare builds a listener's receiver before any peer is known: SOUT's QPs, which every
// path has. The handshake that takes it adds SUP's if its SUP pair wants them (completeSpare).
// Receivers without a SUP pair thus never have SUP QPs, as if built at accept.
func prepareSpare(ctx context.Context, dev int) prepared {
	p := prepared{dev: dev, gen: gidGens(dev), st: setupTimes{last: time.Now()}}
	var params C.struct_mpib_conn_params
	params, p.prefix, p.err = connParams(dev, false, topo.InterIsland, tcUndef, false, supPortUse{gid: -1})
	if p.err != nil {
		return p
	}
	p.comm, p.err = createComm(ctx, &params)
	return p
}

// completeSpare fits a spare to its connection: the path, and SUP's QPs when the SUP pair
// wants them. The setup times start at the hello; create is then SUP's part only.
func (p *prepared) completeSpare(ctx context.Context, local, peer netip.Addr, path topo.PathClass, sup suppair.Plan, supAt supPortUse, start time.Time) error {
	p.local, p.peer, p.path, p.sup, p.st = local, peer, path, sup, setupTimes{last: start}
	params, prefix, err := connParams(p.dev, false, path, tcUndef, sup.SUP(), supAt)
	if err != nil {
		return err
	}
	p.prefix = prefix
	p.st.mark(&p.st.params)
	rc, err := withVerbsSlot(ctx, func() C.int {
		return C.mpib_comm_set_path(p.comm, &params)
	})
	if err == nil && rc != 0 {
		err = fmt.Errorf("building SUP's QPs for %v failed (%d)", peer, int(rc))
	}
	p.st.mark(&p.st.create)
	return err
}

// createComm builds a comm's verbs resources in one of the bounded verbs slots.
func createComm(ctx context.Context, params *C.struct_mpib_conn_params) (*C.struct_mpib_comm, error) {
	comm, err := withVerbsSlot(ctx, func() *C.struct_mpib_comm { return C.mpib_comm_create(params) })
	if err == nil && comm == nil {
		err = errors.New("creating the connection's verbs resources failed (see the warning above)")
	}
	return comm, err
}

// prepare builds a comm for a known path and SUP pair (supAt: the pair's SUP port and GID
// index, -1 for net_ib's rule).
func prepare(ctx context.Context, dev int, local, peer netip.Addr, path topo.PathClass, isSend bool, trafficClass int, sup suppair.Plan, supAt supPortUse) prepared {
	p := prepared{dev: dev, isSend: isSend, local: local, peer: peer, path: path, sup: sup, st: setupTimes{last: time.Now()}}
	var params C.struct_mpib_conn_params
	params, p.prefix, p.err = connParams(dev, isSend, path, trafficClass, sup.SUP(), supAt)
	if p.err != nil {
		return p
	}
	p.st.mark(&p.st.params)
	p.comm, p.err = createComm(ctx, &params)
	p.st.mark(&p.st.create)
	return p
}

// handshakeSteps returns the comm even with an error once it exists, for handshake to free.
func handshakeSteps(ctx context.Context, cc *ctrlConn, p prepared) (*C.struct_mpib_comm, error) {
	if p.err != nil {
		return p.comm, p.err
	}
	hostileHook("handshake")
	comm, st, cfg, peer := p.comm, &p.st, plugin.cfg, p.peer
	var info C.struct_mpib_conn_info
	C.mpib_comm_local_info(comm, &info)
	mine := metadataFromC(&info, cfg.Mode, p.path, p.prefix)
	c := cc.get()
	theirs, err := exchangeMetadata(c, mine, peer)
	if errors.Is(err, errClosedEarly) && p.redial != nil {
		if c2, derr := p.redial(err); derr != nil {
			err = fmt.Errorf("%w (dialing again: %w)", err, derr)
		} else if !cc.swap(c2) {
			err = context.Cause(ctx)
		} else {
			c = c2
			theirs, err = exchangeMetadata(c, mine, peer)
		}
	}
	if err != nil {
		return comm, err
	}
	st.mark(&st.exchange)
	if p.isSend {
		theirs.TC, theirs.SL = mine.TC, mine.SL // the receiver echoes ours; ours is what counts
	}
	if err := checkSupMetadata(comm, p.sup, &mine, &theirs, peer); err != nil {
		return comm, err
	}
	remote := metadataToC(theirs)
	rc, err := withVerbsSlot(ctx, func() C.int { return C.mpib_comm_connect(comm, &remote) })
	if err != nil {
		return comm, err
	}
	if rc != 0 {
		return comm, fmt.Errorf("bringing QPs to %v up failed (%d); is the SUP fabric reachable?", peer, int(rc))
	}
	st.mark(&st.connect)
	if err := exchangeAck(c, peer); err != nil {
		return comm, err
	}
	st.mark(&st.ack)
	registerWithAgent(comm, p.local, peer, p.path, p.sup, p.isSend)
	st.mark(&st.agent)
	supPort := "-"
	if comm.nqps[1] > 0 { // every SUP lane's NIC: lane 1, then the striped lanes 2.. (mpib_lane)
		var names []string
		for i := range int(comm.sup_lanes) {
			names = append(names, C.GoString(&comm.nic[1+i].name[0]))
		}
		supPort = strings.Join(names, "+")
	}
	infof("%s comm %v <-> %v: %v, SOUT QPs %d, SUP QPs %d, CTS on %s, SUP pair %v on %s, traffic class %d, SL %d, setup %v",
		map[bool]string{true: "send", false: "recv"}[p.isSend], p.local, peer, p.path, int(comm.nqps[0]), int(comm.nqps[1]),
		[]string{"SOUT", "SUP"}[comm.cts_rail], p.sup, supPort, int(comm.tc), int(comm.sl), st)
	return comm, nil
}

// setupTimes is where one handshake's time went (the INFO line of each comm: connection setup
// is paid per peer at every job start). exchange and ack include waiting for the peer to
// reach the same step. dial (sender only) is the control connection and its hello, which run
// beside params and create; exchange starts when both are done. The receiver starts at the
// peer's hello.
type setupTimes struct {
	last                                                time.Time
	params, create, dial, exchange, connect, ack, agent time.Duration
}

// mark ends the step d at now (params: classification and the GIDs).
func (st *setupTimes) mark(d *time.Duration) {
	now := time.Now()
	*d = now.Sub(st.last)
	st.last = now
}

func (st *setupTimes) String() string {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	s := fmt.Sprintf("ms: params=%.1f create=%.1f exchange=%.1f connect=%.1f ack=%.1f agent=%.1f",
		ms(st.params), ms(st.create), ms(st.exchange), ms(st.connect), ms(st.ack), ms(st.agent))
	if st.dial > 0 { // senders only
		s += fmt.Sprintf(" dial=%.1f", ms(st.dial))
	}
	return s
}

// connParams chooses what a new comm's QPs are built with: QP counts from the mode and the
// SUP pair (withSup: the pair agreed in the hello wants SUP QPs), the SUP port the pair names
// (supAt.port) and each rail's GID (read now: addresses can change after init; SUP's is the
// pair's, supAt.gid, or net_ib's rule when -1) and the traffic class.
func connParams(dev int, isSend bool, path topo.PathClass, trafficClass int, withSup bool, supAt supPortUse) (C.struct_mpib_conn_params, [2]uint8, error) {
	cfg := plugin.cfg
	var p C.struct_mpib_conn_params
	var prefix [2]uint8
	p.dev, p.is_send, p.mode, p.path_class = C.int(dev), boolInt(isSend), C.int(cfg.Mode), C.int(path)
	p.nqps[0] = C.uint32_t(cfg.SoutQPs)
	if withSup {
		p.nqps[1] = C.uint32_t(max(cfg.SupQPs, 1+len(supAt.stripe))) // a QP on each lane at least
		p.sup_port = C.int(supAt.port)
		if err := stripeParams(&p, dev, supAt.stripe); err != nil {
			return p, prefix, err
		}
	}
	f := &C.mpib_g.fdev[dev]
	nics := [2]C.int{f.sout_nic, f.sup_nic[p.sup_port]}
	for rail, r := range []config.Rail{cfg.Devices[dev].Sout, cfg.Devices[dev].SupPorts[p.sup_port]} {
		if p.nqps[rail] == 0 {
			continue
		}
		configured := r.GIDIndex
		if rail == 1 && supAt.gid >= 0 {
			configured = supAt.gid // the port the pair names (chosen by the same rule, just now)
		}
		idx, addr, err := chooseGID(int(nics[rail]), configured)
		if err != nil {
			return p, prefix, fmt.Errorf("%s rail %s: %w", railNames[rail], r.HCA, err)
		}
		p.gid_index[rail] = C.int(idx)
		prefix[rail] = interfacePrefixLen(addr)
	}
	p.tc = C.int(connectionTC(trafficClass))
	return p, prefix, nil
}

// stripeParams sets a striped connection's further SUP lanes: each lane's port and its GID
// (the pair's, chosen by the same rule as the first port's).
func stripeParams(p *C.struct_mpib_conn_params, dev int, stripe []supLane) error {
	if len(stripe) == 0 {
		return nil
	}
	f := &C.mpib_g.fdev[dev]
	p.sup_lanes = C.int(1 + len(stripe))
	for i, l := range stripe {
		idx, _, err := chooseGID(int(f.sup_nic[l.port]), l.gid)
		if err != nil {
			return fmt.Errorf("SUP lane %d (port %d): %w", i+2, l.port, err)
		}
		p.lane_port[i], p.lane_gid_index[i] = C.int(l.port), C.int(idx)
	}
	return nil
}

var railNames = [2]string{"SOUT", "SUP"}

// The C side's lanes and the hello's pairs must agree (a compile error otherwise).
var _ = [1]struct{}{}[C.MPIB_MAX_STRIPE-wire.MaxPairs]

// gidTables caches each rail's GID table until its device reports a change
// (IBV_EVENT_GID_CHANGE: an address added or removed) or gidTableMaxAge passes, whichever comes
// first. Reading a table is a kernel walk of every entry (1024 per port on soft-RoCE, 10-100 ms
// under the lab's emulation), so a burst of connects reads it once, and init reads it before
// the first connect (warmGIDTables). The age bound covers a provider that reports no events.
var gidTables struct {
	mu    sync.Mutex
	at    [C.MPIB_MAX_NICS]time.Time
	gen   [C.MPIB_MAX_NICS]uint32
	table [C.MPIB_MAX_NICS][]gid.Entry
}

const gidTableMaxAge = 30 * time.Second

func readGIDTable(nic int) []gid.Entry {
	gidTables.mu.Lock()
	defer gidTables.mu.Unlock()
	gen := uint32(C.mpib_gid_gen(C.int(nic))) // before the read: a change during it forces another
	if t := gidTables.table[nic]; t != nil && gen == gidTables.gen[nic] && time.Since(gidTables.at[nic]) < gidTableMaxAge {
		return t
	}
	n := int(C.mpib_gid_table_len(C.int(nic)))
	table := make([]gid.Entry, n)
	if n > 0 {
		raw := make([]byte, 16*n)
		types := make([]C.int, n)
		// A kernel walk of every entry, tens of ms: on a throwaway thread (lifecycle.go), one
		// at a time (gidTables.mu).
		onThrowawayThread(func() struct{} {
			C.mpib_gid_table_read(C.int(nic), (*C.uint8_t)(unsafe.Pointer(&raw[0])), &types[0], C.int(n))
			return struct{}{}
		})
		for i := range table {
			if types[i] >= 0 {
				table[i] = gid.Entry{Present: true, GID: [16]byte(raw[16*i : 16*i+16]), Type: int(types[i])}
			}
		}
	}
	gidTables.table[nic], gidTables.at[nic], gidTables.gen[nic] = table, time.Now(), gen
	return table
}

// warmGIDTables reads both rails' tables and the interface addresses in the background right
// after init, so that the first connect finds them cached (a connect that comes sooner waits
// for the read under the same locks). plugin.mu is held; the devices close only after it.
func warmGIDTables() {
	plugin.warming.Add(1)
	go func() {
		defer plugin.warming.Done()
		for nic := range int(C.mpib_g.nnics) {
			readGIDTable(nic)
		}
		localAddrs()
	}()
}

// chooseGID picks a NIC's GID for a new connection (net_ib's rule) from its current table.
func chooseGID(nic, configured int) (int, netip.Addr, error) {
	table := readGIDTable(nic)
	var idx int
	var err error
	if C.mpib_g.nic[nic].link_layer == C.IBV_LINK_LAYER_INFINIBAND {
		idx, err = gid.ChooseIB(table)
	} else {
		idx, err = gid.ChooseRoCE(table, configured, plugin.cfg.GID)
	}
	if err != nil {
		return -1, netip.Addr{}, err
	}
	return idx, table[idx].Addr(), nil
}

// forgetGIDTables drops the cached tables and addresses (the devices closed; a reopen reads
// afresh, and its event counts start again).
func forgetGIDTables() {
	gidTables.mu.Lock()
	gidTables.table = [C.MPIB_MAX_NICS][]gid.Entry{}
	gidTables.mu.Unlock()
	ifAddrs.mu.Lock()
	ifAddrs.all = nil
	ifAddrs.mu.Unlock()
}

func exchangeMetadata(c net.Conn, mine wire.Metadata, peer netip.Addr) (wire.Metadata, error) {
	if _, err := c.Write(wire.EncodeMetadata(mine)); err != nil {
		return wire.Metadata{}, fmt.Errorf("metadata to %v: %w", peer, closedEarly(err))
	}
	buf := make([]byte, wire.MetadataSize)
	if n, err := io.ReadFull(c, buf); err != nil {
		if n == 0 {
			// The listener closes a connection whose hello it refused, or that it evicted
			// before reading it (errClosedEarly), or its process ended.
			if err = closedEarly(err); errors.Is(err, errClosedEarly) {
				err = fmt.Errorf("%w (the peer refused our hello, see its log, or evicted us before reading it, or its process ended)", err)
			}
		}
		return wire.Metadata{}, fmt.Errorf("metadata from %v: %w", peer, err)
	}
	theirs, err := wire.DecodeMetadata(buf)
	if err == nil {
		err = checkPeer(mine, theirs)
	}
	if err != nil {
		return theirs, fmt.Errorf("peer %v: %w", peer, err)
	}
	return theirs, nil
}

func exchangeAck(c net.Conn, peer netip.Addr) error {
	if _, err := c.Write(wire.EncodeAck()); err != nil {
		return fmt.Errorf("ready to %v: %w", peer, err)
	}
	ack := make([]byte, wire.AckSize)
	if _, err := io.ReadFull(c, ack); err != nil {
		return fmt.Errorf("ready from %v: %w", peer, err)
	}
	if err := wire.CheckAck(ack); err != nil {
		return fmt.Errorf("peer %v: %w", peer, err)
	}
	return nil
}

// checkPeer verifies that both ends agree on everything that shapes the wire protocol.
func checkPeer(mine, theirs wire.Metadata) error {
	if mine.Mode != theirs.Mode {
		return fmt.Errorf("MPIB_MODE differs: local %d, peer %d (set it the same on every rank)", mine.Mode, theirs.Mode)
	}
	if mine.PathClass != theirs.PathClass {
		return fmt.Errorf("island classification differs (local %d, peer %d): check MPIB_ISLAND_PREFIX_LEN on every rank", mine.PathClass, theirs.PathClass)
	}
	if mine.NQPs != theirs.NQPs {
		return fmt.Errorf("QP counts differ: local SOUT/SUP %v, peer %v (set MPIB_SOUT_QP/MPIB_SUP_QP/MPIB_SUP_RELAY alike)", mine.NQPs, theirs.NQPs)
	}
	if mine.SupLanes != theirs.SupLanes {
		return fmt.Errorf("SUP lanes differ: local %d, peer %d (the hello's SUP pairs decide them on both ends)", mine.SupLanes, theirs.SupLanes)
	}
	if theirs.BufAddr == 0 {
		return errors.New("peer advertised a null buffer")
	}
	for r := range mine.Rail {
		if mine.NQPs[r] > 0 && mine.Rail[r].LinkLayer != theirs.Rail[r].LinkLayer {
			return fmt.Errorf("%s link layers differ: local %s, peer %s (both ends of a rail must be InfiniBand or both RoCE)",
				railNames[r], linkLayerName(mine.Rail[r].LinkLayer), linkLayerName(theirs.Rail[r].LinkLayer))
		}
	}
	for i := 0; i+1 < int(mine.SupLanes); i++ {
		if mine.Lane[i].LinkLayer != theirs.Lane[i].LinkLayer {
			return fmt.Errorf("SUP lane %d link layers differ: local %s, peer %s (both ends of a cable must be InfiniBand or both RoCE)",
				i+2, linkLayerName(mine.Lane[i].LinkLayer), linkLayerName(theirs.Lane[i].LinkLayer))
		}
	}
	return nil
}

func linkLayerName(l uint8) string {
	if l == wire.LinkLayerInfiniBand {
		return "InfiniBand"
	}
	return "Ethernet (RoCE)"
}

func metadataFromC(info *C.struct_mpib_conn_info, mode int, path topo.PathClass, prefix [2]uint8) wire.Metadata {
	m := wire.Metadata{Mode: uint8(mode), PathClass: uint8(path), TC: uint8(info.tc), SL: uint8(info.sl),
		BufAddr: uint64(info.buf_addr)}
	for r := 0; r < wire.Rails; r++ {
		m.NQPs[r] = uint32(info.nqps[r])
		ri := &info.rail[r]
		m.Rail[r].GID = *(*[16]byte)(unsafe.Pointer(&ri.gid[0]))
		m.Rail[r].MTU = uint32(ri.mtu)
		m.Rail[r].RKey = uint32(ri.rkey)
		m.Rail[r].LID = uint16(ri.lid)
		m.Rail[r].LinkLayer = uint8(ri.link_layer)
		m.Rail[r].PrefixLen = prefix[r]
		m.Rail[r].ECE = wire.ECE{Valid: ri.ece_valid != 0, VendorID: uint32(ri.ece.vendor_id),
			Options: uint32(ri.ece.options), CompMask: uint32(ri.ece.comp_mask)}
		for q := 0; q < wire.MaxQPsPerRail; q++ {
			m.Rail[r].QPN[q] = uint32(ri.qpn[q])
		}
	}
	m.SupLanes = uint8(info.sup_lanes)
	for i := range m.Lane {
		li := &info.lane[i]
		m.Lane[i] = wire.LaneInfo{GID: *(*[16]byte)(unsafe.Pointer(&li.gid[0])), MTU: uint32(li.mtu), RKey: uint32(li.rkey),
			LID: uint16(li.lid), LinkLayer: uint8(li.link_layer)}
	}
	return m
}

func metadataToC(m wire.Metadata) C.struct_mpib_conn_info {
	var info C.struct_mpib_conn_info
	info.buf_addr = C.uint64_t(m.BufAddr)
	info.tc, info.sl = C.uint8_t(m.TC), C.uint8_t(m.SL)
	for r := 0; r < wire.Rails; r++ {
		info.nqps[r] = C.uint32_t(m.NQPs[r])
		ri := &info.rail[r]
		*(*[16]byte)(unsafe.Pointer(&ri.gid[0])) = m.Rail[r].GID
		ri.mtu = C.uint32_t(m.Rail[r].MTU)
		ri.rkey = C.uint32_t(m.Rail[r].RKey)
		ri.lid = C.uint16_t(m.Rail[r].LID)
		ri.link_layer = C.uint8_t(m.Rail[r].LinkLayer)
		ri.ece_valid = C.uint8_t(boolInt(m.Rail[r].ECE.Valid))
		ri.ece.vendor_id = C.uint32_t(m.Rail[r].ECE.VendorID)
		ri.ece.options = C.uint32_t(m.Rail[r].ECE.Options)
		ri.ece.comp_mask = C.uint32_t(m.Rail[r].ECE.CompMask)
		for q := 0; q < wire.MaxQPsPerRail; q++ {
			ri.qpn[q] = C.uint32_t(m.Rail[r].QPN[q])
		}
	}
	info.sup_lanes = C.uint32_t(m.SupLanes)
	for i, l := range m.Lane {
		li := &info.lane[i]
		*(*[16]byte)(unsafe.Pointer(&li.gid[0])) = l.GID
		li.mtu, li.rkey, li.lid, li.link_layer = C.uint32_t(l.MTU), C.uint32_t(l.RKey), C.uint16_t(l.LID), C.uint8_t(l.LinkLayer)
	}
	return info
}
