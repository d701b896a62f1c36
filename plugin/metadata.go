// metadata.go: the handshake's messages after the hello: each end's metadata (its QPs, GIDs and
// buffer) exchanged and checked for agreement, or the listener's refusal in its place, its
// conversion to and from the C structs, and the final ready ack. handshake.go's steps call them.

package main

/*
#include "mpib.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/topo"
	"github.com/mpib/mpib/plugin/internal/wire"
)

// exchangeMetadata sends our metadata and reads the peer's (both ends write first, so neither
// waits for the other) and checks that the two agree on the wire protocol (checkPeer). A
// listener that closed the connection before answering is errClosedEarly; one that refused it
// (a refusal where its metadata would be) is errRefused, final.
func exchangeMetadata(c net.Conn, mine wire.Metadata, peer netip.Addr) (wire.Metadata, error) {
	if _, err := c.Write(wire.EncodeMetadata(mine)); err != nil {
		return wire.Metadata{}, fmt.Errorf("metadata to %v: %w", peer, closedEarly(err))
	}
	buf := make([]byte, wire.MetadataSize)
	n, err := io.ReadFull(c, buf[:wire.RefusalHeadSize])
	if err == nil && wire.IsRefusal(buf) {
		return wire.Metadata{}, readRefusal(c, buf[:wire.RefusalHeadSize], peer)
	}
	if err == nil {
		var more int
		more, err = io.ReadFull(c, buf[wire.RefusalHeadSize:])
		n += more
	}
	if err != nil {
		if n == 0 {
			// The listener closes a connection unanswered when its gate evicted us before
			// reading our hello, or its process ended (errClosedEarly); a hello it turns down
			// gets a refusal.
			if err = closedEarly(err); errors.Is(err, errClosedEarly) {
				err = fmt.Errorf("%w (the peer evicted us before reading our hello, or its process ended)", err)
			}
		}
		return wire.Metadata{}, fmt.Errorf("metadata from %v: %w", peer, err)
	}
	theirs, err := wire.DecodeMetadata(buf)
	if err == nil {
		err = checkPeer(mine, theirs)
	}
	if err != nil {
		return theirs, fmt.Errorf("peer %v: %w", peer, err)
	}
	return theirs, nil
}

// errRefused marks a connection its listener turned down on its merits after our hello
// (wire.EncodeRefusal): dialing again would be refused again.
var errRefused = errors.New("refused by the listener")

// readRefusal reads the rest of a refusal whose head came where the metadata would be, and
// returns it as errRefused with the listener's reason and words.
func readRefusal(c net.Conn, head []byte, peer netip.Addr) error {
	reason, n, err := wire.DecodeRefusalHead(head)
	if err != nil {
		return fmt.Errorf("peer %v: %w: %w", peer, errRefused, err)
	}
	text := make([]byte, n)
	got, _ := io.ReadFull(c, text) // what came of the words is enough
	return fmt.Errorf("peer %v: %w: %v: %q (its log says more)", peer, errRefused, reason, text[:got])
}

// exchangeAck is the handshake's last step: each end says its QPs are up (RTS), and waits
// until the peer's are, before the comm goes to NCCL. joinNow says that none of this end's
// rails came up while a standby rail waits (mpib_comm_connect's MPIB_CONNECT_JOIN_NOW); it
// returns the peer's.
func exchangeAck(c net.Conn, peer netip.Addr, joinNow bool) (bool, error) {
	if _, err := c.Write(wire.EncodeAck(joinNow)); err != nil {
		return false, fmt.Errorf("ready to %v: %w", peer, err)
	}
	ack := make([]byte, wire.AckSize)
	if _, err := io.ReadFull(c, ack); err != nil {
		return false, fmt.Errorf("ready from %v: %w", peer, err)
	}
	theirs, err := wire.CheckAck(ack)
	if err != nil {
		return false, fmt.Errorf("peer %v: %w", peer, err)
	}
	return theirs, nil
}

// checkPeer verifies that both ends agree on everything that shapes the wire protocol.
func checkPeer(mine, theirs wire.Metadata) error {
	if mine.Mode != theirs.Mode {
		return fmt.Errorf("MPIB_MODE differs: local %d, peer %d (set it the same on every rank)", mine.Mode, theirs.Mode)
	}
	if mine.PathClass != theirs.PathClass {
		return fmt.Errorf("island classification differs (local %d, peer %d): check MPIB_ISLAND_PREFIX_LEN on every rank", mine.PathClass, theirs.PathClass)
	}
	if mine.NQPs != theirs.NQPs {
		return fmt.Errorf("QP counts differ: local SOUT/SUP %v, peer %v (set MPIB_SOUT_QP/MPIB_SUP_QP/MPIB_SUP_RELAY alike)", mine.NQPs, theirs.NQPs)
	}
	if mine.SupLanes != theirs.SupLanes {
		return fmt.Errorf("SUP lanes differ: local %d, peer %d (the hello's SUP pairs decide them on both ends)", mine.SupLanes, theirs.SupLanes)
	}
	if mine.Deferred != 0 && theirs.Deferred != 0 {
		return errors.New("both ends deferred their standby rail (only a sender does)")
	}
	if theirs.BufAddr == 0 {
		return errors.New("peer advertised a null buffer")
	}
	for r := range mine.Rail {
		if mine.NQPs[r] > 0 && mine.Rail[r].LinkLayer != theirs.Rail[r].LinkLayer {
			return fmt.Errorf("%s link layers differ: local %s, peer %s (both ends of a rail must be InfiniBand or both RoCE)",
				railNames[r], linkLayerName(mine.Rail[r].LinkLayer), linkLayerName(theirs.Rail[r].LinkLayer))
		}
	}
	for i := 0; i+1 < int(mine.SupLanes); i++ {
		if mine.Lane[i].LinkLayer != theirs.Lane[i].LinkLayer {
			return fmt.Errorf("SUP lane %d link layers differ: local %s, peer %s (both ends of a cable must be InfiniBand or both RoCE)",
				i+2, linkLayerName(mine.Lane[i].LinkLayer), linkLayerName(theirs.Lane[i].LinkLayer))
		}
	}
	return nil
}

// linkLayerName names a rail's link layer for checkPeer's messages.
func linkLayerName(l uint8) string {
	if l == wire.LinkLayerInfiniBand {
		return "InfiniBand"
	}
	return "Ethernet (RoCE)"
}

// metadataFromC is the wire form of a comm's local info (mpib_comm_local_info) with what Go
// adds: the mode, the path class and each rail's interface prefix length.
func metadataFromC(info *C.struct_mpib_conn_info, mode int, path topo.PathClass, prefix [2]uint8) wire.Metadata {
	m := wire.Metadata{Mode: uint8(mode), PathClass: uint8(path), TC: uint8(info.tc), SL: uint8(info.sl),
		BufAddr: uint64(info.buf_addr)}
	for r := 0; r < wire.Rails; r++ {
		m.NQPs[r] = uint32(info.nqps[r])
		ri := &info.rail[r]
		m.Rail[r].GID = *(*[16]byte)(unsafe.Pointer(&ri.gid[0]))
		m.Rail[r].MTU = uint32(ri.mtu)
		m.Rail[r].RKey = uint32(ri.rkey)
		m.Rail[r].LID = uint16(ri.lid)
		m.Rail[r].LinkLayer = uint8(ri.link_layer)
		m.Rail[r].PrefixLen = prefix[r]
		m.Rail[r].ECE = wire.ECE{Valid: ri.ece_valid != 0, VendorID: uint32(ri.ece.vendor_id),
			Options: uint32(ri.ece.options), CompMask: uint32(ri.ece.comp_mask)}
		for q := 0; q < wire.MaxQPsPerRail; q++ {
			m.Rail[r].QPN[q] = uint32(ri.qpn[q])
		}
	}
	m.SupLanes = uint8(info.sup_lanes)
	m.Deferred = uint8(info.deferred)
	for i := range m.Lane {
		li := &info.lane[i]
		m.Lane[i] = wire.LaneInfo{GID: *(*[16]byte)(unsafe.Pointer(&li.gid[0])), MTU: uint32(li.mtu), RKey: uint32(li.rkey),
			LID: uint16(li.lid), LinkLayer: uint8(li.link_layer)}
	}
	return m
}

// metadataToC is the peer's metadata as mpib_comm_connect takes it.
func metadataToC(m wire.Metadata) C.struct_mpib_conn_info {
	var info C.struct_mpib_conn_info
	info.buf_addr = C.uint64_t(m.BufAddr)
	info.tc, info.sl = C.uint8_t(m.TC), C.uint8_t(m.SL)
	for r := 0; r < wire.Rails; r++ {
		info.nqps[r] = C.uint32_t(m.NQPs[r])
		ri := &info.rail[r]
		*(*[16]byte)(unsafe.Pointer(&ri.gid[0])) = m.Rail[r].GID
		ri.mtu = C.uint32_t(m.Rail[r].MTU)
		ri.rkey = C.uint32_t(m.Rail[r].RKey)
		ri.lid = C.uint16_t(m.Rail[r].LID)
		ri.link_layer = C.uint8_t(m.Rail[r].LinkLayer)
		ri.ece_valid = C.uint8_t(boolInt(m.Rail[r].ECE.Valid))
		ri.ece.vendor_id = C.uint32_t(m.Rail[r].ECE.VendorID)
		ri.ece.options = C.uint32_t(m.Rail[r].ECE.Options)
		ri.ece.comp_mask = C.uint32_t(m.Rail[r].ECE.CompMask)
		for q := 0; q < wire.MaxQPsPerRail; q++ {
			ri.qpn[q] = C.uint32_t(m.Rail[r].QPN[q])
		}
	}
	info.sup_lanes = C.uint32_t(m.SupLanes)
	info.deferred = C.uint32_t(m.Deferred)
	for i, l := range m.Lane {
		li := &info.lane[i]
		*(*[16]byte)(unsafe.Pointer(&li.gid[0])) = l.GID
		li.mtu, li.rkey, li.lid, li.link_layer = C.uint32_t(l.MTU), C.uint32_t(l.RKey), C.uint16_t(l.LID), C.uint8_t(l.LinkLayer)
	}
	return info
}
