package topo

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Proof without GPUs that one fused device per NIC pair gives every GPU of an 8-GPU node its
// own pair: over the PCI trees of real 8-GPU systems (testdata/*.topo, each naming its
// source), each pair's advertised place comes from Place, exactly as getProperties reports it,
// and a model of NCCL's choice picks each GPU's net device. The model: NCCL ranks a GPU's
// paths to net devices PIX (one PCIe switch between them) < PXB (several switches) < PHB
// (through the CPU) < SYS (across CPUs), keeps the nearest, and spreads the GPUs that share
// one set of nearest devices over that set in GPU order (ncclTopoGetLocalNet). It prints
//
//	topology: fixture=NAME gpus=8 nearest_pair_ok=N/8 gdr_safe=N/8
//
// nearest_pair_ok counts GPUs whose device is their own pair (GPU i: the pair at position i of
// MPIB_HCA_SOUT / MPIB_HCA_SUP); gdr_safe counts pairs whose GPUDirect verdict holds for both
// NICs (Place's GPUDirectSafe; MPIB withholds GPUDirect only across NUMA nodes: WithholdGPUDirect).

type fixtureDev struct {
	kind, name string
	pos        pciPosition
	pci        RailPCI
}

type fixture struct {
	gpus, nics []fixtureDev
	sout, sup  []string
}

// readFixture reads "kind numa switch busid name" rows and the two HCA lists. Each device gets
// the sysfs path NCCL would walk: host bridge pci000N:00 for NUMA node N, the switch, a
// downstream port, the device.
func readFixture(t *testing.T, path string) fixture {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var fx fixture
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		switch {
		case len(w) == 0 || strings.HasPrefix(w[0], "#"):
		case (w[0] == "sout" || w[0] == "sup") && len(w) == 2:
			if w[0] == "sout" {
				fx.sout = strings.Split(w[1], ",")
			} else {
				fx.sup = strings.Split(w[1], ",")
			}
		case (w[0] == "gpu" || w[0] == "nic") && len(w) == 5:
			numa, err := strconv.Atoi(w[1])
			if err != nil {
				t.Fatalf("%s: %q: %v", path, sc.Text(), err)
			}
			port := w[2][:11] + w[3][11:] // the switch's downstream port towards the device
			sysfs := fmt.Sprintf("/sys/devices/pci%04x:00/%s/%s/%s", numa, w[2], port, w[3])
			pos, ok := parsePosition(sysfs)
			if !ok {
				t.Fatalf("%s: %s is not a PCI path", path, sysfs)
			}
			d := fixtureDev{kind: w[0], name: w[4], pos: pos, pci: RailPCI{Path: sysfs, NUMA: numa}}
			if w[0] == "gpu" {
				fx.gpus = append(fx.gpus, d)
			} else {
				fx.nics = append(fx.nics, d)
			}
		default:
			t.Fatalf("%s: unreadable row %q", path, sc.Text())
		}
	}
	return fx
}

func (fx fixture) nic(t *testing.T, name string) fixtureDev {
	t.Helper()
	for _, n := range fx.nics {
		if n.name == name {
			return n
		}
	}
	t.Fatalf("no NIC %s in the fixture", name)
	return fixtureDev{}
}

// Path types as NCCL orders them (src/graph/topo.h), nearest first.
const (
	pathPIX = iota
	pathPXB
	pathPHB
	pathSYS
)

func pathType(gpu, nic pciPosition) int {
	if _, dg, dn, ok := commonSwitch(gpu, nic); ok {
		if dg == 0 && dn == 0 {
			return pathPIX
		}
		return pathPXB
	}
	if gpu.hostBridge == nic.hostBridge {
		return pathPHB
	}
	return pathSYS
}

// ncclChoice is the model's net device for each GPU, given each device's advertised place.
func ncclChoice(gpus []pciPosition, devs []pciPosition) []int {
	nearest := make([][]int, len(gpus))
	for g, gpu := range gpus {
		best := pathSYS + 1
		for d, dev := range devs {
			switch p := pathType(gpu, dev); {
			case p < best:
				best, nearest[g] = p, []int{d}
			case p == best:
				nearest[g] = append(nearest[g], d)
			}
		}
	}
	choice := make([]int, len(gpus))
	for g := range gpus {
		k := 0 // GPUs before g with the same nearest set
		for h := range g {
			if slices.Equal(nearest[h], nearest[g]) {
				k++
			}
		}
		choice[g] = nearest[g][k%len(nearest[g])]
	}
	return choice
}

func TestNearestPairOnGPUNodes(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.topo")
	if len(files) < 3 {
		t.Fatalf("want the 8-GPU fixtures in testdata, found %v", files)
	}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".topo")
		t.Run(name, func(t *testing.T) {
			fx := readFixture(t, path)
			if len(fx.gpus) != 8 || len(fx.sout) != 8 || len(fx.sup) != 8 {
				t.Fatalf("want 8 GPUs and 8 pairs: %d GPUs, %d+%d HCAs", len(fx.gpus), len(fx.sout), len(fx.sup))
			}
			var gpus, devs []pciPosition
			for _, g := range fx.gpus {
				gpus = append(gpus, g.pos)
			}
			safe := 0
			for i := range fx.sout {
				pl := Place(fx.nic(t, fx.sout[i]).pci, fx.nic(t, fx.sup[i]).pci)
				pos, ok := parsePosition(pl.AdvertisePath)
				if !ok {
					t.Fatalf("pair %d (%s+%s): no advertised place (%s)", i, fx.sout[i], fx.sup[i], pl.Reason)
				}
				devs = append(devs, pos)
				if pl.GPUDirectSafe {
					safe++
				}
			}
			ok := 0
			for g, d := range ncclChoice(gpus, devs) {
				if d == g {
					ok++
				} else {
					t.Errorf("%s gets pair %d (%s+%s), want pair %d", fx.gpus[g].name, d, fx.sout[d], fx.sup[d], g)
				}
			}
			fmt.Printf("topology: fixture=%s gpus=%d nearest_pair_ok=%d/%d gdr_safe=%d/%d\n", name, len(gpus), ok, len(gpus), safe, len(devs))
		})
	}
}

// TestNCCLChoiceModel: the model itself on hand-made cases, so that a fixture passing is not
// the model always answering "pair i".
func TestNCCLChoiceModel(t *testing.T) {
	pos := func(numa int, sw, bus string) pciPosition {
		p, _ := parsePosition(fmt.Sprintf("/sys/devices/pci%04x:00/%s/%s/%s", numa, sw, sw[:11]+"1", bus))
		return p
	}
	g0, g1 := pos(0, "ffff:ff:01.0", "0001:00:00.0"), pos(0, "ffff:ff:02.0", "0002:00:00.0")
	n0, n1 := pos(0, "ffff:ff:01.0", "0101:00:00.0"), pos(0, "ffff:ff:02.0", "0102:00:00.0")
	far := pos(1, "ffff:ff:05.0", "0105:00:00.0")
	cases := []struct {
		name       string
		gpus, devs []pciPosition
		want       []int
	}{
		{"each GPU its switch's NIC, listed backwards", []pciPosition{g0, g1}, []pciPosition{n1, n0}, []int{1, 0}},
		{"one NIC near both: shared", []pciPosition{g0, g1}, []pciPosition{n0, far}, []int{0, 0}},
		{"two NICs under one switch spread in GPU order", []pciPosition{g0, g0}, []pciPosition{n0, n0}, []int{0, 1}},
		{"only a far NIC", []pciPosition{g0}, []pciPosition{far}, []int{0}},
	}
	for _, c := range cases {
		if got := ncclChoice(c.gpus, c.devs); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if pathType(g0, n0) != pathPIX || pathType(g0, n1) != pathPHB || pathType(g0, far) != pathSYS {
		t.Errorf("path types: %d %d %d, want PIX PHB SYS", pathType(g0, n0), pathType(g0, n1), pathType(g0, far))
	}
}
