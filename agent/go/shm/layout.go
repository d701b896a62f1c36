package shm

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// Format constants (docs/shm-format.md, section 4).
const (
	Magic       = "MPIBHINT"
	Version     = 6
	HeaderSize  = wire.HeaderSize
	SlotSize    = wire.SlotSize
	PeerSize    = wire.PeerSize
	MaxSlots    = 65536
	MaxPeers    = 4096
	SupBwMax    = 1024 // sup_bw is in parts per 1024: 0 all SOUT, 1024 all SUP
	SeqAttempts = 8    // seqlock read attempts before a record counts as busy
	FlagValid   = 1    // hint record flag: the record holds a hint
	// DefaultPathPrefix + the effective uid is the default segment path (one per user).
	DefaultPathPrefix = "/dev/shm/mpib-hints-"
	DefaultSlots      = 1024
	DefaultPeers      = 256
	// DefaultStaleMs is the plugin's MPIB_AGENT_STALE_MS default.
	DefaultStaleMs = 500
	// MaxStaleMs bounds MPIB_AGENT_STALE_MS (as the plugin does).
	MaxStaleMs = 3600000
	// NICNameSize is the size of a slot's NIC name field.
	NICNameSize = wire.NICNameSize
)

// SlotState is the low half of a slot's owner word.
type SlotState uint32

const (
	StateFree     SlotState = 0
	StateClaiming SlotState = 1
	StateActive   SlotState = 2
)

func (s SlotState) String() string {
	switch s {
	case StateFree:
		return "free"
	case StateClaiming:
		return "claiming"
	case StateActive:
		return "active"
	}
	return "invalid"
}

// PathClass of a connection.
type PathClass uint8

const (
	IntraIsland PathClass = 0
	InterIsland PathClass = 1
)

// SupPath is how a connection's SUP QPs reach the peer (slot sup_path). It is a
// number in JSON, as path_class is; String names it for people.
type SupPath uint8

const (
	SupPathNone   SupPath = 0 // no SUP QPs
	SupPathDirect SupPath = 1 // the peer's SUP address is in our port's connected prefix
	SupPathRouted SupPath = 2 // through the fabric's forwarding (MPIB_SUP_RELAY=1)
	SupPathIsland SupPath = 3 // a SUP pair without addresses: the SOUT island says SUP reaches
)

func (p SupPath) String() string {
	switch p {
	case SupPathNone:
		return "none"
	case SupPathDirect:
		return "direct"
	case SupPathRouted:
		return "routed"
	case SupPathIsland:
		return "island"
	}
	return "unknown(" + strconv.Itoa(int(p)) + ")"
}

// RailState is a rail's state on one connection (slot telemetry, sout_state/sup_state).
// It marshals to JSON as "up", "down", "failed", or "unknown(N)" for any other value.
type RailState uint8

const (
	RailUp     RailState = 0 // in service
	RailDown   RailState = 1 // out of service after a failover, retried with back-off
	RailFailed RailState = 2 // its device is gone; never retried
)

func (r RailState) String() string {
	switch r {
	case RailUp:
		return "up"
	case RailDown:
		return "down"
	case RailFailed:
		return "failed"
	}
	return "unknown(" + strconv.Itoa(int(r)) + ")"
}

// ParseRailState is the inverse of RailState.String.
func ParseRailState(s string) (RailState, error) {
	switch s {
	case "up":
		return RailUp, nil
	case "down":
		return RailDown, nil
	case "failed":
		return RailFailed, nil
	}
	if n, ok := strings.CutPrefix(s, "unknown("); ok {
		if n, ok := strings.CutSuffix(n, ")"); ok {
			if v, err := strconv.ParseUint(n, 10, 8); err == nil && RailState(v).String() == s {
				return RailState(v), nil
			}
		}
	}
	return 0, fmt.Errorf("rail state %q: want up, down, failed or unknown(N)", s)
}

func (r RailState) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func (r *RailState) UnmarshalText(b []byte) error {
	v, err := ParseRailState(string(b))
	*r = v
	return err
}

func (c PathClass) String() string {
	switch c {
	case IntraIsland:
		return "intra"
	case InterIsland:
		return "inter"
	}
	return "invalid"
}

// TotalSize is the size of a segment with nslots slots and npeers peer entries.
func TotalSize(nslots, npeers uint32) uint64 {
	return HeaderSize + uint64(nslots)*SlotSize + uint64(npeers)*PeerSize
}
