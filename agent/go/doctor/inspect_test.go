package doctor

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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

// A SUP subnet whose connected route is gone (ip route del) is found on the node alone.
func TestInspectNoRoute(t *testing.T) {
	b, err := os.ReadFile("testdata/roce-2dev/proc/net/route")
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "eth1\t") {
			kept = append(kept, l)
		}
	}
	file := filepath.Join(t.TempDir(), "route")
	if err := os.WriteFile(file, []byte(strings.Join(kept, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	h := FixtureHost("testdata/roce-2dev", "n1")
	h.RouteFile = file
	r := Inspect(h, envOf(roce2dev...))
	want := "doctor: problem=no-route device=0 rail=SUP port=mlx5_1:1 subnet=10.9.1.0/24 netdev=eth1 route_dev=none want=a route to 10.9.1.0/24 leaving on eth1: ip route replace 10.9.1.0/24 dev eth1 proto kernel scope link src 10.9.1.11"
	if got := strings.Join(kinds(r.Problems), " "); got != "no-route/SUP" || !strings.Contains(lines(r), want) {
		t.Errorf("problems %q, want no-route/SUP with\n%s\nin\n%s", got, want, lines(r))
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
