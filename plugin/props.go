// props.go: what getProperties reports for each fused device (abi_common.c reads it from mpib_g:
// its name, GUID, pointer support, forced flush and connection limit), the process's flush
// setting, and the PCI path NCCL's topology sees for the device (placeOnPCI,
// docs/topology.md). init.go's initPlugin fills them each time the devices open.

package main

/*
#include "mpib.h"
#include "mpib_comm.h"
#include "mpib_device.h"
*/
import "C"

import (
	"os"
	"strconv"
	"strings"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/config"
	"github.com/mpib/mpib/plugin/internal/topo"
)

// fillProperties computes what getProperties reports for every fused device, and the flush
// setting (one for the process: any device that needs flushes turns them on).
func fillProperties(cfg config.Config) {
	g := &C.mpib_g
	peermem, nicDmabuf := gpuDirectLoaded(), nicsDmabuf()
	anyDmabuf, dataDirect := false, false
	nqps := [2]C.uint32_t{C.uint32_t(cfg.SoutQPs), C.uint32_t(cfg.SupQPs)}
	for d, dev := range cfg.Devices {
		f := &g.fdev[d]
		support := C.NCCL_PTR_HOST
		if peermem {
			support |= C.NCCL_PTR_CUDA
		}
		if deviceDmabuf(d, nicDmabuf) {
			support |= C.NCCL_PTR_DMABUF
			anyDmabuf = true
		}
		setCString(unsafe.Pointer(&f.prop_name[0]), len(f.prop_name), propName(dev, multiPortHCAs(cfg.Devices)))
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
	g.flush_enabled = C.mpib_flush_needed(boolInt(peermem), boolInt(anyDmabuf), boolInt(cfg.GDRFlushDisable),
		boolInt(cfg.ForceFlush || dataDirect))
	infof("per connection: SOUT QPs %d, SUP QPs %d, CQ %d/%d, SRQ %d, send queue %d/%d entries (send/recv), host memory %d/%d KiB; up to %d connections per device (device limits)",
		cfg.SoutQPs, cfg.SupQPs, C.MPIB_CQ_DEPTH_SENDER, C.MPIB_CQ_DEPTH, C.MPIB_SRQ_DEPTH, C.MPIB_SEND_WR_SENDER, C.MPIB_SEND_WR_RECEIVER,
		C.mpib_comm_host_bytes(1)/1024, C.mpib_comm_host_bytes(0)/1024, int(g.fdev[0].prop_max_comms))
}

// nicsDmabuf is, per open NIC, whether its verbs provider takes DMA-BUF registrations (each
// NIC probed on its own: a fused device may pair providers that differ).
func nicsDmabuf() []bool {
	ok := make([]bool, int(C.mpib_g.nnics))
	for n := range ok {
		ok[n] = C.mpib_nic_dmabuf_supported(C.int(n)) != 0
	}
	return ok
}

// deviceDmabuf is whether fused device d advertises NCCL_PTR_DMABUF, given nicsDmabuf's
// answers; it says at INFO which of its NICs withhold it when others could take it.
func deviceDmabuf(d int, nicOK []bool) bool {
	f := &C.mpib_g.fdev[d]
	nics := []int{int(f.sout_nic)}
	for i := range int(f.nsup) {
		nics = append(nics, int(f.sup_nic[i]))
	}
	lacking := dmabufLacking(nicOK, nics)
	if len(lacking) > 0 && len(lacking) < len(nics) {
		var names []string
		for _, n := range lacking {
			names = append(names, C.GoString(&C.mpib_g.nic[n].name[0]))
		}
		infof("device %d: DMA-BUF not advertised: %s cannot register DMA-BUF memory (its verbs provider refuses ibv_reg_dmabuf_mr)",
			d, strings.Join(names, ", "))
	}
	return len(lacking) == 0
}

// dmabufLacking is the NICs of a fused device (nics: SOUT's, then each SUP port's) that cannot
// take a DMA-BUF registration, in order; the device advertises DMA-BUF only when there is
// none. regMrDmaBuf registers the buffer on every NIC of the device (mpib_reg_mr) and fails
// when one refuses, and NCCL does not fall back to another registration: it aborts. nicOK is
// nicsDmabuf's answer; a NIC beyond it is not open and cannot.
func dmabufLacking(nicOK []bool, nics []int) []int {
	var lacking []int
	for _, n := range nics {
		if n < 0 || n >= len(nicOK) || !nicOK[n] {
			lacking = append(lacking, n)
		}
	}
	return lacking
}

// propName is the device's name for NCCL: mpib[SOUT+SUP], every SUP port listed, an HCA the
// configuration names with more than one port (multiPort) as HCA:PORT. NCCL finds its
// topology's net nodes by name: two devices of one name would be one node, and one device
// would never be used.
func propName(dev config.Device, multiPort map[string]bool) string {
	name := func(r config.Rail) string {
		if multiPort[r.HCA] {
			return r.HCA + ":" + strconv.Itoa(r.Port)
		}
		return r.HCA
	}
	names := []string{name(dev.Sout)}
	for _, r := range dev.SupPorts {
		names = append(names, name(r))
	}
	return "mpib[" + strings.Join(names, "+") + "]"
}

// multiPortHCAs are the HCAs the devices name with more than one port.
func multiPortHCAs(devs []config.Device) map[string]bool {
	ports := map[string]map[int]bool{}
	add := func(r config.Rail) {
		if ports[r.HCA] == nil {
			ports[r.HCA] = map[int]bool{}
		}
		ports[r.HCA][r.Port] = true
	}
	for _, d := range devs {
		add(d.Sout)
		for _, r := range d.SupPorts {
			add(r)
		}
	}
	multi := map[string]bool{}
	for hca, p := range ports {
		multi[hca] = len(p) > 1
	}
	return multi
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

// placeOnPCI reads a device's two NICs' PCI positions, chooses the path NCCL's topology sees
// for the fused device (docs/topology.md) and returns the pointer kinds to withhold:
// GPUDirect when topo.WithholdGPUDirect says so (rails on different NUMA nodes, and the user
// did not set NCCL_NET_GDR_LEVEL).
func placeOnPCI(d int, dev config.Device) int {
	f := &C.mpib_g.fdev[d]
	sout, _ := topo.ReadPCI(dev.Sout.HCA)
	var sups []topo.RailPCI
	for _, r := range dev.SupPorts {
		p, _ := topo.ReadPCI(r.HCA)
		sups = append(sups, p)
	}
	sup := sups[0]
	pl := topo.PlaceAll(sout, sups)
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
	gdrLevelSet := os.Getenv("NCCL_NET_GDR_LEVEL") != ""
	if topo.WithholdGPUDirect(pl, gdrLevelSet) {
		warnf("topology: device %d: GPUDirect RDMA not advertised: its rails hang off different CPUs, so one would read GPU memory across the CPU interconnect (set NCCL_NET_GDR_LEVEL to decide yourself)", d)
		return C.NCCL_PTR_CUDA | C.NCCL_PTR_DMABUF
	}
	if !pl.GPUDirectSafe && pl.Relation != topo.RelationUnknown && !gdrLevelSet {
		infof("topology: device %d: GPUDirect RDMA advertised although its SUP rail reads GPU memory through the CPU's root complex for the GPUs near SOUT (withholding it would send those GPUs to other devices); set NCCL_NET_GDR_LEVEL=PXB to keep NCCL from GPUDirect on this device", d)
	}
	return 0
}

func setCString(dst unsafe.Pointer, size int, s string) {
	b := unsafe.Slice((*byte)(dst), size)
	n := copy(b[:size-1], s)
	b[n] = 0
}
