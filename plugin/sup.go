// sup.go: SUP ports and the SUP pair of a connection (docs/topology.md "SUP ports on a mesh"):
// the listener advertises its SUP port addresses in the handle (listenerHandle, for listen.go),
// the connector picks a pair and names it in its hello (connectPlan, for dial.go), the acceptor
// checks it (acceptPlan, for handshake.go), all before any SUP QP exists, and the exchanged
// metadata is checked against it (checkSupMetadata, for handshake.go). The decisions are
// package suppair's; this file reads what they need (GIDs through gidcache.go, netdevs,
// routes).

package main

/*
#include "mpib.h"
#include "mpib_comm.h"
#include "mpib_device.h"
#include "mpib_policy.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"

	"github.com/mpib/mpib/plugin/internal/config"
	"github.com/mpib/mpib/plugin/internal/suppair"
	"github.com/mpib/mpib/plugin/internal/topo"
	"github.com/mpib/mpib/plugin/internal/wire"
)

// supPorts is a fused device's SUP ports as read now, with each port's GID index.
type supPorts struct {
	local suppair.Local
	gid   map[int]int // the GID index of each port of local.Ports and local.Down, by port index
}

// supPortUse is the SUP port (its index in the fused device) a connection's SUP QPs are
// built on, and their GID index there (-1: chosen by net_ib's rule when the comm is built);
// stripe: the further ports a striped connection's SUP lanes use, with their GID indexes.
type supPortUse struct {
	port, gid int
	stripe    []supLane
}

// supLane is one further SUP lane's port and GID index.
type supLane struct{ port, gid int }

// use is where a plan's SUP QPs go: the port it names with that port's GID; an unaddressed
// or empty plan uses the device's first SUP port and net_ib's rule.
func (s supPorts) use(p suppair.Plan) supPortUse {
	if p.Kind != wire.PairAddressed {
		return supPortUse{gid: -1}
	}
	u := supPortUse{gid: -1}
	if gid, ok := s.gidOf(p.Port.Index); ok {
		u.port, u.gid = p.Port.Index, gid
	}
	for _, l := range p.Stripe {
		if gid, ok := s.gidOf(l.Port.Index); ok {
			u.stripe = append(u.stripe, supLane{port: l.Port.Index, gid: gid})
		}
	}
	return u
}

// gidOf is the GID index chosen for the device's SUP port with the given index.
func (s supPorts) gidOf(index int) (int, bool) {
	gid, ok := s.gid[index]
	return gid, ok
}

// devSupPorts reads a fused device's SUP ports: each port's GID chosen by net_ib's rule (the
// one its QPs use), described by the netdev that holds its address and that address's real
// prefix there (not a global /24: /29../31 links must work). A device whose only port cannot
// be described (InfiniBand, no IPv4 address) is unaddressed: its connections decide SUP by the
// rails' subnets (checkSupMetadata). A device's only port is listed with the ports that are
// up even when it is down: its connections fail over and back as always. Of several ports, those that cannot be
// described now (an address removed) are left out, and those that are down (their async
// event, or down at init) are listed as down (suppair.Local.Down): neither is advertised nor
// chosen, so their peers get no new pair on them, but a pair a peer already chose on a down
// one is accepted and starts degraded. A port whose device died is left out; when every
// port's device died the device has no SUP (suppair.Local.Dead): its connections build no SUP
// QPs, whose verbs calls would fail on the dead device. When no port is up and described
// otherwise, the device is unaddressed on its first port.
func devSupPorts(dev int) supPorts {
	f := &C.mpib_g.fdev[dev]
	out := supPorts{gid: map[int]int{}}
	var firstWhy string
	dead := 0
	for i := range int(f.nsup) {
		nic := int(f.sup_nic[i])
		if C.mpib_nic_dead(C.int(nic)) != 0 {
			dead++
			continue
		}
		port, idx, down, why := describeSupPort(dev, i, nic)
		if why != "" && firstWhy == "" {
			firstWhy = why
		}
		switch {
		case down:
			out.local.Down = append(out.local.Down, port)
		case why == "":
			out.local.Ports = append(out.local.Ports, port)
		default:
			continue
		}
		out.gid[port.Index] = idx
	}
	switch {
	case dead == int(f.nsup):
		out.local.Dead = fmt.Sprintf("the device of every SUP port of fused device %d died", dev)
	case len(out.local.Ports) == 0:
		out.local.Unaddressed = firstWhy
	}
	warnSharedSubnet(dev, out.local)
	return out
}

// sharedSubnetWarned: the devices whose SUP ports were found sharing a subnet, said once each.
var sharedSubnetWarned [config.MaxDevices]atomic.Bool

// warnSharedSubnet says, once per device, that two of its SUP ports share a subnet: right for
// a port's two PCI functions or parallel cables to one node, wrong on a mesh whose cables lead
// to different nodes (topo.SharedSubnet).
// Every connection reads the ports; only the first finding is said, so the rest skip the search.
func warnSharedSubnet(dev int, l suppair.Local) {
	if sharedSubnetWarned[dev].Load() {
		return
	}
	a, b, ok := topo.SharedSubnet(append(append([]topo.Port{}, l.Ports...), l.Down...))
	if !ok || sharedSubnetWarned[dev].Swap(true) {
		return
	}
	warnf("fused device %d: SUP ports %s and %s share a subnet, so a peer in it is taken to be cabled to both: "+
		"right where both lead to the same node, wrong on a mesh whose cables lead to different nodes (give each cable "+
		"a subnet of its own, docs/mesh.md)", dev, a, b)
}

// describeSupPort is SUP port i of a device (NIC nic) described, with its GID index, or why
// it cannot be. down: the port is described but, one of several, its link is down now (why
// then says so).
func describeSupPort(dev, i, nic int) (port topo.Port, gid int, down bool, why string) {
	hca := plugin.cfg.Devices[dev].SupPorts[i].HCA
	idx, addr, err := chooseGID(nic, plugin.cfg.Devices[dev].SupPorts[i].GIDIndex)
	if err != nil {
		return topo.Port{}, -1, false, fmt.Sprintf("no SUP GID on %s: %v", hca, err)
	}
	ib := C.mpib_g.nic[nic].link_layer == C.IBV_LINK_LAYER_INFINIBAND
	ifa := interfaceAddr(addr)
	port, why = suppair.Describe(i, false, ib, addr, ifa.bits(), ifa.dev)
	if why != "" {
		return topo.Port{}, -1, false, fmt.Sprintf("SUP port %s: %s", hca, why)
	}
	if len(plugin.cfg.Devices[dev].SupPorts) > 1 && C.mpib_sup_port_down(C.int(nic)) != 0 {
		return port, idx, true, fmt.Sprintf("SUP port %s: the port is down", hca)
	}
	return port, idx, false, ""
}

// supWanted says whether a connection's mode and path want SUP QPs at all (the SOUT island
// rule, mpib_sup_qps_wanted); the SUP pair then decides whether it gets them.
func supWanted(path topo.PathClass) bool {
	cfg := plugin.cfg
	return C.mpib_sup_qps_wanted(C.int(cfg.Mode), C.int(path), boolInt(cfg.SupRelay)) != 0
}

// supRoutes is the kernel's main IPv4 table when MPIB_SUP_RELAY=1 (only a relayed pair
// consults routes), else nil. A table that cannot be read counts as empty: no routed pair.
func supRoutes() []topo.Route {
	if !plugin.cfg.SupRelay {
		return nil
	}
	f, err := os.Open("/proc/net/route")
	if err != nil {
		warnf("MPIB_SUP_RELAY=1: reading the routes: %v (no SUP pair through a relay)", err)
		return nil
	}
	defer f.Close()
	routes, err := topo.ParseProcRoute(f, binary.NativeEndian)
	if err != nil {
		warnf("MPIB_SUP_RELAY=1: %v (no SUP pair through a relay)", err)
		return nil
	}
	return routes
}

// listenerHandle is the handle listen() publishes: the control address and nonce, the
// device's SUP port addresses and MPIB_SUP_RELAY.
func listenerHandle(dev int, addr netip.AddrPort, nonce uint64) wire.Handle {
	h := wire.Handle{Addr: addr, Nonce: nonce}
	suppair.Advertise(&h, devSupPorts(dev).local, plugin.cfg.SupRelay)
	return h
}

// connectPlan is the connector's SUP verdict for a connection to the handle's listener, and
// the SUP GID to build with. A peer the path wants SUP for but no pair reaches gets one INFO
// line naming it and why.
func connectPlan(dev int, h wire.Handle, path topo.PathClass) (suppair.Plan, supPortUse, error) {
	ports := devSupPorts(dev)
	plan, err := suppair.Connect(h, ports.local, supRoutes(), plugin.cfg.SupRelay, supWanted(path))
	if err == nil && plan.Why != "" {
		infof("peer %v: no SUP pair: %s: this connection uses SOUT only", h.Addr.Addr(), plan.Why)
	}
	return plan, ports.use(plan), err
}

// acceptPlan is the acceptor's check of the connector's hello against the handle it
// advertised and its SUP ports now.
func acceptPlan(dev int, adv wire.Handle, hello wire.Hello, peer netip.Addr, path topo.PathClass) (suppair.Plan, supPortUse, error) {
	ports := devSupPorts(dev)
	plan, err := suppair.Accept(adv, hello, ports.local, supRoutes(), plugin.cfg.SupRelay, supWanted(path))
	if err != nil {
		return plan, supPortUse{gid: -1}, fmt.Errorf("peer %v: %w", peer, err)
	}
	if plan.Why != "" {
		infof("peer %v: no SUP pair: %s: this connection uses SOUT only", peer, plan.Why)
	}
	return plan, ports.use(plan), nil
}

// checkSupMetadata applies the plan to the exchanged metadata: an addressed pair's peer GID
// must be the address it names; an unaddressed pair keeps the subnet rule (both ends drop SUP
// when the two rails' addresses share no subnet, from the same two facts).
func checkSupMetadata(comm *C.struct_mpib_comm, plan suppair.Plan, mine, theirs *wire.Metadata, peer netip.Addr) error {
	if mine.NQPs[1] == 0 {
		return nil
	}
	if err := plan.CheckPeerGID(netip.AddrFrom16(theirs.Rail[1].GID)); err != nil {
		return fmt.Errorf("peer %v: %w", peer, err)
	}
	for i := range plan.Stripe {
		if err := plan.CheckPeerLaneGID(i, netip.AddrFrom16(theirs.Lane[i].GID)); err != nil {
			return fmt.Errorf("peer %v: %w", peer, err)
		}
	}
	if plan.Kind != wire.PairUnaddressed {
		return nil
	}
	if ok, why := suppair.UnaddressedReachable(mine.Rail[1], theirs.Rail[1]); !ok {
		infof("peer %v: %s: this connection uses SOUT only", peer, why)
		inVerbsSlot(func() { C.mpib_comm_drop_rail(comm, 1) })
		mine.NQPs[1], theirs.NQPs[1] = 0, 0
		mine.SupLanes, theirs.SupLanes = 0, 0 // no SUP QPs, no SUP lanes (mpib_comm_connect checks)
	}
	return nil
}
