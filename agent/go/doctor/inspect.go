package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/mpib/mpib/plugin/rules"
)

// inspection is one node's reading in progress.
type inspection struct {
	host   Host
	cfg    rules.Config
	addrs  []IfAddr
	report *Report
}

// Inspect reads the node with the configuration getenv gives (os.Getenv for the real thing)
// and returns its report: every fused device's ports and every problem found on this node.
// An invalid configuration gives a report with Config set and nothing else to check.
func Inspect(h Host, getenv func(string) string) Report {
	r := Report{Version: Version, Node: h.Name, Nettest: h.Nettest, Devices: []Device{}, GPUs: []GPU{},
		Routes: []rules.Route{}, Problems: []Problem{}}
	cfg, err := rules.ParseConfig(getenv)
	if err != nil {
		r.Config = err.Error()
		r.Problems = append(r.Problems, Problem{Kind: KindConfig, Device: -1, Want: "a valid MPIB configuration",
			Fix: strings.TrimPrefix(err.Error(), rules.ErrInvalidConfig.Error()+": ")})
		return r
	}
	r.Settings = Settings{Mode: cfg.Mode, IslandPrefixLen: cfg.IslandPrefixLen, SupRelay: cfg.SupRelay,
		SoutQPs: cfg.SoutQPs, SupQPs: cfg.SupQPs}
	in := &inspection{host: h, cfg: cfg, report: &r}
	if in.addrs, err = h.Addrs(); err != nil {
		in.problem(Problem{Kind: KindOOB, Device: -1, Facts: []string{"error=" + noSpace(err.Error())},
			Want: "the interface addresses", Fix: "run the doctor where it can list interfaces"})
	}
	if routes, err := h.Routes(); err != nil {
		in.problem(Problem{Kind: KindNoRoute, Device: -1, Facts: []string{"error=" + noSpace(err.Error())},
			Want: "a readable /proc/net/route", Fix: "run the doctor where it can read the routing table"})
	} else if routes != nil {
		r.Routes = routes
	}
	if gpus := h.GPUs(); gpus != nil {
		r.GPUs = gpus
	}
	in.oob()
	for d, dev := range cfg.Devices {
		in.device(d, dev)
	}
	in.oobOnSup()
	return r
}

func (in *inspection) problem(p Problem) { in.report.Problems = append(in.report.Problems, p) }

// ConfigNotes are the notes on the MPIB_* variables the plugin ignores, from the lines the
// plugin's config.Unknown gives (each begins with the variable's name). They are notes, not
// problems: the plugin runs on, with the default of the setting that was meant.
func ConfigNotes(ignored []string) []Problem {
	out := make([]Problem, 0, len(ignored))
	for _, line := range ignored {
		name, _, _ := strings.Cut(line, " ")
		out = append(out, Problem{Kind: KindConfig, Device: -1, Facts: []string{"variable=" + name},
			Want: "only MPIB_* variables the plugin reads", Fix: line + ": correct its name or unset it"})
	}
	return out
}

// oob finds MPIB_OOB_IF's first IPv4 address (the plugin's interfaceIPv4) and its island.
func (in *inspection) oob() {
	o := OOB{Interface: in.cfg.OOBInterface}
	known := false
	for _, a := range in.addrs {
		if a.Dev != o.Interface {
			continue
		}
		known = true
		if a.Prefix.Addr().Is4() {
			o.Addr = a.Prefix.Addr()
			o.Island, _ = o.Addr.Prefix(in.cfg.IslandPrefixLen)
			break
		}
	}
	in.report.OOB = o
	if o.Addr.IsValid() {
		in.oobReachable()
		return
	}
	why := "the interface has no IPv4 address"
	if !known {
		why = "no interface of that name has an address here"
	}
	in.problem(Problem{Kind: KindOOB, Device: -1, Facts: []string{"oob_if=" + o.Interface},
		Want: "MPIB_OOB_IF naming the SOUT interface with an IPv4 address (" + why + ")",
		Fix:  "set MPIB_OOB_IF to the SOUT fabric's interface (ip -4 -o addr lists them)"})
}

// oobReachable flags an OOB address no peer can reach: the plugin advertises it in every
// handle, so a loopback or link-local one leaves each remote connect on the wrong host (or on
// no route) and puts every node in one island.
func (in *inspection) oobReachable() {
	o := in.report.OOB
	kind := ""
	switch {
	case o.Addr.IsLoopback():
		kind = "loopback"
	case o.Addr.IsLinkLocalUnicast():
		kind = "link-local"
	default:
		return
	}
	in.problem(Problem{Kind: KindOOB, Device: -1, Facts: []string{"oob_if=" + o.Interface, "address=" + o.Addr.String()},
		Want: "MPIB_OOB_IF naming the SOUT interface, whose IPv4 address the peers reach (" + o.Addr.String() + " is " + kind + ")",
		Fix:  "set MPIB_OOB_IF to the SOUT fabric's interface (ip -4 -o addr lists them)"})
}

// oobOnSup notes an MPIB_OOB_IF that is a SUP port's netdev (and no SOUT port's): the control
// path and the island then follow the SUP subnet, which only reaches the nodes of one island.
// A note, not a problem: a fabric may route the SUP subnets, and the connection still works.
func (in *inspection) oobOnSup() {
	name := in.report.OOB.Interface
	sup := ""
	for _, d := range in.report.Devices {
		if d.Sout.Netdev == name {
			return
		}
		for _, p := range d.Sup {
			if p.Netdev == name && sup == "" {
				sup = p.Name()
			}
		}
	}
	if sup == "" {
		return
	}
	in.report.Notes = append(in.report.Notes, Problem{Kind: KindOOB, Device: -1, Port: sup, Facts: []string{"oob_if=" + name},
		Want: "MPIB_OOB_IF naming the SOUT interface (" + name + " is the netdev of SUP port " + sup + ")",
		Fix:  "set MPIB_OOB_IF to the SOUT fabric's interface, unless the SUP subnets are routed between every node"})
}

// device inspects fused device d: its SOUT port, its SUP ports, their link states, their
// nearest GPU.
func (in *inspection) device(d int, dev rules.Device) {
	out := Device{Index: d, Sout: in.port(d, "SOUT", dev.Sout)}
	for _, r := range dev.SupPorts {
		p := in.port(d, "SUP", r)
		in.supChecks(d, len(out.Sup), len(dev.SupPorts), &p)
		out.Sup = append(out.Sup, p)
	}
	up := 0
	for _, p := range out.Sup {
		if p.Found && !StateProblem(p.State) {
			up++
		}
	}
	for _, p := range append([]Port{out.Sout}, out.Sup...) {
		if p.Found && StateProblem(p.State) && PortDownIsProblem(p.Rail, len(out.Sup), up) {
			in.problem(Problem{Kind: KindPortDown, Device: d, Rail: p.Rail, Port: p.Name(),
				Facts: []string{"state=" + p.State, "phys_state=" + p.PhysState}, Want: "state ACTIVE", Fix: downFix(p)})
		}
	}
	in.gpuChecks(d, &out)
	in.report.Devices = append(in.report.Devices, out)
}

// downFix is what brings a port up.
func downFix(p Port) string {
	fix := "check the cable and the switch port"
	if p.LinkLayer == "Ethernet" {
		fix = "bring the netdev up (ip link set dev " + orName(p.Netdev, "NETDEV") + " up), then " + fix
	}
	return fix
}

// port reads one HCA port: existence, verbs device, link state, GID choice, netdev, MTU,
// P_Key table, PCI place.
func (in *inspection) port(d int, rail string, r rules.Rail) Port {
	p := Port{Rail: rail, HCA: r.HCA, Port: r.Port, GIDIndex: -1, NUMA: -1}
	if _, err := os.Stat(in.host.path("sys/class/infiniband", r.HCA)); err != nil {
		in.problem(Problem{Kind: KindNoDevice, Device: d, Rail: rail, Port: p.Name(),
			Facts: []string{"devices=" + listOrNone(in.host.HCAs())},
			Want:  "an RDMA device named " + r.HCA,
			Fix:   "fix MPIB_HCA_" + rail + " (ibv_devices or ls /sys/class/infiniband lists the names)"})
		return p
	}
	in.verbs(d, &p)
	if _, err := os.Stat(in.host.path(portDir(r.HCA, r.Port))); err != nil {
		in.problem(Problem{Kind: KindNoDevice, Device: d, Rail: rail, Port: p.Name(),
			Facts: []string{"ports=" + listOrNone(in.ports(r.HCA))},
			Want:  fmt.Sprintf("port %d on %s", r.Port, r.HCA),
			Fix:   "fix the port number in MPIB_HCA_" + rail})
		return p
	}
	p.Found = true
	in.host.readPortState(&p)
	in.gid(d, r, &p)
	in.pkey(d, &p)
	pci := in.host.readPCI(r.HCA)
	p.pciPath, p.NUMA = pci.Path, pci.NUMA
	if pci.Path != "" {
		p.PCI = filepath.Base(pci.Path)
	}
	return p
}

// verbs checks that the plugin can open the HCA's verbs device: libibverbs lists a device
// only when it finds its /dev/infiniband/uverbsN, and ibv_open_device opens that node
// read-write, so a container without it leaves the plugin with no device (NCCL falls back).
func (in *inspection) verbs(d int, p *Port) {
	name := in.host.verbsDevice(p.HCA)
	if name == "" {
		in.problem(Problem{Kind: KindNoDevice, Device: d, Rail: p.Rail, Port: p.Name(), Facts: []string{"verbs=none"},
			Want: p.HCA + "'s verbs device (/dev/infiniband/uverbsN)", Fix: "load ib_uverbs (modprobe ib_uverbs)"})
		return
	}
	node := "/dev/infiniband/" + name
	err := in.host.openVerbs(name)
	if err == nil {
		return
	}
	fix := "give the job's user read and write access to " + node + " (the kernel makes it mode 0666)"
	if errors.Is(err, fs.ErrNotExist) {
		fix = "mount /dev/infiniband into the container (docker --device=/dev/infiniband, or request the RDMA device plugin's resource in Kubernetes)"
	}
	in.problem(Problem{Kind: KindNoDevice, Device: d, Rail: p.Rail, Port: p.Name(),
		Facts: []string{"verbs=" + node, "error=" + noSpace(err.Error())},
		Want:  "read-write access to " + p.HCA + "'s verbs device (libibverbs lists no device whose node is missing, and opens it read-write)",
		Fix:   fix})
}

// pkey checks NCCL_IB_PKEY against the port's P_Key table: an index beyond it makes the
// plugin's init open no device.
func (in *inspection) pkey(d int, p *Port) {
	entries := in.host.pkeyEntries(p.HCA, p.Port)
	if PKeyFits(in.cfg.PKeyIndex, entries) {
		return
	}
	in.problem(Problem{Kind: KindConfig, Device: d, Rail: p.Rail, Port: p.Name(),
		Facts: []string{"pkey_index=" + itoa(in.cfg.PKeyIndex), "pkeys=" + itoa(entries)},
		Want:  "a P_Key index inside the port's table (NCCL_IB_PKEY is an index into it)",
		Fix: fmt.Sprintf("set NCCL_IB_PKEY below %d (ls /%s/pkeys), or unset it for index 0",
			entries, portDir(p.HCA, p.Port))})
}

// ports lists an HCA's port numbers.
func (in *inspection) ports(hca string) []string {
	ents, _ := os.ReadDir(in.host.path("sys/class/infiniband", hca, "ports"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// gid picks the port's GID as the plugin would (rules.ChooseIBGID / ChooseRoCEGID) and
// checks a configured index against the policy; it fills the address, netdev and MTUs.
// GIDOK is set when the GID can carry the rail's traffic.
func (in *inspection) gid(d int, r rules.Rail, p *Port) {
	ib := p.LinkLayer == "InfiniBand"
	table, ndevs, err := in.host.readGIDTable(r.HCA, r.Port, ib)
	if err == nil {
		if ib {
			p.GIDIndex, err = rules.ChooseIBGID(table)
		} else {
			p.GIDIndex, err = rules.ChooseRoCEGID(table, r.GIDIndex, in.cfg.GID)
		}
	}
	gidVar := "MPIB_GID_INDEX_" + p.Rail
	if err != nil {
		p.GIDIndex = -1
		in.problem(Problem{Kind: KindGID, Device: d, Rail: p.Rail, Port: p.Name(),
			Facts: []string{"index=" + indexName(r.GIDIndex), "entries=" + strconv.Itoa(len(table))},
			Want:  GIDWant(in.cfg.GID), Fix: noNewline(err.Error()) + " (" + gidVar + " or NCCL_IB_GID_INDEX picks one)"})
		return
	}
	e := table[p.GIDIndex]
	p.Addr, p.GIDType, p.Netdev = e.Addr(), GIDTypeName(e), ndevs[p.GIDIndex]
	in.prefix(p)
	if ib {
		p.GIDOK = true
		return
	}
	p.NetdevMTU = in.host.netdevMTU(p.Netdev)
	p.ActiveMTU = RoCEActiveMTU(p.NetdevMTU)
	// An index the plugin chose itself is net_ib's pick (which may settle for RoCE v1); one
	// the user configured is taken as it is, so it is held to the policy.
	if r.GIDIndex < 0 || GIDFits(e, in.cfg.GID) {
		p.GIDOK = true
		return
	}
	fix := "set NCCL_IB_GID_INDEX or " + gidVar + " to an index that has one"
	if auto, err := rules.ChooseRoCEGID(table, -1, in.cfg.GID); err == nil {
		fix = fmt.Sprintf("set %s=%d (or NCCL_IB_GID_INDEX), or unset both to let the plugin choose", gidVar, auto)
	}
	in.problem(Problem{Kind: KindGID, Device: d, Rail: p.Rail, Port: p.Name(),
		Facts: []string{"index=" + strconv.Itoa(p.GIDIndex), "address=" + p.Addr.String(), "type=" + p.GIDType},
		Want:  GIDWant(in.cfg.GID), Fix: fix})
}

// prefix finds the interface that holds the GID's address: its prefix length, and its netdev
// where gid_attrs/ndevs names none (an older kernel).
func (in *inspection) prefix(p *Port) {
	for _, a := range in.addrs {
		if a.Prefix.Addr().Unmap() == p.Addr && (p.Netdev == "" || a.Dev == p.Netdev) {
			p.PrefixLen = a.Prefix.Bits()
			if p.Netdev == "" {
				p.Netdev = a.Dev
			}
			return
		}
	}
}

func indexName(i int) string {
	if i < 0 {
		return "auto"
	}
	return strconv.Itoa(i)
}

// supChecks describes a SUP port as the plugin advertises it and lists the routes that leave
// on its netdev. A subnet without a route there is no problem of the node: the kernel resolves
// RoCE v2 bound to the netdev, which finds a route in a policy-routing table (not in
// /proc/net/route) or, with none, sends on-link.
func (in *inspection) supChecks(d, i, nports int, p *Port) {
	if !p.GIDOK {
		return // the gid problem says why; what follows needs the right GID
	}
	p.SupRoutes = RoutesOn(in.report.Routes, p.Netdev)
	down := nports > 1 && StateProblem(p.State)
	_, why := rules.DescribeSupPort(i, down, p.LinkLayer == "InfiniBand", p.Addr, p.PrefixLen, p.Netdev)
	p.Described = why == ""
	if why != "" && p.LinkLayer != "InfiniBand" && !down {
		in.problem(Problem{Kind: KindSupAddr, Device: d, Rail: "SUP", Port: p.Name(),
			Facts: []string{"address=" + p.Addr.String(), "netdev=" + orNone(p.Netdev)},
			Want:  "a SUP port the plugin can advertise (" + why + ")",
			Fix:   "give the SUP netdev its IPv4 address and use its RoCE v2 GID; until then peers decide SUP by the island alone"})
	}
}

// gpuChecks gives each port the GPU nearest to the device's SOUT NIC (NCCL places the fused
// device at SOUT's PCI place; topo.Place) and flags a NIC on another NUMA node than that GPU.
func (in *inspection) gpuChecks(d int, dev *Device) {
	gpus := in.report.GPUs
	if len(gpus) == 0 {
		return
	}
	anchor := rules.RailPCI{Path: dev.Sout.pciPath, NUMA: dev.Sout.NUMA}
	if anchor.Path == "" && len(dev.Sup) > 0 {
		anchor = rules.RailPCI{Path: dev.Sup[0].pciPath, NUMA: dev.Sup[0].NUMA}
	}
	g, _ := NearestGPU(anchor, gpus)
	if anchor.Path == "" || g < 0 {
		return
	}
	gpu := gpus[g]
	for _, p := range append([]*Port{&dev.Sout}, ptrs(dev.Sup)...) {
		if p.pciPath == "" {
			continue
		}
		rel := rules.Place(rules.RailPCI{Path: p.pciPath, NUMA: p.NUMA}, rules.RailPCI{Path: gpu.path, NUMA: gpu.NUMA}).Relation
		p.GPU, p.GPURel = gpu.PCI, rel.String()
		if rel == rules.RelationDifferentNUMA {
			in.problem(Problem{Kind: KindNUMA, Device: d, Rail: p.Rail, Port: p.Name(),
				Facts: []string{"numa=" + strconv.Itoa(p.NUMA), "gpu=" + gpu.PCI, "gpu_numa=" + strconv.Itoa(gpu.NUMA)},
				Want:  "the NIC on its device's GPU's NUMA node",
				Fix:   "pair NICs and GPUs by place: reorder MPIB_HCA_SOUT/MPIB_HCA_SUP so each device's NICs sit near one GPU (nvidia-smi topo -m)"})
		}
	}
}

func ptrs(ps []Port) []*Port {
	out := make([]*Port, len(ps))
	for i := range ps {
		out[i] = &ps[i]
	}
	return out
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

func orNone(s string) string { return orName(s, "none") }

func orName(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// noSpace makes a value fit a key=value field.
func noSpace(s string) string { return strings.Join(strings.Fields(s), "_") }

func noNewline(s string) string { return strings.Join(strings.Fields(s), " ") }

func itoa(i int) string { return strconv.Itoa(i) }

// addrOrNone prints an address, "none" when invalid.
func addrOrNone(a netip.Addr) string {
	if !a.IsValid() {
		return "none"
	}
	return a.String()
}
