package doctor

import (
	"math/bits"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"github.com/mpib/mpib/plugin/rules"
)

// The doctor's own small decisions, pure and table-tested. Everything the plugin decides
// itself (GID choice, islands, SUP pairs, PCI relations) comes from package rules instead.

// roceOverhead is what the kernel takes off a netdev's MTU for RoCE headers before rounding
// down to an IB MTU (iboe_get_mtu: GRH 40, UDP 8, BTH 12, XRC ext 4, AtomicETH 28, ICRC 4).
// soft-RoCE (rxe) takes 80; the two differ only for netdev MTUs within 16 bytes above an IB
// MTU plus 80, which no fabric uses.
const roceOverhead = 96

// RoCEActiveMTU is a RoCE port's active MTU in bytes from its netdev's MTU: the largest IB
// MTU (256..4096) that fits with the RoCE headers; 0 when the netdev MTU is unknown (0) and
// 256 below that (what the kernel reports for a tiny MTU).
func RoCEActiveMTU(netdevMTU int) int {
	if netdevMTU <= 0 {
		return 0
	}
	room := netdevMTU - roceOverhead
	for m := 4096; m >= 256; m /= 2 {
		if room >= m {
			return m
		}
	}
	return 256
}

var rateRe = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?) Gb/sec`)

// parseRateMbps reads ports/N/rate ("100 Gb/sec (4X EDR)", "2.5 Gb/sec (1X SDR)") as
// megabits per second; 0 when unreadable.
func parseRateMbps(s string) int {
	m := rateRe.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0
	}
	f, _ := strconv.ParseFloat(m[1], 64)
	return int(f * 1000)
}

// GIDWant says what a GID the policy asks for looks like, e.g. "an IPv4-mapped RoCE v2 GID".
func GIDWant(p rules.GIDPolicy) string {
	fam := "an IPv4-mapped"
	if p.IPv6 {
		fam = "an IPv6"
	}
	s := fam + " RoCE v" + strconv.Itoa(p.RoCEVersion) + " GID"
	if p.Range.IsValid() {
		s += " in " + p.Range.String()
	}
	return s
}

// GIDFits tells whether a present RoCE GID is what the policy asks for: not link-local or
// unspecified (net_ib's validity test), of the policy's family, RoCE version and range. The
// plugin takes a configured index as it is; a configured index that does not fit is what
// leaves a job unable to route (a link-local GID) or without its SUP address.
func GIDFits(e rules.GIDEntry, p rules.GIDPolicy) bool {
	a := netip.AddrFrom16(e.GID)
	if !e.Present || a.IsUnspecified() || a.IsLinkLocalUnicast() {
		return false
	}
	version := 1
	if e.Type == rules.GIDTypeRoCEv2 {
		version = 2
	}
	addr := e.Addr()
	return addr.Is4() != p.IPv6 && version == p.RoCEVersion && (!p.Range.IsValid() || p.Range.Contains(addr))
}

// GIDTypeName names a GID type as sysfs does.
func GIDTypeName(e rules.GIDEntry) string {
	switch e.Type {
	case rules.GIDTypeRoCEv2:
		return "RoCEv2"
	case rules.GIDTypeRoCEv1:
		return "RoCEv1"
	}
	return "IB"
}

// LookupRoute is the route the kernel takes to addr from a port whose netdev is netdev: a
// RoCE v2 address is resolved bound to the GID's netdev, and a bound lookup passes over the
// routes out of other netdevs. Of the main table's routes on netdev, the longest matching
// prefix wins, the first of equals (the kernel's metric order is not in /proc/net/route's
// columns we read). Default routes count only when withDefault: a SUP fabric has none that
// RoCE would use (package topo leaves them out too). Not found says nothing about
// reachability: a policy-routing table (ip rule), which /proc/net/route does not show, may
// hold the route, and with none at all the kernel sends a bound lookup on-link.
func LookupRoute(routes []rules.Route, netdev string, addr netip.Addr, withDefault bool) (rules.Route, bool) {
	var best rules.Route
	found := false
	for _, r := range routes {
		if r.Dev != netdev || (!withDefault && r.IsDefault()) || !r.Dst.Contains(addr) {
			continue
		}
		if !found || r.Dst.Bits() > best.Dst.Bits() {
			best, found = r, true
		}
	}
	return best, found
}

// RoutesOn lists the routes that leave on netdev, "DST" or "DST:via:GATEWAY".
func RoutesOn(routes []rules.Route, netdev string) []string {
	var out []string
	for _, r := range routes {
		if r.Dev != netdev {
			continue
		}
		s := r.Dst.String()
		if r.Via.IsValid() {
			s += ":via:" + r.Via.String()
		}
		out = append(out, s)
	}
	return out
}

// relationRank orders PCI relations nearest first, an unknown relation last.
func relationRank(r rules.Relation) int {
	if r == rules.RelationUnknown {
		return 100
	}
	return int(r)
}

// NearestGPU is the GPU nearest to a NIC under NCCL's PCI model (rules.Place relates the
// two devices), the first in bus order among equals; -1 when there is no GPU.
func NearestGPU(nic rules.RailPCI, gpus []GPU) (int, rules.Relation) {
	best, bestRel := -1, rules.RelationUnknown
	for i, g := range gpus {
		rel := rules.Place(nic, rules.RailPCI{Path: g.path, NUMA: g.NUMA}).Relation
		if best < 0 || relationRank(rel) < relationRank(bestRel) {
			best, bestRel = i, rel
		}
	}
	return best, bestRel
}

// SupWanted is mpib_sup_qps_wanted (mpib_policy.h): a connection builds SUP QPs inside an
// island, and across islands only in advanced mode with MPIB_SUP_RELAY=1.
func SupWanted(class rules.PathClass, s Settings) bool {
	return class == rules.IntraIsland || (s.Mode == 1 && s.SupRelay)
}

// SplittingPrefix is the shortest island prefix length that puts two IPv4 addresses in
// different islands (their common leading bits plus one); 33 for equal addresses.
func SplittingPrefix(a, b netip.Addr) int {
	if !a.Is4() || !b.Is4() {
		return 0
	}
	x, y := a.As4(), b.As4()
	diff := uint32(x[0]^y[0])<<24 | uint32(x[1]^y[1])<<16 | uint32(x[2]^y[2])<<8 | uint32(x[3]^y[3])
	return bits.LeadingZeros32(diff) + 1
}

// StateProblem says whether a port's state keeps it from carrying traffic.
func StateProblem(state string) bool { return state != "ACTIVE" }

// PortDownIsProblem says whether a port that is down stands in the node's way, given its
// device's number of SUP ports and how many of them are up. SOUT always does: no device works
// without it. A SUP port does unless another SUP port of the device is up: the plugin leaves
// a mesh's down port out and pairs its connections over the others.
func PortDownIsProblem(rail string, supPorts, supUp int) bool {
	return rail != "SUP" || supPorts < 2 || supUp == 0
}

// PKeyFits says whether NCCL_IB_PKEY's index lies inside a port's P_Key table of entries
// entries (the plugin's init opens no device otherwise); an unread table (0) fits.
func PKeyFits(index, entries int) bool { return entries == 0 || index < entries }

// isNvidiaGPU: NVIDIA's vendor id (0x10de) and a display class, VGA (0x0300xx) or 3D
// controller (0x0302xx, the data-centre parts); NVSwitches and audio functions are not GPUs.
func isNvidiaGPU(vendor, class string) bool {
	return vendor == "0x10de" && (strings.HasPrefix(class, "0x0300") || strings.HasPrefix(class, "0x0302"))
}
