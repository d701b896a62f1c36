package topo

// PCI placement of the fused device. MPIB shows NCCL one net device made of two HCAs, but
// NCCL's topology gives a net device exactly one place in the PCI tree: the device named by
// the last component of pciPath (vProps is ignored while makeVDevice is NULL). NCCL then
// enables GPUDirect RDMA for a GPU when the path GPU->that place is at most PXB, i.e. when the
// GPU shares a PCIe switch with it. Place picks the rail whose place gives, for every GPU,
// the verdict the farther rail deserves, and says when no rail can (docs/topology.md).

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// RailPCI is where one rail's HCA sits: its resolved sysfs device path and its NUMA node
// (-1 when sysfs does not say).
type RailPCI struct {
	Path string
	NUMA int
}

// Relation is how the two rails' PCI positions relate, from closest to farthest.
type Relation int

const (
	RelationUnknown             Relation = iota // a path is missing or not a PCI device
	RelationSameAdapter                         // functions (ports) of one PCI device
	RelationSamePCIeSwitch                      // some PCIe switch sits above both
	RelationSameHostBridge                      // no common switch, one root complex
	RelationDifferentHostBridge                 // no common switch, two root complexes, one NUMA node
	RelationDifferentNUMA                       // the rails hang off different CPUs
)

func (r Relation) String() string {
	switch r {
	case RelationSameAdapter:
		return "same adapter"
	case RelationSamePCIeSwitch:
		return "same PCIe switch"
	case RelationSameHostBridge:
		return "same host bridge"
	case RelationDifferentHostBridge:
		return "different host bridge"
	case RelationDifferentNUMA:
		return "different NUMA"
	}
	return "unknown"
}

// Placement is what MPIB advertises for the fused device and why.
type Placement struct {
	// AdvertisePath is the pciPath for getProperties(0); "" means report NULL (NCCL then
	// attaches the device to its first CPU).
	AdvertisePath string
	// AdvertisesSup is true when AdvertisePath is SUP's device rather than SOUT's.
	AdvertisesSup bool
	Relation      Relation
	// SupFarther is true when some GPU reaches SUP through more of the PCI tree than SOUT.
	SupFarther bool
	// Reason is one human line on the relation, for an INFO message.
	Reason string
	// GPUDirectSafe is true when NCCL's GPUDirect verdict on AdvertisePath equals, for every
	// PCIe GPU at NCCL's default level, the verdict that holds for both rails. When false,
	// no advertised place is right for every GPU (WithholdGPUDirect says what to do then).
	GPUDirectSafe bool
}

// WithholdGPUDirect says whether a fused device placed as pl should not advertise GPUDirect
// RDMA (NCCL_PTR_CUDA, NCCL_PTR_DMABUF); gdrLevelSet: the user set NCCL_NET_GDR_LEVEL, which
// then decides. Only when the rails hang off different CPUs: a GPU near one rail would have
// the other read its memory across the CPU interconnect (SYS), which NCCL never allows for a
// NIC of its own. Within one NUMA node an unsafe placement is still advertised: withholding
// makes NCCL route every GPU's traffic for the device through host memory (PHB), and on a
// node with NVLink it then sends those GPUs to other GPUs' devices instead (PXN, nearer than
// PHB), leaving this device's NICs idle and the others carrying two GPUs' traffic; the SUP
// rail reading GPU memory through the root complex costs less than that.
func WithholdGPUDirect(pl Placement, gdrLevelSet bool) bool {
	return !gdrLevelSet && !pl.GPUDirectSafe && pl.Relation == RelationDifferentNUMA
}

// pciPosition is a rail as NCCL's topology models it.
type pciPosition struct {
	device     string   // the HCA's own bus id, e.g. 0000:04:00.0
	hostBridge string   // the root complex component, e.g. pci0000:00
	switches   []string // NCCL's PCI switch nodes above the device, nearest first
}

// parsePosition reads a sysfs device path the way NCCL does (xml.cc ncclTopoGetXmlFromSys):
// going up two path components per level, each landing on a bus id becomes a switch node,
// and the walk ends at the first component that is not a bus id (the CPU). Modelling the
// same walk, rather than the true bridge hierarchy, makes "shares a switch" mean what it
// means to NCCL.
func parsePosition(path string) (pciPosition, bool) {
	if path == "" {
		return pciPosition{}, false
	}
	parts := strings.Split(filepath.Clean(path), "/")
	leaf := len(parts) - 1
	if !isBusID(parts[leaf]) {
		return pciPosition{}, false
	}
	top := leaf
	for top > 0 && isBusID(parts[top-1]) {
		top--
	}
	if top == 0 || !strings.HasPrefix(parts[top-1], "pci") {
		return pciPosition{}, false
	}
	pos := pciPosition{device: parts[leaf], hostBridge: parts[top-1]}
	for i := leaf - 2; i >= top; i -= 2 {
		pos.switches = append(pos.switches, parts[i])
	}
	return pos, true
}

// isBusID accepts the 12-character domain:bus:device.function form NCCL requires; longer
// domains (VMD) fail NCCL's own check too, so they count as not PCI here.
func isBusID(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if i == 4 || i == 7 || i == 10 {
			continue
		}
		if !strings.ContainsRune("0123456789abcdefABCDEF", rune(s[i])) {
			return false
		}
	}
	return true
}

// PlaceAll places a device whose SUP rail may be any of several ports (a mesh): the path is
// the first port's placement's, and GPUDirect is safe only when it is for every port whose
// place is known and every one of them would advertise that same path (a GPU's verdict on the
// advertised path must hold whichever port a connection uses).
func PlaceAll(sout RailPCI, sups []RailPCI) Placement {
	if len(sups) == 0 {
		return Place(sout, RailPCI{NUMA: -1})
	}
	first := Place(sout, sups[0])
	for i, sup := range sups[1:] {
		p := Place(sout, sup)
		if p.Relation == RelationUnknown || (p.GPUDirectSafe && p.AdvertisePath == first.AdvertisePath) {
			continue
		}
		if first.GPUDirectSafe {
			first.Reason += fmt.Sprintf("; SUP port %d (%s): %s", i+1, sup.Path, p.Reason)
		}
		first.GPUDirectSafe = false
		first.Relation = max(first.Relation, p.Relation)
	}
	return first
}

// Place decides what to advertise for the fused SOUT+SUP device from the two rails' places.
func Place(sout, sup RailPCI) Placement {
	soutPos, soutOK := parsePosition(sout.Path)
	supPos, supOK := parsePosition(sup.Path)
	switch {
	case !soutOK || !supOK:
		return placeUnknown(sout, sup, soutOK, supOK)
	case sout.NUMA >= 0 && sup.NUMA >= 0 && sout.NUMA != sup.NUMA:
		return placeAcrossNUMA(sout, sup, soutPos, supPos)
	case soutPos.device[:10] == supPos.device[:10]:
		return Placement{AdvertisePath: sout.Path, Relation: RelationSameAdapter, GPUDirectSafe: true,
			Reason: fmt.Sprintf("SOUT %s and SUP %s are functions of one adapter", soutPos.device, supPos.device)}
	}
	if common, soutDepth, supDepth, ok := commonSwitch(soutPos, supPos); ok {
		return placeUnderSwitch(sout, soutPos, supPos, common, soutDepth, supDepth)
	}
	return placeWithoutSwitch(sout, sup, soutPos, supPos)
}

// commonSwitch finds the lowest switch node above both rails and how many switch nodes lie
// between it and each rail.
func commonSwitch(a, b pciPosition) (node string, depthA, depthB int, ok bool) {
	for i, sa := range a.switches {
		for j, sb := range b.switches {
			if sa == sb {
				return sa, i, j, true
			}
		}
	}
	return "", 0, 0, false
}

// placeUnderSwitch: a GPU shares a switch with SOUT exactly when it shares one with SUP
// (any switch above the common one is above both; any below it leaves the GPU under the
// common one), so NCCL's verdict at PXB is the same on either rail. Depth only changes PIX.
func placeUnderSwitch(sout RailPCI, soutPos, supPos pciPosition, common string, soutDepth, supDepth int) Placement {
	p := Placement{AdvertisePath: sout.Path, Relation: RelationSamePCIeSwitch, GPUDirectSafe: true,
		SupFarther: supDepth > soutDepth}
	switch {
	case supDepth > soutDepth:
		p.Reason = fmt.Sprintf("SUP %s is %d PCIe switch level(s) below common switch %s, SOUT %s only %d: "+
			"GPUs at PIX from SOUT are PXB from SUP (GPUDirect verdict unchanged at PXB)",
			supPos.device, supDepth, common, soutPos.device, soutDepth)
	case supDepth < soutDepth:
		p.Reason = fmt.Sprintf("SOUT %s is %d PCIe switch level(s) below common switch %s, SUP %s only %d",
			soutPos.device, soutDepth, common, supPos.device, supDepth)
	default:
		p.Reason = fmt.Sprintf("SOUT %s and SUP %s sit at the same depth under PCIe switch %s",
			soutPos.device, supPos.device, common)
	}
	return p
}

// placeWithoutSwitch: the rails meet only at the CPU, so no PCIe GPU is within PXB of both.
// A rail with no switch above it is within PXB of no PCIe GPU, so advertising it gives every
// GPU the verdict of the farther rail; with a switch above each rail, no choice does.
func placeWithoutSwitch(sout, sup RailPCI, soutPos, supPos pciPosition) Placement {
	p := Placement{Relation: RelationDifferentHostBridge}
	if soutPos.hostBridge == supPos.hostBridge {
		p.Relation = RelationSameHostBridge
	}
	where := fmt.Sprintf("SOUT %s (%s) and SUP %s (%s) share no PCIe switch", soutPos.device,
		soutPos.hostBridge, supPos.device, supPos.hostBridge)
	soutSwitched, supSwitched := len(soutPos.switches) > 0, len(supPos.switches) > 0
	switch {
	case !soutSwitched:
		p.AdvertisePath, p.GPUDirectSafe = sout.Path, true
		p.Reason = where + "; SOUT hangs directly off the CPU, so NCCL sees it at PHB from every GPU, " +
			"as the pair deserves"
	case !supSwitched:
		p.AdvertisePath, p.AdvertisesSup, p.GPUDirectSafe, p.SupFarther = sup.Path, true, true, true
		p.Reason = where + "; SUP hangs directly off the CPU (PHB from every GPU), so SUP's place is advertised"
	default:
		p.AdvertisePath, p.SupFarther = sout.Path, true
		p.Reason = where + "; GPUs under SOUT's switch reach SUP only through the CPU (PHB)"
	}
	return p
}

// placeAcrossNUMA: a GPU near one rail is a socket away (SYS) from the other, so GPUDirect is
// right for no GPU. SOUT keeps the advertised place so NCCL's CPU affinity follows the rail
// that carries every connection's first bytes.
func placeAcrossNUMA(sout, sup RailPCI, soutPos, supPos pciPosition) Placement {
	return Placement{AdvertisePath: sout.Path, Relation: RelationDifferentNUMA, SupFarther: true,
		Reason: fmt.Sprintf("SUP %s is on NUMA node %d, SOUT %s on NUMA node %d: GPUs near SOUT reach SUP "+
			"across the CPU interconnect (SYS)", supPos.device, sup.NUMA, soutPos.device, sout.NUMA)}
}

// placeUnknown: without both places nothing can be proven close, so GPUDirect is not safe.
// A known place still beats NULL, which would put the device on NCCL's first CPU.
func placeUnknown(sout, sup RailPCI, soutOK, supOK bool) Placement {
	p := Placement{Relation: RelationUnknown}
	switch {
	case soutOK:
		p.AdvertisePath = sout.Path
		p.Reason = fmt.Sprintf("SUP path %q is not a PCI device; advertising SOUT's place", sup.Path)
	case supOK:
		p.AdvertisePath, p.AdvertisesSup = sup.Path, true
		p.Reason = fmt.Sprintf("SOUT path %q is not a PCI device; advertising SUP's place", sout.Path)
	default:
		p.Reason = fmt.Sprintf("neither SOUT %q nor SUP %q is a PCI device; advertising no PCI path",
			sout.Path, sup.Path)
	}
	return p
}

// ReadPCI reads where an HCA sits from sysfs: the resolved device path and its NUMA node.
func ReadPCI(hca string) (RailPCI, error) {
	return readPCIUnder("/", hca)
}

// readPCIUnder is ReadPCI against a sysfs rooted at root, so tests can build a fake one.
func readPCIUnder(root, hca string) (RailPCI, error) {
	if hca == "" || hca == "." || hca == ".." || strings.ContainsRune(hca, '/') {
		return RailPCI{NUMA: -1}, fmt.Errorf("invalid HCA name %q", hca)
	}
	path, err := filepath.EvalSymlinks(filepath.Join(root, "sys/class/infiniband", hca, "device"))
	if err != nil {
		return RailPCI{NUMA: -1}, fmt.Errorf("HCA %s has no sysfs device: %w", hca, err)
	}
	return RailPCI{Path: path, NUMA: readNUMANode(path)}, nil
}

// readNUMANode returns the device's NUMA node, -1 when absent or negative (no affinity).
func readNUMANode(devicePath string) int {
	b, err := os.ReadFile(filepath.Join(devicePath, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}
