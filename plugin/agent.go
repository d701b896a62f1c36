// agent.go: advanced mode's agent segment (docs/shm-format.md): the process's one handle and
// its watcher goroutine, and each connection's registration in it (registerWithAgent, called
// by handshake.go's steps); lifecycle.go closes it with the devices (closeAgentSegment).

package main

/*
#include <stdlib.h>
#include "mpib.h"
#include "mpib_device.h"
#include "mpib_shm.h"
#include "mpib_slots.h"
*/
import "C"

import (
	"net/netip"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/suppair"
	"github.com/mpib/mpib/plugin/internal/topo"
)

// Agent segment (advanced mode, docs/shm-format.md). The process has one handle, made at the
// first advanced-mode connection and published to the data path at once: every connection
// gets an id in it, bound to a slot whenever a segment is attached. A watcher goroutine polls
// the path every MPIB_SHM_POLL_MS (never the data path): it attaches the segment when it
// appears (so an agent started after NCCL's init takes effect for every connection), moves
// every connection to a new segment when the file is replaced, and detaches when the segment
// is truncated. Slots are leased with OFD locks on the open segment file: the kernel drops
// them when this process dies, so agents in any PID namespace see the slots go free.
var agent struct {
	mu         sync.Mutex
	shm        *C.mpib_shm
	nextConnID uint64
	stop, done chan struct{}
}

// agentHandle returns the process's handle, creating it (and its watcher) on first use.
func agentHandle() *C.mpib_shm {
	agent.mu.Lock()
	defer agent.mu.Unlock()
	if agent.shm != nil {
		return agent.shm
	}
	path := C.CString(plugin.cfg.ShmPath)
	defer C.free(unsafe.Pointer(path))
	var h *C.mpib_shm
	if rc := C.mpib_shm_handle_new(path, &h); rc != 0 {
		warnf("advanced mode: agent segment %s: cannot allocate a handle (%d): vanilla policy", plugin.cfg.ShmPath, int(rc))
		return nil
	}
	pollAgent(h, true)
	agent.shm = h
	agent.stop, agent.done = make(chan struct{}), make(chan struct{})
	C.mpib_set_shm(unsafe.Pointer(h))
	go func() {
		defer recoverGoroutine("agent segment watcher")
		watchAgent(h, agent.stop, agent.done)
	}()
	return h
}

// pollAgent runs one watcher step and logs what changed (each distinct failure once).
func pollAgent(h *C.mpib_shm, first bool) {
	var msg [512]C.char
	switch C.mpib_shm_poll(h, &msg[0], C.size_t(len(msg))) {
	case C.MPIB_SHM_POLL_ATTACHED:
		infof("advanced mode: %s", C.GoString(&msg[0]))
	case C.MPIB_SHM_POLL_DETACHED:
		warnf("advanced mode: %s", C.GoString(&msg[0]))
	case C.MPIB_SHM_POLL_FAILED:
		s := C.GoString(&msg[0])
		if first {
			infof("advanced mode: agent segment %s unusable (%s): vanilla policy until a valid segment appears", plugin.cfg.ShmPath, s)
		} else {
			infof("advanced mode: agent segment %s unusable (%s)", plugin.cfg.ShmPath, s)
		}
	}
}

func watchAgent(h *C.mpib_shm, stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(C.MPIB_SHM_POLL_MS * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			pollAgent(h, false)
		}
	}
}

func registerWithAgent(comm *C.struct_mpib_comm, local, peer netip.Addr, path topo.PathClass, sup suppair.Plan, isSend bool) {
	if plugin.cfg.Mode != 1 {
		return
	}
	h := agentHandle()
	if h == nil {
		return
	}
	agent.mu.Lock()
	agent.nextConnID++
	connID := uint64(os.Getpid())<<32 | agent.nextConnID
	agent.mu.Unlock()
	d := C.mpib_conn_desc{
		local_sout_ip: C.uint32_t(topo.IPv4ToUint32(local)),
		peer_sout_ip:  C.uint32_t(topo.IPv4ToUint32(peer)),
		peer_island:   C.uint32_t(topo.Island(peer, plugin.cfg.IslandPrefixLen)),
		path_class:    C.uint8_t(path),
		is_send:       C.uint8_t(boolInt(isSend)),
		nqps_sout:     C.uint16_t(comm.nqps[0]),
		nqps_sup:      C.uint16_t(comm.nqps[1]),
		pid:           C.uint32_t(os.Getpid()),
		conn_id:       C.uint64_t(connID),
		dev:           C.uint16_t(comm.fdev),
	}
	if comm.nqps[1] > 0 {
		d.sup_path = C.uint8_t(sup.RecordPath())
	}
	for r, nic := range comm.nic {
		if nic == nil {
			continue
		}
		d.port[r] = C.uint8_t(nic.port)
		for i := 0; i < C.MPIB_SHM_NIC_NAME-1 && nic.name[i] != 0; i++ { // cut to 23 bytes (spec 4.3)
			d.nic[r][i] = nic.name[i]
		}
	}
	var id C.uint32_t
	agent.mu.Lock() // one registration in C at a time (see Threads in threads.go)
	defer agent.mu.Unlock()
	if rc := C.mpib_shm_register(h, &d, &id); rc != 0 {
		warnf("advanced mode: %d connections in this process already (%d): connection %v -> %v stays on the vanilla policy", C.MPIB_SHM_MAX_CONNS, int(rc), local, peer)
		return
	}
	if C.mpib_shm_attached(h) != 0 {
		var slot, gen C.uint32_t
		if C.mpib_shm_conn_slot(h, id, &slot, &gen) != 0 {
			warnf("advanced mode: no free slot in the agent segment: connection %v -> %v stays on the vanilla policy until one frees", local, peer)
		}
	}
	comm.shm_slot = C.int(id)
	// Registration starts every rail up; a rail that did not come up at connect (a degraded
	// start, a standby rail not built yet) says so now, before NCCL has the comm.
	for r := range C.MPIB_NRAILS {
		if comm.nqps[r] > 0 && comm.rail[r].state != C.MPIB_RAIL_UP {
			C.mpib_publish_rail_state(comm, C.int(r))
		}
	}
}

// closeAgentSegment stops the watcher, withdraws the handle from the data path and releases
// every slot (called when no comm is left).
func closeAgentSegment() {
	agent.mu.Lock()
	defer agent.mu.Unlock()
	if agent.shm == nil {
		return
	}
	close(agent.stop)
	<-agent.done
	C.mpib_set_shm(nil)
	C.mpib_shm_close(agent.shm)
	agent.shm = nil
}
