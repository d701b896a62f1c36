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

	"github.com/mpib/mpib/plugin/internal/wire"
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

// localError is a handshake step that failed on this host: a verbs call on its own NIC
// (creating CQs, QPs, registrations; a QP's transitions), whatever the peer sent.
type localError struct{ err error }

func (e *localError) Error() string { return e.err.Error() }
func (e *localError) Unwrap() error { return e.err }

// onThisHost marks err (nil stays nil) as this host's failure (handshakeResult).
func onThisHost(err error) error {
	if err == nil {
		return nil
	}
	return &localError{err}
}

// handshakeResult is what NCCL gets for a failed handshake: ncclInternalError for a caught
// panic (a bug of ours); ncclSystemError for this host's failure (its verbs calls, as net_ib
// returns for a failed ibv_create_qp or ibv_modify_qp, or its lack of local ports);
// ncclInvalidUsage for a peer running another MPIB version (a job to configure alike);
// ncclRemoteError otherwise (the peer, the network or the fabric).
func handshakeResult(err error) C.ncclResult_t {
	var pe *panicError
	if errors.As(err, &pe) {
		return resInternalError
	}
	var le *localError
	if errors.As(err, &le) || isPortShortage(err) {
		return resSystemError
	}
	if errors.Is(err, wire.ErrVersion) {
		return resInvalidUsage
	}
	return resRemoteError
}
