// lifecycle_test.go: a comm's control socket after the handshake (lifecycle.go): its close
// against a peer that stopped reading, and what a peer's unexpected messages cost the log.

package main

import (
	"net"
	"os"
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
