// threads.go: the OS threads the control plane holds in NCCL's process: GOMAXPROCS, the bounded
// verbs slots (withVerbsSlot, inVerbsSlot, destroyInGoroutine), slow C calls (slowCall) and the
// idle trim (noteActivity). Every goroutine that makes a slow C call goes through here:
// prepare.go, handshake.go, gidcache.go, sup.go, lifecycle.go.

package main

/*
#include "mpib.h"
#include "mpib_comm.h"
*/
import "C"

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// Threads. MPIB lives in NCCL's process, and every OS thread it keeps there is a thread the
// user sees (top, /proc, a core dump, a debugger) and pays for. Left alone, the Go runtime
// keeps one thread per P (GOMAXPROCS = the host's cores: 224 on a big host) plus one for every
// goroutine that was ever blocked in a C call at the same moment as the others, and it never
// gives an idle thread back: the count follows the worst moment so far, which can come hours
// into a job. The one way to make the runtime end a thread is a goroutine that locks it
// (runtime.LockOSThread) and returns without unlocking it. So:
//   - GOMAXPROCS is 2 (controlPlaneProcs) while the control plane works and 1 (restProcs) at
//     rest, unless the user set GOMAXPROCS in the environment: the control plane is
//     handshakes waiting on the network, never CPU-bound Go code;
//   - the slow C calls made from goroutines (creating, connecting and destroying verbs
//     objects, reading a GID table: milliseconds each) go through slowCall, verbs calls in
//     one of maxConcurrentVerbs slots: a connect burst holds at most that many threads in C
//     (plus one GID read per NIC);
//   - while a call blocks in C, the runtime hands its P to another thread, made if none is
//     idle, and keeps that one. trimIdleThreads, run once the control plane has been idle for
//     trimAfter with no handshake running, lowers GOMAXPROCS to restProcs and ends the idle
//     ones the same way, so the threads at rest do not depend on what ran before: the
//     runtime's first thread, sysmon, its template thread and the one waiting in the
//     netpoller. It also returns the Go heap's free pages to the kernel, so the memory at
//     rest does not depend on what ran before either;
//   - the fast C calls (a log line under logMu, the agent segment under agent.mu, the pending
//     table, atomics) take no slot and do not arm the trim: each lock lets one at a time into C.
// Calls from NCCL's own threads (init, regMr, closeSend/closeRecv/closeListen, finalize) run
// on those threads and cost MPIB none. Bounds and figures: docs/configuration.md ("Threads");
// integration/leak_test.go (TestLeakConnectClose) checks them.

// controlPlaneProcs is GOMAXPROCS while the control plane works, restProcs while it rests,
// when the environment does not set GOMAXPROCS. A burst of handshakes runs 10-15 % faster
// with two Ps than with one (docs/benchmarks.md); at rest the runtime keeps an idle thread
// for each P beyond the first that the trim does not end, so the trim lowers GOMAXPROCS
// first and the next slow call raises it again (a stop-the-world of microseconds per burst).
const (
	controlPlaneProcs = 2
	restProcs         = 1
)

// procsOwned says whether MPIB sets GOMAXPROCS (the environment does not).
var procsOwned = os.Getenv("GOMAXPROCS") == ""

func init() {
	// The runtime read GOMAXPROCS from the environment before this runs: honour it. Setting
	// it here also stops the runtime from following the cgroup's CPU limit (Go 1.25+).
	if procsOwned {
		runtime.GOMAXPROCS(controlPlaneProcs)
	}
}

// maxConcurrentVerbs bounds the slow verbs calls running at once, and so the threads a
// connect burst holds in C. net_ib makes every verbs call of connection setup on NCCL's proxy
// thread, one at a time; MPIB runs 4 (docs/configuration.md, "Threads", has the figures of a
// 512-connection burst with 4). Goroutines waiting on the network hold no thread.
const maxConcurrentVerbs = 4

var verbsSlots = make(chan struct{}, maxConcurrentVerbs)

// withVerbsSlot runs fn (slowCall) while holding one of the bounded verbs slots.
// It gives up (without running fn) when ctx ends first.
func withVerbsSlot[T any](ctx context.Context, fn func() T) (T, error) {
	return withVerbsSlotWait(ctx, nil, fn)
}

// withVerbsSlotWait is withVerbsSlot that adds how long it waited for the slot to *waited
// (nil: not measured; the caller's phases, phases.go).
func withVerbsSlotWait[T any](ctx context.Context, waited *time.Duration, fn func() T) (T, error) {
	var asked time.Time
	if waited != nil {
		asked = time.Now()
	}
	select {
	case verbsSlots <- struct{}{}:
	case <-ctx.Done():
		var zero T
		return zero, context.Cause(ctx)
	}
	if waited != nil {
		*waited += time.Since(asked)
	}
	defer func() { <-verbsSlots }()
	return slowCall(fn), nil
}

// inVerbsSlot is withVerbsSlot for what must run whatever happens to the context: freeing a
// comm's verbs resources from a goroutine (a failed handshake, a reclaim, a spare).
func inVerbsSlot(fn func()) {
	withVerbsSlot(context.Background(), func() struct{} { fn(); return struct{}{} })
}

// freeComm frees a comm's verbs resources: from one of MPIB's goroutines (inGoroutine) in a
// verbs slot, on NCCL's threads in the call. Then, after the last finalize, the last comm
// closes the devices (outside the slot: closing them takes plugin.mu).
func freeComm(comm *C.struct_mpib_comm, inGoroutine bool) {
	if inGoroutine {
		inVerbsSlot(func() { C.mpib_comm_close(comm) })
	} else {
		C.mpib_comm_close(comm)
	}
	closeDevicesIfUnused()
}

// destroyInGoroutine frees a comm's verbs resources from a goroutine (freeComm).
func destroyInGoroutine(comm *C.struct_mpib_comm) {
	if comm != nil {
		freeComm(comm, true)
	}
}

// slowCall runs fn, a C call that blocks for milliseconds (a verbs object, a GID table), on
// the calling goroutine's own thread, and arms the idle trim: the runtime hands the
// goroutine's P to another thread while the call blocks, and trimIdleThreads ends the threads
// that stood in once the control plane rests. A call handed to a thread of its own instead
// costs two thread wake-ups (140-190 us each in the lab VM, against 2-9 us for the call
// itself): a burst of 8 connections paid about a quarter of its context switches there.
func slowCall[T any](fn func() T) T {
	noteActivity()
	return fn()
}

// trimAfter is how long the control plane stays idle (no slow C call, no close, no handshake
// ending, none running) before the idle threads are ended; trimThreads is how many (an upper
// bound on what the pool holds: the threads that made or stood in for the calls in C, one per
// P, a spare).
const trimAfter = 200 * time.Millisecond

func trimThreads() int {
	return 2*max(runtime.GOMAXPROCS(0), controlPlaneProcs) + maxConcurrentVerbs + 4
}

var trim struct {
	mu     sync.Mutex
	timer  *time.Timer
	atRest bool // GOMAXPROCS is restProcs
}

// noteActivity (re)arms the idle trim, and gives the control plane its Ps back after a rest.
func noteActivity() {
	trim.mu.Lock()
	defer trim.mu.Unlock()
	if trim.atRest {
		trim.atRest = false
		runtime.GOMAXPROCS(controlPlaneProcs)
	}
	if trim.timer == nil {
		trim.timer = time.AfterFunc(trimAfter, trimIdleThreads)
	} else {
		trim.timer.Reset(trimAfter)
	}
}

// trimIdleThreads, the trim timer's function, ends the runtime's idle threads (trimNow) and
// then the thread it ran on: the timer's goroutine exits locked to it. Left running, that
// thread would find no work once the trim is done and stay, idle, beside the one waiting in
// the netpoller.
func trimIdleThreads() {
	if trimNow() {
		runtime.LockOSThread() // never unlocked: the thread ends with the timer's goroutine
	}
}

// trimNow rests the control plane unless a handshake runs (then it arms the trim again and
// returns false): GOMAXPROCS goes to restProcs; a forced collection returns the heap's free
// pages (debug.FreeOSMemory: the control plane's live heap is well under a MiB, its garbage
// fills the runtime's 4 MiB heap goal between collections, and without this those pages stay
// resident in NCCL's process: 14-15 MiB at rest in the lab's leak run instead of 10, moving by
// up to a MiB from one round to the next); then each goroutine it starts runs on an idle
// thread (the runtime takes idle ones before it makes one), locks it and returns, which ends
// it: the collection's workers may have woken one. The runtime makes again what the next
// burst needs.
func trimNow() bool {
	trim.mu.Lock()
	if handshakesInFlight.Load() > 0 {
		trim.timer.Reset(trimAfter) // the last handshake's end arms it again too
		trim.mu.Unlock()
		return false
	}
	if procsOwned {
		trim.atRest = true
		runtime.GOMAXPROCS(restProcs)
	}
	trim.mu.Unlock()
	debug.FreeOSMemory()
	for range trimPasses {
		var wg sync.WaitGroup
		for range trimThreads() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			}()
		}
		wg.Wait()
	}
	return true
}

// trimPasses is how many rounds of thread-ending goroutines a trim runs. Each ended thread
// hands its P to an idle thread, or to a new one once none is idle, and a thread that was
// busy while a round started (the timer's, one leaving the netpoller) goes idle during it:
// after one round, one idle thread is often left (GODEBUG=schedtrace shows idlethreads=1),
// after a second, none.
const trimPasses = 2

// handshakesInFlight counts the handshakes running (guardHandshake). The trim waits for
// none: while one runs, the control plane is not at rest even when no slow call started for
// trimAfter (hundreds of handshakes queued for two Ps in a 512-connection burst), and ending
// threads then only makes the runtime start them again, with one P fewer for the burst.
var handshakesInFlight atomic.Int32

// handshakeBegins and handshakeEnds bracket a handshake (guardHandshake); the end arms the
// trim, as a slow call does.
func handshakeBegins() { handshakesInFlight.Add(1) }

func handshakeEnds() {
	lastHandshakeEnd.Store(time.Now().UnixNano())
	handshakesInFlight.Add(-1)
	noteActivity()
}
