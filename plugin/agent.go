package main

/*
#include <stdlib.h>
#include "mpib.h"
#include "mpib_shm.h"
*/
import "C"

import (
	"net/netip"
	"os"
	"sync"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/topo"
)

// Agent segment (advanced mode). The segment is opened lazily at connect time, so an agent
// started after NCCL's init still takes effect for connections made after it.
var agent struct {
	mu          sync.Mutex
	shm         *C.mpib_shm
	lastFailure string
	nextConnID  uint64
}

func openAgentSegment() *C.mpib_shm {
	agent.mu.Lock()
	defer agent.mu.Unlock()
	if agent.shm != nil {
		return agent.shm
	}
	path := C.CString(plugin.cfg.ShmPath)
	defer C.free(unsafe.Pointer(path))
	var errbuf [256]C.char
	var shm *C.mpib_shm
	if rc := C.mpib_shm_open(path, &shm, &errbuf[0], C.size_t(len(errbuf))); rc != 0 {
		msg := C.GoString(&errbuf[0])
		if msg != agent.lastFailure { // say it once, not per connection
			infof("advanced mode: agent segment %s unusable (%s): vanilla policy for new connections", plugin.cfg.ShmPath, msg)
			agent.lastFailure = msg
		}
		return nil
	}
	agent.shm = shm
	C.mpib_set_shm(unsafe.Pointer(shm))
	infof("advanced mode: agent segment %s opened", plugin.cfg.ShmPath)
	return shm
}

func registerWithAgent(comm *C.struct_mpib_comm, local, peer netip.Addr, path topo.PathClass, isSend bool) {
	if plugin.cfg.Mode != 1 {
		return
	}
	shm := openAgentSegment()
	if shm == nil {
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
	}
	var slot C.uint32_t
	if rc := C.mpib_shm_register(shm, &d, &slot); rc != 0 {
		warnf("advanced mode: no free slot in the agent segment (%d): connection %v -> %v stays on the vanilla policy", int(rc), local, peer)
		return
	}
	comm.shm_slot = C.int(slot)
}

func closeAgentSegment() {
	agent.mu.Lock()
	defer agent.mu.Unlock()
	if agent.shm != nil {
		C.mpib_set_shm(nil)
		C.mpib_shm_close(agent.shm)
		agent.shm = nil
	}
}
