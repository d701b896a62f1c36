package topo

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// A host with two root complexes on NUMA 0 and one on NUMA 1:
//
//	pci0000:00 ─ 00:01.0 ─ switch A (01:00.0) ─┬─ 02:00.0 ─ 03:00.0 (.0 and .1: one adapter)
//	                                             ├─ 02:01.0 ─ 04:00.0
//	                                             ├─ 02:02.0 ─ switch A2 (05:00.0) ─ 06:00.0 ─ 07:00.0
//	                                             └─ 02:03.0 ─ 08:00.0 (GPU)
//	           ─ 00:02.0 ─ switch B (11:00.0) ─┬─ 12:00.0 ─ 13:00.0
//	                                             └─ 12:01.0 ─ 18:00.0 (GPU)
//	           ─ 00:03.0 ─ 14:00.0 (on the root port, no switch)
//	pci0000:40 ─ 40:01.0 ─ 41:00.0 (no switch)
//	           ─ 40:02.0 ─ switch C (42:00.0) ─┬─ 43:00.0 ─ 44:00.0
//	                                             └─ 43:01.0 ─ 45:00.0 (GPU)
//	pci0000:80 ─ 80:01.0 ─ switch D (81:00.0) ─ 82:00.0 ─ 83:00.0   (NUMA 1)
const (
	hb0     = "/sys/devices/pci0000:00"
	swA     = hb0 + "/0000:00:01.0/0000:01:00.0"
	nicA    = swA + "/0000:02:00.0/0000:03:00.0"
	nicA1   = swA + "/0000:02:00.0/0000:03:00.1"
	nicA2   = swA + "/0000:02:01.0/0000:04:00.0"
	nicDeep = swA + "/0000:02:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0"
	gpuA    = swA + "/0000:02:03.0/0000:08:00.0"
	nicB    = hb0 + "/0000:00:02.0/0000:11:00.0/0000:12:00.0/0000:13:00.0"
	gpuB    = hb0 + "/0000:00:02.0/0000:11:00.0/0000:12:01.0/0000:18:00.0"
	nicRoot = hb0 + "/0000:00:03.0/0000:14:00.0"
	nicHB40 = "/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0"
	nicC    = "/sys/devices/pci0000:40/0000:40:02.0/0000:42:00.0/0000:43:00.0/0000:44:00.0"
	gpuC    = "/sys/devices/pci0000:40/0000:40:02.0/0000:42:00.0/0000:43:01.0/0000:45:00.0"
	nicD    = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0"
	virtual = "/sys/devices/virtual/net/eth0"
)

func TestParsePositionFollowsNCCLWalk(t *testing.T) {
	tests := []struct {
		path     string
		switches []string
	}{
		{nicA, []string{"0000:01:00.0"}},
		{nicDeep, []string{"0000:05:00.0", "0000:01:00.0"}},
		{nicRoot, nil},
		{"/tmp/fake" + nicB + "/", []string{"0000:11:00.0"}}, // a fake sysfs root and a trailing slash
	}
	for _, tt := range tests {
		pos, ok := parsePosition(tt.path)
		if !ok || !reflect.DeepEqual(pos.switches, tt.switches) {
			t.Errorf("parsePosition(%s) = %+v, %v; want switches %v", tt.path, pos, ok, tt.switches)
		}
	}
	for _, bad := range []string{"", virtual, "/sys/devices/pci0000:00", "0000:03:00.0",
		"/sys/devices/pci10000:e0/10000:e0:06.0/10000:e1:00.0"} {
		if pos, ok := parsePosition(bad); ok {
			t.Errorf("parsePosition(%q) accepted: %+v", bad, pos)
		}
	}
}

func TestPlace(t *testing.T) {
	tests := []struct {
		name         string
		sout, sup    RailPCI
		wantPath     string
		wantRelation Relation
		wantFarther  bool
		wantGDRSafe  bool
	}{
		{"one adapter", RailPCI{nicA, 0}, RailPCI{nicA1, 0}, nicA, RelationSameAdapter, false, true},
		{"same switch, same depth", RailPCI{nicA, 0}, RailPCI{nicA2, 0}, nicA, RelationSamePCIeSwitch, false, true},
		{"SUP under a nested switch", RailPCI{nicA, 0}, RailPCI{nicDeep, 0}, nicA, RelationSamePCIeSwitch, true, true},
		{"SOUT under a nested switch", RailPCI{nicDeep, 0}, RailPCI{nicA, 0}, nicDeep, RelationSamePCIeSwitch, false, true},
		{"two switches, one host bridge", RailPCI{nicA, 0}, RailPCI{nicB, 0}, nicA, RelationSameHostBridge, true, false},
		{"SUP on a root port", RailPCI{nicA, 0}, RailPCI{nicRoot, 0}, nicRoot, RelationSameHostBridge, true, true},
		{"SOUT on a root port", RailPCI{nicRoot, 0}, RailPCI{nicB, 0}, nicRoot, RelationSameHostBridge, false, true},
		{"SUP on another host bridge, no switch", RailPCI{nicB, 0}, RailPCI{nicHB40, 0}, nicHB40, RelationDifferentHostBridge, true, true},
		{"two host bridges, two switches", RailPCI{nicA, 0}, RailPCI{nicC, 0}, nicA, RelationDifferentHostBridge, true, false},
		{"both on root ports", RailPCI{nicRoot, 0}, RailPCI{nicHB40, 0}, nicRoot, RelationDifferentHostBridge, false, true},
		{"different NUMA", RailPCI{nicA, 0}, RailPCI{nicD, 1}, nicA, RelationDifferentNUMA, true, false},
		{"unknown NUMA is not different", RailPCI{nicA, -1}, RailPCI{nicA2, 1}, nicA, RelationSamePCIeSwitch, false, true},
		{"SUP not PCI", RailPCI{nicA, 0}, RailPCI{virtual, -1}, nicA, RelationUnknown, false, false},
		{"SOUT not PCI", RailPCI{"", -1}, RailPCI{nicB, 0}, nicB, RelationUnknown, false, false},
		{"neither PCI", RailPCI{virtual, -1}, RailPCI{"", -1}, "", RelationUnknown, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Place(tt.sout, tt.sup)
			if p.AdvertisePath != tt.wantPath || p.Relation != tt.wantRelation || p.SupFarther != tt.wantFarther ||
				p.GPUDirectSafe != tt.wantGDRSafe || p.AdvertisesSup != (tt.wantPath != "" && tt.wantPath == tt.sup.Path) {
				t.Errorf("Place = %+v\nwant path %s, %v, farther %v, GPUDirect safe %v",
					p, tt.wantPath, tt.wantRelation, tt.wantFarther, tt.wantGDRSafe)
			}
			if p.Reason == "" {
				t.Error("no reason given")
			}
		})
	}
}

// A mesh device's GPUDirect verdict holds for every SUP port a connection may use.
func TestPlaceAll(t *testing.T) {
	tests := []struct {
		name        string
		sups        []RailPCI
		wantPath    string
		wantGDRSafe bool
	}{
		{"one port: Place's verdict", []RailPCI{{nicA2, 0}}, nicA, true},
		{"two ports under SOUT's switch", []RailPCI{{nicA2, 0}, {nicA1, 0}}, nicA, true},
		{"the second port on the other socket", []RailPCI{{nicA2, 0}, {nicD, 1}}, nicA, false},
		{"the second port under another switch", []RailPCI{{nicA2, 0}, {nicB, 0}}, nicA, false},
		{"the second port would advertise another path", []RailPCI{{nicA2, 0}, {nicRoot, 0}}, nicA, false},
		{"the second port's place unknown: the first's verdict", []RailPCI{{nicA2, 0}, {virtual, -1}}, nicA, true},
		{"the first port unsafe", []RailPCI{{nicB, 0}, {nicA2, 0}}, nicA, false},
	}
	for _, tt := range tests {
		p := PlaceAll(RailPCI{nicA, 0}, tt.sups)
		if p.AdvertisePath != tt.wantPath || p.GPUDirectSafe != tt.wantGDRSafe {
			t.Errorf("%s: PlaceAll = path %s, GPUDirect safe %v; want %s, %v (%s)", tt.name, p.AdvertisePath, p.GPUDirectSafe,
				tt.wantPath, tt.wantGDRSafe, p.Reason)
		}
	}
}

// gpuWithinPXB is NCCL's default GPUDirect test for a PCIe GPU (paths.cc ncclTopoCheckGdr):
// the path GPU->NIC stays below the CPU, i.e. both hang under one NCCL switch node.
func gpuWithinPXB(gpu, nic pciPosition) bool {
	_, _, _, ok := commonSwitch(gpu, nic)
	return ok
}

// TestPlaceGPUDirectVerdict is the proof the lab cannot give: over every pair of rails and
// every GPU of the host above, when Place says GPUDirectSafe, NCCL's verdict on the advertised
// place is exactly "within PXB of both rails"; when it says unsafe on one NUMA node, some GPU
// really would get GPUDirect from the advertised place while one rail is beyond PXB.
func TestPlaceGPUDirectVerdict(t *testing.T) {
	rails := []RailPCI{{nicA, 0}, {nicA1, 0}, {nicA2, 0}, {nicDeep, 0}, {nicB, 0}, {nicRoot, 0},
		{nicHB40, 0}, {nicC, 0}, {nicD, 1}}
	gpus := []string{gpuA, gpuB, swA + "/0000:02:02.0/0000:05:00.0/0000:06:01.0/0000:09:00.0",
		hb0 + "/0000:00:04.0/0000:15:00.0", gpuC}
	for _, sout := range rails {
		for _, sup := range rails {
			if sout == sup {
				continue
			}
			checkVerdict(t, Place(sout, sup), sout, sup, gpus)
		}
	}
}

func checkVerdict(t *testing.T, p Placement, sout, sup RailPCI, gpus []string) {
	t.Helper()
	adv, _ := parsePosition(p.AdvertisePath)
	soutPos, _ := parsePosition(sout.Path)
	supPos, _ := parsePosition(sup.Path)
	misjudged := false
	for _, g := range gpus {
		gpu, ok := parsePosition(g)
		if !ok {
			t.Fatalf("bad GPU path %s", g)
		}
		both := gpuWithinPXB(gpu, soutPos) && gpuWithinPXB(gpu, supPos)
		if gpuWithinPXB(gpu, adv) != both {
			misjudged = true
			if p.GPUDirectSafe {
				t.Errorf("SOUT %s SUP %s: GPU %s misjudged on advertised %s", sout.Path, sup.Path, g, p.AdvertisePath)
			}
		}
	}
	if !p.GPUDirectSafe && p.Relation != RelationDifferentNUMA && !misjudged {
		t.Errorf("SOUT %s SUP %s: marked unsafe (%s) but no GPU is misjudged", sout.Path, sup.Path, p.Relation)
	}
}

func TestReadPCIFakeSysfs(t *testing.T) {
	root := t.TempDir()
	dev := filepath.Join(root, "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0")
	mustMkdir(t, dev)
	mustMkdir(t, filepath.Join(root, "sys/class/infiniband/mlx5_0"))
	mustMkdir(t, filepath.Join(root, "sys/class/infiniband/mlx5_1"))
	if err := os.Symlink("../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0",
		filepath.Join(root, "sys/class/infiniband/mlx5_0/device")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dev, "numa_node"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readPCIUnder(root, "mlx5_0")
	want, _ := filepath.EvalSymlinks(dev)
	if err != nil || got != (RailPCI{want, 1}) {
		t.Fatalf("readPCIUnder(mlx5_0) = %+v, %v; want %s on NUMA 1", got, err, want)
	}
	if _, ok := parsePosition(got.Path); !ok {
		t.Errorf("path read from fake sysfs does not parse: %s", got.Path)
	}
	for _, numa := range []string{"-1\n", "junk", ""} {
		os.WriteFile(filepath.Join(dev, "numa_node"), []byte(numa), 0o644)
		if got, _ := readPCIUnder(root, "mlx5_0"); got.NUMA != -1 {
			t.Errorf("numa_node %q read as %d, want -1", numa, got.NUMA)
		}
	}
	for _, hca := range []string{"mlx5_1", "mlx5_9", "", "..", "a/b"} {
		if got, err := readPCIUnder(root, hca); err == nil || got.NUMA != -1 {
			t.Errorf("readPCIUnder(%q) = %+v, %v; want an error and NUMA -1", hca, got, err)
		}
	}
}

// TestReadPCIWithoutRDMA runs against the real sysfs, which may hold no RDMA device at all.
func TestReadPCIWithoutRDMA(t *testing.T) {
	if got, err := ReadPCI("mpib-no-such-hca"); err == nil || got.Path != "" || got.NUMA != -1 {
		t.Errorf("ReadPCI(missing) = %+v, %v; want an error", got, err)
	}
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestWithholdGPUDirect: GPUDirect is withheld only across NUMA nodes (and never when the user
// set NCCL_NET_GDR_LEVEL): within one node, withholding sends the device's GPUs elsewhere.
func TestWithholdGPUDirect(t *testing.T) {
	for _, tt := range []struct {
		name        string
		sout, sup   RailPCI
		gdrLevelSet bool
		safe, want  bool
	}{
		{"a common switch", RailPCI{nicA, 0}, RailPCI{nicA1, 0}, false, true, false},
		{"a switch above each rail, one root complex", RailPCI{nicA, 0}, RailPCI{nicB, 0}, false, false, false},
		{"a switch above each rail, two host bridges, one NUMA node", RailPCI{nicA, 0}, RailPCI{nicC, 0}, false, false, false},
		{"different NUMA nodes", RailPCI{nicA, 0}, RailPCI{nicD, 1}, false, false, true},
		{"different NUMA nodes, NCCL_NET_GDR_LEVEL set", RailPCI{nicA, 0}, RailPCI{nicD, 1}, true, false, false},
		{"a path that is not PCI", RailPCI{"/sys/devices/virtual/net/rxe0", -1}, RailPCI{nicA, 0}, false, false, false},
	} {
		pl := Place(tt.sout, tt.sup)
		if pl.GPUDirectSafe != tt.safe {
			t.Errorf("%s: placement safe %v, want %v (the row tests another case than it names)", tt.name, pl.GPUDirectSafe, tt.safe)
		}
		if got := WithholdGPUDirect(pl, tt.gdrLevelSet); got != tt.want {
			t.Errorf("%s (%v, safe %v): withhold %v, want %v", tt.name, pl.Relation, pl.GPUDirectSafe, got, tt.want)
		}
	}
}
