// params.go: what a new comm's QPs are built with (connParams: QP counts, the SUP port and the
// striped lanes' ports, each rail's GID, the traffic class), for prepare.go.

package main

/*
#include "mpib.h"
*/
import "C"

import (
	"fmt"

	"github.com/mpib/mpib/plugin/internal/config"
	"github.com/mpib/mpib/plugin/internal/topo"
	"github.com/mpib/mpib/plugin/internal/wire"
)

// connParams chooses what a new comm's QPs are built with: QP counts from the mode and the
// SUP pair (withSup: the pair agreed in the hello wants SUP QPs), the SUP port the pair names
// (supAt.port) and each rail's GID (read now: addresses can change after init; SUP's is the
// pair's, supAt.gid, or net_ib's rule when -1) and the traffic class.
func connParams(dev int, isSend bool, path topo.PathClass, trafficClass int, withSup bool, supAt supPortUse) (C.struct_mpib_conn_params, [2]uint8, error) {
	cfg := plugin.cfg
	var p C.struct_mpib_conn_params
	var prefix [2]uint8
	p.dev, p.is_send, p.mode, p.path_class = C.int(dev), boolInt(isSend), C.int(cfg.Mode), C.int(path)
	p.nqps[0] = C.uint32_t(cfg.SoutQPs)
	if withSup {
		p.nqps[1] = C.uint32_t(max(cfg.SupQPs, 1+len(supAt.stripe))) // a QP on each lane at least
		p.sup_port = C.int(supAt.port)
		if err := stripeParams(&p, dev, supAt.stripe); err != nil {
			return p, prefix, err
		}
	}
	f := &C.mpib_g.fdev[dev]
	nics := [2]C.int{f.sout_nic, f.sup_nic[p.sup_port]}
	for rail, r := range []config.Rail{cfg.Devices[dev].Sout, cfg.Devices[dev].SupPorts[p.sup_port]} {
		if p.nqps[rail] == 0 {
			continue
		}
		configured := r.GIDIndex
		if rail == 1 && supAt.gid >= 0 {
			configured = supAt.gid // the port the pair names (chosen by the same rule, just now)
		}
		idx, addr, err := chooseGID(int(nics[rail]), configured)
		if err != nil {
			return p, prefix, fmt.Errorf("%s rail %s: %w", railNames[rail], r.HCA, err)
		}
		p.gid_index[rail] = C.int(idx)
		prefix[rail] = interfacePrefixLen(addr)
	}
	p.tc = C.int(connectionTC(trafficClass))
	return p, prefix, nil
}

// stripeParams sets a striped connection's further SUP lanes: each lane's port and its GID
// (the pair's, chosen by the same rule as the first port's).
func stripeParams(p *C.struct_mpib_conn_params, dev int, stripe []supLane) error {
	if len(stripe) == 0 {
		return nil
	}
	f := &C.mpib_g.fdev[dev]
	p.sup_lanes = C.int(1 + len(stripe))
	for i, l := range stripe {
		idx, _, err := chooseGID(int(f.sup_nic[l.port]), l.gid)
		if err != nil {
			return fmt.Errorf("SUP lane %d (port %d): %w", i+2, l.port, err)
		}
		p.lane_port[i], p.lane_gid_index[i] = C.int(l.port), C.int(idx)
	}
	return nil
}

var railNames = [2]string{"SOUT", "SUP"}

// The C side's lanes and the hello's pairs must agree (a compile error otherwise).
var _ = [1]struct{}{}[C.MPIB_MAX_STRIPE-wire.MaxPairs]

// connectionTC is the traffic class of a new send connection, with net_ib's precedence: the
// environment (MPIB_IB_TC, then NCCL_IB_TC), then NCCL's per-communicator class, then 0.
func connectionTC(commClass int) int {
	switch {
	case plugin.cfg.IBTC >= 0:
		return plugin.cfg.IBTC
	case commClass >= 0 && commClass <= 255:
		return commClass
	default:
		return 0
	}
}
