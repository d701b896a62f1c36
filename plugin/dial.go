// dial.go: the connecting side of the handshake. connectHandshake, which attempt.go starts for
// each connect, classifies the path, decides the SUP pair (sup.go), dials the listener and
// sends the hello while the sender's verbs resources are built (prepare.go), then runs the
// steps both sides share (handshake.go). Also errClosedEarly: the one case a connector dials
// again, with back-off (redialer).

package main

/*
#include "mpib.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/mpib/mpib/plugin/internal/admit"
	"github.com/mpib/mpib/plugin/internal/suppair"
	"github.com/mpib/mpib/plugin/internal/topo"
	"github.com/mpib/mpib/plugin/internal/wire"
	"golang.org/x/sys/unix"
)

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
	ph := newPhases(time.Now())
	deadline := ph.start.Add(handshakeTimeout())
	plan, supAt, err := connectorPlan(dev, h, path)
	if err != nil {
		// A relay mismatch: the hello still goes (naming no pair), so that the listener fails
		// with the same message instead of waiting for a peer that never comes.
		if c, _, _, derr := dialHello(ctx, h, plan, deadline); derr == nil {
			c.Close()
		}
		return nil, fmt.Errorf("peer %v: %w", h.Addr, err)
	}
	ready := make(chan prepared, 1)
	go func() {
		p := prepared{err: errors.New("building the connection's resources failed (see the panic above)")}
		defer func() { ready <- p }()
		defer recoverGoroutine("connect: building the sender")
		p = prepare(ctx, dev, plugin.oobAddr, peer, path, true, trafficClass, plan, supAt, ph)
	}()
	rd := &redialer{ctx: ctx, h: h, plan: plan, deadline: deadline}
	dialStart := time.Now()
	c, dialed, helloSent, err := dialHello(ctx, h, plan, deadline)
	if errors.Is(err, errClosedEarly) {
		c, err = rd.again(err)
		helloSent = time.Now()
	}
	p := <-ready
	p.redial = rd.again
	if err != nil {
		destroyInGoroutine(p.comm)
		return nil, err
	}
	p.ph.dial, p.ph.hello = dialed.Sub(dialStart), helloSent.Sub(dialed)
	p.ph.joinAt(helloSent) // metadata starts when the resources and the hello are both done
	return handshake(ctx, c, p)
}

// connectorPlan is connectPlan (sup.go), except that a connection whose mode and path want
// no SUP QPs (vanilla mode across islands) reads nothing of SUP: not the device's SUP ports,
// their GID tables nor their addresses, so it never waits on a read of those. Its hello then
// names no pair, and a MPIB_SUP_RELAY mismatch is still an error (suppair.Connect looks at
// nothing else when SUP is not wanted).
func connectorPlan(dev int, h wire.Handle, path topo.PathClass) (suppair.Plan, supPortUse, error) {
	if !supWanted(path) {
		plan, err := suppair.Connect(h, suppair.Local{}, nil, plugin.cfg.SupRelay, false)
		return plan, supPortUse{gid: -1}, err
	}
	return connectPlan(dev, h, path)
}

// dialHello opens the control connection and names the listener it expects, our
// MPIB_SUP_RELAY and the SUP pair we chose; deadline is the whole handshake's. It also returns
// when the connection was up and when the hello was written (the phases dial and hello).
func dialHello(ctx context.Context, h wire.Handle, plan suppair.Plan, deadline time.Time) (c net.Conn, dialed, sent time.Time, err error) {
	hello, err := wire.EncodeHello(plan.Hello(h.Nonce, plugin.cfg.SupRelay))
	if err != nil {
		return nil, dialed, sent, fmt.Errorf("hello to %v: %w", h.Addr, err)
	}
	c, err = dialControl(ctx, h.Addr, deadline)
	dialed = time.Now()
	if err != nil {
		return nil, dialed, sent, fmt.Errorf("control connection to %v from %v: %w", h.Addr, plugin.oobAddr, err)
	}
	c.SetDeadline(deadline)
	if _, err := c.Write(hello); err != nil {
		c.Close()
		return nil, dialed, sent, fmt.Errorf("hello to %v: %w", h.Addr, closedEarly(err))
	}
	return c, dialed, time.Now(), nil
}

// errClosedEarly marks a control connection the listener closed before sending any metadata.
// The listener does so when it refuses our hello, but also when its gate (gate.go) dropped us
// before reading our hello: evicted to make room for newer clients while we were still silent
// (descheduled between connect and the hello write), or closed at once because every unproven
// client it holds from our address has sent bytes it has not read yet (its process is busy, and
// one peer may have hundreds of connects in flight to it: NCCL listens once per receive
// connection). Neither is the peer's final word, so the connector dials again (redialer). A
// hello the listener turns down on its merits gets its refusal instead (wire.EncodeRefusal:
// used already, a stale handle, no SUP pair, a failed setup), and the connect fails at once
// with its reason.
var errClosedEarly = errors.New("closed before any metadata")

// connectRedials is NCCL's schedule for a refused connect (ncclSocketConnect, src/misc/socket.cc
// and its OS layer: up to NCCL_SOCKET_RETRY_CNT = 34 retries, the n-th after n ×
// NCCL_SOCKET_RETRY_SLEEP_MSEC = 100 ms, about 60 s in all), here jittered (admit.Redial) and
// always within the handshake's deadline. net_ib needs nothing more: its listener never closes a
// client unread; ours does when its gate is full, which is the same answer as a full backlog.
var connectRedials = admit.Redials{Step: 100 * time.Millisecond, Max: 34}

// redialer dials a connection's listener again after each close before any metadata; one per
// connect, shared by the hello's write (connectHandshake) and the metadata's read (handshake.go).
type redialer struct {
	ctx      context.Context
	h        wire.Handle
	plan     suppair.Plan
	deadline time.Time
	n        int // redials so far
}

// again pauses as admit.Redial says and dials again after why (an errClosedEarly), and again
// while the new connection's hello write meets such a close too. Once the redials run out it
// returns why with their count; a failed dial (the listener closed: connection refused) or the
// context's end is returned as is, with why.
func (r *redialer) again(why error) (net.Conn, error) {
	for {
		r.n++
		wait, ok := admit.Redial(r.n, time.Until(r.deadline), rand.Float64(), connectRedials)
		if !ok {
			return nil, fmt.Errorf("%w (gave up after %d redials)", why, r.n-1)
		}
		if r.n&(r.n-1) == 0 { // the 1st, 2nd, 4th, 8th...: a busy listener must not flood the log
			infof("connect to %v: the listener closed our control connection before any metadata (%v): dialing it once more in %d ms (redial %d, at most %d)",
				r.h.Addr, why, wait.Milliseconds(), r.n, connectRedials.Max)
		}
		t := time.NewTimer(wait)
		select {
		case <-r.ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (not dialed again: %w)", why, context.Cause(r.ctx))
		case <-t.C:
		}
		c, _, _, err := dialHello(r.ctx, r.h, r.plan, r.deadline)
		if !errors.Is(err, errClosedEarly) {
			if err != nil {
				err = fmt.Errorf("%w (dialing again: %w)", why, err)
			}
			return c, err
		}
		why = err
	}
}

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
// accept loop does, instead of failing the connection at once: a flood aimed at a listener
// must not fail a real peer's own connect ("socket: too many open files").
//
// The socket binds the OOB address (the peer classifies us by it) without a port
// (IP_BIND_ADDRESS_NO_PORT): the port is chosen at connect, by destination, as an unbound
// connect's is (NCCL's own sockets never bind). A bind that takes a port holds it against
// every destination, and a node whose 8 processes hold thousands of control connections each
// (an all-to-all of a thousand GPUs) runs out of the ephemeral range (28,231 ports by
// default) twice as fast.
func dialControl(ctx context.Context, addr netip.AddrPort, deadline time.Time) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: plugin.oobAddr.AsSlice()}, Deadline: deadline, Control: bindNoPort}
	for backoff := 5 * time.Millisecond; ; backoff = min(2*backoff, 200*time.Millisecond) {
		c, err := d.DialContext(ctx, "tcp4", addr.String())
		if isPortShortage(err) {
			return nil, fmt.Errorf("%w: this host is out of local TCP ports for %v (net.ipv4.ip_local_port_range, and connections in TIME_WAIT)", err, plugin.oobAddr)
		}
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

// bindNoPort is dialControl's socket option: bind the address, leave the port to connect. A
// kernel without the option (before Linux 4.2) binds a port as before.
func bindNoPort(network, address string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	}); err != nil {
		return err
	}
	if errors.Is(serr, unix.ENOPROTOOPT) {
		return nil
	}
	return serr
}
