package doctor

import (
	"net/netip"
	"testing"

	"github.com/mpib/mpib/plugin/rules"
)

func TestRoCEActiveMTU(t *testing.T) {
	for _, c := range []struct{ netdev, want int }{
		{0, 0}, {-1, 0}, {100, 256}, {352, 256}, {1000, 512}, {1119, 512}, {1120, 1024}, {1500, 1024},
		{2144, 2048}, {2143, 1024}, {4191, 2048}, {4192, 4096}, {9000, 4096},
	} {
		if got := RoCEActiveMTU(c.netdev); got != c.want {
			t.Errorf("RoCEActiveMTU(%d) = %d, want %d", c.netdev, got, c.want)
		}
	}
}

func TestParseRateMbps(t *testing.T) {
	for _, c := range []struct {
		s    string
		want int
	}{
		{"100 Gb/sec (4X EDR)", 100000}, {"2.5 Gb/sec (1X SDR)", 2500}, {"200 Gb/sec (4X HDR)\n", 200000},
		{"", 0}, {"fast", 0}, {"10 Mb/sec", 0},
	} {
		if got := parseRateMbps(c.s); got != c.want {
			t.Errorf("parseRateMbps(%q) = %d, want %d", c.s, got, c.want)
		}
	}
}

func entry(addr string, typ int) rules.GIDEntry {
	return rules.GIDEntry{Present: true, GID: netip.MustParseAddr(addr).As16(), Type: typ}
}

func TestGIDFits(t *testing.T) {
	v4 := rules.GIDPolicy{RoCEVersion: 2}
	v6 := rules.GIDPolicy{RoCEVersion: 2, IPv6: true}
	ranged := rules.GIDPolicy{RoCEVersion: 2, Range: netip.MustParsePrefix("10.9.0.0/16")}
	for _, c := range []struct {
		name string
		e    rules.GIDEntry
		p    rules.GIDPolicy
		want bool
	}{
		{"IPv4 RoCE v2", entry("::ffff:10.9.1.11", rules.GIDTypeRoCEv2), v4, true},
		{"IPv4 RoCE v1", entry("::ffff:10.9.1.11", rules.GIDTypeRoCEv1), v4, false},
		{"link-local v2", entry("fe80::a00:27ff:fe00:1", rules.GIDTypeRoCEv2), v4, false},
		{"link-local under IPv6 policy", entry("fe80::a00:27ff:fe00:1", rules.GIDTypeRoCEv2), v6, false},
		{"global IPv6", entry("2001:db8::1", rules.GIDTypeRoCEv2), v6, true},
		{"IPv4 under IPv6 policy", entry("::ffff:10.9.1.11", rules.GIDTypeRoCEv2), v6, false},
		{"in range", entry("::ffff:10.9.1.11", rules.GIDTypeRoCEv2), ranged, true},
		{"out of range", entry("::ffff:10.0.1.11", rules.GIDTypeRoCEv2), ranged, false},
		{"empty slot", rules.GIDEntry{}, v4, false},
		{"all zero", entry("::", rules.GIDTypeRoCEv2), v4, false},
	} {
		if got := GIDFits(c.e, c.p); got != c.want {
			t.Errorf("%s: GIDFits = %v, want %v", c.name, got, c.want)
		}
	}
	if got := GIDWant(v4); got != "an IPv4-mapped RoCE v2 GID" {
		t.Errorf("GIDWant(v4) = %q", got)
	}
	if got := GIDWant(ranged); got != "an IPv4-mapped RoCE v2 GID in 10.9.0.0/16" {
		t.Errorf("GIDWant(ranged) = %q", got)
	}
	if got := GIDWant(rules.GIDPolicy{RoCEVersion: 1, IPv6: true}); got != "an IPv6 RoCE v1 GID" {
		t.Errorf("GIDWant(v1 v6) = %q", got)
	}
}

func rt(dst, via, dev string) rules.Route {
	r := rules.Route{Dst: netip.MustParsePrefix(dst), Dev: dev}
	if via != "" {
		r.Via = netip.MustParseAddr(via)
	}
	return r
}

func TestLookupRoute(t *testing.T) {
	routes := []rules.Route{
		rt("0.0.0.0/0", "10.0.1.1", "eth0"), rt("10.0.1.0/24", "", "eth0"), rt("10.0.2.0/24", "10.0.1.1", "eth0"),
		rt("10.9.1.0/24", "", "eth1"), rt("10.9.0.0/16", "10.9.1.254", "eth1"), rt("10.9.1.128/25", "", "eth5"),
		rt("10.9.1.0/24", "", "eth3"), rt("10.0.0.0/8", "10.0.1.1", "eth0"), rt("10.0.0.0/8", "10.0.3.1", "eth2"),
	}
	for _, c := range []struct {
		netdev, addr string
		withDefault  bool
		dev, via     string
		found        bool
	}{
		{"eth0", "10.0.1.12", true, "eth0", "", true},
		{"eth0", "10.0.2.11", false, "eth0", "10.0.1.1", true},
		{"eth1", "10.9.1.12", false, "eth1", "", true},
		{"eth1", "10.9.1.200", false, "eth1", "", true}, // eth5's longer prefix is not eth1's
		{"eth5", "10.9.1.200", false, "eth5", "", true},
		{"eth1", "10.9.7.1", false, "eth1", "10.9.1.254", true},
		{"eth3", "10.9.1.11", false, "eth3", "", true},         // two NICs on one subnet: each its own route
		{"eth2", "10.0.4.11", false, "eth2", "10.0.3.1", true}, // rail-optimized: one supernet route per NIC
		{"eth0", "10.0.4.11", false, "eth0", "10.0.1.1", true},
		{"eth3", "10.9.7.1", false, "", "", false}, // only other netdevs' routes match
		{"eth0", "192.168.0.1", false, "", "", false},
		{"eth0", "192.168.0.1", true, "eth0", "10.0.1.1", true},
		{"eth1", "192.168.0.1", true, "", "", false},
	} {
		r, ok := LookupRoute(routes, c.netdev, netip.MustParseAddr(c.addr), c.withDefault)
		via := ""
		if r.Via.IsValid() {
			via = r.Via.String()
		}
		if ok != c.found || r.Dev != c.dev || via != c.via {
			t.Errorf("LookupRoute(%s, %s, default=%v) = %v %v, want dev %q via %q found %v", c.netdev, c.addr, c.withDefault, r, ok, c.dev, c.via, c.found)
		}
	}
	if got := RoutesOn(routes, "eth1"); len(got) != 2 || got[0] != "10.9.1.0/24" || got[1] != "10.9.0.0/16:via:10.9.1.254" {
		t.Errorf("RoutesOn(eth1) = %v", got)
	}
}

func TestPortDownIsProblem(t *testing.T) {
	for _, c := range []struct {
		rail         string
		supPorts, up int
		want         bool
	}{
		{"SOUT", 1, 1, true},
		{"SOUT", 3, 3, true},
		{"SUP", 1, 0, true},  // a device's only SUP port
		{"SUP", 3, 2, false}, // a mesh runs on the ports that are up
		{"SUP", 3, 1, false},
		{"SUP", 3, 0, true}, // every SUP port down
		{"SUP", 2, 0, true},
	} {
		if got := PortDownIsProblem(c.rail, c.supPorts, c.up); got != c.want {
			t.Errorf("PortDownIsProblem(%s, %d ports, %d up) = %v, want %v", c.rail, c.supPorts, c.up, got, c.want)
		}
	}
}

func TestPKeyFits(t *testing.T) {
	for _, c := range []struct {
		index, entries int
		want           bool
	}{
		{0, 1, true}, {1, 1, false}, {5, 128, true}, {127, 128, true}, {128, 128, false},
		{3, 0, true}, // the table could not be read: no verdict
	} {
		if got := PKeyFits(c.index, c.entries); got != c.want {
			t.Errorf("PKeyFits(%d, %d entries) = %v, want %v", c.index, c.entries, got, c.want)
		}
	}
}

func TestSplittingPrefix(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"10.0.1.11", "10.0.2.11", 23}, // differ in bit 23 (1 = 01, 2 = 10 in the third byte)
		{"10.0.1.11", "10.0.1.12", 30},
		{"10.0.1.11", "11.0.1.11", 8},
		{"10.0.1.11", "138.0.1.11", 1},
		{"10.0.1.11", "10.0.1.11", 33},
		{"10.0.1.11", "2001:db8::1", 0},
	} {
		if got := SplittingPrefix(netip.MustParseAddr(c.a), netip.MustParseAddr(c.b)); got != c.want {
			t.Errorf("SplittingPrefix(%s, %s) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestSupWanted(t *testing.T) {
	for _, c := range []struct {
		class rules.PathClass
		s     Settings
		want  bool
	}{
		{rules.IntraIsland, Settings{}, true},
		{rules.InterIsland, Settings{}, false},
		{rules.InterIsland, Settings{Mode: 1}, false},
		{rules.InterIsland, Settings{SupRelay: true}, false},
		{rules.InterIsland, Settings{Mode: 1, SupRelay: true}, true},
		{rules.IntraIsland, Settings{Mode: 1}, true},
	} {
		if got := SupWanted(c.class, c.s); got != c.want {
			t.Errorf("SupWanted(%v, %+v) = %v, want %v", c.class, c.s, got, c.want)
		}
	}
}

func TestMTUMismatch(t *testing.T) {
	for _, c := range []struct {
		a, b Port
		want bool
	}{
		{Port{ActiveMTU: 4096, NetdevMTU: 9000}, Port{ActiveMTU: 4096, NetdevMTU: 9000}, false},
		{Port{ActiveMTU: 1024, NetdevMTU: 1500}, Port{ActiveMTU: 512, NetdevMTU: 1000}, true},
		{Port{ActiveMTU: 4096, NetdevMTU: 9000}, Port{ActiveMTU: 4096, NetdevMTU: 9216}, false}, // RoCE frames fit both
		{Port{ActiveMTU: 4096, NetdevMTU: 9000}, Port{ActiveMTU: 4096, NetdevMTU: 4200}, false},
		{Port{ActiveMTU: 0}, Port{ActiveMTU: 4096, NetdevMTU: 9000}, false}, // InfiniBand: unknown
	} {
		if got := MTUMismatch(c.a, c.b); got != c.want {
			t.Errorf("MTUMismatch(%+v, %+v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestNearestGPU(t *testing.T) {
	h := FixtureHost("testdata/roce-2dev", "n")
	gpus := h.GPUs()
	if len(gpus) != 2 || gpus[0].PCI != "0000:1b:00.0" || gpus[1].PCI != "0000:9b:00.0" || gpus[0].NUMA != 0 || gpus[1].NUMA != 1 {
		t.Fatalf("GPUs = %+v, want 0000:1b:00.0 (NUMA 0) and 0000:9b:00.0 (NUMA 1), bridges left out", gpus)
	}
	for _, c := range []struct {
		hca  string
		want int
		rel  rules.Relation
	}{
		{"mlx5_0", 0, rules.RelationSamePCIeSwitch},
		{"mlx5_3", 1, rules.RelationSamePCIeSwitch},
	} {
		g, rel := NearestGPU(h.readPCI(c.hca), gpus)
		if g != c.want || rel != c.rel {
			t.Errorf("NearestGPU(%s) = %d %v, want %d %v", c.hca, g, rel, c.want, c.rel)
		}
	}
	if g, _ := NearestGPU(rules.RailPCI{NUMA: -1}, nil); g != -1 {
		t.Errorf("NearestGPU with no GPU = %d, want -1", g)
	}
}

func TestIsNvidiaGPU(t *testing.T) {
	for _, c := range []struct {
		vendor, class string
		want          bool
	}{
		{"0x10de", "0x030200", true}, {"0x10de", "0x030000", true}, {"0x10de", "0x068000", false},
		{"0x10de", "0x040300", false}, {"0x1234", "0x030000", false}, {"", "", false},
	} {
		if got := isNvidiaGPU(c.vendor, c.class); got != c.want {
			t.Errorf("isNvidiaGPU(%q, %q) = %v, want %v", c.vendor, c.class, got, c.want)
		}
	}
}
