package doctor

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mpib/mpib/plugin/rules"
)

// Tests over the fixture trees of testdata (mkfixtures.sh says what each one is).

func envOf(kv ...string) func(string) string {
	m := map[string]string{}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		m[k] = v
	}
	return func(k string) string { return m[k] }
}

var roce2dev = []string{"MPIB_HCA_SOUT=mlx5_0,mlx5_2", "MPIB_HCA_SUP=mlx5_1,mlx5_3", "MPIB_OOB_IF=eth0"}

func inspectFixture(t *testing.T, fixture string, env ...string) Report {
	t.Helper()
	return Inspect(FixtureHost(filepath.Join("testdata", fixture), "n1"), envOf(env...))
}

func kinds(ps []Problem) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Kind+"/"+p.Rail)
	}
	return out
}

func lines(r Report) string {
	var b bytes.Buffer
	WriteReport(&b, r)
	return b.String()
}

func TestInspectHealthy(t *testing.T) {
	r := inspectFixture(t, "roce-2dev", roce2dev...)
	if len(r.Problems) != 0 || Exit(r, nil) != ExitHealthy {
		t.Fatalf("problems on the healthy fixture: %v\n%s", kinds(r.Problems), lines(r))
	}
	if r.OOB.Addr.String() != "10.0.1.11" || r.OOB.Island.String() != "10.0.1.0/24" {
		t.Errorf("OOB = %+v", r.OOB)
	}
	want := []string{
		"doctor: node=n1 oob_if=eth0 address=10.0.1.11 island=10.0.1.0/24 prefix_len=24 mode=0 sup_relay=0 devices=2 gpus=0000:1b:00.0,0000:9b:00.0 nettest=none",
		"doctor: device=0 rail=SOUT port=mlx5_0:1 state=ACTIVE mtu=4096 link_layer=Ethernet gid_index=3 address=10.0.1.11 numa=0 gpu=0000:1b:00.0 netdev=eth0 netdev_mtu=9000 speed_mbps=200000 pci=0000:1a:00.0",
		"doctor: device=0 rail=SUP port=mlx5_1:1 state=ACTIVE mtu=4096 link_layer=Ethernet gid_index=3 address=10.9.1.11 numa=0 gpu=0000:1b:00.0 netdev=eth1 netdev_mtu=9000 speed_mbps=200000 pci=0000:1a:00.1 routes=10.9.1.0/24",
		"doctor: device=1 rail=SUP port=mlx5_3:1 state=ACTIVE mtu=4096 link_layer=Ethernet gid_index=3 address=10.9.3.11 numa=1 gpu=0000:9b:00.0 netdev=eth3 netdev_mtu=9000 speed_mbps=200000 pci=0000:9a:00.1 routes=10.9.3.0/24",
	}
	out := lines(r)
	for _, w := range want {
		if !strings.Contains(out, w+"\n") {
			t.Errorf("missing line\n%s\nin\n%s", w, out)
		}
	}
	if p := r.Devices[0].Sup[0]; !p.Described || p.PrefixLen != 24 || !p.GIDOK {
		t.Errorf("SUP port = %+v, want described with /24", p)
	}
}

func TestInspectProblems(t *testing.T) {
	for _, c := range []struct {
		name, fixture string
		env           []string
		want          []string // problem kind/rail, in order
		line          string   // a line the output must have
	}{
		{"wrong HCA name", "roce-2dev", []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=nosuch", "MPIB_OOB_IF=eth0"},
			[]string{"no-device/SUP"},
			"doctor: problem=no-device device=0 rail=SUP port=nosuch:1 devices=mlx5_0,mlx5_1,mlx5_2,mlx5_3 want=an RDMA device named nosuch: fix MPIB_HCA_SUP"},
		{"wrong port", "roce-2dev", []string{"MPIB_HCA_SOUT=mlx5_0:2", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0"},
			[]string{"no-device/SOUT"}, "doctor: problem=no-device device=0 rail=SOUT port=mlx5_0:2 ports=1 want=port 2 on mlx5_0"},
		{"link-local SUP GID", "roce-2dev", []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0", "MPIB_GID_INDEX_SUP=1"},
			[]string{"gid/SUP"},
			"doctor: problem=gid device=0 rail=SUP port=mlx5_1:1 index=1 address=fe80::a00:27ff:fe00:1 type=RoCEv2 want=an IPv4-mapped RoCE v2 GID: set MPIB_GID_INDEX_SUP=3"},
		{"NCCL_IB_GID_INDEX on both rails, RoCE v1", "roce-2dev", []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0", "NCCL_IB_GID_INDEX=2"},
			[]string{"gid/SOUT", "gid/SUP"}, "index=2 address=10.0.1.11 type=RoCEv1 want=an IPv4-mapped RoCE v2 GID"},
		{"empty GID index", "roce-2dev", []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0", "MPIB_GID_INDEX_SOUT=6"},
			[]string{"gid/SOUT"}, "doctor: problem=gid device=0 rail=SOUT port=mlx5_0:1 index=6 entries=8 want=an IPv4-mapped RoCE v2 GID: no usable GID: GID index 6 is empty"},
		{"no GID in range", "roce-2dev", []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0", "NCCL_IB_ADDR_RANGE=192.168.0.0/16"},
			[]string{"gid/SOUT", "gid/SUP"}, "want=an IPv4-mapped RoCE v2 GID in 192.168.0.0/16"},
		{"SUP NICs crossed over NUMA nodes", "roce-2dev", []string{"MPIB_HCA_SOUT=mlx5_0,mlx5_2", "MPIB_HCA_SUP=mlx5_3,mlx5_1", "MPIB_OOB_IF=eth0"},
			[]string{"numa/SUP", "numa/SUP"}, "doctor: problem=numa device=0 rail=SUP port=mlx5_3:1 numa=1 gpu=0000:1b:00.0 gpu_numa=0 want="},
		{"OOB interface without IPv4", "roce-2dev", []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth9"},
			[]string{"oob-if/"}, "doctor: problem=oob-if oob_if=eth9 want=MPIB_OOB_IF naming the SOUT interface"},
		{"OOB interface is loopback", "roce-2dev", []string{"MPIB_HCA_SOUT=mlx5_0,mlx5_2", "MPIB_HCA_SUP=mlx5_1,mlx5_3", "MPIB_OOB_IF=lo"},
			[]string{"oob-if/"}, "doctor: problem=oob-if oob_if=lo address=127.0.0.1 want=MPIB_OOB_IF naming the SOUT interface, whose IPv4 address the peers reach (127.0.0.1 is loopback)"},
		{"P_Key index beyond the ports' tables", "roce-2dev", append([]string{"NCCL_IB_PKEY=1"}, roce2dev...),
			[]string{"config/SOUT", "config/SUP", "config/SOUT", "config/SUP"},
			"doctor: problem=config device=0 rail=SOUT port=mlx5_0:1 pkey_index=1 pkeys=1 want=a P_Key index inside the port's table (NCCL_IB_PKEY is an index into it): set NCCL_IB_PKEY below 1 (ls /sys/class/infiniband/mlx5_0/ports/1/pkeys), or unset it for index 0"},
		{"the only SUP port of a device down", "roce-mesh", []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_9", "MPIB_OOB_IF=eth0"},
			[]string{"port-down/SUP"}, "doctor: problem=port-down device=0 rail=SUP port=mlx5_9:1 state=DOWN"},
		{"SUP link down, SOUT on InfiniBand", "ib-sup-down", []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=ib0"},
			[]string{"port-down/SUP"},
			"doctor: problem=port-down device=0 rail=SUP port=mlx5_1:1 state=DOWN phys_state=Disabled want=state ACTIVE: bring the netdev up (ip link set dev eth1 up)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := inspectFixture(t, c.fixture, c.env...)
			out := lines(r)
			if got := strings.Join(kinds(r.Problems), " "); got != strings.Join(c.want, " ") {
				t.Errorf("problems %q, want %q\n%s", got, strings.Join(c.want, " "), out)
			}
			if !strings.Contains(out, c.line) {
				t.Errorf("no line with\n%s\nin\n%s", c.line, out)
			}
			if Exit(r, nil) != ExitProblems {
				t.Errorf("exit %d, want %d", Exit(r, nil), ExitProblems)
			}
		})
	}
}

func TestInspectInfiniBand(t *testing.T) {
	r := inspectFixture(t, "ib-sup-down", "MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=ib0")
	s := r.Devices[0].Sout
	if s.LinkLayer != "InfiniBand" || s.GIDIndex != 0 || s.ActiveMTU != 0 || s.GIDType != "IB" || s.SpeedMbps != 100000 {
		t.Errorf("InfiniBand SOUT = %+v, want GID 0, MTU unknown, 100 Gb/s", s)
	}
	if !strings.Contains(lines(r), "doctor: device=0 rail=SOUT port=mlx5_0:1 state=ACTIVE mtu=unknown link_layer=InfiniBand gid_index=0 address=fe80::2:c903:1:1 numa=0 gpu=none netdev=none netdev_mtu=unknown speed_mbps=100000 pci=0000:3b:00.0") {
		t.Errorf("SOUT line:\n%s", lines(r))
	}
}

// routeFile writes routes as /proc/net/route lists them (little-endian, as the fixtures).
func routeFile(t *testing.T, routes ...rules.Route) string {
	t.Helper()
	le := func(a netip.Addr) uint32 { return binary.LittleEndian.Uint32(a.AsSlice()) }
	var b strings.Builder
	b.WriteString("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n")
	for _, r := range routes {
		mask := netip.AddrFrom4([4]byte{})
		if bits := r.Dst.Bits(); bits > 0 {
			m := ^uint32(0) << (32 - bits)
			mask = netip.AddrFrom4([4]byte{byte(m >> 24), byte(m >> 16), byte(m >> 8), byte(m)})
		}
		gw, flags := uint32(0), 1
		if r.Via.IsValid() {
			gw, flags = le(r.Via), 3
		}
		fmt.Fprintf(&b, "%s\t%08X\t%08X\t%04X\t0\t0\t0\t%08X\t0\t0\t0\n", r.Dev, le(r.Dst.Addr()), gw, flags, le(mask))
	}
	file := filepath.Join(t.TempDir(), "route")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// The SUP subnet check takes only the routes that leave on the port's netdev: the kernel
// resolves a RoCE v2 address bound to the GID's netdev. A subnet with no route there is no
// problem of the node (a policy-routing table may hold one; /proc/net/route shows the main
// table only).
func TestInspectRoutes(t *testing.T) {
	own := []rules.Route{rt("10.0.1.0/24", "", "eth0"), rt("10.0.2.0/24", "10.0.1.1", "eth0"), rt("10.0.3.0/24", "", "eth2"),
		rt("10.9.3.0/24", "", "eth3")}
	for _, c := range []struct {
		name   string
		routes []rules.Route
		line   string // a line the output must have
	}{
		{"another SUP NIC on the same subnet, its route listed first", append(append([]rules.Route{}, own...),
			rt("10.9.1.0/24", "", "eth3"), rt("10.9.1.0/24", "", "eth1")),
			"doctor: device=0 rail=SUP port=mlx5_1:1 state=ACTIVE"},
		{"the connected route gone", own, " routes=none\n"},
		{"the SUP subnet only through SOUT", append(append([]rules.Route{}, own...), rt("10.9.0.0/16", "10.0.1.1", "eth0")),
			"rail=SUP port=mlx5_1:1 state=ACTIVE"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := FixtureHost("testdata/roce-2dev", "n1")
			h.RouteFile = routeFile(t, c.routes...)
			r := Inspect(h, envOf(roce2dev...))
			if len(r.Problems) != 0 || !strings.Contains(lines(r), c.line) {
				t.Errorf("problems %v, want none and a line with %q\n%s", kinds(r.Problems), c.line, lines(r))
			}
		})
	}
}

// fixtureWithout is a fixture tree without the given paths: a temporary root whose entries
// link to the fixture's, with real directories only on the way to what is left out.
func fixtureWithout(t *testing.T, fixture string, hidden ...string) string {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	onTheWay := func(rel string) bool {
		for _, h := range hidden {
			if strings.HasPrefix(h, rel+"/") {
				return true
			}
		}
		return false
	}
	var mirror func(rel string)
	mirror = func(rel string) {
		ents, err := os.ReadDir(filepath.Join(src, rel))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			p := filepath.Join(rel, e.Name())
			switch {
			case slices.Contains(hidden, p):
			case onTheWay(p):
				if err := os.Mkdir(filepath.Join(root, p), 0o755); err != nil {
					t.Fatal(err)
				}
				mirror(p)
			default:
				if err := os.Symlink(filepath.Join(src, p), filepath.Join(root, p)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	mirror("")
	return root
}

// libibverbs lists only the devices whose /dev/infiniband/uverbsN it finds, and opens that
// node read-write: a container without it leaves the plugin with no device.
func TestInspectVerbsDevice(t *testing.T) {
	for _, c := range []struct {
		name   string
		hidden []string
		want   []string
		line   string
	}{
		{"no /dev/infiniband in the container", []string{"dev"}, []string{"no-device/SOUT", "no-device/SUP"},
			"doctor: problem=no-device device=0 rail=SOUT port=mlx5_0:1 verbs=/dev/infiniband/uverbs0 error=no_such_file_or_directory want=read-write access to mlx5_0's verbs device (libibverbs lists no device whose node is missing, and opens it read-write): mount /dev/infiniband into the container (docker --device=/dev/infiniband, or request the RDMA device plugin's resource in Kubernetes)"},
		{"one node missing", []string{"dev/infiniband/uverbs1"}, []string{"no-device/SUP"},
			"doctor: problem=no-device device=0 rail=SUP port=mlx5_1:1 verbs=/dev/infiniband/uverbs1 error=no_such_file_or_directory"},
		{"ib_uverbs not loaded", []string{"sys/class/infiniband_verbs"}, []string{"no-device/SOUT", "no-device/SUP"},
			"doctor: problem=no-device device=0 rail=SUP port=mlx5_1:1 verbs=none want=mlx5_1's verbs device (/dev/infiniband/uverbsN): load ib_uverbs (modprobe ib_uverbs)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := Inspect(FixtureHost(fixtureWithout(t, "roce-2dev", c.hidden...), "n1"), envOf(oneDev...))
			if got := strings.Join(kinds(r.Problems), " "); got != strings.Join(c.want, " ") || !strings.Contains(lines(r), c.line) {
				t.Errorf("problems %q, want %q with\n%s\nin\n%s", got, strings.Join(c.want, " "), c.line, lines(r))
			}
		})
	}
}

// A node the job's user may not open is found too (root opens any file: nothing to test).
func TestInspectVerbsUnopenable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root opens a file of any mode")
	}
	root := fixtureWithout(t, "roce-2dev", "dev/infiniband/uverbs1")
	if err := os.WriteFile(filepath.Join(root, "dev/infiniband/uverbs1"), nil, 0o400); err != nil {
		t.Fatal(err)
	}
	r := Inspect(FixtureHost(root, "n1"), envOf(oneDev...))
	want := "doctor: problem=no-device device=0 rail=SUP port=mlx5_1:1 verbs=/dev/infiniband/uverbs1 error=permission_denied want=read-write access to mlx5_1's verbs device (libibverbs lists no device whose node is missing, and opens it read-write): give the job's user read and write access to /dev/infiniband/uverbs1 (the kernel makes it mode 0666)"
	if got := strings.Join(kinds(r.Problems), " "); got != "no-device/SUP" || !strings.Contains(lines(r), want) {
		t.Errorf("problems %q, want no-device/SUP with\n%s\nin\n%s", got, want, lines(r))
	}
}

var meshEnv = []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_8+mlx5_9+mlx5_10", "MPIB_OOB_IF=eth0"}

// A mesh device runs on its SUP ports that are up: one neighbour's link down is no node problem.
func TestInspectMesh(t *testing.T) {
	r := inspectFixture(t, "roce-mesh", meshEnv...)
	if len(r.Problems) != 0 || Exit(r, nil) != ExitHealthy {
		t.Fatalf("problems %v, want none\n%s", kinds(r.Problems), lines(r))
	}
	var described []bool
	for _, p := range r.Devices[0].Sup {
		described = append(described, p.Described)
	}
	if !slices.Equal(described, []bool{true, false, true}) {
		t.Errorf("described %v, want the down mlx5_9 left out", described)
	}
	if !strings.Contains(lines(r), "doctor: device=0 rail=SUP port=mlx5_9:1 state=DOWN") {
		t.Errorf("no line for the down port\n%s", lines(r))
	}
}

func TestInspectInvalidConfig(t *testing.T) {
	for _, env := range [][]string{
		{"MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0"},
		{"MPIB_HCA_SOUT=mlx5_0,mlx5_2", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0"},
		{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0", "MPIB_ISLAND_PREFIX_LEN=40"},
	} {
		r := inspectFixture(t, "roce-2dev", env...)
		if r.Config == "" || Exit(r, nil) != ExitConfig || len(r.Problems) != 1 || r.Problems[0].Kind != KindConfig {
			t.Errorf("%v: config %q, exit %d, problems %v; want exit 2 and one config problem", env, r.Config, Exit(r, nil), kinds(r.Problems))
		}
		if out := lines(r); !strings.HasPrefix(out, "doctor: problem=config want=a valid MPIB configuration: MPIB_") {
			t.Errorf("%v: %s", env, out)
		}
	}
}

// An MPIB_* name the plugin ignores is a note: printed, never counted against the node.
func TestConfigNotes(t *testing.T) {
	r := inspectFixture(t, "roce-2dev", roce2dev...)
	r.Notes = ConfigNotes([]string{ // as config.Unknown words them
		"MPIB_SOUT_QPS is not an MPIB setting and is ignored (did you mean MPIB_SOUT_QP?)",
		"MPIB_COLOUR is not an MPIB setting and is ignored",
	})
	out := lines(r)
	for _, want := range []string{
		"doctor: note=config variable=MPIB_SOUT_QPS want=only MPIB_* variables the plugin reads: MPIB_SOUT_QPS is not an MPIB setting and is ignored (did you mean MPIB_SOUT_QP?): correct its name or unset it\n",
		"doctor: note=config variable=MPIB_COLOUR want=only MPIB_* variables the plugin reads: MPIB_COLOUR is not an MPIB setting and is ignored: correct its name or unset it\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no line\n%s\nin\n%s", want, out)
		}
	}
	if len(r.Problems) != 0 || Exit(r, nil) != ExitHealthy {
		t.Errorf("notes made the node unhealthy: problems %v, exit %d", kinds(r.Problems), Exit(r, nil))
	}
	if len(ConfigNotes(nil)) != 0 {
		t.Errorf("notes from no ignored variable")
	}
}

// An OOB address on the link-local range reaches no peer: a problem, as loopback is.
func TestInspectOOBLinkLocal(t *testing.T) {
	h := FixtureHost("testdata/roce-2dev", "n1")
	addrs := h.Addrs
	h.Addrs = func() ([]IfAddr, error) {
		a, err := addrs()
		return append(a, IfAddr{Dev: "eth7", Prefix: netip.MustParsePrefix("169.254.3.4/16")}), err
	}
	r := Inspect(h, envOf("MPIB_HCA_SOUT=mlx5_0,mlx5_2", "MPIB_HCA_SUP=mlx5_1,mlx5_3", "MPIB_OOB_IF=eth7"))
	want := "doctor: problem=oob-if oob_if=eth7 address=169.254.3.4 want=MPIB_OOB_IF naming the SOUT interface, whose IPv4 address the peers reach (169.254.3.4 is link-local)"
	if got := strings.Join(kinds(r.Problems), " "); got != "oob-if/" || !strings.Contains(lines(r), want) || Exit(r, nil) != ExitProblems {
		t.Errorf("problems %q exit %d, want oob-if and exit 1 with\n%s\nin\n%s", got, Exit(r, nil), want, lines(r))
	}
}

// MPIB_OOB_IF on a SUP port's netdev is a note: the control path then follows the SUP
// subnet, which a routed fabric may still carry, so it is no problem of the node.
func TestInspectOOBOnSup(t *testing.T) {
	r := inspectFixture(t, "roce-2dev", "MPIB_HCA_SOUT=mlx5_0,mlx5_2", "MPIB_HCA_SUP=mlx5_1,mlx5_3", "MPIB_OOB_IF=eth1")
	want := "doctor: note=oob-if port=mlx5_1:1 oob_if=eth1 want=MPIB_OOB_IF naming the SOUT interface (eth1 is the netdev of SUP port mlx5_1:1)"
	if len(r.Problems) != 0 || Exit(r, nil) != ExitHealthy || len(r.Notes) != 1 || !strings.Contains(lines(r), want) {
		t.Errorf("problems %v notes %v exit %d, want one note\n%s\nin\n%s", kinds(r.Problems), kinds(r.Notes), Exit(r, nil), want, lines(r))
	}
	if r := inspectFixture(t, "roce-2dev", roce2dev...); len(r.Notes) != 0 {
		t.Errorf("notes %v on the SOUT netdev", kinds(r.Notes))
	}
}
