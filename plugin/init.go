// init.go: NCCL's init and finalize (mpibGoInit, mpibGoFinalize, called by abi_common.c): the
// configuration (internal/config), opening every fused device's NICs, and the settings the C
// data path reads (applyConfig). Each init is a netCtx (lifecycle.go); the devices close when
// the last context and the last comm are gone (lifecycle.go's closeDevicesIfUnused).

package main

/*
#include <stdlib.h>
#include "mpib.h"
#include "mpib_device.h"
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
)

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
			stopGoTrace() // NCCL finalizes no plugin whose init failed
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
	for _, ignored := range config.Unknown(os.Environ()) {
		warnf("%s", ignored)
	}
	if path, err := startGoTrace(cfg.GoTrace, cfg.GoTraceS); err != nil {
		warnf("%v: no trace", err)
	} else if path != "" {
		infof("MPIB_GO_TRACE: tracing the control plane into %s for %d s", path, cfg.GoTraceS)
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
	// A port that does not open (a SOUT port down, a NIC absent) leaves out the devices that use
	// it, and only those: net_ib likewise leaves out the ports it cannot use.
	opened := make([]bool, len(nics))
	for i, n := range nics {
		name := C.CString(n.HCA)
		rc := C.mpib_nic_open(C.int(i), C.int(n.Role), name, C.int(n.Port), C.int(cfg.PKeyIndex), boolInt(n.Role == 1)) // 1: SUP (a NIC that is some device's SOUT is opened as SOUT)
		C.free(unsafe.Pointer(name))
		opened[i] = rc == 0
	}
	if !keepSurvivingDevices(&cfg, &index, opened) {
		// Like net_ib without devices: init succeeds, devices() reports 0 and NCCL moves on
		// to its next network. The warnings above name the NICs and the reasons.
		C.mpib_nic_close_all()
		return C.int(resSuccess)
	}
	plugin.cfg.Devices = cfg.Devices
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

// keepSurvivingDevices narrows cfg's devices and their NIC index to those whose every port
// opened (config.Surviving), warning for each one left out; false when none is left.
func keepSurvivingDevices(cfg *config.Config, index *[]config.DeviceNICs, opened []bool) bool {
	all := cfg.Devices
	kept, keptIndex, dropped := config.Surviving(all, *index, opened)
	for _, d := range dropped {
		warnf("device %d (%s) left out: one of its ports did not open (the warning above says why); NCCL gets %d of %d devices",
			d, deviceList(all[d:d+1]), len(kept), len(all))
	}
	cfg.Devices, *index = kept, keptIndex
	return len(kept) > 0
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
	finalizeCtx(uint64(ctxID))
	return C.int(resSuccess)
}

// finalizeCtx ends an init's context, and the devices when nothing needs them any more.
func finalizeCtx(id uint64) {
	// Cancel and wait outside plugin.mu: the context's goroutines may need it to finish.
	if !endNetCtx(id) {
		return // no init of ours counted it: the other contexts keep the devices
	}
	plugin.mu.Lock()
	if plugin.refs > 0 {
		plugin.refs--
	}
	last := plugin.refs == 0
	plugin.mu.Unlock()
	if last {
		stopGoTrace()
	}
	closeDevicesIfUnused()
}
