// Command plugin is libnccl-net-mpib.so, built with -buildmode=c-shared. Go owns the control
// plane (configuration, devices, connection setup, memory registration, teardown); the data
// path (isend/irecv/test/iflush) is C in this package and never calls Go.
//
// Never call signal.Notify here: the host process (NCCL) owns signals.
//
// The C is built with -O3, as NCCL builds net_ib (makefiles/common.mk, DEBUG=0);
// plugin/ctest's hot-path count and failover model read their optimisation flag from the
// #cgo CFLAGS line below (pluginOptFlag), so they measure and check the code as it ships.
//
// This file holds main, the process-wide state (plugin), NCCL's result codes and the checks
// that the configuration's bounds match the C arrays; each other file opens with what it owns
// and who calls it.
package main

/*
#cgo CFLAGS: -std=gnu11 -O3 -Wall -fvisibility=hidden
#cgo LDFLAGS: -libverbs
#include <stdlib.h>
#include "mpib.h"
#include "mpib_shm.h"
#include "mpib_verbs.h"
*/
import "C"

import (
	"net/netip"
	"sync"

	"github.com/mpib/mpib/plugin/internal/config"
)

func main() {} // required by -buildmode=c-shared; never runs

// plugin is the process-wide control-plane state, guarded by mu.
var plugin struct {
	mu          sync.Mutex
	refs        int            // init calls not yet finalized (v11 inits once per communicator)
	devicesOpen bool           // every NIC open; closed when refs and live comms reach 0
	warming     sync.WaitGroup // warmGIDTables reading the open devices: they close after it
	cfg         config.Config
	oobAddr     netip.Addr
}

const (
	resSuccess         = C.ncclResult_t(C.ncclSuccess)
	resSystemError     = C.ncclResult_t(C.ncclSystemError)
	resInternalError   = C.ncclResult_t(C.ncclInternalError)
	resInvalidArgument = C.ncclResult_t(C.ncclInvalidArgument)
	resInvalidUsage    = C.ncclResult_t(C.ncclInvalidUsage)
	resRemoteError     = C.ncclResult_t(C.ncclRemoteError)
)

// The configuration's bounds are the C arrays' sizes: either differing fails the build (a
// negative array length).
var (
	_ [C.MPIB_MAX_DEVS - config.MaxDevices]struct{}
	_ [config.MaxDevices - C.MPIB_MAX_DEVS]struct{}
	_ [C.MPIB_MAX_SUP_PORTS - config.MaxSupPorts]struct{}
	_ [config.MaxSupPorts - C.MPIB_MAX_SUP_PORTS]struct{}
)

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
