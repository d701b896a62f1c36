// Command plugin is libnccl-net-mpib.so, built with -buildmode=c-shared. Go owns the control
// plane (configuration, devices, connection setup, memory registration, teardown); the data
// path (isend/irecv/test/iflush) is C in this package and never calls Go.
//
// Never call signal.Notify here: the host process (NCCL) owns signals.
package main

/*
#cgo CFLAGS: -std=gnu11 -O2 -Wall -fvisibility=hidden
#cgo LDFLAGS: -libverbs
#include <stdlib.h>
#include "mpib.h"
#include "mpib_shm.h"
*/
import "C"

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/config"
)

func main() {} // required by -buildmode=c-shared; never runs

// plugin is the process-wide control-plane state, guarded by mu.
var plugin struct {
	mu       sync.Mutex
	refs     int // init calls not yet finalized (v11 inits once per communicator)
	cfg      config.Config
	oobAddr  netip.Addr
	propName *C.char
}

const (
	resSuccess         = C.ncclResult_t(C.ncclSuccess)
	resSystemError     = C.ncclResult_t(C.ncclSystemError)
	resInternalError   = C.ncclResult_t(C.ncclInternalError)
	resInvalidArgument = C.ncclResult_t(C.ncclInvalidArgument)
	resInvalidUsage    = C.ncclResult_t(C.ncclInvalidUsage)
	resRemoteError     = C.ncclResult_t(C.ncclRemoteError)
)

func logf(level C.int, format string, args ...any) {
	msg := C.CString(fmt.Sprintf(format, args...))
	C.mpib_log_str(level, msg)
	C.free(unsafe.Pointer(msg))
}

func warnf(format string, args ...any) { logf(C.NCCL_LOG_WARN, format, args...) }
func infof(format string, args ...any) { logf(C.NCCL_LOG_INFO, format, args...) }

//export mpibGoInit
func mpibGoInit() C.int {
	plugin.mu.Lock()
	defer plugin.mu.Unlock()
	if plugin.refs > 0 {
		plugin.refs++
		return C.int(resSuccess)
	}
	cfg, err := config.Parse(os.Getenv)
	if err != nil {
		warnf("%v", err)
		return C.int(resInvalidUsage)
	}
	oob, err := interfaceIPv4(cfg.OOBInterface)
	if err != nil {
		warnf("MPIB_OOB_IF=%s: %v", cfg.OOBInterface, err)
		return C.int(resInvalidUsage)
	}
	applyConfig(cfg)
	plugin.cfg, plugin.oobAddr = cfg, oob
	plugin.refs = 1
	for rail, r := range []config.Rail{cfg.Sout, cfg.Sup} {
		name := C.CString(r.HCA)
		rc := C.mpib_dev_open(C.int(rail), name, C.int(r.Port), C.int(r.GIDIndex))
		C.free(unsafe.Pointer(name))
		if rc != 0 {
			// Like net_ib without devices: init succeeds, devices() reports 0 and NCCL moves on
			// to its next network. The warning above names the rail and the reason.
			C.mpib_dev_close_all()
			return C.int(resSuccess)
		}
	}
	fillProperties(cfg)
	infof("ready: SOUT %s:%d + SUP %s:%d fused as one device, mode %d, OOB %s (%v), island /%d",
		cfg.Sout.HCA, cfg.Sout.Port, cfg.Sup.HCA, cfg.Sup.Port, cfg.Mode, cfg.OOBInterface, oob, cfg.IslandPrefixLen)
	return C.int(resSuccess)
}

// applyConfig copies what the C data path reads into the C global.
func applyConfig(cfg config.Config) {
	g := &C.mpib_g
	g.mode = C.int(cfg.Mode)
	g.sup_relay = boolInt(cfg.SupRelay)
	g.force_sup_bw = C.MPIB_NO_OVERRIDE
	if cfg.ForceSupBW >= 0 {
		g.force_sup_bw = C.uint32_t(cfg.ForceSupBW)
	}
	g.flush_enabled = boolInt(cfg.ForceFlush || gpuDirectLoaded())
	g.relaxed_ordering = boolInt(cfg.RelaxedOrdering)
	g.ib_timeout = C.uint8_t(cfg.IBTimeout)
	g.ib_retry_cnt = C.uint8_t(cfg.IBRetryCnt)
	g.ib_tc = C.uint8_t(cfg.IBTC)
	g.ib_sl = C.uint8_t(cfg.IBSL)
	g.agent_stale_ns = C.uint64_t(cfg.AgentStaleMS) * 1000000
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// gpuDirectLoaded reports whether a peer-memory module lets the NIC reach CUDA memory.
func gpuDirectLoaded() bool {
	for _, p := range []string{"/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/module/nvidia_peermem/version",
		"/sys/module/nv_peer_mem/version"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

func fillProperties(cfg config.Config) {
	g := &C.mpib_g
	name := fmt.Sprintf("mpib[%s+%s]", cfg.Sout.HCA, cfg.Sup.HCA)
	setCString(unsafe.Pointer(&g.prop_name[0]), len(g.prop_name), name)
	g.prop_has_pci_path = 0
	if p, err := filepath.EvalSymlinks("/sys/class/infiniband/" + cfg.Sout.HCA + "/device"); err == nil {
		setCString(unsafe.Pointer(&g.prop_pci_path[0]), len(g.prop_pci_path), p)
		g.prop_has_pci_path = 1
	}
	g.prop_guid = C.uint64_t(C.ibv_get_device_guid(g.dev[0].ctx.device))
	support := C.NCCL_PTR_HOST
	if gpuDirectLoaded() {
		support |= C.NCCL_PTR_CUDA
	}
	if C.mpib_dmabuf_supported() != 0 {
		support |= C.NCCL_PTR_DMABUF
	}
	g.prop_ptr_support = C.int(support)
}

func setCString(dst unsafe.Pointer, size int, s string) {
	b := unsafe.Slice((*byte)(dst), size)
	n := copy(b[:size-1], s)
	b[n] = 0
}

// interfaceIPv4 returns the first IPv4 address of a network interface.
func interfaceIPv4(name string) (netip.Addr, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no such interface: %w", err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil && pfx.Addr().Is4() {
			return pfx.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("interface has no IPv4 address")
}

//export mpibGoFinalize
func mpibGoFinalize() C.int {
	plugin.mu.Lock()
	defer plugin.mu.Unlock()
	if plugin.refs == 0 {
		return C.int(resSuccess)
	}
	plugin.refs--
	if plugin.refs == 0 {
		closeAgentSegment()
		C.mpib_dev_close_all()
	}
	return C.int(resSuccess)
}

//export mpibGoRegMr
func mpibGoRegMr(comm unsafe.Pointer, data unsafe.Pointer, size C.size_t, typ C.int, fd C.int, offset C.uint64_t, mhandle *unsafe.Pointer) C.int {
	*mhandle = nil
	if typ != C.NCCL_PTR_HOST && typ != C.NCCL_PTR_CUDA {
		warnf("regMr: unsupported memory type %d", int(typ))
		return C.int(resInvalidArgument)
	}
	if typ == C.NCCL_PTR_CUDA && fd < 0 && C.mpib_g.prop_ptr_support&C.NCCL_PTR_CUDA == 0 {
		warnf("regMr: CUDA memory without GPUDirect RDMA (load nvidia_peermem or use DMA-BUF)")
		return C.int(resInvalidUsage)
	}
	var mh *C.struct_mpib_mr
	if rc := C.mpib_reg_mr(data, size, fd, offset, &mh); rc != 0 {
		return C.int(resSystemError)
	}
	*mhandle = unsafe.Pointer(mh)
	return C.int(resSuccess)
}

//export mpibGoDeregMr
func mpibGoDeregMr(comm unsafe.Pointer, mhandle unsafe.Pointer) C.int {
	if C.mpib_dereg_mr((*C.struct_mpib_mr)(mhandle)) != 0 {
		warnf("deregMr failed")
		return C.int(resSystemError)
	}
	return C.int(resSuccess)
}

//export mpibGoCloseComm
func mpibGoCloseComm(comm unsafe.Pointer) C.int {
	C.mpib_comm_destroy((*C.struct_mpib_comm)(comm))
	return C.int(resSuccess)
}
