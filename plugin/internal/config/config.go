// Package config reads every MPIB_* environment variable, and the NCCL_IB_* ones that net_ib
// users already set, in one place. Each knob is a row of Knobs (name, default, meaning);
// docs/configuration.md is written from the same table. Where both exist, the MPIB_* variable
// wins, then NCCL's, then the default: a job tuned for NCCL_NET=IB behaves the same on MPIB.
package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// ErrInvalid marks a configuration the user must fix.
var ErrInvalid = errors.New("invalid MPIB configuration")

// Knob documents one environment variable.
type Knob struct {
	Name, Default, Meaning string
}

// Knobs lists every MPIB_* variable the plugin reads.
var Knobs = []Knob{
	{"MPIB_HCA_SOUT", "(required)", "SOUT (scale-out, routable) HCAs, comma-separated, each NAME[:PORT[:RAIL[:PLANE]]] as NCCL_IB_HCA, e.g. mlx5_0:1 or mlx5_0,mlx5_1,...: one fused device per entry (at most 16); RAIL and PLANE are NCCL's railId and planeId (default: the entry's position, and no plane; give RAIL for every entry or for none)"},
	{"MPIB_HCA_SUP", "(required)", "SUP (direct-attach, island-local) HCAs, as many entries as MPIB_HCA_SOUT, paired by position (NAME[:PORT]); a NIC may be named more than once where GPUs share one; on a direct-attach mesh an entry names up to 8 ports joined by '+' (NAME[:PORT]+NAME[:PORT]), and each connection uses the one its peer is cabled to (docs/topology.md)"},
	{"MPIB_GID_INDEX_SOUT", "auto", "GID index on SOUT (wins over NCCL_IB_GID_INDEX); auto chooses at every connect like net_ib"},
	{"MPIB_GID_INDEX_SUP", "auto", "GID index on SUP; as above"},
	{"MPIB_OOB_IF", "(required)", "network interface (on the SOUT fabric) for the TCP control path"},
	{"MPIB_ISLAND_PREFIX_LEN", "24", "SOUT IPv4 prefix length that defines an island (0..32)"},
	{"MPIB_MODE", "0", "0 = vanilla (intra-island on SUP, inter-island on SOUT); 1 = advanced (agent hints)"},
	{"MPIB_SOUT_QP", "1", "QPs per connection on SOUT (1..16), used round-robin per request"},
	{"MPIB_SUP_QP", "1", "QPs per connection on SUP (1..16; a connection striped over several cables rounds it up to a multiple of its lanes, docs/mesh.md)"},
	{"MPIB_SUP_RELAY", "0", "1 = the fabric forwards SUP (a relay node or router): advanced mode may then use SUP across islands, and a peer no SUP cable reaches is reached through a kernel route with a gateway on a SUP port; must be equal on every rank (checked at connect)"},
	{"MPIB_FORCE_SUP_BW", "(unset)", "test override of the policy: SUP share in parts per 1024 (0..1024) for every request"},
	{"MPIB_SHM_PATH", "/dev/shm/mpib-hints-EUID", "agent hint segment (advanced mode), one per user (EUID: the effective uid); see docs/shm-format.md"},
	{"MPIB_AGENT_STALE_MS", "500", "agent heartbeat age after which advanced mode falls back to vanilla"},
	{"MPIB_IB_TIMEOUT", "20", "RC local ACK timeout exponent (4.096 us * 2^N, 4.3 s by default, as net_ib); wins over NCCL_IB_TIMEOUT. Long on purpose: a try shorter than a congested queue retransmits into it; a dead path is found by MPIB_DETECT_MS, the RC budget is the backstop (docs/failover.md)"},
	{"MPIB_IB_RETRY_CNT", "6", "RC retry count; wins over NCCL_IB_RETRY_CNT: 4.3 s * (6 + 1) = 30 s by default, the ride-through budget (7 means retry forever on rxe)"},
	{"MPIB_DETECT_MS", "600", "a rail with signalled writes outstanding whose path (local NIC, peer) has returned no acknowledgement to any comm of the process for this long fails over; widened on a path whose acknowledgements come slowly; 0 = only the RC budget detects (docs/failover.md, no-progress watch)"},
	{"MPIB_FAILOVER", "1", "1 = a failed rail's traffic moves to the other rail and the rail is retried in the background; 0 = any rail error fails the connection (net_ib without NCCL_IB_RESILIENCY_PORT_FAILOVER)"},
	{"MPIB_RECOVERY_BACKOFF_MS", "250", "first retry of a failed rail after this long, doubling per failed attempt (a port that comes back up is retried at once)"},
	{"MPIB_RECOVERY_BACKOFF_MAX_MS", "2000", "the longest wait between retries of a failed rail; retries never stop"},
	{"MPIB_FAILOVER_TIMEOUT_MS", "5000", "how long the sender waits for the receiver's answer to a recovery attempt before it retries, and for its fence record before it logs the wait (it keeps waiting: a dead peer is caught by the control socket)"},
	{"MPIB_STANDBY_DEFER", "1", "1: a vanilla-mode sender inside the island builds its SOUT rail (a standby there, used only when SUP fails) after the process's connection setups are done, and it joins the connection then; until it joins a SUP failure rides through. 0: built with the connection, as net_ib builds every device's QPs (docs/failover.md, the standby rail)"},
	{"MPIB_STALL_TIMEOUT_MS", "30000", "how long a connection none of whose rails works (both faulted, or the only one of an inter-island connection) stalls, retrying them, before it fails on both ends; 0 fails it at once (docs/failover.md, ride-through)"},
	{"MPIB_IB_TC", "(unset)", "traffic class of the connection (the IP TOS byte on RoCE); wins over NCCL_IB_TC and NCCL's per-communicator class"},
	{"MPIB_IB_SL", "(unset)", "service level of the connection; wins over NCCL_IB_SL"},
	{"MPIB_RELAXED_ORDERING", "(unset)", "1 = register memory with relaxed ordering, 0 = strict; wins over NCCL_IB_PCI_RELAXED_ORDERING"},
	{"MPIB_FORCE_FLUSH", "0", "1 = build the loopback flush QPs and flush even without GPUDirect (testing)"},
	{"MPIB_HANDSHAKE_TIMEOUT_MS", "120000", "deadline for one connection's TCP handshake"},
	{"MPIB_GO_TRACE", "(unset)", "a path prefix: the process writes the Go runtime's execution trace of the plugin's control plane (goroutines and what woke them, syscalls and cgo calls, the runtime's threads) to PREFIX.PID.trace, from its first init for MPIB_GO_TRACE_S seconds or until its last finalize, for `go tool trace`: where a slow connection setup waits (docs/benchmarks.md). The data path is C and never appears in it"},
	{"MPIB_GO_TRACE_S", "10", "how many seconds MPIB_GO_TRACE records (1..3600)"},
	{"MPIB_WHOLE_MSG_MAX", "65536", "a receive slot of at most this many bytes goes whole to one rail (a deficit counter keeps the byte share at the weight); larger ones are cut by the weight; 0 = always cut"},
	{"NCCL_IB_TIMEOUT", "20", "as in net_ib, when MPIB_IB_TIMEOUT is unset"},
	{"NCCL_IB_RETRY_CNT", "6", "as in net_ib, when MPIB_IB_RETRY_CNT is unset (net_ib's default is 7)"},
	{"NCCL_IB_TC", "(unset)", "as in net_ib: traffic class when MPIB_IB_TC is unset; wins over the per-communicator class; else 0"},
	{"NCCL_IB_SL", "(unset)", "as in net_ib: service level when MPIB_IB_SL is unset; else 0"},
	{"NCCL_IB_FIFO_TC", "(unset)", "as in net_ib: traffic class of the receiver's CTS writes (RoCE); unset = the connection's"},
	{"NCCL_IB_GID_INDEX", "auto", "as in net_ib: RoCE GID index for both rails when MPIB_GID_INDEX_* are unset"},
	{"NCCL_IB_ROCE_VERSION_NUM", "2", "as in net_ib: RoCE version the GID auto-selection prefers (1 or 2)"},
	{"NCCL_IB_ADDR_FAMILY", "AF_INET", "as in net_ib: address family of the auto-selected GID (AF_INET or AF_INET6)"},
	{"NCCL_IB_ADDR_RANGE", "(unset)", "as in net_ib: auto-select only GIDs inside this CIDR range"},
	{"NCCL_IB_PKEY", "0", "as in net_ib: P_Key index of every QP"},
	{"NCCL_IB_PCI_RELAXED_ORDERING", "2", "as in net_ib: 0 = strict ordering, 1 or 2 = relaxed ordering where libibverbs supports it"},
	{"NCCL_IB_ECE_ENABLE", "1", "as in net_ib: negotiate Enhanced Connection Establishment when both ends support it"},
	{"NCCL_IB_USE_INLINE", "1", "1 = the receiver sends its CTS inline (net_ib's default is 0; MPIB saves the NIC a DMA read per CTS); 0 = never"},
	{"NCCL_GDR_FLUSH_DISABLE", "0", "as in net_ib: 1 = never flush receives into GPU memory (unsafe before sm90)"},
}

// DefaultShmPath is MPIB_SHM_PATH's default: one segment per user, /dev/shm/mpib-hints-EUID
// (the agents use the same default).
func DefaultShmPath() string { return fmt.Sprintf("/dev/shm/mpib-hints-%d", os.Geteuid()) }

// Rail names one HCA port and its GID index (-1 = auto).
type Rail struct {
	HCA      string
	Port     int
	GIDIndex int
}

// MaxDevices is how many fused devices the lists may name (mpib.h MPIB_MAX_DEVS).
const MaxDevices = 16

// MaxSupPorts is how many SUP ports one fused device may have (mpib.h MPIB_MAX_SUP_PORTS,
// topo.MaxSupPorts): on a direct-attach mesh, one per cable.
const MaxSupPorts = 8

// NoID is NCCL_NET_ID_UNDEF: a device with no rail or plane of its own.
const NoID = -1

// Device is one fused device: the SOUT and SUP ports at the same position of the two lists,
// and NCCL's railId and planeId for it (v12). A SUP entry may name several ports joined by
// '+' (a direct-attach mesh: one port per cable); each connection uses the one its peer is
// cabled to (package suppair). Sup is the first, the device's SUP port wherever one port
// stands for all (its name, its PCI placement).
type Device struct {
	Sout, Sup       Rail
	SupPorts        []Rail // Sup first, at most MaxSupPorts
	RailID, PlaneID int
}

// Config is the parsed environment.
type Config struct {
	Devices            []Device // at least one
	OOBInterface       string
	IslandPrefixLen    int
	Mode               int
	SoutQPs, SupQPs    int
	SupRelay           bool
	ForceSupBW         int // -1 = no override
	ShmPath            string
	AgentStaleMS       int
	IBTimeout          int
	IBRetryCnt         int
	IBTC               int // -1 = unset: NCCL's per-communicator class, else 0
	IBSL               int // -1 = unset: 0
	FifoTC             int // -1 = unset: the connection's class
	RelaxedOrdering    bool
	ForceFlush         bool
	HandshakeTimeoutMS int
	GID                GIDPolicy
	PKeyIndex          int
	ECE                bool
	UseInline          bool
	WholeMsgMax        int
	Failover           bool // MPIB_FAILOVER
	RecoveryBackoffMS  int
	RecoveryBackoffMax int
	FailoverTimeoutMS  int
	StallTimeoutMS     int // MPIB_STALL_TIMEOUT_MS: how long a connection with no working rail waits for one (0: fail at once)
	DetectMS           int // MPIB_DETECT_MS: the no-progress watch's limit (0: off)
	GDRFlushDisable    bool
	StandbyDefer       bool   // MPIB_STANDBY_DEFER: a vanilla intra-island sender builds its standby SOUT rail after the setup
	GoTrace            string // MPIB_GO_TRACE: the execution trace's path prefix ("": none)
	GoTraceS           int    // MPIB_GO_TRACE_S: how long it records
}

// GIDPolicy steers the RoCE GID auto-selection (net_ib's NCCL_IB_ROCE_VERSION_NUM,
// NCCL_IB_ADDR_FAMILY and NCCL_IB_ADDR_RANGE).
type GIDPolicy struct {
	RoCEVersion int          // 1 or 2
	IPv6        bool         // AF_INET6 instead of AF_INET
	Range       netip.Prefix // the zero Prefix: any address
}

// Parse reads the configuration through getenv (os.Getenv in the plugin).
func Parse(getenv func(string) string) (Config, error) {
	p := parser{getenv: getenv}
	c := Config{
		Devices:            p.devices(),
		OOBInterface:       strings.TrimSpace(getenv("MPIB_OOB_IF")),
		IslandPrefixLen:    p.int("MPIB_ISLAND_PREFIX_LEN", 24, 0, 32),
		Mode:               p.int("MPIB_MODE", 0, 0, 1),
		SoutQPs:            p.int("MPIB_SOUT_QP", 1, 1, 16),
		SupQPs:             p.int("MPIB_SUP_QP", 1, 1, 16),
		SupRelay:           p.int("MPIB_SUP_RELAY", 0, 0, 1) == 1,
		ForceSupBW:         p.int("MPIB_FORCE_SUP_BW", -1, 0, 1024),
		ShmPath:            p.str("MPIB_SHM_PATH", DefaultShmPath()),
		AgentStaleMS:       p.int("MPIB_AGENT_STALE_MS", 500, 1, 3600000),
		IBTimeout:          p.first(20, 1, 31, "MPIB_IB_TIMEOUT", "NCCL_IB_TIMEOUT"),
		IBRetryCnt:         p.first(6, 0, 7, "MPIB_IB_RETRY_CNT", "NCCL_IB_RETRY_CNT"),
		DetectMS:           p.int("MPIB_DETECT_MS", 600, 0, 3600000),
		Failover:           p.int("MPIB_FAILOVER", 1, 0, 1) == 1,
		RecoveryBackoffMS:  p.int("MPIB_RECOVERY_BACKOFF_MS", 250, 1, 3600000),
		RecoveryBackoffMax: p.int("MPIB_RECOVERY_BACKOFF_MAX_MS", 2000, 1, 3600000),
		FailoverTimeoutMS:  p.int("MPIB_FAILOVER_TIMEOUT_MS", 5000, 100, 3600000),
		StallTimeoutMS:     p.int("MPIB_STALL_TIMEOUT_MS", 30000, 0, 3600000),
		IBTC:               p.first(-1, -1, 255, "MPIB_IB_TC", "NCCL_IB_TC"),
		IBSL:               p.first(-1, -1, 15, "MPIB_IB_SL", "NCCL_IB_SL"),
		FifoTC:             p.int("NCCL_IB_FIFO_TC", -1, -1, 255),
		ForceFlush:         p.int("MPIB_FORCE_FLUSH", 0, 0, 1) == 1,
		HandshakeTimeoutMS: p.int("MPIB_HANDSHAKE_TIMEOUT_MS", 120000, 100, 3600000),
		PKeyIndex:          p.int("NCCL_IB_PKEY", 0, 0, 65535),
		ECE:                p.int("NCCL_IB_ECE_ENABLE", 1, 0, 1) == 1,
		UseInline:          p.int("NCCL_IB_USE_INLINE", 1, 0, 1) == 1,
		WholeMsgMax:        p.int("MPIB_WHOLE_MSG_MAX", 65536, 0, 1<<30),
		GDRFlushDisable:    p.int("NCCL_GDR_FLUSH_DISABLE", 0, 0, 1) == 1,
		StandbyDefer:       p.int("MPIB_STANDBY_DEFER", 1, 0, 1) == 1,
		GoTrace:            p.str("MPIB_GO_TRACE", ""),
		GoTraceS:           p.int("MPIB_GO_TRACE_S", 10, 1, 3600),
		GID:                p.gidPolicy(),
	}
	c.RelaxedOrdering = p.first(2, 0, 2, "MPIB_RELAXED_ORDERING", "NCCL_IB_PCI_RELAXED_ORDERING") >= 1
	if c.OOBInterface == "" {
		p.fail("MPIB_OOB_IF is required: the interface of the SOUT fabric used for the TCP control path")
	}
	return c, p.err
}

// DeviceNICs is one fused device's ports as indexes into the list NICs returns.
type DeviceNICs struct {
	Sout int
	Sup  []int // in SupPorts order
}

// NICs lists the distinct ports the devices use, SOUT's in list order and then SUP's, and
// for each device the index of its SOUT and SUP ports in that list: a NIC named by several
// devices is opened once.
func (c Config) NICs() (nics []NIC, index []DeviceNICs) {
	at := map[[2]any]int{}
	add := func(r Rail, role int) int {
		k := [2]any{r.HCA, r.Port}
		if i, ok := at[k]; ok {
			return i
		}
		at[k] = len(nics)
		nics = append(nics, NIC{Rail: r, Role: role})
		return len(nics) - 1
	}
	index = make([]DeviceNICs, len(c.Devices))
	for d, dev := range c.Devices {
		index[d].Sout = add(dev.Sout, 0)
	}
	for d, dev := range c.Devices {
		for _, r := range dev.SupPorts {
			index[d].Sup = append(index[d].Sup, add(r, 1))
		}
	}
	return nics, index
}

// Surviving keeps the devices whose every port opened (opened[i]: NICs()'s port i), with
// their ports' indices, and lists the positions of those it leaves out. A device keeps its
// RailID and PlaneID: the rail-optimized matching of the others does not move because one
// port failed. net_ib likewise leaves out only the ports it cannot use.
func Surviving(devs []Device, index []DeviceNICs, opened []bool) (kept []Device, keptIndex []DeviceNICs, dropped []int) {
	for d, dev := range devs {
		ok := opened[index[d].Sout]
		for _, n := range index[d].Sup {
			ok = ok && opened[n]
		}
		if !ok {
			dropped = append(dropped, d)
			continue
		}
		kept = append(kept, dev)
		keptIndex = append(keptIndex, index[d])
	}
	return kept, keptIndex, dropped
}

// NIC is a port to open and the rail it serves (0: SOUT, 1: SUP).
type NIC struct {
	Rail
	Role int
}

// parser keeps the first error so Parse reads top to bottom.
type parser struct {
	getenv func(string) string
	err    error
}

func (p *parser) fail(msg string) {
	if p.err == nil {
		p.err = fmt.Errorf("%w: %s", ErrInvalid, msg)
	}
}

func (p *parser) str(name, def string) string {
	if v := strings.TrimSpace(p.getenv(name)); v != "" {
		return v
	}
	return def
}

func (p *parser) int(name string, def, min, max int) int {
	v := strings.TrimSpace(p.getenv(name))
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min || n > max {
		p.fail(fmt.Sprintf("%s=%q: want an integer in %d..%d", name, v, min, max))
		return def
	}
	return n
}

// first reads the first of names that is set (MPIB_* before its NCCL_* equivalent): an MPIB_*
// value wins, -1 (auto, as NCCL's own default) included.
func (p *parser) first(def, min, max int, names ...string) int {
	for _, n := range names {
		if strings.TrimSpace(p.getenv(n)) != "" {
			return p.int(n, def, min, max)
		}
	}
	return def
}

func (p *parser) gidPolicy() GIDPolicy {
	g := GIDPolicy{RoCEVersion: p.int("NCCL_IB_ROCE_VERSION_NUM", 2, 1, 2)}
	switch fam := p.str("NCCL_IB_ADDR_FAMILY", "AF_INET"); fam {
	case "AF_INET":
	case "AF_INET6":
		g.IPv6 = true
	default:
		p.fail(fmt.Sprintf("NCCL_IB_ADDR_FAMILY=%q: want AF_INET or AF_INET6", fam))
	}
	if v := p.str("NCCL_IB_ADDR_RANGE", ""); v != "" {
		pfx, err := netip.ParsePrefix(v)
		if err != nil || pfx.Addr().Is6() != g.IPv6 {
			p.fail(fmt.Sprintf("NCCL_IB_ADDR_RANGE=%q: want a CIDR range of NCCL_IB_ADDR_FAMILY, e.g. 10.0.0.0/16", v))
		} else {
			g.Range = pfx.Masked()
		}
	}
	return g
}

// devices pairs MPIB_HCA_SOUT's entries with MPIB_HCA_SUP's by position.
func (p *parser) devices() []Device {
	sout := p.hcaList("MPIB_HCA_SOUT", "MPIB_GID_INDEX_SOUT", true)
	sup := p.hcaList("MPIB_HCA_SUP", "MPIB_GID_INDEX_SUP", false)
	if p.err != nil {
		return nil
	}
	if len(sout) != len(sup) {
		p.fail(fmt.Sprintf("MPIB_HCA_SOUT names %d HCAs and MPIB_HCA_SUP %d: they pair by position, one SUP entry per SOUT entry (repeat a SUP NIC that several devices share)",
			len(sout), len(sup)))
		return nil
	}
	explicit := -1 // an entry that gives its RAIL
	for i := range sout {
		if sout[i].railID != NoID {
			explicit = i
		}
	}
	devs := make([]Device, len(sout))
	soutPorts := map[[2]any]int{}
	for i := range sout {
		if explicit >= 0 && sout[i].railID == NoID {
			// A position would collide with some entry's explicit rail (NCCL's crossNic=0
			// search would then let a ring enter on one device and leave on another).
			p.fail(fmt.Sprintf("MPIB_HCA_SOUT entry %d (%s) gives no RAIL while entry %d (%s) does: give NAME:PORT:RAIL for every entry or for none (then the rail is the position)",
				i, sout[i].HCA, explicit, sout[explicit].HCA))
			return nil
		}
		devs[i] = Device{Sout: sout[i].Rail, Sup: sup[i].Rail, SupPorts: sup[i].ports, RailID: sout[i].railID, PlaneID: sout[i].planeID}
		if devs[i].RailID == NoID {
			devs[i].RailID = i
		}
		k := [2]any{sout[i].HCA, sout[i].Port}
		if j, dup := soutPorts[k]; dup {
			p.fail(fmt.Sprintf("MPIB_HCA_SOUT names %s:%d twice (entries %d and %d): each fused device needs a SOUT port of its own", sout[i].HCA, sout[i].Port, j, i))
			return nil
		}
		soutPorts[k] = i
	}
	for i, e := range sup {
		for _, s := range e.ports {
			if j, clash := soutPorts[[2]any{s.HCA, s.Port}]; clash {
				p.fail(fmt.Sprintf("MPIB_HCA_SUP entry %d (%s:%d) is MPIB_HCA_SOUT entry %d: a port serves one fabric", i, s.HCA, s.Port, j))
				return nil
			}
		}
	}
	return devs
}

type hcaEntry struct {
	Rail            // the first port
	ports           []Rail
	railID, planeID int
}

// hcaList reads one comma-separated list of NCCL_IB_HCA-style entries: SOUT's (withIDs: it
// carries the device's ids) NAME[:PORT[:RAIL[:PLANE]]], SUP's NAME[:PORT] or several of them
// joined by '+' (one per cable of a mesh).
func (p *parser) hcaList(hcaVar, gidVar string, withIDs bool) []hcaEntry {
	gidIndex := p.first(-1, -1, 255, gidVar, "NCCL_IB_GID_INDEX")
	v := strings.TrimSpace(p.getenv(hcaVar))
	if v == "" {
		p.fail(hcaVar + " is required (HCA names, e.g. mlx5_0 or mlx5_0:1, or a comma-separated list, one per fused device)")
		return nil
	}
	if strings.HasPrefix(v, "^") || strings.HasPrefix(v, "=") {
		p.fail(fmt.Sprintf("%s=%q: MPIB takes an exact list in pairing order (no NCCL_IB_HCA ^ or = prefix)", hcaVar, v))
		return nil
	}
	parts := strings.Split(v, ",")
	if len(parts) > MaxDevices {
		p.fail(fmt.Sprintf("%s names %d HCAs: at most %d fused devices", hcaVar, len(parts), MaxDevices))
		return nil
	}
	out := make([]hcaEntry, 0, len(parts))
	for i, part := range parts {
		e, msg := parseEntry(strings.TrimSpace(part), withIDs, gidIndex)
		if msg != "" {
			p.fail(fmt.Sprintf("%s entry %d (%q): %s", hcaVar, i, part, msg))
			return nil
		}
		out = append(out, e)
	}
	return out
}

// parseEntry reads one device's entry: one port (parseHCA), or for SUP (!withIDs) up to
// MaxSupPorts joined by '+', each named once.
func parseEntry(s string, withIDs bool, gidIndex int) (hcaEntry, string) {
	names := strings.Split(s, "+")
	if len(names) > 1 && withIDs {
		return hcaEntry{}, "a fused device has one SOUT port ('+' joins SUP ports only)"
	}
	if len(names) > MaxSupPorts {
		return hcaEntry{}, fmt.Sprintf("%d SUP ports: at most %d per fused device", len(names), MaxSupPorts)
	}
	var first hcaEntry
	seen := map[[2]any]bool{}
	for i, name := range names {
		e, msg := parseHCA(strings.TrimSpace(name), withIDs)
		if msg != "" {
			if len(names) > 1 {
				msg = fmt.Sprintf("port %d (%q): %s", i, name, msg)
			}
			return hcaEntry{}, msg
		}
		e.GIDIndex = gidIndex
		if k := [2]any{e.HCA, e.Port}; seen[k] {
			return hcaEntry{}, fmt.Sprintf("names %s:%d twice", e.HCA, e.Port)
		} else {
			seen[k] = true
		}
		if i == 0 {
			first = e
		}
		first.ports = append(first.ports, e.Rail)
	}
	return first, ""
}

// parseHCA reads NAME[:PORT[:RAIL[:PLANE]]] (net_ib's NCCL_IB_HCA entry); the empty message
// when it is well formed.
func parseHCA(s string, withIDs bool) (hcaEntry, string) {
	e := hcaEntry{Rail: Rail{Port: 1}, railID: NoID, planeID: NoID}
	f := strings.Split(s, ":")
	if f[0] == "" || strings.ContainsAny(f[0], " /") {
		return e, "not an HCA name"
	}
	e.HCA = f[0]
	if len(f) > 4 || (!withIDs && len(f) > 2) {
		if withIDs {
			return e, "want NAME[:PORT[:RAIL[:PLANE]]]"
		}
		return e, "want NAME[:PORT] (the device's rail and plane come from MPIB_HCA_SOUT)"
	}
	num := func(i, lo, hi int, what string) (int, string) {
		n, err := strconv.Atoi(f[i])
		if err != nil || n < lo || n > hi {
			return 0, fmt.Sprintf("%s must be %d..%d", what, lo, hi)
		}
		return n, ""
	}
	var msg string
	if len(f) > 1 {
		if e.Port, msg = num(1, 1, 255, "port"); msg != "" {
			return e, msg
		}
	}
	if len(f) > 2 {
		if e.railID, msg = num(2, 0, 32767, "rail"); msg != "" {
			return e, msg
		}
	}
	if len(f) > 3 {
		if e.planeID, msg = num(3, 0, 32767, "plane"); msg != "" {
			return e, msg
		}
	}
	return e, ""
}

// toolVariables are the MPIB_* names (a trailing '_': every name it begins) that MPIB's own
// tools read, never the plugin: the lab, the benchmarks and tests, mpib-nettest, the model
// checker. Unknown passes them over.
var toolVariables = []string{"MPIB_LAB_", "MPIB_BENCH", "MPIB_BENCH_", "MPIB_MODEL_", "MPIB_TEST_", "MPIB_NETTEST_",
	"MPIB_DEMO", "MPIB_DEMO_", "MPIB_LEAKS", "MPIB_LEAK_", "MPIB_FUZZTIME", "MPIB_CALLGRIND_DIR", "MPIB_NETIB_REF_SRC",
	"MPIB_RECORD_TRACE", "MPIB_SCALE", "MPIB_FAULTS", "MPIB_HOSTILE_", "MPIB_CONGESTION_", "MPIB_SHM_VECTORS",
	"MPIB_PRODUCT_LIB"}

// Unknown says, for each MPIB_* variable of environ (KEY=VALUE entries, as os.Environ) that
// is neither a knob nor one of MPIB's tools', that it is ignored and which knobs it may mean:
// Parse reads only the names it knows, so a misspelt one (MPIB_SOUT_QPS) would otherwise
// leave its default in place without a word.
func Unknown(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "MPIB_") || isKnob(name) || isToolVariable(name) {
			continue
		}
		line := name + " is not an MPIB setting and is ignored"
		if near := nearKnobs(name); len(near) > 0 {
			line += " (did you mean " + strings.Join(near, " or ") + "?)"
		}
		out = append(out, line)
	}
	return out
}

func isKnob(name string) bool {
	for _, k := range Knobs {
		if k.Name == name {
			return true
		}
	}
	return false
}

func isToolVariable(name string) bool {
	for _, t := range toolVariables {
		if name == t || (strings.HasSuffix(t, "_") && strings.HasPrefix(name, t)) {
			return true
		}
	}
	return false
}

// nearKnobs are the MPIB_* knobs closest to name: those it begins or that begin it (a
// missing or extra suffix), else those at the smallest edit distance up to 3.
func nearKnobs(name string) []string {
	var near []string
	best := 4
	for _, k := range Knobs {
		if !strings.HasPrefix(k.Name, "MPIB_") {
			continue
		}
		d := editDistance(name, k.Name)
		if strings.HasPrefix(k.Name, name+"_") || strings.HasPrefix(name, k.Name+"_") {
			d = 0
		}
		switch {
		case d < best:
			best, near = d, []string{k.Name}
		case d == best:
			near = append(near, k.Name)
		}
	}
	return near
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
