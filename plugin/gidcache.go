// gidcache.go: the caches of each NIC's GID table and of the host's interface addresses, and
// chooseGID, net_ib's rule over the current table. Readers: params.go (each new comm's GIDs),
// sup.go (describing SUP ports), prepare.go (gidGens: whether a listener's spare is still
// current). init.go fills them right after init (warmGIDTables); lifecycle.go drops them when
// the devices close (forgetGIDTables).

package main

/*
#include "mpib.h"
#include "mpib_device.h"
*/
import "C"

import (
	"net"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/gid"
)

// gidTables caches each rail's GID table until its device reports a change
// (IBV_EVENT_GID_CHANGE: an address added or removed) or gidTableMaxAge passes, whichever comes
// first. Reading a table is a kernel walk of every entry (1024 per port on soft-RoCE, 10-100 ms
// under emulated RoCE), so a burst of connects reads it once, and init reads it before
// the first connect (warmGIDTables). The age bound covers a provider that reports no events.
// Each NIC has its own lock: a connection waits only for a read of a table it uses (a SOUT-only
// connection never for a SUP port's).
var gidTables struct {
	mu    [C.MPIB_MAX_NICS]sync.Mutex // mu[nic] guards at, gen, table and chosen of that NIC
	at    [C.MPIB_MAX_NICS]time.Time
	gen   [C.MPIB_MAX_NICS]uint32
	table [C.MPIB_MAX_NICS][]gid.Entry
	// chosen is chooseGID's answer per configured index for the table cached beside it (dropped
	// with it): net_ib's rule walks every entry (1,024 on soft-RoCE, about 40,000 instructions),
	// and every connection asks it for each of its NICs.
	chosen [C.MPIB_MAX_NICS]map[int]gidChoice
}

// gidChoice is one answer of chooseGID.
type gidChoice struct {
	idx  int
	addr netip.Addr
	err  error
}

const gidTableMaxAge = 30 * time.Second

// readGIDTable is a NIC's GID table, cached (gidTables); connParams, stripeParams (through
// chooseGID), sup.go's SUP port descriptions and warmGIDTables read it.
func readGIDTable(nic int) []gid.Entry {
	gidTables.mu[nic].Lock()
	defer gidTables.mu[nic].Unlock()
	return currentGIDTable(nic)
}

// currentGIDTable is readGIDTable with gidTables.mu[nic] held.
func currentGIDTable(nic int) []gid.Entry {
	gen := uint32(C.mpib_gid_gen(C.int(nic))) // before the read: a change during it forces another
	if t := gidTables.table[nic]; t != nil && gen == gidTables.gen[nic] && time.Since(gidTables.at[nic]) < gidTableMaxAge {
		return t
	}
	n := int(C.mpib_gid_table_len(C.int(nic)))
	table := make([]gid.Entry, n)
	if n > 0 {
		raw := make([]byte, 16*n)
		types := make([]C.int, n)
		// A kernel walk of every entry, milliseconds: a slow call (threads.go), one at a
		// time per NIC (gidTables.mu[nic]).
		slowCall(func() struct{} {
			C.mpib_gid_table_read(C.int(nic), (*C.uint8_t)(unsafe.Pointer(&raw[0])), &types[0], C.int(n))
			return struct{}{}
		})
		for i := range table {
			if types[i] >= 0 {
				table[i] = gid.Entry{Present: true, GID: [16]byte(raw[16*i : 16*i+16]), Type: int(types[i])}
			}
		}
	}
	gidTables.table[nic], gidTables.at[nic], gidTables.gen[nic] = table, time.Now(), gen
	gidTables.chosen[nic] = nil
	return table
}

// warmGIDTables reads both rails' tables and the interface addresses in the background right
// after init, so that the first connect finds them cached (a connect that comes sooner waits
// for the read under the same locks). plugin.mu is held; the devices close only after it.
func warmGIDTables() {
	plugin.warming.Add(1)
	go func() {
		defer plugin.warming.Done()
		for nic := range int(C.mpib_g.nnics) {
			readGIDTable(nic)
		}
		localAddrs()
	}()
}

// chooseGID picks a NIC's GID for a new connection (net_ib's rule) from its current table.
// The answer is kept with the table (gidTables.chosen) until the table is read again.
func chooseGID(nic, configured int) (int, netip.Addr, error) {
	gidTables.mu[nic].Lock()
	defer gidTables.mu[nic].Unlock()
	table := currentGIDTable(nic)
	if c, ok := gidTables.chosen[nic][configured]; ok {
		return c.idx, c.addr, c.err
	}
	var c gidChoice
	if C.mpib_g.nic[nic].link_layer == C.IBV_LINK_LAYER_INFINIBAND {
		c.idx, c.err = gid.ChooseIB(table)
	} else {
		c.idx, c.err = gid.ChooseRoCE(table, configured, plugin.cfg.GID)
	}
	if c.err == nil {
		c.addr = table[c.idx].Addr()
	}
	if gidTables.chosen[nic] == nil {
		gidTables.chosen[nic] = map[int]gidChoice{}
	}
	gidTables.chosen[nic][configured] = c
	return c.idx, c.addr, c.err
}

// forgetGIDTables drops the cached tables and addresses (the devices closed; a reopen reads
// afresh, and its event counts start again).
func forgetGIDTables() {
	for nic := range gidTables.mu {
		gidTables.mu[nic].Lock()
		gidTables.table[nic] = nil
		gidTables.chosen[nic] = nil
		gidTables.mu[nic].Unlock()
	}
	ifAddrs.mu.Lock()
	ifAddrs.all = nil
	ifAddrs.mu.Unlock()
}

// gidGens is a device's GID change counts: SOUT's, and the sum of its SUP ports'.
func gidGens(dev int) [2]uint32 {
	f := &C.mpib_g.fdev[dev]
	gens := [2]uint32{uint32(C.mpib_gid_gen(f.sout_nic)), 0}
	for i := range int(f.nsup) {
		gens[1] += uint32(C.mpib_gid_gen(f.sup_nic[i]))
	}
	return gens
}

// allGIDGens sums every open NIC's GID change count: it moves when any address came or went.
func allGIDGens() uint32 {
	var sum uint32
	for n := range int(C.mpib_g.nnics) {
		sum += uint32(C.mpib_gid_gen(C.int(n)))
	}
	return sum
}

// ifAddr is one interface address: its prefix on the netdev that holds it.
type ifAddr struct {
	prefix netip.Prefix
	dev    string
}

// interfaceAddr is the local interface address equal to addr with its netdev, or the zero
// ifAddr when no interface holds it (InfiniBand GIDs, or an address outside this network
// namespace). The list is cached like the GID tables, and read again when either table
// changed (on RoCE every address added or removed is a GID change). A new prefix length on an
// address that stays changes no GID: it is seen when the cache ages out (30 s).
func interfaceAddr(addr netip.Addr) ifAddr {
	for _, a := range localAddrs() {
		if a.prefix.Addr().Unmap() == addr {
			return a
		}
	}
	return ifAddr{}
}

// bits is the address's prefix length on its netdev (0: no netdev holds it).
func (a ifAddr) bits() int {
	if a.prefix.IsValid() {
		return a.prefix.Bits()
	}
	return 0
}

// interfacePrefixLen is the prefix length of interfaceAddr (0: none holds addr).
func interfacePrefixLen(addr netip.Addr) uint8 { return uint8(interfaceAddr(addr).bits()) }

var ifAddrs struct {
	mu  sync.Mutex
	at  time.Time
	gen uint32
	all []ifAddr
}

func localAddrs() []ifAddr {
	ifAddrs.mu.Lock()
	defer ifAddrs.mu.Unlock()
	gen := allGIDGens()
	if ifAddrs.all != nil && gen == ifAddrs.gen && time.Since(ifAddrs.at) < gidTableMaxAge {
		return ifAddrs.all
	}
	all := []ifAddr{}
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if pfx, err := netip.ParsePrefix(a.String()); err == nil {
				all = append(all, ifAddr{prefix: pfx, dev: ifc.Name})
			}
		}
	}
	ifAddrs.all, ifAddrs.at, ifAddrs.gen = all, time.Now(), gen
	return all
}
