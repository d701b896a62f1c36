// gate.go: the bound on every listener's unproven TCP clients (accepted, hello not read yet).
// listen.go's accept loop admits each client through gateAdmit and reads its hello through
// pendingClient.readHello; clients are evicted when the process runs out of descriptors
// (gateEvictOldestSilent, from the accept loop) or their listener closes (gateEvictListener).

package main

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpib/mpib/plugin/internal/admit"
)

// The gate holds every unproven TCP client of the process (accepted by any listener, hello not
// read yet), oldest first, under one lock. Reading a hello's bytes and evicting a client both
// happen under that lock, so a client whose bytes were read, or wait in its socket, is never
// evicted, and a client is either evicted or proven, never both: a real peer whose hello has
// arrived cannot be closed by newer clients, and a listener never marks itself served for a
// closed socket. An evicted client stops counting at once, not when its goroutine next runs.
// The limits and the choice of victim are admit.Displace's (plugin/internal/admit).
//
// Every section under gate.mu unlocks by defer (gateEnter, withGate, readHello's read), so a
// panic in one (a bug of ours) leaves the lock free, and no section changes gate.clients before
// its last step that can panic (admit.Displace decides, then its victims are taken out): the
// accept loop recovers per client (listen.go, admit) and goes on with the gate as it was.

var unprovenLimits = admit.Limits{
	// Process bounds the descriptors all listeners together spend on unproven clients (the
	// process shares its descriptors with NCCL, CUDA and PyTorch).
	Process: 256,
	// PerSource: one address cannot hold more than a quarter of the process's room, so a
	// silent flood from one host only ever displaces its own clients once it reaches this.
	// One honest peer can exceed it (NCCL listens once per receive connection: a peer process
	// may have hundreds of connects in flight here) while this process is too busy to read
	// the hellos it holds; its newest clients are then closed at once, and its connector dials
	// again with back-off until the hellos are read (dial.go, redialer), as NCCL's sockets do
	// for a full backlog. No bound fits every burst, and raising this one would let one host
	// crowd the others out.
	PerSource: 64,
	// PerListener: a real peer writes its hello right after connecting, and its bytes protect
	// it from eviction from then on, however many newer clients arrive.
	PerListener: 32,
	// PerSourceListener: on a full listener, a source keeps at most this many clients that
	// have sent bytes (a real peer connects once per listener): one address cannot fill a
	// listener with partial hellos and refuse the real peer.
	PerSourceListener: 4,
}

// zeroByteGrace: a client that has sent nothing this long after its connection is dropped; a
// client that sent part of a hello keeps helloTimeout. A real peer's kernel completes the TCP
// handshake before its process writes the hello, and a connector descheduled on a loaded
// 2-core host was measured spending up to 4.8 s between the two: 10 s is twice that. The grace
// does not decide whether a real peer finds room (eviction of the oldest silent client does);
// it only bounds how long one silent client holds a descriptor, so an attacker who wants to
// keep N of them must reopen N/10 a second.
const zeroByteGrace = 10 * time.Second

// errEvicted: the gate closed the client to make room for a newer one.
var errEvicted = errors.New("evicted by a newer client (it had sent nothing)")

var gate struct {
	mu      sync.Mutex
	clients []*pendingClient
}

// pendingClient is one unproven client.
type pendingClient struct {
	c   net.Conn
	raw syscall.RawConn
	l   *listener
	src netip.Addr
	at  time.Time // accepted
	// got: the hello's bytes read so far; out: no longer in gate.clients (evicted, proven or
	// released); evicted: out because the gate closed it; sent: it has sent a byte (read, or
	// seen waiting in its socket). All four change under gate.mu.
	got                int
	out, evicted, sent bool
}

// sentLocked says whether the client has sent any byte: read already, or waiting in its
// socket. A socket that cannot be asked counts as having sent (it is never evicted blindly).
// The answer, once yes, stays yes without asking the socket again: bytes leave the socket only
// through readHello, which counts them in got under the same lock. A gate full of one busy
// peer's hellos (every one sent, none read yet) then costs each newer client no syscall.
func (p *pendingClient) sentLocked() bool {
	if p.got > 0 || p.sent {
		return true
	}
	n := 1
	p.raw.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil {
			n = v
		}
	})
	p.sent = n > 0
	return p.sent
}

// gateAdmit counts a new client of l as unproven, displacing the oldest silent clients that
// the limits require; nil when it was closed at once (every client it could displace has sent
// bytes, or l closed).
func gateAdmit(l *listener, c net.Conn) *pendingClient {
	p := &pendingClient{c: c, l: l, at: time.Now()}
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		p.src = ap.Addr().Unmap()
	}
	if sc, ok := c.(syscall.Conn); ok {
		p.raw, _ = sc.SyscallConn()
	}
	if p.raw == nil { // not a socket: nothing to read a hello from
		c.Close()
		return nil
	}
	victims, err := gateEnter(p)
	closeEvicted(victims, "evicted by a newer client: it had sent nothing")
	if err != nil {
		c.Close()
		if !errors.Is(err, errListenerClosed) {
			l.drops.note(l.ln.Addr(), err.Error())
		}
		return nil
	}
	return p
}

// errGateFull: a new client found no room and nothing it could displace.
var errGateFull = errors.New("closed at once: every unproven client it could displace has sent bytes")

// gateEnter adds p to the gate and returns the clients it displaces (closed by closeEvicted,
// outside the lock); errGateFull or errListenerClosed when p is not admitted. A client whose
// listener closed is never admitted: close ends l.ctx before gateEvictListener takes the lock,
// so p is either here before that eviction (and evicted by it) or sees l.ctx ended.
func gateEnter(p *pendingClient) ([]*pendingClient, error) {
	gate.mu.Lock()
	defer gate.mu.Unlock()
	if p.l.ctx.Err() != nil {
		return nil, errListenerClosed
	}
	victims, ok := displaceLocked(p.src, p.l.id, unprovenLimits)
	if !ok {
		return nil, errGateFull
	}
	gate.clients = append(gate.clients, p)
	return victims, nil
}

// displaceLocked removes the clients a new one from src on listener displaces and returns
// them (closed by closeEvicted, outside the lock); false when it cannot be admitted.
func displaceLocked(src netip.Addr, listener uint64, lim admit.Limits) ([]*pendingClient, bool) {
	view := make([]admit.Client, len(gate.clients))
	for i, q := range gate.clients {
		view[i] = admit.Client{Src: q.src, Listener: q.l.id}
	}
	idx, ok := admit.Displace(view, src, listener, lim, func(i int) bool { return gate.clients[i].sentLocked() })
	if !ok || len(idx) == 0 {
		return nil, ok
	}
	victims := make([]*pendingClient, len(idx))
	for k, i := range idx {
		victims[k] = gate.clients[i]
		victims[k].evicted = true
	}
	removeLocked(func(q *pendingClient) bool { return q.evicted && !q.out })
	return victims, true
}

// removeLocked takes every client that drop selects out of gate.clients, keeping the order.
func removeLocked(drop func(*pendingClient) bool) {
	kept := gate.clients[:0]
	for _, q := range gate.clients {
		if drop(q) {
			q.out = true
		} else {
			kept = append(kept, q)
		}
	}
	clear(gate.clients[len(kept):])
	gate.clients = kept
}

func closeEvicted(victims []*pendingClient, why string) {
	for _, q := range victims {
		q.c.Close()
		q.l.drops.note(q.l.ln.Addr(), why)
	}
}

// withGate runs fn under gate.mu, unlocked on every path, a panic's too.
func withGate(fn func()) {
	gate.mu.Lock()
	defer gate.mu.Unlock()
	fn()
}

// gateEvictOldestSilent evicts the process's oldest client that has sent nothing (the process
// is out of descriptors); false when there is none.
func gateEvictOldestSilent(why string) bool {
	var victims []*pendingClient
	withGate(func() { victims, _ = displaceLocked(netip.Addr{}, 0, admit.Limits{Process: len(gate.clients)}) })
	closeEvicted(victims, why)
	return len(victims) > 0
}

// gateEvictListener evicts all of l's unproven clients, whatever they sent (l closed).
func gateEvictListener(l *listener, why string) {
	var victims []*pendingClient
	withGate(func() {
		removeLocked(func(q *pendingClient) bool {
			if q.l != l {
				return false
			}
			q.evicted = true
			victims = append(victims, q)
			return true
		})
	})
	closeEvicted(victims, why)
}

// release ends a client's unproven time after its hello failed (it closes the client itself).
func (p *pendingClient) release() {
	withGate(func() {
		if !p.out {
			removeLocked(func(q *pendingClient) bool { return q == p })
		}
	})
}

// gateForget takes c's client, if the gate holds one, out of the gate: its admission failed
// by a panic, and the accept loop closes it.
func gateForget(c net.Conn) {
	withGate(func() { removeLocked(func(q *pendingClient) bool { return q.c == c }) })
}

// readHello reads the client's hello into b (wire.HelloSize bytes). Each read happens under
// gate.mu, and the read that completes the hello also proves the client there: from then on
// no eviction can close it. The deadline is admit.Deadline's: zeroByteGrace while the client
// has sent nothing, full once it has sent a byte, both counted from its connection.
func (p *pendingClient) readHello(b []byte, full time.Duration) error {
	for p.got < len(b) { // p.got: this goroutine is its only writer
		p.c.SetReadDeadline(p.at.Add(admit.Deadline(p.got, zeroByteGrace, full)))
		var rerr error
		err := p.raw.Read(func(fd uintptr) bool {
			gate.mu.Lock()
			defer gate.mu.Unlock()
			if p.evicted {
				rerr = errEvicted
				return true
			}
			n, err := syscall.Read(int(fd), b[p.got:])
			switch {
			case err == syscall.EAGAIN || err == syscall.EINTR:
				return false
			case err != nil:
				rerr = err
			case n == 0:
				rerr = io.ErrUnexpectedEOF
				if p.got == 0 {
					rerr = io.EOF
				}
			default:
				p.got += n
				if p.got == len(b) {
					removeLocked(func(q *pendingClient) bool { return q == p })
				}
			}
			return true
		})
		if err == nil {
			err = rerr
		}
		if err != nil {
			if p.evictedNow() {
				err = errEvicted
			}
			return err
		}
	}
	return nil
}

func (p *pendingClient) evictedNow() bool {
	var evicted bool
	withGate(func() { evicted = p.evicted })
	return evicted
}
