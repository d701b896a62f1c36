// events.go: the NICs' async events (mpib_events.c) waited on by the Go runtime's netpoller.
// Each open NIC has a goroutine parked on its async fd, which holds no OS thread: the runtime
// already waits in epoll for the control plane's sockets, so events cost MPIB no thread of
// their own (net_ib runs one per device). When the fd is readable the goroutine makes one C
// call, mpib_events_drain, which handles every queued event; the handling itself stays in C.
// init.go starts a watcher per NIC it opens; closeNICs ends them before the NICs close.

package main

/*
#include "mpib.h"
#include "mpib_device.h"
#include "mpib_events.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// eventWatchers are the watchers' files (each a dup of a NIC's async fd, so closing it never
// closes libibverbs' own) and their goroutines.
var eventWatchers struct {
	mu       sync.Mutex
	files    []*os.File
	stopping bool // stopAllEvents is closing the files: a watcher's read error is expected
	wg       sync.WaitGroup
}

// watchNICEvents starts the watcher of an open NIC (mpib_nic_open made its async fd
// non-blocking, which makes the dup pollable, and watched it). It ends when the NIC's device
// goes away (drain: closed), when mpib_events_forget_all has run (drain: stopped) or when
// stopAllEvents closes its file. plugin.mu is held.
func watchNICEvents(nic int) error {
	fd := int(C.mpib_g.nic[nic].ctx.async_fd)
	name := C.GoString(&C.mpib_g.nic[nic].name[0])
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("dup of its async fd %d: %w", fd, err)
	}
	f := os.NewFile(uintptr(dup), fmt.Sprintf("mpib-nic%d-async", nic))
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	eventWatchers.mu.Lock()
	eventWatchers.files = append(eventWatchers.files, f)
	eventWatchers.mu.Unlock()
	eventWatchers.wg.Add(1)
	go func() {
		defer eventWatchers.wg.Done()
		defer f.Close()
		// Read calls the function when the fd may be readable and parks until the next edge
		// when it returns false: the netpoller's epoll is edge-triggered, so drain reads until
		// the kernel answers EAGAIN. A closed event queue polls as EPOLLERR, which wakes it too.
		err := raw.Read(func(uintptr) bool {
			rc := C.mpib_events_drain(C.int(nic))
			noteActivity() // a slow drain (a port query) may have made the runtime start a thread
			return rc != C.MPIB_EVENTS_WAIT
		})
		eventWatchers.mu.Lock()
		stopping := eventWatchers.stopping
		eventWatchers.mu.Unlock()
		if err != nil && !stopping {
			warnf("HCA %s: no longer waiting on its async events: %v", name, err)
		}
	}()
	return nil
}

// stopAllEvents closes every watcher's file and waits for the watchers to end.
func stopAllEvents() {
	eventWatchers.mu.Lock()
	files := eventWatchers.files
	eventWatchers.files, eventWatchers.stopping = nil, true
	eventWatchers.mu.Unlock()
	for _, f := range files {
		f.Close() // wakes a parked Read with an error; a drain in progress finishes first
	}
	eventWatchers.wg.Wait()
	eventWatchers.mu.Lock()
	eventWatchers.stopping = false
	eventWatchers.mu.Unlock()
}

// closeNICs closes every open NIC. The order is the contract: C forgets the NICs first (no
// drain reads a context after that), then the watchers end (their dups close, so nothing of
// MPIB's holds the devices' event files), then the contexts close. plugin.mu is held.
func closeNICs() {
	C.mpib_events_forget_all()
	stopAllEvents()
	C.mpib_nic_close_all()
}
