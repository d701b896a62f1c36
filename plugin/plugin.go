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
#include "mpib_comm.h"
#include "mpib_device.h"
#include "mpib_shm.h"
#include "mpib_verbs.h"
*/
import "C"

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
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
func mpibGoInit(trafficClass C.int, ctxOut *C.uint64_t) (rc C.int) {
	defer recoverEntry("init", &rc)
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

// initPlugin reads the configuration and opens every fused device's NICs (the first init of the
// process, or the first after the devices were closed). plugin.mu is held.
func initPlugin() C.int {
	infof("%s", versionLine())
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
	nics, index := cfg.NICs()
	// A SUP port may be down at init (a cable unplugged, a switch port not up yet): it is
	// opened, and the device runs on SOUT until the port comes up, as after a port that goes
	// down later (a mesh device leaves it out of SUP pairs; a device's only SUP port gets its
	// connections' SUP QPs, which fail over to SOUT and come back by themselves). net_ib skips
	// a port that is not active; one unplugged cable must not take a fused device, or with it
	// every device of the node, away from NCCL. SOUT must be up: no device works without it.
	for i, n := range nics {
		name := C.CString(n.HCA)
		rc := C.mpib_nic_open(C.int(i), C.int(n.Role), name, C.int(n.Port), C.int(cfg.PKeyIndex), boolInt(n.Role == 1)) // 1: SUP (a NIC that is some device's SOUT is opened as SOUT)
		C.free(unsafe.Pointer(name))
		if rc != 0 {
			// Like net_ib without devices: init succeeds, devices() reports 0 and NCCL moves on
			// to its next network. The warning above names the NIC and the reason.
			C.mpib_nic_close_all()
			return C.int(resSuccess)
		}
	}
	for d, dev := range cfg.Devices {
		f := &C.mpib_g.fdev[d]
		f.sout_nic = C.int(index[d].Sout)
		for i, n := range index[d].Sup {
			f.sup_nic[i] = C.int(n)
		}
		f.nsup = C.int(len(index[d].Sup))
		f.rail_id, f.plane_id = C.int(dev.RailID), C.int(dev.PlaneID)
	}
	plugin.devicesOpen = true
	warmGIDTables()
	fillProperties(cfg)
	C.mpib_g.nfdevs = C.int(len(cfg.Devices)) // last: the data path and NCCL see complete devices
	infof("ready: %d fused device%s (%s), mode %d, OOB %s (%v), island /%d, flush %v",
		len(cfg.Devices), map[bool]string{true: "", false: "s"}[len(cfg.Devices) == 1], deviceList(cfg.Devices),
		cfg.Mode, cfg.OOBInterface, oob, cfg.IslandPrefixLen, C.mpib_g.flush_enabled != 0)
	return C.int(resSuccess)
}

// deviceList names each fused device's two ports: "SOUT s:1 + SUP p:1, ...".
func deviceList(devs []config.Device) string {
	var b strings.Builder
	for d, dev := range devs {
		if d > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "SOUT %s:%d + SUP ", dev.Sout.HCA, dev.Sout.Port)
		for i, r := range dev.SupPorts {
			if i > 0 {
				b.WriteString("+")
			}
			fmt.Fprintf(&b, "%s:%d", r.HCA, r.Port)
		}
	}
	return b.String()
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
	g.detect_ms = C.uint64_t(cfg.DetectMS)
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

// fillProperties computes what getProperties reports for every fused device, and the flush
// setting (one for the process: any device that needs flushes turns them on).
// propName is the device's name for NCCL: mpib[SOUT+SUP], every SUP port listed.
func propName(dev config.Device) string {
	names := []string{dev.Sout.HCA}
	for _, r := range dev.SupPorts {
		names = append(names, r.HCA)
	}
	return "mpib[" + strings.Join(names, "+") + "]"
}

func fillProperties(cfg config.Config) {
	g := &C.mpib_g
	peermem, dmabuf := gpuDirectLoaded(), C.mpib_dmabuf_supported() != 0
	support := C.NCCL_PTR_HOST
	if peermem {
		support |= C.NCCL_PTR_CUDA
	}
	if dmabuf {
		support |= C.NCCL_PTR_DMABUF
	}
	dataDirect := false
	nqps := [2]C.uint32_t{C.uint32_t(cfg.SoutQPs), C.uint32_t(cfg.SupQPs)}
	for d, dev := range cfg.Devices {
		f := &g.fdev[d]
		setCString(unsafe.Pointer(&f.prop_name[0]), len(f.prop_name), propName(dev))
		f.prop_guid = C.uint64_t(C.ibv_get_device_guid(g.nic[f.sout_nic].ctx.device))
		dd := C.mpib_data_direct(f.sout_nic) != 0
		for i := range int(f.nsup) {
			dd = dd || C.mpib_data_direct(f.sup_nic[i]) != 0
		}
		dataDirect = dataDirect || dd
		f.prop_force_flush = boolInt(dd)
		f.prop_ptr_support = C.int(support &^ placeOnPCI(d, dev))
		f.prop_max_comms = C.mpib_max_comms(C.int(d), &nqps[0])
	}
	g.flush_enabled = C.mpib_flush_needed(boolInt(peermem), boolInt(dmabuf), boolInt(cfg.GDRFlushDisable),
		boolInt(cfg.ForceFlush || dataDirect))
	infof("per connection: SOUT QPs %d, SUP QPs %d, CQ %d/%d, SRQ %d, send queue %d/%d entries (send/recv), host memory %d/%d KiB; up to %d connections per device (device limits)",
		cfg.SoutQPs, cfg.SupQPs, C.MPIB_CQ_DEPTH_SENDER, C.MPIB_CQ_DEPTH, C.MPIB_SRQ_DEPTH, C.MPIB_SEND_WR_SENDER, C.MPIB_SEND_WR_RECEIVER,
		C.mpib_comm_host_bytes(1)/1024, C.mpib_comm_host_bytes(0)/1024, int(g.fdev[0].prop_max_comms))
}

// placeOnPCI reads a device's two NICs' PCI positions, chooses the path NCCL's topology sees
// for the fused device (docs/topology.md) and returns the pointer kinds to withhold:
// GPUDirect when no single position is right for both rails and the user did not set
// NCCL_NET_GDR_LEVEL.
func placeOnPCI(d int, dev config.Device) int {
	f := &C.mpib_g.fdev[d]
	sout, _ := topo.ReadPCI(dev.Sout.HCA)
	sup, _ := topo.ReadPCI(dev.Sup.HCA)
	pl := topo.Place(sout, sup)
	f.prop_has_pci_path = 0
	if pl.AdvertisePath != "" {
		setCString(unsafe.Pointer(&f.prop_pci_path[0]), len(f.prop_pci_path), pl.AdvertisePath)
		f.prop_has_pci_path = 1
	}
	switch {
	case pl.Relation >= topo.RelationSameHostBridge: // no PCIe switch in common, or not one NUMA node
		warnf("topology: device %d pairs SOUT %s and SUP %s, which share no PCIe switch (%v): %s (SOUT NUMA %d, SUP NUMA %d)",
			d, dev.Sout.HCA, dev.Sup.HCA, pl.Relation, pl.Reason, sout.NUMA, sup.NUMA)
	case pl.SupFarther || !pl.GPUDirectSafe:
		infof("topology: device %d: %s (SOUT %s NUMA %d, SUP %s NUMA %d)", d, pl.Reason, dev.Sout.HCA, sout.NUMA, dev.Sup.HCA, sup.NUMA)
	}
	if !pl.GPUDirectSafe && pl.Relation != topo.RelationUnknown && os.Getenv("NCCL_NET_GDR_LEVEL") == "" {
		infof("topology: device %d: GPUDirect RDMA not advertised: no GPU can be close to both rails (set NCCL_NET_GDR_LEVEL to decide yourself)", d)
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
func mpibGoFinalize(ctxID C.uint64_t) (rc C.int) {
	defer recoverEntry("finalize", &rc)
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
func mpibGoRegMr(comm unsafe.Pointer, data unsafe.Pointer, size C.size_t, typ C.int, fd C.int, offset C.uint64_t, mhandle *unsafe.Pointer) (rc C.int) {
	defer recoverEntry("regMr", &rc)
	*mhandle = nil
	if typ != C.NCCL_PTR_HOST && typ != C.NCCL_PTR_CUDA {
		warnf("regMr: unsupported memory type %d", int(typ))
		return C.int(resInvalidArgument)
	}
	dev := 0 // NCCL registers with a comm of the device; a NULL comm gets device 0
	if comm != nil {
		dev = int((*C.struct_mpib_comm)(comm).fdev)
	}
	if dev < 0 || dev >= int(C.mpib_g.nfdevs) {
		warnf("regMr: the comm names device %d: %d exist (a closed or foreign comm?)", dev, int(C.mpib_g.nfdevs))
		return C.int(resInvalidArgument)
	}
	if typ == C.NCCL_PTR_CUDA && fd < 0 && C.mpib_g.fdev[dev].prop_ptr_support&C.NCCL_PTR_CUDA == 0 {
		warnf("regMr: CUDA memory without GPUDirect RDMA on device %d (load nvidia_peermem or use DMA-BUF)", dev)
		return C.int(resInvalidUsage)
	}
	var mh *C.struct_mpib_mr
	if rc := C.mpib_reg_mr(C.int(dev), data, size, fd, offset, &mh); rc != 0 {
		return C.int(resSystemError)
	}
	*mhandle = unsafe.Pointer(mh)
	return C.int(resSuccess)
}

//export mpibGoDeregMr
func mpibGoDeregMr(comm unsafe.Pointer, mhandle unsafe.Pointer) (rc C.int) {
	defer recoverEntry("deregMr", &rc)
	if C.mpib_dereg_mr((*C.struct_mpib_mr)(mhandle)) != 0 {
		warnf("deregMr failed")
		return C.int(resSystemError)
	}
	return C.int(resSuccess)
}
