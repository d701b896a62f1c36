package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mpib/mpib/plugin/internal/wire"
)

// TestDialBindsNoPort: the control connection binds the OOB address and leaves its port to
// connect (IP_BIND_ADDRESS_NO_PORT), so that ports are shared across destinations as an
// unbound connect's are.
func TestDialBindsNoPort(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	saved := plugin.oobAddr
	plugin.oobAddr = netip.MustParseAddr("127.0.0.1")
	defer func() { plugin.oobAddr = saved }()
	c, err := dialControl(context.Background(), netip.MustParseAddrPort(ln.Addr().String()), time.Now().Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT) })
	if gerr != nil || v != 1 {
		t.Fatalf("IP_BIND_ADDRESS_NO_PORT = %d (%v), want 1", v, gerr)
	}
	if got := c.LocalAddr().(*net.TCPAddr).IP.String(); got != "127.0.0.1" {
		t.Fatalf("local address %s, want the OOB address 127.0.0.1", got)
	}
}

func TestIsPortShortage(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&net.OpError{Op: "dial", Err: &net.AddrError{}}, false},
		{fmt.Errorf("dial: %w", syscall.EADDRNOTAVAIL), true},
		{fmt.Errorf("bind: %w", syscall.EADDRINUSE), true},
		{syscall.EMFILE, false},
		{errors.New("connection refused"), false},
		{nil, false},
	} {
		if got := isPortShortage(tc.err); got != tc.want {
			t.Errorf("isPortShortage(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestPortShortageIsLocal: a handshake that failed for this host's lack of local ports is
// NCCL's ncclSystemError (a local limit to fix here), not ncclRemoteError (the peer's side).
func TestPortShortageIsLocal(t *testing.T) {
	if got := handshakeResult(fmt.Errorf("control connection: %w", syscall.EADDRNOTAVAIL)); got != resSystemError {
		t.Errorf("out of local ports: %d, want ncclSystemError (%d)", got, resSystemError)
	}
	if got := handshakeResult(fmt.Errorf("metadata: %w", syscall.ECONNRESET)); got != resRemoteError {
		t.Errorf("peer reset: %d, want ncclRemoteError (%d)", got, resRemoteError)
	}
}

// TestHandshakeResultNamesWhoseFault: what NCCL's connect or accept returns for each kind of
// failed handshake, wrapped as the handshake wraps its steps' errors.
func TestHandshakeResultNamesWhoseFault(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want any
	}{
		{"a caught panic", fmt.Errorf("accept: %w", &panicError{where: "connection setup", value: "x"}), resInternalError},
		{"this host's verbs call", fmt.Errorf("connect to 10.0.0.2: %w", onThisHost(errors.New("creating the connection's verbs resources failed"))), resSystemError},
		{"this host's standby join", onThisHost(fmt.Errorf("bringing the standby SOUT rail up failed: %w", syscall.ENOMEM)), resSystemError},
		{"this host out of ports", fmt.Errorf("control connection: %w", syscall.EADDRNOTAVAIL), resSystemError},
		{"a peer of another version", fmt.Errorf("hello from 10.0.0.2: %w", fmt.Errorf("%w: peer speaks version 6, this plugin 7", wire.ErrVersion)), resInvalidUsage},
		{"a malformed message", fmt.Errorf("metadata: %w", wire.ErrMalformed), resRemoteError},
		{"the peer reset", fmt.Errorf("metadata: %w", syscall.ECONNRESET), resRemoteError},
		{"the peer's refusal", errors.New("peer 10.0.0.2 refused the connection: no SUP pair"), resRemoteError},
	} {
		if got := handshakeResult(tc.err); any(got) != tc.want {
			t.Errorf("%s (%v): %d, want %d", tc.name, tc.err, got, tc.want)
		}
	}
	if onThisHost(nil) != nil {
		t.Error("onThisHost(nil) is not nil")
	}
}
