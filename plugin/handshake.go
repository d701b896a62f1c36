// handshake.go: the steps both ends of a connection run once the control connection is up
// (metadata exchange, QPs to RTS, ready), with their timing, and the accept side's entry,
// acceptConnection, which listen.go calls once a client's hello named its listener. The
// connect side's entry is connectHandshake (dial.go), which attempt.go starts. Every handshake
// runs in a goroutine of its netCtx (lifecycle.go): NCCL's connect and accept never wait for
// one.

package main

/*
#include "mpib.h"
#include "mpib_comm.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/mpib/mpib/plugin/internal/suppair"
	"github.com/mpib/mpib/plugin/internal/topo"
	"github.com/mpib/mpib/plugin/internal/wire"
)

// acceptConnection is the accept side's entry into the handshake, called by listen.go once a
// client's hello named the listener. It owns c from here (closed on failure, kept on success,
// as handshake). It classifies the path between c's two ends, checks the hello's SUP pair
// against adv (the handle the listener published) and the device's SUP ports now, builds the
// receiver (the listener's spare, from takeSpare, while it has one) and runs the handshake.
// A failure before the metadata is told to the connector (refuse), which then fails at once
// instead of dialing again.
func acceptConnection(ctx context.Context, c net.Conn, dev int, adv wire.Handle, hello wire.Hello, takeSpare func() (prepared, bool), accepted time.Time) (*C.struct_mpib_comm, error) {
	ph := newPhases(accepted)
	ph.mark(&ph.hello)
	c.SetDeadline(ph.last.Add(handshakeTimeout()))
	local := netip.MustParseAddrPort(c.LocalAddr().String()).Addr().Unmap()
	peer := netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()
	path, err := topo.Classify(local, peer, plugin.cfg.IslandPrefixLen)
	var plan suppair.Plan
	var supAt supPortUse
	reason := wire.RefuseSetup
	if err == nil {
		reason = wire.RefusePair
		plan, supAt, err = acceptorPlan(dev, adv, hello, peer, path)
	}
	if err != nil {
		refuse(c, &refusal{reason, err})
		c.Close()
		return nil, err
	}
	p := receiver(ctx, dev, takeSpare, local, peer, path, plan, supAt, ph)
	if p.err != nil {
		refuse(c, &refusal{wire.RefuseSetup, p.err}) // handshake closes c and frees the comm
	}
	return handshake(ctx, c, p)
}

// acceptorPlan is acceptPlan (sup.go), except that a connection whose mode and path want no
// SUP QPs reads nothing of SUP (as connectorPlan): only the relay flags are compared.
func acceptorPlan(dev int, adv wire.Handle, hello wire.Hello, peer netip.Addr, path topo.PathClass) (suppair.Plan, supPortUse, error) {
	if !supWanted(path) {
		plan, err := suppair.Accept(adv, hello, suppair.Local{}, nil, plugin.cfg.SupRelay, false)
		if err != nil {
			return plan, supPortUse{gid: -1}, fmt.Errorf("peer %v: %w", peer, err)
		}
		return plan, supPortUse{gid: -1}, nil
	}
	return acceptPlan(dev, adv, hello, peer, path)
}

// handshake classifies the connection, builds the comm and its QPs, exchanges metadata with
// the peer and brings every QP to RTS. Both sides compute the path class from the two ends
// of the same TCP socket, so their QP counts agree; the metadata exchange verifies it. It owns
// c: closed on failure, kept on success as the comm's liveness signal (adoptComm). The
// connector's c may be replaced by new dials (prepared.redial, a bounded number of times).
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
	standby := p.isSend && comm.rail[0].join_wait != 0 // NCCL does not have the comm yet
	lc := adoptComm(comm, c)
	if standby {
		queueStandby(lc)
	}
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

// ctrlConn is a handshake's control connection, which the connector may replace (redials)
// while a context's end may close it from another goroutine.
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

// handshakeSteps returns the comm even with an error once it exists, for handshake to free.
func handshakeSteps(ctx context.Context, cc *ctrlConn, p prepared) (*C.struct_mpib_comm, error) {
	if p.err != nil {
		return p.comm, p.err
	}
	hostileHook("handshake")
	comm, ph, cfg, peer := p.comm, &p.ph, plugin.cfg, p.peer
	var info C.struct_mpib_conn_info
	C.mpib_comm_local_info(comm, &info)
	mine := metadataFromC(&info, cfg.Mode, p.path, p.prefix)
	c := cc.get()
	theirs, err := exchangeMetadata(c, mine, peer)
	for errors.Is(err, errClosedEarly) && p.redial != nil { // ends when p.redial gives up
		c2, derr := p.redial(err)
		if derr != nil {
			err = derr
			break
		}
		if !cc.swap(c2) {
			err = context.Cause(ctx)
			break
		}
		c = c2
		theirs, err = exchangeMetadata(c, mine, peer)
	}
	if err != nil {
		return comm, err
	}
	ph.mark(&ph.metadata)
	if p.isSend {
		theirs.TC, theirs.SL = mine.TC, mine.SL // the receiver echoes ours; ours is what counts
	}
	if err := checkSupMetadata(comm, p.sup, &mine, &theirs, peer); err != nil {
		return comm, err
	}
	remote := metadataToC(theirs)
	rc, err := inSlot(ctx, ph, &ph.rtrRts, func() C.int { return C.mpib_comm_connect(comm, &remote) })
	if err != nil {
		return comm, err
	}
	if rc != 0 && rc != C.MPIB_CONNECT_JOIN_NOW {
		return comm, onThisHost(fmt.Errorf("bringing QPs to %v up failed (%d); is the SUP fabric reachable?", peer, int(rc)))
	}
	peerJoinNow, err := exchangeAck(c, peer, rc == C.MPIB_CONNECT_JOIN_NOW)
	if err != nil {
		return comm, err
	}
	if rc == C.MPIB_CONNECT_JOIN_NOW || peerJoinNow {
		if err := joinStandbyNow(ctx, c, comm, p.isSend, peer); err != nil {
			return comm, err
		}
	}
	ph.mark(&ph.ack)
	registerWithAgent(comm, p.local, peer, p.path, p.sup, p.isSend)
	ph.mark(&ph.agent)
	ph.finish()
	supPort := "-"
	if comm.nqps[1] > 0 { // every SUP lane's NIC: lane 1, then the striped lanes 2.. (mpib_lane)
		var names []string
		for i := range int(comm.sup_lanes) {
			names = append(names, C.GoString(&comm.nic[1+i].name[0]))
		}
		supPort = strings.Join(names, "+")
	}
	standby := ""
	if comm.rail[0].join_wait != 0 {
		standby = ", SOUT a standby that joins after the setups"
	}
	infof("%s comm %v <-> %v: %v, SOUT QPs %d, SUP QPs %d, CTS on %s, SUP pair %v on %s, traffic class %d, SL %d%s, %v",
		map[bool]string{true: "send", false: "recv"}[p.isSend], p.local, peer, p.path, int(comm.nqps[0]), int(comm.nqps[1]),
		[]string{"SOUT", "SUP"}[comm.cts_rail], p.sup, supPort, int(comm.tc), int(comm.sl), standby, ph)
	return comm, nil
}
