package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mpib/mpib/plugin/internal/wire"
)

// refuseCase runs a connector's metadata exchange against a listener end that fails with
// listenErr after the hello: the listener refuses (when listenErr is a refusal) and closes,
// as acceptHandshake and acceptConnection do. It returns the connector's error.
func refuseCase(t *testing.T, listenErr error) error {
	t.Helper()
	conn, ln := tcpPair(t)
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	go func() {
		refuse(ln, listenErr)
		ln.Close()
	}()
	mine := wire.Metadata{NQPs: [wire.Rails]uint32{1, 0}, BufAddr: 1}
	_, err := exchangeMetadata(conn, mine, netip.MustParseAddr("10.0.0.2"))
	return err
}

// tcpPair is a connected loopback TCP pair (a close with unread bytes resets it, as the
// control connection's would).
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	tcp, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	conn, err := net.Dial("tcp4", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tcp.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return conn, ln
}

// A listener that turns a connection down after its hello (its SUP pair's address is gone,
// its QPs could not be built, the handle was used already or is stale) says why; the
// connector fails at once with the listener's reason instead of dialing again dozens of times
// into refusals.
func TestRefusalFailsTheConnectorAtOnce(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"SUP pair gone", &refusal{wire.RefusePair, errors.New("peer 10.0.0.1: SUP address 10.1.0.1 is not on this port")}, "SUP address 10.1.0.1"},
		{"receiver failed", &refusal{wire.RefuseSetup, errors.New("creating QP: Cannot allocate memory")}, "could not build its end"},
		{"used already", &refusal{wire.RefuseUsed, fmt.Errorf("client 10.0.0.1:5000: %w", errServedAlready)}, "used already"},
		{"stale handle", &refusal{wire.RefuseStale, fmt.Errorf("%w: client 10.0.0.1:5000: its hello names another listener", errNotAPeer)}, "another listener"},
	}
	for _, tt := range tests {
		err := refuseCase(t, tt.err)
		if !errors.Is(err, errRefused) || errors.Is(err, errClosedEarly) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: connector: %v; want a final refusal saying %q (not retried as a close)", tt.name, err, tt.want)
		}
	}
}

// A close without a word (the gate evicted the client before its hello) stays retryable.
func TestSilentCloseStaysRetryable(t *testing.T) {
	err := refuseCase(t, fmt.Errorf("%w: evicted while silent", errNotAPeer))
	if !errors.Is(err, errClosedEarly) || errors.Is(err, errRefused) {
		t.Errorf("connector: %v; want errClosedEarly (dialed again)", err)
	}
}

// Hellos for a served listener (a replayed handle, dialed at will) are logged at most about
// once a second with their count, not once each.
func TestUsedAlreadyIsRateLimited(t *testing.T) {
	tcp, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	lines := tapLog(t, "used already")
	l := &listener{ln: tcp}
	for range 50 {
		l.noteUsedAlready(fmt.Errorf("client 10.0.0.1:5000: %w", errServedAlready))
	}
	if n := lines(); n != 1 {
		t.Errorf("%d lines for 50 refused hellos within a second, want 1", n)
	}
}
