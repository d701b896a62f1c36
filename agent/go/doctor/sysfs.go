package doctor

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/mpib/mpib/plugin/rules"
)

// Host is the node the doctor reads. Root is the directory sys/ and proc/ are read under:
// "/" on a node, a fixture tree in tests. Addrs lists the interface addresses (the plugin
// reads them through the OS, which no sysfs file shows).
type Host struct {
	Root      string
	Name      string
	Addrs     func() ([]IfAddr, error)
	RouteFile string           // "" = ROOT/proc/net/route
	ByteOrder binary.ByteOrder // of /proc/net/route's numbers: the host's own
	Nettest   Nettest          // what FindNettest found; the doctor only reports it
}

// IfAddr is one interface address with its prefix length.
type IfAddr struct {
	Dev    string
	Prefix netip.Prefix
}

// LiveHost is this machine.
func LiveHost() Host {
	name, _ := os.Hostname()
	return Host{Root: "/", Name: name, Addrs: liveAddrs, ByteOrder: binary.NativeEndian}
}

// FixtureHost reads a fixture tree: sys/ and proc/ under root, and the interface addresses
// from root/ip-addr, one "NETDEV ADDRESS/PREFIX" per line ('#' starts a comment). The
// tree's proc/net/route is written little-endian, as on x86.
func FixtureHost(root, name string) Host {
	return Host{Root: root, Name: name, ByteOrder: binary.LittleEndian,
		Addrs: func() ([]IfAddr, error) { return readAddrFile(filepath.Join(root, "ip-addr")) }}
}

func liveAddrs() ([]IfAddr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []IfAddr
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				out = append(out, IfAddr{Dev: ifc.Name, Prefix: p})
			}
		}
	}
	return out, nil
}

func readAddrFile(path string) ([]IfAddr, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []IfAddr
	for i, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		p, err := netip.ParsePrefix(strings.Join(f[1:], ""))
		if len(f) != 2 || err != nil {
			return nil, fmt.Errorf("%s line %d: want NETDEV ADDRESS/PREFIX, got %q", path, i+1, line)
		}
		out = append(out, IfAddr{Dev: f[0], Prefix: p})
	}
	return out, nil
}

func (h Host) path(parts ...string) string {
	return filepath.Join(append([]string{h.Root}, parts...)...)
}

// readLine is a sysfs attribute's first line, trimmed.
func (h Host) readLine(parts ...string) (string, error) {
	b, err := os.ReadFile(h.path(parts...))
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line), nil
}

// HCAs lists the RDMA devices in /sys/class/infiniband.
func (h Host) HCAs() []string {
	ents, _ := os.ReadDir(h.path("sys/class/infiniband"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// portDir is /sys/class/infiniband/HCA/ports/N relative to the root.
func portDir(hca string, port int) string {
	return filepath.Join("sys/class/infiniband", hca, "ports", strconv.Itoa(port))
}

// readPortState fills a port's link facts from ports/N/{state,phys_state,link_layer,rate}.
// "4: ACTIVE" reads as ACTIVE (ib_port_state names, include/rdma/ib_verbs.h).
func (h Host) readPortState(p *Port) {
	dir := portDir(p.HCA, p.Port)
	name := func(attr string) string {
		s, err := h.readLine(dir, attr)
		if err != nil {
			return "unknown"
		}
		if _, after, ok := strings.Cut(s, ": "); ok {
			return after
		}
		return s
	}
	p.State, p.PhysState, p.LinkLayer = name("state"), name("phys_state"), name("link_layer")
	if rate, err := h.readLine(dir, "rate"); err == nil {
		p.SpeedMbps = parseRateMbps(rate)
	}
}

// readGIDTable reads ports/N/gids/I and gid_attrs/{types,ndevs}/I for every index the port
// has. An entry is present when its GID is not all zero and its type reads (the kernel
// refuses the attributes of an empty slot); ndevs[i] is the entry's netdev ("" unknown).
func (h Host) readGIDTable(hca string, port int, infiniband bool) ([]rules.GIDEntry, []string, error) {
	dir := portDir(hca, port)
	ents, err := os.ReadDir(h.path(dir, "gids"))
	if err != nil {
		return nil, nil, err
	}
	n := 0
	for _, e := range ents {
		if i, err := strconv.Atoi(e.Name()); err == nil && i+1 > n {
			n = i + 1
		}
	}
	table, ndevs := make([]rules.GIDEntry, n), make([]string, n)
	for i := range n {
		idx := strconv.Itoa(i)
		s, err := h.readLine(dir, "gids", idx)
		if err != nil {
			continue
		}
		g, ok := parseGID(s)
		if !ok || g == ([16]byte{}) {
			continue
		}
		typ, err := h.readLine(dir, "gid_attrs/types", idx)
		if err != nil && !infiniband {
			continue
		}
		table[i] = rules.GIDEntry{Present: true, GID: g, Type: gidType(typ, infiniband)}
		ndevs[i], _ = h.readLine(dir, "gid_attrs/ndevs", idx)
	}
	return table, ndevs, nil
}

// parseGID reads sysfs's "fe80:0000:0000:0000:0000:0000:0000:0001" form.
func parseGID(s string) ([16]byte, bool) {
	var g [16]byte
	h := strings.ReplaceAll(s, ":", "")
	if len(h) != 32 {
		return g, false
	}
	if _, err := hex.Decode(g[:], []byte(h)); err != nil {
		return g, false
	}
	return g, true
}

// gidType maps gid_attrs/types ("IB/RoCE v1", "RoCE v2") to libibverbs' numbers as the
// plugin's table holds them: v1 is RoCE v1 on Ethernet, IB on InfiniBand.
func gidType(s string, infiniband bool) int {
	switch {
	case s == "RoCE v2":
		return rules.GIDTypeRoCEv2
	case infiniband:
		return rules.GIDTypeIB
	}
	return rules.GIDTypeRoCEv1
}

// pkeyEntries is the size of a port's P_Key table: the entries of ports/N/pkeys; 0 when it
// cannot be read.
func (h Host) pkeyEntries(hca string, port int) int {
	ents, _ := os.ReadDir(h.path(portDir(hca, port), "pkeys"))
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	return n
}

// verbsDevice is an HCA's uverbs device, the uverbsN of /sys/class/infiniband_verbs whose
// ibdev names it (a soft-RoCE device has no PCI parent to find it under); "" when none does
// (ib_uverbs is not loaded).
func (h Host) verbsDevice(hca string) string {
	ents, _ := os.ReadDir(h.path("sys/class/infiniband_verbs"))
	for _, e := range ents {
		if name, err := h.readLine("sys/class/infiniband_verbs", e.Name(), "ibdev"); err == nil && name == hca {
			return e.Name()
		}
	}
	return ""
}

// openVerbs opens /dev/infiniband/NAME under the root read-write, as ibv_open_device does
// (libibverbs lists a device only when its node is there); the error's cause, or nil.
func (h Host) openVerbs(name string) error {
	f, err := os.OpenFile(h.path("dev/infiniband", name), os.O_RDWR, 0)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return pe.Err
		}
		return err
	}
	return f.Close()
}

// netdevMTU reads /sys/class/net/DEV/mtu; 0 when unknown.
func (h Host) netdevMTU(dev string) int {
	if dev == "" {
		return 0
	}
	s, err := h.readLine("sys/class/net", dev, "mtu")
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(s)
	return n
}

// readPCI is where an HCA sits: its resolved device path (its last component the bus id)
// and NUMA node, as the plugin's topo.ReadPCI reads them; a soft-RoCE device has none.
func (h Host) readPCI(hca string) rules.RailPCI {
	path, err := filepath.EvalSymlinks(h.path("sys/class/infiniband", hca, "device"))
	if err != nil {
		return rules.RailPCI{NUMA: -1}
	}
	return rules.RailPCI{Path: path, NUMA: readNUMA(path)}
}

func readNUMA(devicePath string) int {
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

// GPUs lists NVIDIA GPUs in /sys/bus/pci/devices: vendor 0x10de, class 0x0300xx (VGA) or
// 0x0302xx (3D controller, the data-centre parts), in bus id order.
func (h Host) GPUs() []GPU {
	dir := h.path("sys/bus/pci/devices")
	ents, _ := os.ReadDir(dir)
	var out []GPU
	for _, e := range ents {
		vendor, _ := h.readLine("sys/bus/pci/devices", e.Name(), "vendor")
		class, _ := h.readLine("sys/bus/pci/devices", e.Name(), "class")
		if !isNvidiaGPU(vendor, class) {
			continue
		}
		path, err := filepath.EvalSymlinks(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		out = append(out, GPU{PCI: e.Name(), NUMA: readNUMA(path), path: path})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PCI < out[j].PCI })
	return out
}

// Routes reads the main IPv4 routing table from proc/net/route; a missing file is no routes.
func (h Host) Routes() ([]rules.Route, error) {
	file := h.RouteFile
	if file == "" {
		file = h.path("proc/net/route")
	}
	f, err := os.Open(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	order := h.ByteOrder
	if order == nil {
		order = binary.NativeEndian
	}
	return rules.ParseProcRoute(bufio.NewReader(f), order)
}
