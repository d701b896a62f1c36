// guard.go: panic containment for Go code in NCCL's process: recoverEntry (deferred by every
// exported entry point), recoverGoroutine (every goroutine), guardHandshake and
// handshakeResult (around attempt.go's and listen.go's handshakes).

package main

/*
#include "mpib.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime/debug"
)

// A Go panic in a plugin call or goroutine would end NCCL's whole process (a training job,
// with PyTorch and CUDA in it). Every exported entry point and every goroutine therefore
// recovers: an entry point returns ncclInternalError with a message, a handshake fails with an
// error NCCL's connect or accept returns, any other goroutine logs and ends.

// panicError is a panic caught in a handshake: the handshake fails with it.
type panicError struct {
	where string
	value any
}

func (e *panicError) Error() string {
	return fmt.Sprintf("internal error in %s (Go panic: %v; please report it with the stack in the log)", e.where, e.value)
}

// recoverEntry is deferred first in every //export function: a panic becomes rc =
// ncclInternalError and a WARN line with the stack.
func recoverEntry(name string, rc *C.int) {
	if r := recover(); r != nil {
		warnf("%s: internal error: Go panic: %v (returning ncclInternalError; please report it with this stack)\n%s", name, r, debug.Stack())
		*rc = C.int(resInternalError)
	}
}

// recoverGoroutine is deferred in every goroutine that has no result to fail.
func recoverGoroutine(name string) {
	if r := recover(); r != nil {
		warnf("%s: internal error: Go panic: %v (that goroutine ended; the process goes on; please report it with this stack)\n%s", name, r, debug.Stack())
	}
}

// guardHandshake runs a whole handshake (connect or accept side): a panic anywhere in it
// becomes its error. handshake itself recovers the steps that own a comm and a socket, so that
// those are freed; this catches the rest.
func guardHandshake(fn func() (*C.struct_mpib_comm, error)) (comm *C.struct_mpib_comm, err error) {
	handshakeBegins() // the idle trim waits for it (threads.go)
	defer handshakeEnds()
	defer func() {
		if r := recover(); r != nil {
			warnf("handshake: Go panic: %v\n%s", r, debug.Stack())
			comm, err = nil, &panicError{where: "connection setup", value: r}
		}
	}()
	return fn()
}

// handshakeResult is what NCCL gets for a failed handshake: ncclInternalError for a caught
// panic (a bug of ours), ncclSystemError for this host out of local ports (its limit, not the
// peer's), ncclRemoteError otherwise (the peer, the network or the fabric).
func handshakeResult(err error) C.ncclResult_t {
	var pe *panicError
	if errors.As(err, &pe) {
		return resInternalError
	}
	if isPortShortage(err) {
		return resSystemError
	}
	return resRemoteError
}
