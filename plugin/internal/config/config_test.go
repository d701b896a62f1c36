package config

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

var base = []string{"MPIB_HCA_SOUT", "mlx5_0", "MPIB_HCA_SUP", "mlx5_1:2", "MPIB_OOB_IF", "eth0"}

func TestParseDefaults(t *testing.T) {
	c, err := Parse(env(base...))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Devices:         []Device{{Sout: Rail{"mlx5_0", 1, -1}, Sup: Rail{"mlx5_1", 2, -1}, SupPorts: []Rail{{"mlx5_1", 2, -1}}, RailID: 0, PlaneID: NoID}},
		OOBInterface:    "eth0",
		IslandPrefixLen: 24, SoutQPs: 1, SupQPs: 1, ForceSupBW: -1, ShmPath: DefaultShmPath(),
		AgentStaleMS: 500, IBTimeout: 20, IBRetryCnt: 6, DetectMS: 600, IBTC: -1, IBSL: -1, FifoTC: -1, RelaxedOrdering: true,
		HandshakeTimeoutMS: 120000, ECE: true, GID: GIDPolicy{RoCEVersion: 2}, UseInline: true, WholeMsgMax: 65536,
		Failover: true, RecoveryBackoffMS: 250, RecoveryBackoffMax: 2000, FailoverTimeoutMS: 5000, StallTimeoutMS: 30000,
		StandbyDefer: true, GoTraceS: 10,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", c, want)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		kv   []string
		want string // substring of the error
	}{
		{"no SOUT", []string{"MPIB_HCA_SUP", "b", "MPIB_OOB_IF", "eth0"}, "MPIB_HCA_SOUT is required"},
		{"no SUP", []string{"MPIB_HCA_SOUT", "a", "MPIB_OOB_IF", "eth0"}, "MPIB_HCA_SUP is required"},
		{"no OOB", []string{"MPIB_HCA_SOUT", "a", "MPIB_HCA_SUP", "b"}, "MPIB_OOB_IF is required"},
		{"bad port", append([]string{"MPIB_HCA_SOUT", "a:x"}, base[2:]...), "port must be 1..255"},
		{"same port", []string{"MPIB_HCA_SOUT", "a", "MPIB_HCA_SUP", "a:1", "MPIB_OOB_IF", "e"}, "MPIB_HCA_SUP entry 0 (a:1) is MPIB_HCA_SOUT entry 0: a port serves one fabric"},
		{"rails given for some entries", []string{"MPIB_HCA_SOUT", "m0:1:1,m1", "MPIB_HCA_SUP", "p0,p1", "MPIB_OOB_IF", "e"}, "entry 1 (m1) gives no RAIL while entry 0 (m0) does"},
		{"counts differ", []string{"MPIB_HCA_SOUT", "a,b,c", "MPIB_HCA_SUP", "x,y", "MPIB_OOB_IF", "e"}, "MPIB_HCA_SOUT names 3 HCAs and MPIB_HCA_SUP 2"},
		{"SOUT twice", []string{"MPIB_HCA_SOUT", "a,a:1", "MPIB_HCA_SUP", "x,y", "MPIB_OOB_IF", "e"}, "MPIB_HCA_SOUT names a:1 twice (entries 0 and 1)"},
		{"SUP ids", []string{"MPIB_HCA_SOUT", "a", "MPIB_HCA_SUP", "x:1:0", "MPIB_OOB_IF", "e"}, "MPIB_HCA_SUP entry 0 (\"x:1:0\"): want NAME[:PORT] (the device's rail and plane come from MPIB_HCA_SOUT)"},
		{"five fields", []string{"MPIB_HCA_SOUT", "a:1:0:0:9", "MPIB_HCA_SUP", "x", "MPIB_OOB_IF", "e"}, "want NAME[:PORT[:RAIL[:PLANE]]]"},
		{"bad rail", []string{"MPIB_HCA_SOUT", "a,b:1:r", "MPIB_HCA_SUP", "x,y", "MPIB_OOB_IF", "e"}, "MPIB_HCA_SOUT entry 1 (\"b:1:r\"): rail must be 0..32767"},
		{"bad plane", []string{"MPIB_HCA_SOUT", "a:1:0:-2", "MPIB_HCA_SUP", "x", "MPIB_OOB_IF", "e"}, "plane must be 0..32767"},
		{"empty entry", []string{"MPIB_HCA_SOUT", "a,", "MPIB_HCA_SUP", "x,y", "MPIB_OOB_IF", "e"}, "MPIB_HCA_SOUT entry 1 (\"\"): not an HCA name"},
		{"exclude prefix", []string{"MPIB_HCA_SOUT", "^mlx5_0", "MPIB_HCA_SUP", "x", "MPIB_OOB_IF", "e"}, "no NCCL_IB_HCA ^ or = prefix"},
		{"17 devices", []string{"MPIB_HCA_SOUT", "a0,a1,a2,a3,a4,a5,a6,a7,a8,a9,a10,a11,a12,a13,a14,a15,a16", "MPIB_HCA_SUP", "x", "MPIB_OOB_IF", "e"}, "at most 16 fused devices"},
		{"mode 2", append(append([]string{}, base...), "MPIB_MODE", "2"), "MPIB_MODE=\"2\""},
		{"prefix 33", append(append([]string{}, base...), "MPIB_ISLAND_PREFIX_LEN", "33"), "0..32"},
		{"qps 0", append(append([]string{}, base...), "MPIB_SUP_QP", "0"), "MPIB_SUP_QP"},
		{"trace 0 s", append(append([]string{}, base...), "MPIB_GO_TRACE", "/tmp/t", "MPIB_GO_TRACE_S", "0"), "MPIB_GO_TRACE_S"},
		{"force 1025", append(append([]string{}, base...), "MPIB_FORCE_SUP_BW", "1025"), "0..1024"},
		{"gid text", append(append([]string{}, base...), "MPIB_GID_INDEX_SUP", "x"), "MPIB_GID_INDEX_SUP"},
		{"two SOUT ports", []string{"MPIB_HCA_SOUT", "a+b", "MPIB_HCA_SUP", "x", "MPIB_OOB_IF", "e"}, "MPIB_HCA_SOUT entry 0 (\"a+b\"): a fused device has one SOUT port"},
		{"nine SUP ports", []string{"MPIB_HCA_SOUT", "a", "MPIB_HCA_SUP", "p0+p1+p2+p3+p4+p5+p6+p7+p8", "MPIB_OOB_IF", "e"}, "9 SUP ports: at most 8 per fused device"},
		{"SUP port twice", []string{"MPIB_HCA_SOUT", "a", "MPIB_HCA_SUP", "x+y+x:1", "MPIB_OOB_IF", "e"}, "MPIB_HCA_SUP entry 0 (\"x+y+x:1\"): names x:1 twice"},
		{"empty SUP port", []string{"MPIB_HCA_SOUT", "a", "MPIB_HCA_SUP", "x+", "MPIB_OOB_IF", "e"}, "MPIB_HCA_SUP entry 0 (\"x+\"): port 1 (\"\"): not an HCA name"},
		{"SUP port with ids", []string{"MPIB_HCA_SOUT", "a", "MPIB_HCA_SUP", "x+y:1:3", "MPIB_OOB_IF", "e"}, "port 1 (\"y:1:3\"): want NAME[:PORT]"},
		{"second SUP port is SOUT's", []string{"MPIB_HCA_SOUT", "a,b", "MPIB_HCA_SUP", "x,y+a", "MPIB_OOB_IF", "e"}, "MPIB_HCA_SUP entry 1 (a:1) is MPIB_HCA_SOUT entry 0: a port serves one fabric"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(env(tt.kv...))
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want ErrInvalid containing %q", err, tt.want)
			}
		})
	}
}

// TestParseDevices: the lists of an 8-GPU node (one SOUT and one SUP NIC per GPU), of one
// whose SUP NICs serve pairs of GPUs, NCCL_IB_HCA's rail and plane fields, and SUP entries
// of several ports (a direct-attach mesh, one port per cable).
func TestParseDevices(t *testing.T) {
	r := func(name string, port int) Rail { return Rail{name, port, -1} }
	dev := func(sout Rail, rail, plane int, sup ...Rail) Device {
		return Device{Sout: sout, Sup: sup[0], SupPorts: sup, RailID: rail, PlaneID: plane}
	}
	tests := []struct {
		name      string
		sout, sup string
		want      []Device
		nics      int
		index     []DeviceNICs
	}{
		{"one pair", "mlx5_0", "mlx5_1:2", []Device{dev(r("mlx5_0", 1), 0, NoID, r("mlx5_1", 2))}, 2, []DeviceNICs{{0, []int{1}}}},
		{"two pairs", "s0, s1", "p0,p1", []Device{dev(r("s0", 1), 0, NoID, r("p0", 1)), dev(r("s1", 1), 1, NoID, r("p1", 1))},
			4, []DeviceNICs{{0, []int{2}}, {1, []int{3}}}},
		{"shared SUP", "s0,s1,s2,s3", "p0,p0,p1,p1", []Device{dev(r("s0", 1), 0, NoID, r("p0", 1)),
			dev(r("s1", 1), 1, NoID, r("p0", 1)), dev(r("s2", 1), 2, NoID, r("p1", 1)), dev(r("s3", 1), 3, NoID, r("p1", 1))},
			6, []DeviceNICs{{0, []int{4}}, {1, []int{4}}, {2, []int{5}}, {3, []int{5}}}},
		{"rail and plane", "s0:1:4:1,s1:2:5", "p0,p1:2", []Device{dev(r("s0", 1), 4, 1, r("p0", 1)), dev(r("s1", 2), 5, NoID, r("p1", 2))},
			4, []DeviceNICs{{0, []int{2}}, {1, []int{3}}}},
		{"one NIC, two ports", "m0:1", "m0:2", []Device{dev(r("m0", 1), 0, NoID, r("m0", 2))}, 2, []DeviceNICs{{0, []int{1}}}},
		{"mesh: two SUP ports", "mlx5_0", "mlx5_2+mlx5_3", []Device{dev(r("mlx5_0", 1), 0, NoID, r("mlx5_2", 1), r("mlx5_3", 1))},
			3, []DeviceNICs{{0, []int{1, 2}}}},
		{"mesh: a Spark port's two functions, spaces", "s0", " rocep1s0f0 + rocep1s0f1:1 ", []Device{dev(r("s0", 1), 0, NoID, r("rocep1s0f0", 1), r("rocep1s0f1", 1))},
			3, []DeviceNICs{{0, []int{1, 2}}}},
		{"mesh: two devices share a port", "s0,s1", "p0+p1,p1+p2", []Device{dev(r("s0", 1), 0, NoID, r("p0", 1), r("p1", 1)), dev(r("s1", 1), 1, NoID, r("p1", 1), r("p2", 1))},
			5, []DeviceNICs{{0, []int{2, 3}}, {1, []int{3, 4}}}},
		{"eight SUP ports", "s", "p0+p1+p2+p3+p4+p5+p6+p7", []Device{dev(r("s", 1), 0, NoID, r("p0", 1), r("p1", 1), r("p2", 1), r("p3", 1), r("p4", 1), r("p5", 1), r("p6", 1), r("p7", 1))},
			9, []DeviceNICs{{0, []int{1, 2, 3, 4, 5, 6, 7, 8}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse(env("MPIB_HCA_SOUT", tt.sout, "MPIB_HCA_SUP", tt.sup, "MPIB_OOB_IF", "eth0"))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Devices, tt.want) {
				t.Errorf("devices:\n got %+v\nwant %+v", c.Devices, tt.want)
			}
			nics, index := c.NICs()
			if len(nics) != tt.nics || !reflect.DeepEqual(index, tt.index) {
				t.Errorf("NICs: %d %v, want %d %v", len(nics), index, tt.nics, tt.index)
			}
			for d, ix := range index {
				if nics[ix.Sout].Rail != c.Devices[d].Sout || nics[ix.Sout].Role != 0 {
					t.Errorf("device %d: SOUT NIC %+v, want %+v", d, nics[ix.Sout], c.Devices[d].Sout)
				}
				for i, n := range ix.Sup {
					if nics[n].Rail != c.Devices[d].SupPorts[i] || nics[n].Role != 1 {
						t.Errorf("device %d: SUP port %d NIC %+v, want %+v", d, i, nics[n], c.Devices[d].SupPorts[i])
					}
				}
			}
		})
	}
}

func TestParseOverrides(t *testing.T) {
	kv := append(append([]string{}, base...), "MPIB_MODE", "1", "MPIB_SUP_QP", "4", "MPIB_FORCE_SUP_BW", "512",
		"MPIB_GID_INDEX_SOUT", "3", "MPIB_SUP_RELAY", "1", "MPIB_ISLAND_PREFIX_LEN", "16")
	c, err := Parse(env(kv...))
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode != 1 || c.SupQPs != 4 || c.ForceSupBW != 512 || c.Devices[0].Sout.GIDIndex != 3 || !c.SupRelay || c.IslandPrefixLen != 16 {
		t.Fatalf("overrides not applied: %+v", c)
	}
}

// A job tuned for NCCL_NET=IB keeps its NCCL_IB_* settings on MPIB; an MPIB_* variable wins.
func TestNCCLKnobPrecedence(t *testing.T) {
	tests := []struct {
		name string
		kv   []string
		get  func(Config) any
		want any
	}{
		{"NCCL_IB_TC alone", []string{"NCCL_IB_TC", "106"}, func(c Config) any { return c.IBTC }, 106},
		{"MPIB_IB_TC wins", []string{"NCCL_IB_TC", "106", "MPIB_IB_TC", "32"}, func(c Config) any { return c.IBTC }, 32},
		{"TC unset", nil, func(c Config) any { return c.IBTC }, -1},
		{"NCCL_IB_SL", []string{"NCCL_IB_SL", "3"}, func(c Config) any { return c.IBSL }, 3},
		{"NCCL_IB_TIMEOUT", []string{"NCCL_IB_TIMEOUT", "14"}, func(c Config) any { return c.IBTimeout }, 14},
		{"MPIB_IB_TIMEOUT wins", []string{"NCCL_IB_TIMEOUT", "14", "MPIB_IB_TIMEOUT", "18"}, func(c Config) any { return c.IBTimeout }, 18},
		{"NCCL_IB_RETRY_CNT", []string{"NCCL_IB_RETRY_CNT", "3"}, func(c Config) any { return c.IBRetryCnt }, 3},
		{"NCCL_IB_FIFO_TC", []string{"NCCL_IB_FIFO_TC", "184"}, func(c Config) any { return c.FifoTC }, 184},
		{"NCCL_IB_GID_INDEX both rails", []string{"NCCL_IB_GID_INDEX", "3"}, func(c Config) any { return [2]int{c.Devices[0].Sout.GIDIndex, c.Devices[0].Sup.GIDIndex} }, [2]int{3, 3}},
		{"MPIB_GID_INDEX_SUP wins on SUP", []string{"NCCL_IB_GID_INDEX", "3", "MPIB_GID_INDEX_SUP", "1"}, func(c Config) any { return [2]int{c.Devices[0].Sout.GIDIndex, c.Devices[0].Sup.GIDIndex} }, [2]int{3, 1}},
		{"relaxed ordering off", []string{"NCCL_IB_PCI_RELAXED_ORDERING", "0"}, func(c Config) any { return c.RelaxedOrdering }, false},
		{"MPIB_RELAXED_ORDERING wins", []string{"NCCL_IB_PCI_RELAXED_ORDERING", "0", "MPIB_RELAXED_ORDERING", "1"}, func(c Config) any { return c.RelaxedOrdering }, true},
		{"pkey index", []string{"NCCL_IB_PKEY", "2"}, func(c Config) any { return c.PKeyIndex }, 2},
		{"ECE off", []string{"NCCL_IB_ECE_ENABLE", "0"}, func(c Config) any { return c.ECE }, false},
		{"inline off", []string{"NCCL_IB_USE_INLINE", "0"}, func(c Config) any { return c.UseInline }, false},
		{"flush disable", []string{"NCCL_GDR_FLUSH_DISABLE", "1"}, func(c Config) any { return c.GDRFlushDisable }, true},
		{"standby deferred by default", nil, func(c Config) any { return c.StandbyDefer }, true},
		{"standby built at connect", []string{"MPIB_STANDBY_DEFER", "0"}, func(c Config) any { return c.StandbyDefer }, false},
		{"Go trace", []string{"MPIB_GO_TRACE", " /tmp/mpib ", "MPIB_GO_TRACE_S", "3"}, func(c Config) any { return [2]any{c.GoTrace, c.GoTraceS} }, [2]any{"/tmp/mpib", 3}},
		{"RoCE v1", []string{"NCCL_IB_ROCE_VERSION_NUM", "1"}, func(c Config) any { return c.GID.RoCEVersion }, 1},
		{"IPv6 family and range", []string{"NCCL_IB_ADDR_FAMILY", "AF_INET6", "NCCL_IB_ADDR_RANGE", "fd00::1/64"},
			func(c Config) any { return c.GID }, GIDPolicy{RoCEVersion: 2, IPv6: true, Range: netip.MustParsePrefix("fd00::/64")}},
		{"IPv4 range", []string{"NCCL_IB_ADDR_RANGE", "10.9.1.7/24"}, func(c Config) any { return c.GID.Range }, netip.MustParsePrefix("10.9.1.0/24")},
	}
	for _, tt := range tests {
		c, err := Parse(env(append(append([]string{}, base...), tt.kv...)...))
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if got := tt.get(c); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
	for _, bad := range [][]string{{"NCCL_IB_ADDR_FAMILY", "inet"}, {"NCCL_IB_ADDR_RANGE", "10.0.0.0"},
		{"NCCL_IB_ADDR_RANGE", "fd00::/64"}, {"NCCL_IB_TC", "256"}, {"NCCL_IB_SL", "16"}} {
		if _, err := Parse(env(append(append([]string{}, base...), bad...)...)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestEveryKnobIsRead(t *testing.T) {
	read := map[string]bool{}
	Parse(func(k string) string { read[k] = true; return "" })
	for _, k := range Knobs {
		if !read[k.Name] {
			t.Errorf("knob %s is documented but never read", k.Name)
		}
	}
	if len(read) != len(Knobs) {
		t.Errorf("Parse reads %d variables, Knobs documents %d", len(read), len(Knobs))
	}
}

func TestConfigurationDocListsEveryKnob(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Knobs {
		row := "| `" + k.Name + "` | " + k.Default + " | " + k.Meaning + " |"
		if !strings.Contains(string(doc), row) {
			t.Errorf("docs/configuration.md lacks the row %q", row)
		}
	}
}

func TestUnknownNamesMisspeltKnobs(t *testing.T) {
	got := Unknown([]string{"PATH=/bin", "MPIB_MODE=0", "MPIB_SOUT_QPS=4", "MPIB_GID_INDEX=3", "MPIB_ISLAND_PREFIX=16",
		"MPIB_LAB_MODE=tcg", "MPIB_BENCH=1", "MPIB_BENCH_PAIRS=7", "MPIB_TEST_HOSTILE=x", "MPIB_ZZZZZZZZZZZZ=1", "NCCL_IB_HCA=mlx5",
		"MPIB_DETECT_MS"})
	want := []string{
		"MPIB_SOUT_QPS is not an MPIB setting and is ignored (did you mean MPIB_SOUT_QP?)",
		"MPIB_GID_INDEX is not an MPIB setting and is ignored (did you mean MPIB_GID_INDEX_SOUT or MPIB_GID_INDEX_SUP?)",
		"MPIB_ISLAND_PREFIX is not an MPIB setting and is ignored (did you mean MPIB_ISLAND_PREFIX_LEN?)",
		"MPIB_ZZZZZZZZZZZZ is not an MPIB setting and is ignored",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Unknown:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Every MPIB_* name the repository's Go and C code reads is a knob or one of the tools':
// a new tool variable that the list misses would make every plugin process warn about it.
func TestToolVariablesCoverTheRepository(t *testing.T) {
	quoted := regexp.MustCompile(`"(MPIB_[A-Z0-9_]*[A-Z0-9])"`)
	seen := map[string]string{}
	for _, dir := range []string{"../../..", "../../../integration", "../../../internal", "../../../plugin", "../../../plugin/nettest",
		"../../../plugin/ctest", "../../../agent/go/doctor"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, f := range files {
			if ext := filepath.Ext(f); ext != ".go" && ext != ".c" && ext != ".h" {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range quoted.FindAllStringSubmatch(string(b), -1) {
				seen[m[1]] = f
			}
		}
	}
	bare := regexp.MustCompile(`\bMPIB_[A-Z0-9_]*[A-Z0-9]\b`) // shell, Python and container files
	for _, pattern := range []string{"../../../scripts/*.sh", "../../../.ci/run", "../../../containers/node/*",
		"../../../agent/python/src/mpib_agent/*.py"} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // a directory
			}
			for _, name := range bare.FindAllString(string(b), -1) {
				seen[name] = f
			}
		}
	}
	if len(seen) < 20 {
		t.Fatalf("found only %d MPIB_* names: the scan is looking in the wrong place", len(seen))
	}
	for name, f := range seen {
		if !isKnob(name) && !isToolVariable(name) {
			t.Errorf("%s (read in %s) is neither a knob nor in toolVariables", name, f)
		}
	}
}

func TestMinusOneIsUnsetAsInNCCL(t *testing.T) {
	c, err := Parse(env(append(append([]string{}, base...), "NCCL_IB_GID_INDEX", "-1", "NCCL_IB_TC", "-1", "NCCL_IB_SL", "-1",
		"NCCL_IB_FIFO_TC", "-1")...))
	if err != nil {
		t.Fatal(err)
	}
	if c.Devices[0].Sout.GIDIndex != -1 || c.IBTC != -1 || c.IBSL != -1 || c.FifoTC != -1 {
		t.Errorf("-1 read as %d %d %d %d, want unset (-1)", c.Devices[0].Sout.GIDIndex, c.IBTC, c.IBSL, c.FifoTC)
	}
	c, err = Parse(env(append(append([]string{}, base...), "MPIB_GID_INDEX_SUP", "-1", "NCCL_IB_GID_INDEX", "3")...))
	if err != nil || c.Devices[0].SupPorts[0].GIDIndex != -1 || c.Devices[0].Sout.GIDIndex != 3 {
		t.Errorf("MPIB_GID_INDEX_SUP=-1 NCCL_IB_GID_INDEX=3: SUP %d SOUT %d (%v), want SUP auto (-1), SOUT 3", c.Devices[0].SupPorts[0].GIDIndex,
			c.Devices[0].Sout.GIDIndex, err)
	}
	if _, err := Parse(env(append(append([]string{}, base...), "NCCL_IB_TC", "-2")...)); err == nil {
		t.Error("NCCL_IB_TC=-2 accepted")
	}
}

// TestSurviving: a port that did not open (a SOUT port down, a NIC absent) leaves out only the
// devices that use it; the others keep their ports and their rail ids.
func TestSurviving(t *testing.T) {
	tests := []struct {
		name, sout, sup string
		failed          []string // NICs (name) that did not open
		wantRails       []int
		wantDropped     []int
	}{
		{"all open", "s0,s1,s2,s3", "p0,p1,p2,p3", nil, []int{0, 1, 2, 3}, nil},
		{"one SOUT down of eight", "s0,s1,s2,s3,s4,s5,s6,s7", "p0,p1,p2,p3,p4,p5,p6,p7", []string{"s5"},
			[]int{0, 1, 2, 3, 4, 6, 7}, []int{5}},
		{"a shared SUP NIC absent", "s0,s1,s2,s3", "p0,p0,p1,p1", []string{"p0"}, []int{2, 3}, []int{0, 1}},
		{"a mesh port absent", "s0,s1", "p0+p1,p2+p3", []string{"p3"}, []int{0}, []int{1}},
		{"explicit rails kept", "s0:1:4,s1:1:5,s2:1:6", "p0,p1,p2", []string{"p1"}, []int{4, 6}, []int{1}},
		{"everything down", "s0,s1", "p0,p1", []string{"s0", "s1"}, nil, []int{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse(env("MPIB_HCA_SOUT", tt.sout, "MPIB_HCA_SUP", tt.sup, "MPIB_OOB_IF", "eth0"))
			if err != nil {
				t.Fatal(err)
			}
			nics, index := c.NICs()
			opened := make([]bool, len(nics))
			for i, n := range nics {
				opened[i] = !strings.Contains(","+strings.Join(tt.failed, ",")+",", ","+n.HCA+",")
			}
			kept, keptIndex, dropped := Surviving(c.Devices, index, opened)
			var rails []int
			for i, d := range kept {
				rails = append(rails, d.RailID)
				if nics[keptIndex[i].Sout].Rail != d.Sout {
					t.Errorf("kept device %d: SOUT index %d names %+v, want %+v", i, keptIndex[i].Sout, nics[keptIndex[i].Sout].Rail, d.Sout)
				}
			}
			if !reflect.DeepEqual(rails, tt.wantRails) || !reflect.DeepEqual(dropped, tt.wantDropped) {
				t.Errorf("rails %v dropped %v, want rails %v dropped %v", rails, dropped, tt.wantRails, tt.wantDropped)
			}
		})
	}
}
