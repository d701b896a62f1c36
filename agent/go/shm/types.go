package shm

import (
	"encoding/json"
	"fmt"
	"net/netip"
)

// IPv4 is an IPv4 address as the segment stores it: the host-order value (10.0.2.7 is
// 0x0A000207). It marshals to JSON as a dotted string.
type IPv4 uint32

func (ip IPv4) String() string {
	return fmt.Sprintf("%d.%d.%d.%d", byte(ip>>24), byte(ip>>16), byte(ip>>8), byte(ip))
}

// ParseIPv4 parses a dotted IPv4 address.
func ParseIPv4(s string) (IPv4, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return 0, fmt.Errorf("parse IPv4 %q: not an IPv4 address", s)
	}
	b := a.As4()
	return IPv4(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])), nil
}

// Masked is ip with the bits past its first prefixLen zeroed: the key a peer entry stores
// (spec 5.6). A prefixLen above 32 leaves ip as it is.
func (ip IPv4) Masked(prefixLen uint8) IPv4 {
	if prefixLen > 32 {
		return ip
	}
	return ip & IPv4(prefixMask(prefixLen))
}

func (ip IPv4) MarshalJSON() ([]byte, error) { return json.Marshal(ip.String()) }

func (ip *IPv4) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := ParseIPv4(s)
	*ip = v
	return err
}

// Record is a hint record (slot hint, peer entry or class default).
type Record struct {
	Seq       uint32 `json:"seq"`
	SupBw     uint32 `json:"sup_bw"`
	Flags     uint32 `json:"flags"`
	Gen       uint32 `json:"gen"`
	SetNs     uint64 `json:"set_ns"`
	PeerIP    IPv4   `json:"peer_ip"`
	PrefixLen uint8  `json:"prefix_len"`
}

// Valid reports whether the record holds a hint.
func (r Record) Valid() bool { return r.Flags&FlagValid != 0 }

// Header is the decoded segment header.
type Header struct {
	Version     uint32 `json:"version"`
	TotalSize   uint64 `json:"total_size"`
	NSlots      uint32 `json:"nslots"`
	NPeers      uint32 `json:"npeers"`
	Flags       uint32 `json:"flags"`
	HeartbeatNs uint64 `json:"heartbeat_ns"`
	AgentPID    uint32 `json:"agent_pid"`
	PeersEpoch  uint32 `json:"peers_epoch"`
	CreatedNs   uint64 `json:"created_ns"`
}

// Telemetry is a slot's plugin-written counters and rail states.
type Telemetry struct {
	SoutBytes     uint64 `json:"sout_bytes"`
	SoutRequests  uint64 `json:"sout_requests"`
	SupBytes      uint64 `json:"sup_bytes"`
	SupRequests   uint64 `json:"sup_requests"`
	ReadsApplied  uint64 `json:"reads_applied"`
	ReadsFallback uint64 `json:"reads_fallback"`
	ReadsStale    uint64 `json:"reads_stale"`
	Clamped       uint64 `json:"clamped"`
	LastSupBw     uint32 `json:"last_sup_bw"`
	LastSource    uint32 `json:"last_source"`
	LastReadNs    uint64 `json:"last_read_ns"`
	// Rail states (spec 4.3): a rail leaves service (failover) and rejoins it.
	SoutState   RailState `json:"sout_state"`
	SupState    RailState `json:"sup_state"`
	Failovers   uint32    `json:"failovers"`     // times a rail of this connection left service
	Recoveries  uint32    `json:"recoveries"`    // times a rail came back into service (format 5)
	SoutStateNs uint64    `json:"sout_state_ns"` // CLOCK_REALTIME ns of the last SoutState change, 0 never
	SupStateNs  uint64    `json:"sup_state_ns"`  // same for SupState
	// Completion telemetry (spec 4.3): what the plugin applied, when it last published, and per rail what
	// completed. Throughput is the difference of *CompletedBytes between two samples over
	// their interval; mean completion latency is the difference of *BusyNs over that of
	// *CompletedRequests.
	AppliedSupBw          uint32 `json:"applied_sup_bw"`          // split of the last posted message, after the guard and failover
	FlushWallNs           uint64 `json:"flush_wall_ns"`           // CLOCK_REALTIME ns of the plugin's last telemetry flush, 0 never
	SoutCompletedBytes    uint64 `json:"sout_completed_bytes"`    // bytes whose completion the sender saw on SOUT
	SoutCompletedRequests uint64 `json:"sout_completed_requests"` // request parts completed on SOUT
	SoutInflightBytes     uint64 `json:"sout_inflight_bytes"`     // gauge: bytes posted on SOUT, not completed yet
	SoutBusyNs            uint64 `json:"sout_busy_ns"`            // sum of completion - post time over SoutCompletedRequests
	SupCompletedBytes     uint64 `json:"sup_completed_bytes"`
	SupCompletedRequests  uint64 `json:"sup_completed_requests"`
	SupInflightBytes      uint64 `json:"sup_inflight_bytes"`
	SupBusyNs             uint64 `json:"sup_busy_ns"`
	// Active time: ns during which at least one of the connection's requests was in flight
	// on the rail. Δ*CompletedBytes over Δ*ActiveNs is the rate the rail delivered while it
	// had work: its capacity for this connection when it is the bottleneck (it never
	// idles), the rate it finishes its part at (latency included) when it is not.
	SoutActiveNs uint64 `json:"sout_active_ns"`
	SupActiveNs  uint64 `json:"sup_active_ns"`
}

// Slot is one connection slot: descriptor, hint and telemetry.
type Slot struct {
	Index        uint32    `json:"index"`
	State        SlotState `json:"state"`
	OwnerPID     uint32    `json:"owner_pid"`
	Gen          uint32    `json:"gen"`
	ConnID       uint64    `json:"conn_id"`
	LocalSoutIP  IPv4      `json:"local_sout_ip"`
	PeerSoutIP   IPv4      `json:"peer_sout_ip"`
	PeerIsland   IPv4      `json:"peer_island"`
	PathClass    PathClass `json:"path_class"`
	IsSend       uint8     `json:"is_send"`
	NQPsSout     uint16    `json:"nqps_sout"`
	NQPsSup      uint16    `json:"nqps_sup"`
	PID          uint32    `json:"pid"`
	RegisteredNs uint64    `json:"registered_ns"`
	Dev          uint16    `json:"dev"` // the plugin's fused device (format 4)
	SoutPort     uint8     `json:"sout_port"`
	SupPort      uint8     `json:"sup_port"`
	SupPath      SupPath   `json:"sup_path"` // how SUP reaches the peer (format 6)
	SoutNIC      string    `json:"sout_nic"` // as NICName shows it
	SupNIC       string    `json:"sup_nic"`
	Hint         Record    `json:"hint"`
	Telemetry    Telemetry `json:"telemetry"`
}

// Peer is one per-peer default entry.
type Peer struct {
	Index  uint32 `json:"index"`
	Record Record `json:"record"`
}

// Snapshot is a whole decoded segment. Slots and Peers hold only entries with a non-zero
// byte, in index order; all others are zero.
type Snapshot struct {
	Header Header    `json:"header"`
	Class  [2]Record `json:"class_defaults"`
	Peers  []Peer    `json:"peers"`
	Slots  []Slot    `json:"slots"`
}
