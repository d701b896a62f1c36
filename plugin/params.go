// params.go: what a new comm's QPs are built with (connParams: QP counts, the SUP port and the
// striped lanes' ports, each rail's GID, the traffic class), for prepare.go.

package main

/*
#include "mpib.h"
#include "mpib_device.h"
*/
import "C"

import (
	"fmt"

	"github.com/mpib/mpib/plugin/internal/config"
	"github.com/mpib/mpib/plugin/internal/suppair"
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
		p.nqps[1] = C.uint32_t(suppair.SupQPCount(cfg.SupQPs, 1+len(supAt.stripe))) // an equal count on each lane
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
	if standbyDeferred(cfg, isSend, path, withSup, func() bool { return supPortsUp(dev, &p) }) {
		p.defer_rails = 1 << 0
	}
	return p, prefix, nil
}

// standbyDeferred says whether a sender builds its SOUT rail after the handshake, as a standby
// that joins the connection once the process's setups are done (standby.go; docs/failover.md,
// "The standby rail"): only where SOUT carries nothing while SUP works (vanilla mode inside
// the island, no MPIB_FORCE_SUP_BW split) and is there for failover alone, with a ride-through
// to cover a SUP failure before it joins, and only while SUP's ports are up (a connection whose
// SUP cannot come up starts on SOUT, built now, as before). The receiver follows the sender's
// metadata; its SOUT QPs come from the listener's spare. supUp reads the ports' state, asked
// last: only for a connection everything else defers.
func standbyDeferred(cfg config.Config, isSend bool, path topo.PathClass, withSup bool, supUp func() bool) bool {
	vanillaSplit := cfg.ForceSupBW < 0 || cfg.ForceSupBW == 1024
	return cfg.StandbyDefer && isSend && cfg.Mode == 0 && path == topo.IntraIsland && withSup && vanillaSplit &&
		cfg.Failover && cfg.StallTimeoutMS > 0 && supUp()
}

// supPortsUp says whether every SUP port p's lanes use is up (no IBV_EVENT_PORT_ERR since it
// last came up).
func supPortsUp(dev int, p *C.struct_mpib_conn_params) bool {
	f := &C.mpib_g.fdev[dev]
	ports := []C.int{p.sup_port}
	for i := 1; i < int(p.sup_lanes); i++ {
		ports = append(ports, p.lane_port[i-1])
	}
	for _, port := range ports {
		if C.mpib_sup_port_down(f.sup_nic[port]) != 0 {
			return false
		}
	}
	return true
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

// The C side's lanes and the hello's pairs must agree, and so must its QPs per rail and
// suppair.SupQPCount's cap (a compile error otherwise).
var (
	_ = [1]struct{}{}[C.MPIB_MAX_STRIPE-wire.MaxPairs]
	_ = [1]struct{}{}[C.MPIB_MAX_QPS_PER_RAIL-suppair.MaxQPsPerRail]
)

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
