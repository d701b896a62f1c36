// listen.go: NCCL's listen, accept and closeListen (mpibGoListen, mpibGoCloseListen, called by
// abi_common.c; accept itself is C, from the queue filled here), each listener's accept loop
// and how it proves a client is its peer (the hello, with gate.go's bounds) before
// acceptConnection (handshake.go) takes over.
//
// Anybody who can reach the listen port can open TCP connections to it (a port scan, a health
// probe, a flood): until a client's hello names this listener it is "unproven", and unproven
// clients are bounded so that they can neither end the accept loop nor take the process's file
// descriptors, which it shares with NCCL, CUDA and PyTorch (docs/security.md). net_ib accepts
// only when NCCL calls accept, one at a time; MPIB accepts in the background so that two peers
// connecting to each other cannot deadlock, so it bounds what it accepts instead.

package main

/*
#include "mpib.h"
#include "mpib_handoff.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/admit"
	"github.com/mpib/mpib/plugin/internal/wire"
)

type listener struct {
	id    uint64 // its registry id: the gate counts its unproven clients by it
	owner *netCtx
	// ctx is owner's context, also ended when the listener closes (cause errListenerClosed):
	// its clients' hello reads and handshakes end with it, since nobody would accept their comm.
	ctx    context.Context
	cancel context.CancelCauseFunc
	dev    int // the fused device NCCL listened on: its connections' comms live there
	ln     net.Listener
	nonce  uint64
	adv    wire.Handle                // the handle it published: the SUP addresses a hello may name
	lc     *C.struct_mpib_listen_comm // NCCL's listen comm: finished handshakes queue there for accept

	// spare is the first connection's receiver, built (SOUT only) right after listen while the
	// handle travels to the peer; spareTaken says whether a handshake (or close) took it.
	spare      chan prepared
	spareTaken atomic.Bool
	// unhook removes the finalize hook (close on the context's end) once NCCL closed the
	// listener: the context would otherwise keep every closed listener until finalize.
	unhook func() bool

	// served: a hello naming this listener was taken. NCCL connects once per listen, so a
	// second one is a copied handle (refused with a message, never a second comm).
	served atomic.Bool

	drops   dropLog
	usedLog burstLog // hellos refused for errServedAlready

	mu     sync.Mutex
	closed bool
}

// acceptBackoffMax: the longest pause after a failed accept (out of descriptors or memory).
const acceptBackoffMax = time.Second

// helloTimeout bounds how long an accepted TCP client that has sent part of its hello may take
// to send the rest (one that sent nothing has zeroByteGrace, gate.go). A real peer writes its
// hello in one write right after its connect returns, so a partial hello is a real peer on a
// loaded host or a slow network far more often than an attacker: net_ib's accept waits for
// NCCL's socket magic with no deadline of its own; ours only frees the descriptors of slow
// clients, whose number the gate's limits bound.
const helloTimeoutMax = 30 * time.Second

// slowHello: a hello later than this is reported (INFO), to show how close peers come.
const slowHello = time.Second

func helloTimeout() time.Duration {
	return min(handshakeTimeout(), helloTimeoutMax)
}

// errNotAPeer marks an accepted TCP client that never proved it is an MPIB peer of this
// listener (a port scan, a health probe, a stale rank): it is dropped, not reported to NCCL.
var errNotAPeer = errors.New("not an MPIB peer of this listener")

// errListenerClosed ends a listener's context: its clients' handshakes are abandoned.
var errListenerClosed = errors.New("the listener closed")

// errServedAlready marks a valid hello for a listener that served one already.
var errServedAlready = errors.New("this listener's handle was used already (NCCL connects once per listen: a copied or replayed handle?): refused")

//export mpibGoListen
func mpibGoListen(ctxID C.uint64_t, dev C.int, handle unsafe.Pointer, listenComm *unsafe.Pointer) (rc C.int) {
	defer recoverEntry("listen", &rc)
	*listenComm = nil
	if rc := checkDevice(dev); rc != C.int(resSuccess) {
		return rc
	}
	owner := lookupCtx(uint64(ctxID))
	if owner == nil {
		warnf("listen: unknown or finalized context")
		return C.int(resInvalidUsage)
	}
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(plugin.oobAddr, 0).String())
	if err != nil {
		warnf("listen on %s (MPIB_OOB_IF=%s): %v", plugin.oobAddr, plugin.cfg.OOBInterface, err)
		return C.int(resSystemError)
	}
	l := newListener(owner, int(dev), ln)
	if l == nil {
		ln.Close()
		warnf("listen: out of memory")
		return C.int(resSystemError)
	}
	if err := wire.EncodeHandle(unsafe.Slice((*byte)(handle), wire.HandleSize), l.adv); err != nil {
		l.discard() // a bug: suppair.Describe admits only addresses a handle carries
		warnf("listen: %v", err)
		return C.int(resInternalError)
	}
	registry.mu.Lock()
	if registry.ctxs[owner.id] != owner { // finalized meanwhile: endNetCtx waits for no goroutine of it
		registry.mu.Unlock()
		l.discard()
		warnf("listen: the context was finalized meanwhile")
		return C.int(resInvalidUsage)
	}
	registry.listeners[l.id] = l
	owner.wg.Add(2)
	registry.mu.Unlock()
	go l.acceptLoop()
	go func() {
		defer owner.wg.Done()
		// A spare always arrives, a failed one after a panic too: its first taker waits for it.
		p := prepared{dev: l.dev, err: errors.New("building the spare receiver failed (see the panic above)")}
		defer func() { l.spare <- p }()
		defer recoverGoroutine("listen: building the spare receiver")
		p = prepareSpare(owner.ctx, l.dev)
	}()
	l.unhook = context.AfterFunc(owner.ctx, func() {
		defer recoverGoroutine("listener: closing at finalize")
		l.close(true)
	})
	*listenComm = unsafe.Pointer(l.lc)
	return C.int(resSuccess)
}

// newListener is a listener of owner on ln for fused device dev, with its listen comm, not
// registered yet (nothing runs for it); nil when out of memory.
func newListener(owner *netCtx, dev int, ln net.Listener) *listener {
	l := &listener{owner: owner, dev: dev, ln: ln, nonce: randomNonce(), spare: make(chan prepared, 1)}
	l.adv = listenerHandle(l.dev, netip.MustParseAddrPort(ln.Addr().String()), l.nonce)
	registry.mu.Lock()
	l.id = newID()
	registry.mu.Unlock()
	l.lc = C.mpib_listen_comm_new(C.uint64_t(l.id))
	if l.lc == nil {
		return nil
	}
	l.ctx, l.cancel = context.WithCancelCause(owner.ctx)
	return l
}

// discard frees a listener that was never registered, and closes its socket.
func (l *listener) discard() {
	l.cancel(errListenerClosed)
	C.mpib_listen_comm_free(l.lc)
	l.ln.Close()
}

// acceptLoop ends only when the listener closes. A failed accept (EMFILE, ENFILE, ENOBUFS,
// ENOMEM: the process or host is out of something) evicts the process's oldest unproven client
// that has sent nothing, which frees a descriptor, or else pauses, doubling up to a second; it
// is logged once per episode.
func (l *listener) acceptLoop() {
	defer l.owner.wg.Done()
	defer recoverGoroutine("listener: accept loop")
	var backoff time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || l.isClosed() {
				return // closed by closeListen or finalize
			}
			backoff = l.acceptFailed(err, backoff)
			continue
		}
		if backoff > 0 {
			infof("listener %v: accepting again after a resource shortage", l.ln.Addr())
			backoff = 0
		}
		l.admit(c)
	}
}

// admit counts a new client as unproven (gateAdmit) and starts serving it. A panic here (a bug
// of ours) costs that client alone: it is closed and logged, and the accept loop goes on. The
// gate is left as it was before the client came (gate.go: its lock discipline).
func (l *listener) admit(c net.Conn) {
	defer func() {
		if r := recover(); r != nil {
			gateForget(c)
			c.Close()
			l.admitPanicked(c.RemoteAddr(), r)
		}
	}()
	if p := gateAdmit(l, c); p != nil {
		l.owner.wg.Add(1)
		go l.serve(p)
	}
}

// admitPanics limits the lines about panics in admission: a bug that every client hits must
// not write a stack per client of a flood.
var admitPanics burstLog

func (l *listener) admitPanicked(client net.Addr, r any) {
	switch n, total := admitPanics.note(time.Now()); n {
	case 0:
	case 1:
		warnf("listener %v: internal error admitting client %v: Go panic: %v (that client was closed; the listener goes on; %d so far; please report it with this stack)\n%s",
			l.ln.Addr(), client, r, total, debug.Stack())
	default:
		warnf("listener %v: %d more Go panics admitting clients in the last second, each client closed (%d so far; the last: %v)",
			l.ln.Addr(), n, total, r)
	}
}

func (l *listener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// acceptFailed handles one failed accept and returns the next pause.
func (l *listener) acceptFailed(err error, backoff time.Duration) time.Duration {
	if backoff == 0 {
		warnf("listener %v: accept: %v: backing off; the listener stays up (a flood of TCP clients, or the process is out of %s)",
			l.ln.Addr(), err, map[bool]string{true: "file descriptors", false: "resources"}[isFDShortage(err)])
	}
	if gateEvictOldestSilent("evicted while the process was out of descriptors: it had sent nothing") {
		return max(backoff, time.Millisecond) // a descriptor came free: try again at once
	}
	backoff = min(max(2*backoff, 5*time.Millisecond), acceptBackoffMax)
	time.Sleep(backoff)
	return backoff
}

// serve runs one incoming control connection and hands its comm to NCCL's next accept. A
// handshake that failed because its listener closed (or its context ended) is not reported:
// nobody would accept its result, and it was abandoned on purpose.
func (l *listener) serve(p *pendingClient) {
	defer l.owner.wg.Done()
	defer recoverGoroutine("listener: serving a client")
	comm, err := guardHandshake(func() (*C.struct_mpib_comm, error) { return acceptHandshake(l.ctx, p, l) })
	if err != nil && l.ctx.Err() != nil {
		return
	}
	if errors.Is(err, errNotAPeer) {
		l.drops.note(l.ln.Addr(), err.Error())
		return
	}
	if errors.Is(err, errServedAlready) {
		l.noteUsedAlready(err)
		return
	}
	rc := resSuccess
	if err != nil {
		warnf("accept: %v", err) // now: accept() returns the error without calling into Go
		rc = handshakeResult(err)
	}
	l.mu.Lock()
	if !l.closed && C.mpib_listen_push(l.lc, comm, C.int(rc)) == 0 {
		comm = nil // accept() hands it to NCCL
	}
	l.mu.Unlock()
	if comm != nil {
		closeComm(comm, true) // the listener closed meanwhile (or no memory): nobody will accept it
	}
}

// close stops accepting and destroys handshakes that finished but were never accepted;
// handshakes still running are abandoned (l.ctx) and destroy their own comm.
// inGoroutine: see closeComm.
func (l *listener) close(inGoroutine bool) {
	l.mu.Lock()
	if !l.closed { // the first close happens before NCCL's closeListen frees lc
		l.closed = true
		l.cancel(errListenerClosed) // before gateEvictListener: see gateEnter
		l.ln.Close()
		C.mpib_listen_close(l.lc)
	}
	var unaccepted []*C.struct_mpib_comm
	var comm *C.struct_mpib_comm
	var rc C.int
	for l.lc != nil && C.mpib_listen_pop(l.lc, &comm, &rc) == 1 { // nil: NCCL's closeListen freed it
		if comm != nil {
			unaccepted = append(unaccepted, comm)
		}
	}
	l.mu.Unlock()
	gateEvictListener(l, "the listener closed")
	if p, ok := l.takeSpare(); ok { // no connection came: its spare goes
		p.discard(inGoroutine)
	}
	for _, comm := range unaccepted {
		closeComm(comm, inGoroutine)
	}
}

//export mpibGoCloseListen
func mpibGoCloseListen(listenComm unsafe.Pointer) (rc C.int) {
	defer recoverEntry("closeListen", &rc)
	lc := (*C.struct_mpib_listen_comm)(listenComm)
	registry.mu.Lock()
	l := registry.listeners[uint64(lc.id)]
	delete(registry.listeners, uint64(lc.id))
	registry.mu.Unlock()
	if l != nil {
		l.unhook()
		l.close(false)
		l.mu.Lock()
		l.lc = nil // a later close (finalize's) must not touch it
		l.mu.Unlock()
	}
	C.mpib_listen_comm_free(lc)
	noteActivity() // the accept loop's exit may have made the runtime start a thread (threads.go)
	return C.int(resSuccess)
}

// acceptHandshake is the receiving side of one incoming control connection. Until the
// client's hello names this listener, failures are errNotAPeer; then acceptConnection
// (handshake.go) checks the hello's SUP pair against what this listener advertised and its
// SUP ports now, and runs the handshake.
func acceptHandshake(ctx context.Context, p *pendingClient, l *listener) (*C.struct_mpib_comm, error) {
	hello, err := l.readHello(ctx, p)
	if err == nil && ctx.Err() != nil { // the listener closed as the hello came
		err = context.Cause(ctx)
	}
	if err != nil {
		refuse(p.c, err)
		p.c.Close()
		return nil, err
	}
	return acceptConnection(ctx, p.c, l.dev, l.adv, hello, l.takeSpare, p.at)
}

// takeSpare hands the listener's spare receiver (prepare.go) to its first taker, the first
// accepted connection or close, once it is built; false for every later caller.
func (l *listener) takeSpare() (prepared, bool) {
	if !l.spareTaken.CompareAndSwap(false, true) {
		return prepared{}, false
	}
	return <-l.spare, true
}

// readHello reads and checks a client's hello (gate.go: its deadlines, and how it stops being
// unproven before anything else may serve it). A valid hello is taken once per listener.
func (l *listener) readHello(ctx context.Context, p *pendingClient) (wire.Hello, error) {
	c := p.c
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	b := make([]byte, wire.HelloSize)
	err := p.readHello(b, helloTimeout())
	if err != nil {
		p.release()
	}
	var hello wire.Hello
	if err == nil {
		hello, err = wire.DecodeHello(b)
	}
	if wait := time.Since(p.at); err == nil && wait > slowHello {
		infof("listener %v: the hello of %v came %d ms after its TCP connection (a loaded peer; a client silent for %v is dropped)",
			l.ln.Addr(), c.RemoteAddr(), wait.Milliseconds(), admit.Deadline(0, zeroByteGrace, helloTimeout()))
	}
	if err == nil && hello.Nonce != l.nonce {
		return hello, &refusal{wire.RefuseStale, fmt.Errorf("%w: client %v: its hello names another listener (a stale or misrouted handle)", errNotAPeer, c.RemoteAddr())}
	}
	if err != nil {
		return hello, fmt.Errorf("%w: client %v: %v", errNotAPeer, c.RemoteAddr(), err)
	}
	if l.served.Swap(true) {
		return hello, &refusal{wire.RefuseUsed, fmt.Errorf("client %v: %w", c.RemoteAddr(), errServedAlready)}
	}
	return hello, nil
}

// refusal is a listener's error that the connector is told (refuse): a hello turned down on
// its merits, or an end of the connection the listener could not build after taking it.
type refusal struct {
	reason wire.RefuseReason
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// refusalLinger bounds how long refuse waits for the connector to read the refusal and close.
const refusalLinger = time.Second

// refuse tells the connector on c why the listener turns its connection down, when err is a
// refusal; other errors (a gate eviction, a client that never proved it is a peer) close
// without a word, which the connector takes as retryable. The connector's unread metadata is
// drained before the caller's close, so that the close is a FIN, not a reset that may discard
// the refusal before the connector reads it.
func refuse(c net.Conn, err error) {
	var r *refusal
	if !errors.As(err, &r) {
		return
	}
	c.SetDeadline(time.Now().Add(refusalLinger))
	if _, werr := c.Write(wire.EncodeRefusal(r.reason, r.err.Error())); werr != nil {
		return
	}
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		tc.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, 4*wire.MetadataSize)) // until the connector closes
}

// noteUsedAlready reports a hello for a served listener: the first of a burst, then at most a
// line a second (a replayed handle can be dialed at will).
func (l *listener) noteUsedAlready(err error) {
	switch n, total := l.usedLog.note(time.Now()); n {
	case 0:
	case 1:
		warnf("listener %v: %v (%d so far)", l.ln.Addr(), err, total)
	default:
		warnf("listener %v: refused %d more hellos for a handle used already in the last second (%d so far; the last: %v)", l.ln.Addr(), n, total, err)
	}
}

// dropLog reports dropped TCP clients: the first of a burst with its reason, then at most one
// line a second with the count since (a flood must not flood NCCL's log too).
type dropLog struct{ burst burstLog }

func (d *dropLog) note(addr net.Addr, why string) {
	switch n, total := d.burst.note(time.Now()); n {
	case 0:
	case 1:
		infof("listener %v: dropped a TCP client (%d so far): %s", addr, total, why)
	default:
		infof("listener %v: dropped %d TCP clients in the last second (%d so far; the last: %s)", addr, n, total, why)
	}
}
