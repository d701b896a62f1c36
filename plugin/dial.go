// dial.go: the connecting side of the handshake. connectHandshake, which attempt.go starts for
// each connect, classifies the path, decides the SUP pair (sup.go), dials the listener and
// sends the hello while the sender's verbs resources are built (prepare.go), then runs the
// steps both sides share (handshake.go). Also errClosedEarly: the one case a connector dials
// again.

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
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/mpib/mpib/plugin/internal/suppair"
	"github.com/mpib/mpib/plugin/internal/topo"
	"github.com/mpib/mpib/plugin/internal/wire"
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
	redialed := false
	redial := func(why error) (net.Conn, error) {
		if redialed {
			return nil, why
		}
		redialed = true
		infof("connect to %v: the listener closed our control connection before any metadata (%v): dialing it once more", h.Addr, why)
		c, _, _, err := dialHello(ctx, h, plan, deadline)
		return c, err
	}
	dialStart := time.Now()
	c, dialed, helloSent, err := dialHello(ctx, h, plan, deadline)
	if errors.Is(err, errClosedEarly) {
		c, err = redial(err)
		helloSent = time.Now()
	}
	p := <-ready
	p.redial = redial
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
// accept loop does, instead of failing the connection at once: a flood aimed at a listener
// must not fail a real peer's own connect ("socket: too many open files").
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
