// Package config reads every MPIB_* environment variable in one place. Each knob is a row of
// Knobs (name, default, meaning); docs/configuration.md is written from the same table.
package config

import (
	"errors"
	"fmt"
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
	{"MPIB_HCA_SOUT", "(required)", "SOUT (scale-out, routable) HCA as NAME or NAME:PORT, e.g. mlx5_0:1"},
	{"MPIB_HCA_SUP", "(required)", "SUP (direct-attach, island-local) HCA as NAME or NAME:PORT"},
	{"MPIB_GID_INDEX_SOUT", "auto", "GID index on SOUT; auto picks the RoCE v2 IPv4 GID like net_ib"},
	{"MPIB_GID_INDEX_SUP", "auto", "GID index on SUP; auto as above"},
	{"MPIB_OOB_IF", "(required)", "network interface (on the SOUT fabric) for the TCP control path"},
	{"MPIB_ISLAND_PREFIX_LEN", "24", "SOUT IPv4 prefix length that defines an island (0..32)"},
	{"MPIB_MODE", "0", "0 = vanilla (intra-island on SUP, inter-island on SOUT); 1 = advanced (agent hints)"},
	{"MPIB_SOUT_QP", "1", "QPs per connection on SOUT (1..16), used round-robin per request"},
	{"MPIB_SUP_QP", "1", "QPs per connection on SUP (1..16)"},
	{"MPIB_SUP_RELAY", "0", "1 = a relay carries SUP between islands: advanced mode may then use SUP across islands"},
	{"MPIB_FORCE_SUP_BW", "(unset)", "test override of the policy: SUP share in parts per 1024 (0..1024) for every request"},
	{"MPIB_SHM_PATH", "/dev/shm/mpib-hints", "agent hint segment (advanced mode); see docs/shm-format.md"},
	{"MPIB_AGENT_STALE_MS", "500", "agent heartbeat age after which advanced mode falls back to vanilla"},
	{"MPIB_IB_TIMEOUT", "20", "RC local ACK timeout exponent (4.096 us * 2^N), as NCCL_IB_TIMEOUT"},
	{"MPIB_IB_RETRY_CNT", "7", "RC retry count, as NCCL_IB_RETRY_CNT"},
	{"MPIB_IB_TC", "0", "traffic class of every QP"},
	{"MPIB_IB_SL", "0", "service level of every QP"},
	{"MPIB_RELAXED_ORDERING", "1", "register memory with relaxed ordering (0 forces strict ordering)"},
	{"MPIB_FORCE_FLUSH", "0", "1 = build the loopback flush QPs and flush even without GPUDirect (testing)"},
	{"MPIB_HANDSHAKE_TIMEOUT_MS", "120000", "deadline for one connection's TCP handshake"},
}

// Rail names one HCA port and its GID index (-1 = auto).
type Rail struct {
	HCA      string
	Port     int
	GIDIndex int
}

// Config is the parsed environment.
type Config struct {
	Sout, Sup          Rail
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
	IBTC, IBSL         int
	RelaxedOrdering    bool
	ForceFlush         bool
	HandshakeTimeoutMS int
}

// Parse reads the configuration through getenv (os.Getenv in the plugin).
func Parse(getenv func(string) string) (Config, error) {
	p := parser{getenv: getenv}
	c := Config{
		Sout:               p.rail("MPIB_HCA_SOUT", "MPIB_GID_INDEX_SOUT"),
		Sup:                p.rail("MPIB_HCA_SUP", "MPIB_GID_INDEX_SUP"),
		OOBInterface:       strings.TrimSpace(getenv("MPIB_OOB_IF")),
		IslandPrefixLen:    p.int("MPIB_ISLAND_PREFIX_LEN", 24, 0, 32),
		Mode:               p.int("MPIB_MODE", 0, 0, 1),
		SoutQPs:            p.int("MPIB_SOUT_QP", 1, 1, 16),
		SupQPs:             p.int("MPIB_SUP_QP", 1, 1, 16),
		SupRelay:           p.int("MPIB_SUP_RELAY", 0, 0, 1) == 1,
		ForceSupBW:         p.int("MPIB_FORCE_SUP_BW", -1, 0, 1024),
		ShmPath:            p.str("MPIB_SHM_PATH", "/dev/shm/mpib-hints"),
		AgentStaleMS:       p.int("MPIB_AGENT_STALE_MS", 500, 1, 3600000),
		IBTimeout:          p.int("MPIB_IB_TIMEOUT", 20, 1, 31),
		IBRetryCnt:         p.int("MPIB_IB_RETRY_CNT", 7, 0, 7),
		IBTC:               p.int("MPIB_IB_TC", 0, 0, 255),
		IBSL:               p.int("MPIB_IB_SL", 0, 0, 15),
		RelaxedOrdering:    p.int("MPIB_RELAXED_ORDERING", 1, 0, 1) == 1,
		ForceFlush:         p.int("MPIB_FORCE_FLUSH", 0, 0, 1) == 1,
		HandshakeTimeoutMS: p.int("MPIB_HANDSHAKE_TIMEOUT_MS", 120000, 100, 3600000),
	}
	if c.OOBInterface == "" {
		p.fail("MPIB_OOB_IF is required: the interface of the SOUT fabric used for the TCP control path")
	}
	if p.err == nil && c.Sout.HCA == c.Sup.HCA && c.Sout.Port == c.Sup.Port {
		p.fail(fmt.Sprintf("MPIB_HCA_SOUT and MPIB_HCA_SUP name the same port (%s:%d)", c.Sout.HCA, c.Sout.Port))
	}
	return c, p.err
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

func (p *parser) rail(hcaVar, gidVar string) Rail {
	r := Rail{Port: 1, GIDIndex: p.int(gidVar, -1, 0, 255)}
	v := strings.TrimSpace(p.getenv(hcaVar))
	if v == "" {
		p.fail(hcaVar + " is required (the HCA name, e.g. mlx5_0 or mlx5_0:1)")
		return r
	}
	name, port, hasPort := strings.Cut(v, ":")
	if name == "" || strings.ContainsAny(name, " ,/") {
		p.fail(fmt.Sprintf("%s=%q: not an HCA name", hcaVar, v))
		return r
	}
	r.HCA = name
	if hasPort {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 255 {
			p.fail(fmt.Sprintf("%s=%q: port must be 1..255", hcaVar, v))
			return r
		}
		r.Port = n
	}
	return r
}
