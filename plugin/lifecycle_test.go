// lifecycle_test.go: a context's finalize, and a comm's control socket after the handshake
// (lifecycle.go): its close against a peer that stopped reading, and what a peer's unexpected
// messages cost the log.

package main

import (
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// fakeComm points *p at zeroed memory the size of a comm: enough for the control socket's
// paths, which touch only its socket, its lock (zero is an unlocked mutex) and its queue.
// Nothing in it may reach verbs.
func fakeComm[T any](p **T) {
	var zero T
	mem := make([]uint64, (unsafe.Sizeof(zero)+7)/8)
	*p = (*T)(unsafe.Pointer(&mem[0]))
}

// socketPair returns the two ends of a connected stream socket, each a net.Conn on its own
// descriptor (as a comm's control socket is), with small buffers so that a peer that does not
// read fills them quickly.
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
		syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// fill writes to c until its socket takes no more (its peer does not read).
func fill(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := c.Write(make([]byte, 4<<20)); err == nil {
		t.Fatal("4 MiB went into a socket whose peer does not read")
	}
	c.SetWriteDeadline(time.Time{})
}

// adoptFake adopts a fake comm on conn as the handshake does (adoptComm: its watcher runs);
// the test's cleanup stops it and takes it out of the registry.
func adoptFake(t *testing.T, conn net.Conn, isSend bool) *liveComm {
	var fake liveComm
	fakeComm(&fake.comm)
	if isSend {
		fake.comm.is_send = 1
	}
	lc := adoptComm(fake.comm, conn)
	t.Cleanup(func() {
		lc.stop()
		registry.mu.Lock()
		delete(registry.comms, lc.comm)
		registry.mu.Unlock()
	})
	return lc
}

// NCCL's close of a comm whose peer stopped reading does not wait for a standby rail's join
// being sent to it: the control-plane send waits up to about 2 s for room, and the close
// waits for the standby builder (it uses the comm's memory). The close takes the socket away
// from the send first, which then gives up at once.
func TestCloseDoesNotWaitForAJoinToAPeerNotReading(t *testing.T) {
	conn, peer := socketPair(t)
	defer peer.Close()
	lc := adoptFake(t, conn, true)
	fill(t, conn)
	sending := make(chan struct{})
	go func() { // the standby builder's send (buildStandby), under standbyMu as there
		lc.standbyMu.Lock()
		defer lc.standbyMu.Unlock()
		close(sending)
		lc.ctrlSend(make([]byte, 2+joinInfoSize))
	}()
	<-sending
	for lc.comm.ctrl_out_n == 0 { // queued behind the full socket: the send now waits for room
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	lc.stop()
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("close took %v behind a standby join to a peer that does not read: want it at once", took.Round(time.Millisecond))
	}
}

// tapLog sends the package's log lines to the returned function's count of lines containing
// want, until the test ends.
func tapLog(t *testing.T, want string) func() int {
	var mu sync.Mutex
	n := 0
	logMu.Lock()
	logTap = func(_ bool, line string) {
		if strings.Contains(line, want) {
			mu.Lock()
			n++
			mu.Unlock()
		}
	}
	logMu.Unlock()
	t.Cleanup(func() {
		logMu.Lock()
		logTap = nil
		logMu.Unlock()
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// A peer that floods its control socket with standby rail messages its side must not send
// (here 'J', the sender's own kind, to a sender) gets them ignored, and logged at most about
// once a second with their count, not once each.
func TestUnexpectedJoinsAreRateLimited(t *testing.T) {
	const flood = 2000
	conn, peer := socketPair(t)
	lines := tapLog(t, "unexpected standby rail message")
	unexpectedJoins.mu.Lock()
	unexpectedJoins.last = time.Time{} // a new burst, whatever ran before
	unexpectedJoins.mu.Unlock()
	lc := adoptFake(t, conn, true)
	msg := make([]byte, 2+joinInfoSize)
	msg[0] = 'J'
	start := time.Now()
	for range flood {
		if _, err := peer.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
	peer.Close()
	<-lc.watchDone
	took := time.Since(start)
	if n, most := lines(), 1+int(took/time.Second)+1; n == 0 || n > most {
		t.Errorf("%d unexpected standby messages in %v were logged in %d lines: want 1 to %d", flood, took.Round(time.Millisecond), n, most)
	}
}

// TestFinalizeOfAnUnknownContext: NCCL 2.28.3 finalizes a communicator whose init failed (no
// context of ours); that ends nothing and leaves the live contexts' count of the devices as it
// was, while a live context's finalize ends it and drops its count.
func TestFinalizeOfAnUnknownContext(t *testing.T) {
	plugin.mu.Lock()
	plugin.refs = 1
	plugin.mu.Unlock()
	id := newNetCtx(tcUndef)
	finalizeCtx(id + 1000)
	finalizeCtx(0)
	plugin.mu.Lock()
	refs := plugin.refs
	plugin.mu.Unlock()
	if refs != 1 || lookupCtx(id) == nil {
		t.Fatalf("after finalizes of unknown contexts: refs %d (want 1), context live %v (want true)", refs, lookupCtx(id) != nil)
	}
	finalizeCtx(id)
	plugin.mu.Lock()
	refs = plugin.refs
	plugin.mu.Unlock()
	if refs != 0 || lookupCtx(id) != nil {
		t.Fatalf("after the live context's finalize: refs %d (want 0), context live %v (want false)", refs, lookupCtx(id) != nil)
	}
}
