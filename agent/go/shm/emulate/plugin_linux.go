//go:build linux

package emulate

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/internal/wire"
)

// Plugin is one emulated plugin process attached to a segment. Methods are safe for
// concurrent use by goroutines. Its leases last until Release or Close.
type Plugin struct {
	path   string
	mu     sync.RWMutex // Close takes it for writing; every access holds it for reading
	f      *os.File     // the open file description the leases are taken through
	v      wire.View
	nslots uint32
	gone   atomic.Bool
}

// Attach maps the segment at path (validated as shm.Validate does) for the plugin's side.
func Attach(path string) (*Plugin, error) {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_CLOEXEC|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("attach: %w", err)
	}
	st, err := f.Stat()
	if err != nil || st.Size() < shm.HeaderSize {
		f.Close()
		return nil, fmt.Errorf("attach %s: %w", path, errors.Join(err, shm.ErrTooSmall))
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("attach %s: mmap: %w", path, err)
	}
	h, err := shm.Validate(mem)
	if err != nil {
		_ = unix.Munmap(mem)
		f.Close()
		return nil, fmt.Errorf("attach %s: %w", path, err)
	}
	return &Plugin{path: path, f: f, v: wire.View{B: mem, Live: true}, nslots: h.NSlots}, nil
}

// Close unmaps the segment and drops the Plugin's leases, as a plugin process exiting does.
func (p *Plugin) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.f == nil {
		return nil
	}
	err := unix.Munmap(p.v.B)
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	p.f, p.v = nil, wire.View{}
	return err
}

// do runs fn on the mapping; a fault (the file truncated under the mapping) becomes
// shm.ErrSegmentGone instead of a crash, as for the agent's Segment.
func (p *Plugin) do(fn func(v wire.View) error) (err error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.f == nil {
		return fmt.Errorf("%s: %w", p.path, os.ErrClosed)
	}
	if p.gone.Load() {
		return fmt.Errorf("%s: %w", p.path, shm.ErrSegmentGone)
	}
	faulted, err := wire.Guarded(p.v, fn)
	if faulted {
		p.gone.Store(true)
		return fmt.Errorf("%s: %w", p.path, shm.ErrSegmentGone)
	}
	return err
}

// ofdLock takes (F_WRLCK, never waiting) or drops (F_UNLCK) the OFD lock on one byte.
func ofdLock(f *os.File, off int64, typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: off, Len: 1}
	err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return unix.EAGAIN
	}
	return err
}

// Register claims a slot as the plugin does (spec 5.4): take the slot's lease, CAS the owner
// word free -> claiming, fill the slot, zero its telemetry, then publish it active. A zero
// d.PID is this process's pid.
func (p *Plugin) Register(d ConnDesc) (uint32, error) {
	pid := d.PID
	if pid == 0 {
		pid = uint32(os.Getpid())
	}
	var slot uint32
	err := p.do(func(v wire.View) error {
		n := p.nslots
		start := uint32((uint64(pid)*31 + d.ConnID) % uint64(n))
		for k := uint32(0); k < n; k++ {
			i := (start + k) % n
			off := wire.SlotOff(i)
			if v.U64(off+wire.SlOwner) != 0 || ofdLock(p.f, wire.SlotLockOff(i), unix.F_WRLCK) != nil {
				continue
			}
			if !v.CAS64(off+wire.SlOwner, 0, uint64(shm.StateClaiming)|uint64(pid)<<32) {
				_ = ofdLock(p.f, wire.SlotLockOff(i), unix.F_UNLCK)
				continue
			}
			fillSlot(v, off, d, pid)
			v.Put64(off+wire.SlOwner, uint64(shm.StateActive)|uint64(pid)<<32)
			slot = i
			return nil
		}
		return fmt.Errorf("register: %w (%d slots)", shm.ErrSlotsFull, n)
	})
	return slot, err
}

// fillSlot writes a claimed slot's registration (generation + 1, never 0) and zeroes its
// telemetry.
func fillSlot(v wire.View, off int, d ConnDesc, pid uint32) {
	gen := v.U32(off+wire.SlGen) + 1
	if gen == 0 {
		gen = 1
	}
	v.Put32(off+wire.SlGen, gen)
	v.Put64(off+wire.SlConnID, d.ConnID)
	v.Put32(off+wire.SlLocalIP, uint32(d.LocalSoutIP))
	v.Put32(off+wire.SlPeerIP, uint32(d.PeerSoutIP))
	v.Put32(off+wire.SlPeerIsland, uint32(d.PeerIsland))
	v.Put8(off+wire.SlPathClass, uint8(d.PathClass))
	var send uint8
	if d.IsSend {
		send = 1
	}
	v.Put8(off+wire.SlIsSend, send)
	v.Put16(off+wire.SlNQPsSout, d.NQPsSout)
	v.Put16(off+wire.SlNQPsSup, d.NQPsSup)
	v.Put32(off+wire.SlPID, pid)
	v.Put64(off+wire.SlRegistered, shm.Now())
	v.Put16(off+wire.SlDev, d.Dev)
	v.Put8(off+wire.SlSoutPort, d.Ports[0])
	v.Put8(off+wire.SlSupPort, d.Ports[1])
	v.Put8(off+wire.SlSupPath, uint8(d.SupPath))
	v.PutNICName(off+wire.SlSoutNIC, d.NICs[0])
	v.PutNICName(off+wire.SlSupNIC, d.NICs[1])
	zeroTelemetry(v, off)
}

// zeroTelemetry zeroes every telemetry field of the slot at off (its reserved bytes stay).
func zeroTelemetry(v wire.View, off int) {
	for _, o := range []int{wire.SlSoutBytes, wire.SlSoutRequests, wire.SlSupBytes, wire.SlSupRequests,
		wire.SlReadsApplied, wire.SlReadsFallback, wire.SlReadsStale, wire.SlClamped, wire.SlLastReadNs,
		wire.SlSoutStateNs, wire.SlSupStateNs, wire.SlFlushWallNs, wire.SlActiveNs, wire.SlActiveNs + 8} {
		v.Put64(off+o, 0)
	}
	for _, o := range []int{wire.SlLastSupBw, wire.SlLastSource, wire.SlFailovers, wire.SlAppliedSupBw, wire.SlRecoveries} {
		v.Put32(off+o, 0)
	}
	v.Put8(off+wire.SlSoutState, 0)
	v.Put8(off+wire.SlSupState, 0)
	for o := wire.SlRailDone; o < wire.SlRailDone+2*wire.RdSize; o += 8 {
		v.Put64(off+o, 0)
	}
}

// Release frees a slot as the plugin does at close: owner word to 0, then the lease.
func (p *Plugin) Release(slot uint32) error {
	if slot >= p.nslots {
		return fmt.Errorf("release slot %d: %w", slot, shm.ErrSlotRange)
	}
	return p.do(func(v wire.View) error {
		v.Put64(wire.SlotOff(slot)+wire.SlOwner, 0)
		_ = ofdLock(p.f, wire.SlotLockOff(slot), unix.F_UNLCK)
		return nil
	})
}
