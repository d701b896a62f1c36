// Package rules re-exports, for programs outside plugin/, the plugin's own configuration
// parser and the pure decisions it takes from that configuration: which GID a port uses,
// which island a peer is in, whether SUP reaches a peer, and where a NIC sits in the PCI
// tree. Go's internal rule keeps plugin/internal/* importable only from under plugin/;
// mpib-agent doctor (agent/go/doctor) must decide exactly as the plugin does, so it calls
// the same code through these names. Aliases and function values only: no logic lives here,
// and a change to the plugin's rules is a change to the doctor's.
package rules

import (
	"github.com/mpib/mpib/plugin/internal/config"
	"github.com/mpib/mpib/plugin/internal/gid"
	"github.com/mpib/mpib/plugin/internal/suppair"
	"github.com/mpib/mpib/plugin/internal/topo"
)

// The configuration (package config).
type (
	Config    = config.Config
	Device    = config.Device
	Rail      = config.Rail
	GIDPolicy = config.GIDPolicy
)

var (
	// ParseConfig reads MPIB_* and NCCL_IB_* through getenv as the plugin's init does.
	ParseConfig = config.Parse
	// ErrInvalidConfig marks a configuration error ParseConfig returns.
	ErrInvalidConfig = config.ErrInvalid
	// UnknownSettings words, for each MPIB_* variable of an environment (os.Environ) that the
	// plugin does not read, the warning its init logs.
	UnknownSettings = config.Unknown
)

// GID selection (package gid).
type GIDEntry = gid.Entry

const (
	GIDTypeIB     = gid.TypeIB
	GIDTypeRoCEv1 = gid.TypeRoCEv1
	GIDTypeRoCEv2 = gid.TypeRoCEv2
	MaxGIDIndex   = gid.MaxIndex
)

var (
	ChooseRoCEGID = gid.ChooseRoCE
	ChooseIBGID   = gid.ChooseIB
	ErrNoGID      = gid.ErrNoGID
)

// Islands, SUP pairs, routes and PCI places (package topo).
type (
	PathClass = topo.PathClass
	PathKind  = topo.PathKind
	SupPort   = topo.Port
	PeerAddr  = topo.PeerAddr
	Route     = topo.Route
	Choice    = topo.Choice
	RailPCI   = topo.RailPCI
	Relation  = topo.Relation
)

const (
	IntraIsland = topo.IntraIsland
	InterIsland = topo.InterIsland

	PathNone   = topo.PathNone
	PathDirect = topo.PathDirect
	PathRouted = topo.PathRouted

	RelationUnknown             = topo.RelationUnknown
	RelationSameAdapter         = topo.RelationSameAdapter
	RelationSamePCIeSwitch      = topo.RelationSamePCIeSwitch
	RelationSameHostBridge      = topo.RelationSameHostBridge
	RelationDifferentHostBridge = topo.RelationDifferentHostBridge
	RelationDifferentNUMA       = topo.RelationDifferentNUMA
)

var (
	// Classify is the island rule both ends of a connection apply to their SOUT addresses.
	Classify = topo.Classify
	// ChooseSupPairs is the connector's SUP verdict towards a peer's SUP addresses.
	ChooseSupPairs = topo.ChooseSupPairs
	// ParseProcRoute reads /proc/net/route as the plugin does for MPIB_SUP_RELAY.
	ParseProcRoute = topo.ParseProcRoute
	// Place relates two PCI devices the way NCCL's topology walk does.
	Place = topo.Place
	// DescribeSupPort turns a SUP port's facts into the port the plugin advertises, or says
	// why it cannot (then the plugin treats the device's SUP as unaddressed).
	DescribeSupPort = suppair.Describe
)
