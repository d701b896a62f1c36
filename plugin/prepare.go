// prepare.go: a comm's verbs resources before its handshake (prepared). prepare builds them
// for a known peer (dial.go's connector while it dials; a listener's later connections);
// prepareSpare builds a listener's first receiver before any peer is known (listen.go's
// listen), which receiver completes for the first accepted connection (handshake.go's
// acceptConnection). The QPs' parameters come from params.go.

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

	"github.com/mpib/mpib/plugin/internal/suppair"
	"github.com/mpib/mpib/plugin/internal/topo"
)

// prepared is a comm's verbs resources before its handshake: the path between the control
// connection's two ends decides its QPs (both ends classify the same two addresses, so their
// QP counts agree; the metadata exchange verifies it).
type prepared struct {
	dev    int // the fused device
	comm   *C.struct_mpib_comm
	isSend bool
	path   topo.PathClass
	sup    suppair.Plan // the SUP pair both ends agreed on in the hello
	prefix [2]uint8
	local  netip.Addr
	peer   netip.Addr
	ph     connPhases
	err    error
	gen    [2]uint32 // its device's GID change counts its GIDs were chosen under (a listener's spare)
	// redial (connector only) dials the listener again after it closed the connection before
	// any metadata, on NCCL's schedule until it gives up (dial.go's redialer): see errClosedEarly.
	redial func(why error) (net.Conn, error)
}

// prepare builds a comm for a known path and SUP pair (supAt: the pair's SUP port and GID
// index, -1 for net_ib's rule); ph is the handshake's phases so far (params and qp_create go on).
func prepare(ctx context.Context, dev int, local, peer netip.Addr, path topo.PathClass, isSend bool, trafficClass int, sup suppair.Plan, supAt supPortUse, ph connPhases) prepared {
	p := prepared{dev: dev, isSend: isSend, local: local, peer: peer, path: path, sup: sup, ph: ph}
	var params C.struct_mpib_conn_params
	params, p.prefix, p.err = connParams(dev, isSend, path, trafficClass, sup.SUP(), supAt)
	if p.err != nil {
		return p
	}
	p.ph.mark(&p.ph.params)
	p.comm, p.err = createComm(ctx, &params, &p.ph)
	return p
}

// prepareSpare builds a listener's receiver before any peer is known: SOUT's QPs, which every
// path has. The handshake that takes it adds SUP's if its SUP pair wants them (completeSpare).
// Receivers without a SUP pair thus never have SUP QPs, as if built at accept.
func prepareSpare(ctx context.Context, dev int) prepared {
	p := prepared{dev: dev, gen: gidGens(dev)}
	var params C.struct_mpib_conn_params
	params, p.prefix, p.err = connParams(dev, false, topo.InterIsland, tcUndef, false, supPortUse{gid: -1})
	if p.err != nil {
		return p
	}
	p.comm, p.err = createComm(ctx, &params, nil)
	return p
}

// completeSpare fits a spare to its connection: the path, and SUP's QPs when the SUP pair
// wants them. The phases go on from ph; qp_create is then SUP's part only.
func (p *prepared) completeSpare(ctx context.Context, local, peer netip.Addr, path topo.PathClass, sup suppair.Plan, supAt supPortUse, ph connPhases) error {
	p.local, p.peer, p.path, p.sup, p.ph = local, peer, path, sup, ph
	params, prefix, err := connParams(p.dev, false, path, tcUndef, sup.SUP(), supAt)
	if err != nil {
		return err
	}
	p.prefix = prefix
	p.ph.mark(&p.ph.params)
	setPath := func() C.int { return C.mpib_comm_set_path(p.comm, &params) }
	var rc C.int
	if spareNeedsVerbs(uint32(params.nqps[1]), uint32(p.comm.nqps[1])) {
		rc, err = inSlot(ctx, &p.ph, &p.ph.qpCreate, setPath)
	} else {
		rc = setPath() // two fields of the comm: no verbs call, so no slot nor thread
		p.ph.mark(&p.ph.qpCreate)
	}
	if err == nil && rc != 0 {
		err = onThisHost(fmt.Errorf("building SUP's QPs for %v failed (%d)", peer, int(rc)))
	}
	return err
}

// spareNeedsVerbs says whether fitting a spare to its connection (mpib_comm_set_path) makes
// verbs calls: only when the connection wants SUP QPs (wantSup) and the spare has none yet.
// Otherwise the call only sets the comm's path class and CTS rail, so an inter-island
// receiver never waits for a verbs slot behind other connections' QP work.
func spareNeedsVerbs(wantSup, haveSup uint32) bool { return wantSup > 0 && haveSup == 0 }

// createComm builds a comm's verbs resources in one of the bounded verbs slots, as the step
// qp_create of ph (nil: not measured).
func createComm(ctx context.Context, params *C.struct_mpib_conn_params, ph *connPhases) (*C.struct_mpib_comm, error) {
	create := func() *C.struct_mpib_comm { return C.mpib_comm_create(params) }
	var comm *C.struct_mpib_comm
	var err error
	if ph != nil {
		comm, err = inSlot(ctx, ph, &ph.qpCreate, create)
	} else {
		comm, err = withVerbsSlot(ctx, create)
	}
	if err == nil && comm == nil {
		err = onThisHost(errors.New("creating the connection's verbs resources failed (see the warning above)"))
	}
	return comm, err
}

// receiver is an accepted connection's prepared receiver: the listener's spare (takeSpare),
// completed for this path and SUP pair, for its first connection; built now for any other (or
// when the spare failed or a GID changed since it was built). Waiting for a spare still being
// built is the phase verbs_wait.
func receiver(ctx context.Context, dev int, takeSpare func() (prepared, bool), local, peer netip.Addr, path topo.PathClass, sup suppair.Plan, supAt supPortUse, ph connPhases) prepared {
	ph.mark(&ph.params)
	p, ok := takeSpare() // at most the rest of its creation
	ph.mark(&ph.verbsWait)
	if ok {
		if p.err == nil && p.gen == gidGens(dev) {
			if err := p.completeSpare(ctx, local, peer, path, sup, supAt, ph); err == nil {
				return p
			}
		}
		destroyInGoroutine(p.comm)
	}
	return prepare(ctx, dev, local, peer, path, false, tcUndef, sup, supAt, ph)
}

// discard frees the comm of a prepared receiver no handshake will take (a listener's spare at
// its close). inGoroutine: see closeComm.
func (p prepared) discard(inGoroutine bool) {
	if p.comm != nil {
		freeComm(p.comm, inGoroutine)
	}
}
