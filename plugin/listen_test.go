// listen_test.go: a listener's accept path against its own close (listen.go, gate.go).

package main

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/wire"
)

// testListener is a listener on a loopback port, as listen makes one (its accept loop not
// started), of a context of its own; the test's cleanup closes it as NCCL's closeListen does.
func testListener(t *testing.T) *listener {
	t.Helper()
	owner := &netCtx{trafficClass: tcUndef}
	owner.ctx, owner.cancel = context.WithCancelCause(context.Background())
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newListener(owner, 0, ln)
	if l == nil {
		t.Fatal("newListener: out of memory")
	}
	l.spare <- prepared{err: errors.New("no spare receiver in a test")}
	t.Cleanup(func() {
		l.close(true)
		mpibGoCloseListen(unsafe.Pointer(l.lc))
		owner.cancel(nil)
	})
	return l
}

// accepted returns the listener's end of a new client's connection, taken from l's socket
// directly (as the accept loop's Accept does), and the client's end.
func accepted(t *testing.T, l *listener) (server, client net.Conn) {
	t.Helper()
	client, err := net.Dial("tcp4", l.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	if server, err = l.ln.Accept(); err != nil {
		t.Fatal(err)
	}
	return server, client
}

// closedByServer says whether the server closed client's connection within d.
func closedByServer(client net.Conn, d time.Duration) bool {
	client.SetReadDeadline(time.Now().Add(d))
	_, err := client.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// A client whose TCP connection was accepted just before its listener closed, and that the
// accept loop admits just after, is closed at once: no handshake runs for a result nobody
// would accept.
func TestAdmitAfterCloseClosesTheClient(t *testing.T) {
	l := testListener(t)
	server, client := accepted(t, l)
	l.close(true)
	if p := gateAdmit(l, server); p != nil {
		p.release()
		server.Close()
		t.Fatal("a client admitted after its listener closed: its handshake would run and be thrown away")
	}
	if !closedByServer(client, 2*time.Second) {
		t.Error("the client of a closed listener was not closed")
	}
}

// panicRaw is a socket that panics when asked anything: a stand-in for a bug of ours in
// admission.
type panicRaw struct{}

func (panicRaw) Control(func(uintptr)) error    { panic("test: a socket that panics when asked") }
func (panicRaw) Read(func(uintptr) bool) error  { panic("test: a socket that panics when read") }
func (panicRaw) Write(func(uintptr) bool) error { panic("test: a socket that panics when written") }

// A Go panic while one client is admitted (here in the gate, which asks its clients' sockets
// whether they sent bytes) closes that client only: the gate's lock is free again, the accept
// loop goes on, and the next client is served.
func TestAdmissionPanicKeepsTheListener(t *testing.T) {
	l := testListener(t)
	l.owner.wg.Add(1)
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		l.acceptLoop()
	}()
	isFake := func(q *pendingClient) bool { _, ok := q.raw.(panicRaw); return ok }
	gate.mu.Lock()
	for range unprovenLimits.PerListener { // l is full: the next client must displace one
		a, _ := net.Pipe()
		gate.clients = append(gate.clients, &pendingClient{c: a, raw: panicRaw{}, l: l})
	}
	gate.mu.Unlock()
	client, err := net.Dial("tcp4", l.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if !closedByServer(client, 2*time.Second) {
		t.Error("the client whose admission panicked was not closed")
	}
	if !gate.mu.TryLock() {
		gate.mu.Unlock() // for the cleanup and the tests after this one
		t.Fatal("the gate's lock is held after a panic in admission: every listener's accept loop now blocks on it")
	}
	removeLocked(isFake)
	gate.mu.Unlock()
	select {
	case <-loopDone:
		t.Fatal("the accept loop ended on a panic admitting one client")
	default:
	}
	next, err := net.Dial("tcp4", l.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	next.Write(make([]byte, wire.HelloSize)) // not a hello: refused, and closed
	if !closedByServer(next, 3*time.Second) {
		t.Error("a client after the panic was not served (its junk hello was not refused)")
	}
	l.close(true)
	<-loopDone
	l.owner.wg.Wait()
}
