// Package doctor is mpib-agent doctor: a preflight check of one node, or of two nodes
// together, against the configuration a job would run with (docs/deploying.md, "Before the
// first job"). It parses MPIB_* and NCCL_IB_* with the plugin's own parser and picks GIDs,
// islands and SUP pairs with the plugin's own rules (package plugin/rules re-exports them),
// reads everything else from sysfs and procfs under a root directory (so tests run over
// fixture trees), and reports each port's facts and each problem as one line with its cause
// and its fix. It never loads the plugin: a Go program cannot hold a second Go runtime, so
// traffic through the plugin is left to mpib-nettest, run as a subprocess (nettest.go).
package doctor

import (
	"net/netip"

	"github.com/mpib/mpib/plugin/rules"
)

// Version is the report's JSON format version; the peer exchange refuses another, so that
// two doctors never compare a field one of them lacks.
const Version = 2

// Report is one node's findings: what --json prints, and what two nodes exchange.
type Report struct {
	Version  int    `json:"version"`
	Node     string `json:"node"` // the hostname
	Config   string `json:"config_error,omitempty"`
	Settings `json:"settings"`
	OOB      OOB           `json:"oob"`
	Devices  []Device      `json:"devices"`
	GPUs     []GPU         `json:"gpus"`
	Routes   []rules.Route `json:"routes"` // the main IPv4 table, as /proc/net/route shows it
	Problems []Problem     `json:"problems"`
	// Notes are findings that stand in no job's way, so Exit does not count them: each
	// MPIB_* variable the plugin ignores (kind config).
	Notes   []Problem `json:"notes,omitempty"`
	Nettest Nettest   `json:"nettest"`
}

// Settings are the configuration values a pair of nodes must agree on: the plugin's
// handshake refuses a connection whose two ends build different QP counts.
type Settings struct {
	Mode            int  `json:"mode"`
	IslandPrefixLen int  `json:"island_prefix_len"`
	SupRelay        bool `json:"sup_relay"`
	SoutQPs         int  `json:"sout_qp"` // MPIB_SOUT_QP
	SupQPs          int  `json:"sup_qp"`  // MPIB_SUP_QP
}

// OOB is the control-path interface (MPIB_OOB_IF), its IPv4 address and the island that
// address falls in; Addr is invalid when the interface has none.
type OOB struct {
	Interface string       `json:"interface"`
	Addr      netip.Addr   `json:"address"`
	Island    netip.Prefix `json:"island"`
}

// Device is one fused device: its SOUT port and its SUP ports (more than one on a mesh).
type Device struct {
	Index int    `json:"index"`
	Sout  Port   `json:"sout"`
	Sup   []Port `json:"sup"`
}

// Port is what the doctor found about one HCA port. Found is false when the HCA or the port
// does not exist; the other facts are then empty. GIDIndex is -1 when no GID qualifies.
type Port struct {
	Rail      string     `json:"rail"` // SOUT or SUP
	HCA       string     `json:"hca"`
	Port      int        `json:"port"`
	Found     bool       `json:"found"`
	State     string     `json:"state"`      // ACTIVE, DOWN, INIT, ...
	PhysState string     `json:"phys_state"` // LinkUp, Disabled, Polling, ...
	LinkLayer string     `json:"link_layer"` // Ethernet or InfiniBand
	SpeedMbps int        `json:"speed_mbps"` // from ports/N/rate; 0 unknown
	Netdev    string     `json:"netdev"`     // RoCE: the GID's netdev
	NetdevMTU int        `json:"netdev_mtu"` // 0 unknown
	ActiveMTU int        `json:"active_mtu"` // bytes; 0 unknown (InfiniBand: not in sysfs)
	GIDIndex  int        `json:"gid_index"`
	GIDType   string     `json:"gid_type"`
	Addr      netip.Addr `json:"address"` // the chosen GID's address
	PrefixLen int        `json:"prefix_len"`
	Described bool       `json:"described"` // SUP: the plugin can advertise the port's address (suppair.Describe)
	PCI       string     `json:"pci"`       // bus id, "" when not a PCI device (soft-RoCE)
	pciPath   string     // the resolved sysfs device path, for the GPU relation
	GIDOK     bool       `json:"gid_ok"` // the GID chosen is what the policy asks for
	NUMA      int        `json:"numa"`   // -1 unknown
	GPU       string     `json:"gpu"`    // nearest GPU's bus id, "" none
	GPURel    string     `json:"gpu_relation"`
	SupRoutes []string   `json:"routes,omitempty"` // SUP: the routes that leave on its netdev
}

// Name is the port as MPIB_HCA_* spells it, NAME:PORT.
func (p Port) Name() string { return p.HCA + ":" + itoa(p.Port) }

// GPU is one NVIDIA display or 3D controller in /sys/bus/pci.
type GPU struct {
	PCI  string `json:"pci"`
	NUMA int    `json:"numa"`
	path string
}

// Nettest says whether traffic tests can run here: the driver and plugin found, or why not.
type Nettest struct {
	Path   string `json:"path,omitempty"`
	Plugin string `json:"plugin,omitempty"` // "" = the loader's search path
	Why    string `json:"why,omitempty"`    // set when Path is ""
}

// Problem is one finding that would make a job fail or run badly. Facts are key=value pairs
// (values without spaces), Want is what a healthy node has, Fix what to do.
type Problem struct {
	Kind   string   `json:"problem"`
	Device int      `json:"device"` // -1: the node, not one device
	Rail   string   `json:"rail,omitempty"`
	Port   string   `json:"port,omitempty"`
	Facts  []string `json:"facts,omitempty"`
	Want   string   `json:"want"`
	Fix    string   `json:"fix"`
}

// Problem kinds.
const (
	KindConfig   = "config"    // config.Parse refused the environment (exit 2), NCCL_IB_PKEY does not fit a port; a note: an ignored MPIB_* name
	KindOOB      = "oob-if"    // MPIB_OOB_IF missing, without IPv4, loopback or link-local, or one address on both nodes; a note: a SUP netdev
	KindNoDevice = "no-device" // the HCA or its port does not exist, or its verbs device cannot be opened here
	KindPortDown = "port-down" // the port is not ACTIVE (a mesh's SUP port: all of them are, or a pair needs it)
	KindGID      = "gid"       // no usable GID, or the configured one is of the wrong kind
	KindSupAddr  = "sup-address"
	KindNoRoute  = "no-route" // the routing table cannot be read
	KindNUMA     = "numa"     // NIC on another NUMA node than its device's GPU
	KindMTU      = "mtu"      // the two ends of a rail have different active MTUs (peer mode)
	KindIsland   = "island"   // the island prefix merges islands whose SUP cannot meet, or splits one
	KindSettings = "settings" // the two nodes' Settings differ
	KindDevices  = "devices"  // the two nodes have different device counts
	KindPeer     = "peer"     // the exchange with the other node failed
	KindTraffic  = "traffic"  // mpib-nettest could not move verified data on a rail
)

// PeerProblems are the other node's own problems, each with node=NAME first, so that both
// nodes of a pair print (and count) every problem that stands between them.
func PeerProblems(peer Report) []Problem {
	out := make([]Problem, 0, len(peer.Problems))
	for _, p := range peer.Problems {
		p.Facts = append([]string{"node=" + peer.Node}, p.Facts...)
		out = append(out, p)
	}
	return out
}

// Exit statuses of the doctor.
const (
	ExitHealthy  = 0
	ExitProblems = 1
	ExitConfig   = 2
)

// Exit is the status a report (and the pair checks' problems) give.
func Exit(r Report, pairProblems []Problem) int {
	switch {
	case r.Config != "":
		return ExitConfig
	case len(r.Problems)+len(pairProblems) > 0:
		return ExitProblems
	}
	return ExitHealthy
}
