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
#include "mpib_verbs.h"
*/
import "C"

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/config"
	"github.com/mpib/mpib/plugin/internal/topo"
)

func main() {} // required by -buildmode=c-shared; never runs

// plugin is the process-wide control-plane state, guarded by mu.
var plugin struct {
	mu          sync.Mutex
	refs        int            // init calls not yet finalized (v11 inits once per communicator)
	devicesOpen bool           // both rails open; closed when refs and live comms reach 0
	warming     sync.WaitGroup // warmGIDTables reading the open devices: they close after it
	cfg         config.Config
	oobAddr     netip.Addr
	propName    *C.char
}

const (
	resSuccess         = C.ncclResult_t(C.ncclSuccess)
	resSystemError     = C.ncclResult_t(C.ncclSystemError)
	resInternalError   = C.ncclResult_t(C.ncclInternalError)
	resInvalidArgument = C.ncclResult_t(C.ncclInvalidArgument)
	resInvalidUsage    = C.ncclResult_t(C.ncclInvalidUsage)
	resRemoteError     = C.ncclResult_t(C.ncclRemoteError)
)

// logf writes through NCCL's logger, one goroutine at a time: the logger takes its own lock
// and writes to a file or pipe, and a goroutine waiting there would hold an OS thread, where
// one waiting on logMu holds none (see Threads in lifecycle.go).
func logf(level C.int, format string, args ...any) {
	msg := C.CString(fmt.Sprintf(format, args...))
	logMu.Lock()
	C.mpib_log_str(level, msg)
	logMu.Unlock()
	C.free(unsafe.Pointer(msg))
}

var logMu sync.Mutex

func warnf(format string, args ...any) { logf(C.NCCL_LOG_WARN, format, args...) }
func infof(format string, args ...any) { logf(C.NCCL_LOG_INFO, format, args...) }

//export mpibGoInit
func mpibGoInit(trafficClass C.int, ctxOut *C.uint64_t) C.int {
	plugin.mu.Lock()
	defer plugin.mu.Unlock()
	// The devices stay open while comms outlive the last finalize; a new init then uses them
	// (opening them again would wipe the open devices under those comms).
	if plugin.refs == 0 && !plugin.devicesOpen {
		startConnectDispatcher()
		if rc := initPlugin(); rc != C.int(resSuccess) {
			return rc
		}
	}
	plugin.refs++
	*ctxOut = C.uint64_t(newNetCtx(int(trafficClass)))
	return C.int(resSuccess)
}

// initPlugin reads the configuration and opens both rails (the first init of the process, or
// the first after the devices were closed). plugin.mu is held.
func initPlugin() C.int {
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
	forkInit.Do(func() {
		// Before any registration (as net_ib): with it, fork() children do not share the pages
		// the NIC uses, so a PyTorch DataLoader worker cannot break the parent's transfers.
		if rc := C.ibv_fork_init(); rc != 0 {
			warnf("ibv_fork_init failed (%d): fork() after connecting is unsafe on kernels before 5.13", int(rc))
		}
	})
	C.mpib_verbs_load()
	if missing := C.GoString(C.mpib_verbs_missing()); missing != "" {
		infof("libibverbs lacks %s: those features stay off", missing)
	}
	plugin.cfg, plugin.oobAddr = cfg, oob
	applyConfig(cfg)
	for rail, r := range []config.Rail{cfg.Sout, cfg.Sup} {
		name := C.CString(r.HCA)
		rc := C.mpib_dev_open(C.int(rail), name, C.int(r.Port), C.int(cfg.PKeyIndex))
		C.free(unsafe.Pointer(name))
		if rc != 0 {
			// Like net_ib without devices: init succeeds, devices() reports 0 and NCCL moves on
			// to its next network. The warning above names the rail and the reason.
			C.mpib_dev_close_all()
			return C.int(resSuccess)
		}
	}
	plugin.devicesOpen = true
	warmGIDTables()
	fillProperties(cfg)
	infof("ready: SOUT %s:%d + SUP %s:%d fused as one device, mode %d, OOB %s (%v), island /%d, flush %v",
		cfg.Sout.HCA, cfg.Sout.Port, cfg.Sup.HCA, cfg.Sup.Port, cfg.Mode, cfg.OOBInterface, oob, cfg.IslandPrefixLen,
		C.mpib_g.flush_enabled != 0)
	return C.int(resSuccess)
}

var forkInit sync.Once

// applyConfig copies what the C data path reads into the C global.
func applyConfig(cfg config.Config) {
	g := &C.mpib_g
	g.mode = C.int(cfg.Mode)
	g.sup_relay = boolInt(cfg.SupRelay)
	g.force_sup_bw = C.MPIB_NO_OVERRIDE
	if cfg.ForceSupBW >= 0 {
		g.force_sup_bw = C.uint32_t(cfg.ForceSupBW)
	}
	g.relaxed_ordering = boolInt(cfg.RelaxedOrdering)
	g.ib_timeout = C.uint8_t(cfg.IBTimeout)
	g.ib_retry_cnt = C.uint8_t(cfg.IBRetryCnt)
	g.ib_tc = C.int(cfg.IBTC)
	g.ib_sl = C.uint8_t(max(cfg.IBSL, 0))
	g.fifo_tc = C.int(cfg.FifoTC)
	g.use_inline = boolInt(cfg.UseInline)
	g.ece_enable = boolInt(cfg.ECE)
	g.whole_msg_max = C.uint64_t(cfg.WholeMsgMax)
	g.failover = boolInt(cfg.Failover)
	g.recovery_backoff_ms = C.uint64_t(cfg.RecoveryBackoffMS)
	g.recovery_backoff_max_ms = C.uint64_t(max(cfg.RecoveryBackoffMax, cfg.RecoveryBackoffMS))
	g.failover_timeout_ms = C.uint64_t(cfg.FailoverTimeoutMS)
	g.stall_timeout_ms = C.uint64_t(cfg.StallTimeoutMS)
	g.agent_stale_ns = C.uint64_t(cfg.AgentStaleMS) * 1000000
}

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

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// gpuDirectLoaded reports whether a peer-memory module lets the NIC reach CUDA memory (the
// files net_ib's ncclIbGdrSupport checks).
func gpuDirectLoaded() bool {
	for _, p := range []string{"/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
		"/sys/module/nvidia_peermem/version", "/sys/module/nv_peer_mem/version"} {
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
	g.prop_guid = C.uint64_t(C.ibv_get_device_guid(g.dev[0].ctx.device))
	peermem, dmabuf := gpuDirectLoaded(), C.mpib_dmabuf_supported() != 0
	support := C.NCCL_PTR_HOST
	if peermem {
		support |= C.NCCL_PTR_CUDA
	}
	if dmabuf {
		support |= C.NCCL_PTR_DMABUF
	}
	dataDirect := C.mpib_data_direct(0) != 0 || C.mpib_data_direct(1) != 0
	g.prop_force_flush = boolInt(dataDirect)
	g.flush_enabled = C.mpib_flush_needed(boolInt(peermem), boolInt(dmabuf), boolInt(cfg.GDRFlushDisable),
		boolInt(cfg.ForceFlush || dataDirect))
	g.prop_ptr_support = C.int(support &^ placeOnPCI(cfg))
	nqps := [2]C.uint32_t{C.uint32_t(cfg.SoutQPs), C.uint32_t(cfg.SupQPs)}
	g.prop_max_comms = C.mpib_max_comms(&nqps[0])
	infof("per connection: SOUT QPs %d, SUP QPs %d, CQ %d/%d, SRQ %d, send queue %d/%d entries (send/recv), host memory %d/%d KiB; up to %d connections (device limits)",
		cfg.SoutQPs, cfg.SupQPs, C.MPIB_CQ_DEPTH_SENDER, C.MPIB_CQ_DEPTH, C.MPIB_SRQ_DEPTH, C.MPIB_SEND_WR_SENDER, C.MPIB_SEND_WR_RECEIVER,
		C.mpib_comm_host_bytes(1)/1024, C.mpib_comm_host_bytes(0)/1024, int(g.prop_max_comms))
}

// placeOnPCI reads both rails' PCI positions, chooses the path NCCL's topology sees for the
// fused device (docs/topology.md) and returns the pointer kinds to withhold: GPUDirect when no
// single position is right for both rails and the user did not set NCCL_NET_GDR_LEVEL.
func placeOnPCI(cfg config.Config) int {
	g := &C.mpib_g
	sout, _ := topo.ReadPCI(cfg.Sout.HCA)
	sup, _ := topo.ReadPCI(cfg.Sup.HCA)
	pl := topo.Place(sout, sup)
	g.prop_has_pci_path = 0
	if pl.AdvertisePath != "" {
		setCString(unsafe.Pointer(&g.prop_pci_path[0]), len(g.prop_pci_path), pl.AdvertisePath)
		g.prop_has_pci_path = 1
	}
	if pl.SupFarther || !pl.GPUDirectSafe {
		infof("topology: %s (SOUT NUMA %d, SUP NUMA %d)", pl.Reason, sout.NUMA, sup.NUMA)
	}
	if !pl.GPUDirectSafe && pl.Relation != topo.RelationUnknown && os.Getenv("NCCL_NET_GDR_LEVEL") == "" {
		infof("topology: GPUDirect RDMA not advertised: no GPU can be close to both rails (set NCCL_NET_GDR_LEVEL to decide yourself)")
		return C.NCCL_PTR_CUDA | C.NCCL_PTR_DMABUF
	}
	return 0
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
func mpibGoFinalize(ctxID C.uint64_t) C.int {
	// Cancel and wait outside plugin.mu: the context's goroutines may need it to finish.
	endNetCtx(uint64(ctxID))
	plugin.mu.Lock()
	if plugin.refs > 0 {
		plugin.refs--
	}
	plugin.mu.Unlock()
	closeDevicesIfUnused()
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
