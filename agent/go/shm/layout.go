package shm

import (
	"fmt"
	"strconv"
	"strings"
)

// Format constants (docs/shm-format.md, section 4).
const (
	Magic       = "MPIBHINT"
	Version     = 6
	HeaderSize  = 256
	SlotSize    = 384
	PeerSize    = 64
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
)

// Lock bytes (spec 5.7): file offsets used as OFD lock keys, never as data.
const (
	lockAttach = 0 // shared: a plugin process has the segment attached
	lockAgent  = 1 // exclusive: the one agent that beats the heartbeat
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

// SupPath is how a connection's SUP QPs reach the peer (slot sup_path, version 6). It is a
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

// Header field offsets.
const (
	offMagic       = 0
	offVersion     = 8
	offHeaderSize  = 12
	offTotalSize   = 16
	offNSlots      = 24
	offSlotSize    = 28
	offNPeers      = 32
	offPeerSize    = 36
	offFlags       = 40
	offHeartbeat   = 64
	offAgentPID    = 72
	offPeersEpoch  = 76
	offCreated     = 80
	offClassRecord = 128 // two hint records, 64 bytes each
)

// Hint record field offsets (relative).
const (
	recSeq       = 0
	recSupBw     = 4
	recFlags     = 8
	recGen       = 12
	recSetNs     = 16
	recPeerIP    = 24
	recPrefixLen = 28
	recSize      = 64
)

// Slot field offsets (relative).
const (
	slOwner         = 0
	slGen           = 8
	slConnID        = 16
	slLocalIP       = 24
	slPeerIP        = 28
	slPeerIsland    = 32
	slPathClass     = 36
	slIsSend        = 37
	slNQPsSout      = 38
	slNQPsSup       = 40
	slDev           = 42 // version 4: the fused device
	slPID           = 44
	slRegistered    = 48
	slSoutPort      = 56 // version 4: the NICs' ports, u8 each
	slSupPort       = 57
	slSupPath       = 58 // version 6: how SUP reaches the peer (SupPath)
	slHint          = 64
	slSoutBytes     = 128
	slSoutRequests  = 136
	slSupBytes      = 144
	slSupRequests   = 152
	slReadsApplied  = 160
	slReadsFallback = 168
	slReadsStale    = 176
	slClamped       = 184
	slLastSupBw     = 192
	slLastSource    = 196
	slLastReadNs    = 200
	slSoutState     = 208
	slSupState      = 209
	slFailovers     = 212
	slSoutStateNs   = 216
	slSupStateNs    = 224
	slAppliedSupBw  = 232
	slRecoveries    = 236 // version 5: times a rail came back into service
	slFlushWallNs   = 240
	// Per-rail completion telemetry (version 3): one 32-byte block per rail, SOUT then SUP.
	slRailDone = 256
	rdBytes    = 0  // completed_bytes
	rdRequests = 8  // completed_requests
	rdInflight = 16 // inflight_bytes (a gauge)
	rdBusyNs   = 24 // busy_ns: sum of completion - post time over completed requests
	rdSize     = 32
	// Per-rail active time (version 3, +320): u64 SOUT, then u64 SUP.
	slActiveNs = 320
	// The NICs' names (version 4, +336): char[NICNameSize] SOUT, then SUP.
	slSoutNIC   = 336
	slSupNIC    = 360
	NICNameSize = 24
	slTelemetry = 128 // telemetry spans [128, SlotSize)
)

// TotalSize is the size of a segment with nslots slots and npeers peer entries.
func TotalSize(nslots, npeers uint32) uint64 {
	return HeaderSize + uint64(nslots)*SlotSize + uint64(npeers)*PeerSize
}

func slotOff(i uint32) int { return HeaderSize + int(i)*SlotSize }

func peerOff(nslots, j uint32) int { return HeaderSize + int(nslots)*SlotSize + int(j)*PeerSize }

func classOff(c uint8) int { return offClassRecord + int(c)*recSize }

// slotLockOff is the lock byte of slot i's lease: the slot's first byte.
func slotLockOff(i uint32) int64 { return int64(slotOff(i)) }
