package main

/*
#include <stdlib.h>
#include "mpib.h"
#include "mpib_shm.h"
*/
import "C"

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/mpib/mpib/plugin/internal/topo"
	"github.com/mpib/mpib/plugin/internal/wire"
)

// Connection setup runs in goroutines so that NCCL's connect/accept calls never block: each
// call only looks at whether the handshake finished. Two peers connecting to each other
// first therefore cannot deadlock.

type result struct {
	comm *C.struct_mpib_comm
	err  error
}

type listener struct {
	ln      net.Listener
	nonce   uint64
	results chan result
	done    chan struct{}
}

type attempt struct {
	done chan struct{}
	res  result
}

var registry struct {
	mu        sync.Mutex
	nextID    uint64
	listeners map[uint64]*listener
	attempts  map[uint64]*attempt
}

func newID() uint64 {
	registry.nextID++
	return registry.nextID
}

func randomNonce() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

func handshakeTimeout() time.Duration {
	return time.Duration(plugin.cfg.HandshakeTimeoutMS) * time.Millisecond
}

func checkDevice(dev C.int) C.int {
	if C.mpib_g.ndevs_open != C.MPIB_NRAILS {
		warnf("called before a successful init")
		return C.int(resInternalError)
	}
	if dev != 0 {
		warnf("device %d does not exist: MPIB exposes one fused device (0)", int(dev))
		return C.int(resInvalidArgument)
	}
	return C.int(resSuccess)
}

//export mpibGoListen
func mpibGoListen(dev C.int, handle unsafe.Pointer, listenComm *unsafe.Pointer) C.int {
	*listenComm = nil
	if rc := checkDevice(dev); rc != C.int(resSuccess) {
		return rc
	}
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(plugin.oobAddr, 0).String())
	if err != nil {
		warnf("listen on %s (MPIB_OOB_IF=%s): %v", plugin.oobAddr, plugin.cfg.OOBInterface, err)
		return C.int(resSystemError)
	}
	l := &listener{ln: ln, nonce: randomNonce(), results: make(chan result, 64), done: make(chan struct{})}
	wire.EncodeHandle(unsafe.Slice((*byte)(handle), wire.HandleSize),
		wire.Handle{Addr: netip.MustParseAddrPort(ln.Addr().String()), Nonce: l.nonce})
	registry.mu.Lock()
	if registry.listeners == nil {
		registry.listeners = map[uint64]*listener{}
		registry.attempts = map[uint64]*attempt{}
	}
	id := newID()
	registry.listeners[id] = l
	registry.mu.Unlock()
	go l.acceptLoop()
	lc := (*C.struct_mpib_listen_comm)(C.calloc(1, C.sizeof_struct_mpib_listen_comm))
	lc.id = C.uint64_t(id)
	*listenComm = unsafe.Pointer(lc)
	return C.int(resSuccess)
}

func (l *listener) acceptLoop() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return // closed by closeListen
		}
		go func() {
			comm, err := acceptHandshake(c, l.nonce)
			select {
			case l.results <- result{comm, err}:
			case <-l.done:
				C.mpib_comm_destroy(comm)
			}
		}()
	}
}

//export mpibGoAccept
func mpibGoAccept(listenComm unsafe.Pointer, recvComm *unsafe.Pointer) C.int {
	*recvComm = nil
	id := uint64((*C.struct_mpib_listen_comm)(listenComm).id)
	registry.mu.Lock()
	l := registry.listeners[id]
	registry.mu.Unlock()
	if l == nil {
		warnf("accept on a closed or unknown listen comm")
		return C.int(resInvalidArgument)
	}
	select {
	case r := <-l.results:
		if r.err != nil {
			warnf("accept: %v", r.err)
			return C.int(resRemoteError)
		}
		*recvComm = unsafe.Pointer(r.comm)
	default:
	}
	return C.int(resSuccess)
}

//export mpibGoCloseListen
func mpibGoCloseListen(listenComm unsafe.Pointer) C.int {
	lc := (*C.struct_mpib_listen_comm)(listenComm)
	registry.mu.Lock()
	l := registry.listeners[uint64(lc.id)]
	delete(registry.listeners, uint64(lc.id))
	registry.mu.Unlock()
	if l != nil {
		close(l.done)
		l.ln.Close()
	drain:
		for {
			select {
			case r := <-l.results:
				C.mpib_comm_destroy(r.comm)
			default:
				break drain
			}
		}
	}
	C.free(listenComm)
	return C.int(resSuccess)
}

//export mpibGoConnect
func mpibGoConnect(dev C.int, handle unsafe.Pointer, sendComm *unsafe.Pointer) C.int {
	*sendComm = nil
	if rc := checkDevice(dev); rc != C.int(resSuccess) {
		return rc
	}
	hb := unsafe.Slice((*byte)(handle), wire.HandleSize)
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if id := wire.Attempt(hb); id != 0 {
		a := registry.attempts[id]
		if a == nil {
			warnf("connect: unknown connection attempt %d in the handle", id)
			return C.int(resInvalidArgument)
		}
		select {
		case <-a.done:
		default:
			return C.int(resSuccess) // still in progress: NCCL calls again
		}
		delete(registry.attempts, id)
		if a.res.err != nil {
			warnf("connect: %v", a.res.err)
			return C.int(resRemoteError)
		}
		*sendComm = unsafe.Pointer(a.res.comm)
		return C.int(resSuccess)
	}
	h, err := wire.DecodeHandle(hb)
	if err != nil {
		warnf("connect: %v", err)
		return C.int(resInvalidArgument)
	}
	if registry.attempts == nil {
		registry.listeners = map[uint64]*listener{}
		registry.attempts = map[uint64]*attempt{}
	}
	id := newID()
	a := &attempt{done: make(chan struct{})}
	registry.attempts[id] = a
	wire.SetAttempt(hb, id)
	go func() {
		a.res.comm, a.res.err = connectHandshake(h)
		close(a.done)
	}()
	return C.int(resSuccess)
}

// connectHandshake is the sending side: dial, hello, metadata, QPs to RTS, ready.
func connectHandshake(h wire.Handle) (*C.struct_mpib_comm, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: plugin.oobAddr.AsSlice()}, Timeout: handshakeTimeout()}
	c, err := d.Dial("tcp4", h.Addr.String())
	if err != nil {
		return nil, fmt.Errorf("control connection to %v from %v: %w", h.Addr, plugin.oobAddr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(handshakeTimeout()))
	if _, err := c.Write(wire.EncodeHello(h.Nonce)); err != nil {
		return nil, fmt.Errorf("hello to %v: %w", h.Addr, err)
	}
	return handshake(c, true)
}

// acceptHandshake is the receiving side of one incoming control connection.
func acceptHandshake(c net.Conn, nonce uint64) (*C.struct_mpib_comm, error) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(handshakeTimeout()))
	hello := make([]byte, wire.HelloSize)
	if _, err := io.ReadFull(c, hello); err != nil {
		return nil, fmt.Errorf("hello from %v: %w", c.RemoteAddr(), err)
	}
	got, err := wire.DecodeHello(hello)
	if err != nil {
		return nil, fmt.Errorf("peer %v: %w", c.RemoteAddr(), err)
	}
	if got != nonce {
		return nil, fmt.Errorf("peer %v used a handle of another listener (stale or misrouted handle)", c.RemoteAddr())
	}
	return handshake(c, false)
}

// handshake classifies the connection, builds the comm and its QPs, exchanges metadata with
// the peer and brings every QP to RTS. Both sides compute the path class from the two ends
// of the same TCP socket, so their QP counts agree; the metadata exchange verifies it.
func handshake(c net.Conn, isSend bool) (*C.struct_mpib_comm, error) {
	local := netip.MustParseAddrPort(c.LocalAddr().String()).Addr().Unmap()
	peer := netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()
	cfg := plugin.cfg
	path, err := topo.Classify(local, peer, cfg.IslandPrefixLen)
	if err != nil {
		return nil, err
	}
	nqps := [2]C.uint32_t{C.uint32_t(cfg.SoutQPs), 0}
	if C.mpib_sup_qps_wanted(C.int(cfg.Mode), C.int(path), boolInt(cfg.SupRelay)) != 0 {
		nqps[1] = C.uint32_t(cfg.SupQPs)
	}
	comm := C.mpib_comm_create(boolInt(isSend), C.int(cfg.Mode), C.int(path), &nqps[0])
	if comm == nil {
		return nil, errors.New("creating the connection's verbs resources failed (see the warning above)")
	}
	fail := func(err error) (*C.struct_mpib_comm, error) {
		C.mpib_comm_destroy(comm)
		return nil, err
	}
	var info C.struct_mpib_conn_info
	C.mpib_comm_local_info(comm, &info)
	mine := metadataFromC(&info, cfg.Mode, path)
	if _, err := c.Write(wire.EncodeMetadata(mine)); err != nil {
		return fail(fmt.Errorf("metadata to %v: %w", peer, err))
	}
	buf := make([]byte, wire.MetadataSize)
	if _, err := io.ReadFull(c, buf); err != nil {
		return fail(fmt.Errorf("metadata from %v: %w", peer, err))
	}
	theirs, err := wire.DecodeMetadata(buf)
	if err != nil {
		return fail(fmt.Errorf("peer %v: %w", peer, err))
	}
	if err := checkPeer(mine, theirs); err != nil {
		return fail(fmt.Errorf("peer %v: %w", peer, err))
	}
	remote := metadataToC(theirs)
	if rc := C.mpib_comm_connect(comm, &remote); rc != 0 {
		return fail(fmt.Errorf("bringing QPs to %v up failed (%d); is the SUP fabric reachable?", peer, int(rc)))
	}
	if _, err := c.Write(wire.EncodeAck()); err != nil {
		return fail(fmt.Errorf("ready to %v: %w", peer, err))
	}
	ack := make([]byte, wire.AckSize)
	if _, err := io.ReadFull(c, ack); err != nil {
		return fail(fmt.Errorf("ready from %v: %w", peer, err))
	}
	if err := wire.CheckAck(ack); err != nil {
		return fail(fmt.Errorf("peer %v: %w", peer, err))
	}
	registerWithAgent(comm, local, peer, path, isSend)
	infof("%s comm %v <-> %v: %v, SOUT QPs %d, SUP QPs %d, CTS on %s", map[bool]string{true: "send", false: "recv"}[isSend],
		local, peer, path, int(nqps[0]), int(nqps[1]), []string{"SOUT", "SUP"}[comm.cts_rail])
	return comm, nil
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
	if theirs.BufAddr == 0 {
		return errors.New("peer advertised a null buffer")
	}
	return nil
}

func metadataFromC(info *C.struct_mpib_conn_info, mode int, path topo.PathClass) wire.Metadata {
	m := wire.Metadata{Mode: uint8(mode), PathClass: uint8(path), BufAddr: uint64(info.buf_addr)}
	for r := 0; r < wire.Rails; r++ {
		m.NQPs[r] = uint32(info.nqps[r])
		ri := &info.rail[r]
		m.Rail[r].GID = *(*[16]byte)(unsafe.Pointer(&ri.gid[0]))
		m.Rail[r].MTU = uint32(ri.mtu)
		m.Rail[r].RKey = uint32(ri.rkey)
		for q := 0; q < wire.MaxQPsPerRail; q++ {
			m.Rail[r].QPN[q] = uint32(ri.qpn[q])
		}
	}
	return m
}

func metadataToC(m wire.Metadata) C.struct_mpib_conn_info {
	var info C.struct_mpib_conn_info
	info.buf_addr = C.uint64_t(m.BufAddr)
	for r := 0; r < wire.Rails; r++ {
		info.nqps[r] = C.uint32_t(m.NQPs[r])
		ri := &info.rail[r]
		*(*[16]byte)(unsafe.Pointer(&ri.gid[0])) = m.Rail[r].GID
		ri.mtu = C.uint32_t(m.Rail[r].MTU)
		ri.rkey = C.uint32_t(m.Rail[r].RKey)
		for q := 0; q < wire.MaxQPsPerRail; q++ {
			ri.qpn[q] = C.uint32_t(m.Rail[r].QPN[q])
		}
	}
	return info
}

// Agent segment (advanced mode). The segment is opened lazily at connect time, so an agent
// started after NCCL's init still takes effect for connections made after it.
var agent struct {
	mu          sync.Mutex
	shm         *C.mpib_shm
	lastFailure string
	nextConnID  uint64
}

func openAgentSegment() *C.mpib_shm {
	agent.mu.Lock()
	defer agent.mu.Unlock()
	if agent.shm != nil {
		return agent.shm
	}
	path := C.CString(plugin.cfg.ShmPath)
	defer C.free(unsafe.Pointer(path))
	var errbuf [256]C.char
	var shm *C.mpib_shm
	if rc := C.mpib_shm_open(path, &shm, &errbuf[0], C.size_t(len(errbuf))); rc != 0 {
		msg := C.GoString(&errbuf[0])
		if msg != agent.lastFailure { // say it once, not per connection
			infof("advanced mode: agent segment %s unusable (%s): vanilla policy for new connections", plugin.cfg.ShmPath, msg)
			agent.lastFailure = msg
		}
		return nil
	}
	agent.shm = shm
	C.mpib_set_shm(unsafe.Pointer(shm))
	infof("advanced mode: agent segment %s opened", plugin.cfg.ShmPath)
	return shm
}

func registerWithAgent(comm *C.struct_mpib_comm, local, peer netip.Addr, path topo.PathClass, isSend bool) {
	if plugin.cfg.Mode != 1 {
		return
	}
	shm := openAgentSegment()
	if shm == nil {
		return
	}
	agent.mu.Lock()
	agent.nextConnID++
	connID := uint64(os.Getpid())<<32 | agent.nextConnID
	agent.mu.Unlock()
	d := C.mpib_conn_desc{
		local_sout_ip: C.uint32_t(topo.IPv4ToUint32(local)),
		peer_sout_ip:  C.uint32_t(topo.IPv4ToUint32(peer)),
		peer_island:   C.uint32_t(topo.Island(peer, plugin.cfg.IslandPrefixLen)),
		path_class:    C.uint8_t(path),
		is_send:       C.uint8_t(boolInt(isSend)),
		nqps_sout:     C.uint16_t(comm.nqps[0]),
		nqps_sup:      C.uint16_t(comm.nqps[1]),
		pid:           C.uint32_t(os.Getpid()),
		conn_id:       C.uint64_t(connID),
	}
	var slot C.uint32_t
	if rc := C.mpib_shm_register(shm, &d, &slot); rc != 0 {
		warnf("advanced mode: no free slot in the agent segment (%d): connection %v -> %v stays on the vanilla policy", int(rc), local, peer)
		return
	}
	comm.shm_slot = C.int(slot)
}

func closeAgentSegment() {
	agent.mu.Lock()
	defer agent.mu.Unlock()
	if agent.shm != nil {
		C.mpib_set_shm(nil)
		C.mpib_shm_close(agent.shm)
		agent.shm = nil
	}
}
