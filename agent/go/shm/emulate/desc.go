package emulate

import "github.com/mpib/mpib/agent/go/shm"

// ConnDesc describes a connection as the plugin registers it (mpib_conn_desc in C).
type ConnDesc struct {
	LocalSoutIP, PeerSoutIP, PeerIsland shm.IPv4
	PathClass                           shm.PathClass
	IsSend                              bool
	NQPsSout, NQPsSup                   uint16
	PID                                 uint32
	ConnID                              uint64
	Dev                                 uint16   // the fused device
	Ports                               [2]uint8 // SOUT's, SUP's
	NICs                                [2]string
	SupPath                             shm.SupPath // how SUP reaches the peer
}
