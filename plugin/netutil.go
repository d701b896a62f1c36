// netutil.go: small helpers that both sides of connection setup share, so that neither side's
// file reaches into the other's: checkDevice (listen and connect check NCCL's device index),
// handshakeTimeout, randomNonce (a listener's nonce, a connect attempt's id), isFDShortage
// (listen.go's accept loop backs off on it, dial.go's dial retries on it) and isPortShortage.

package main

/*
#include "mpib.h"
*/
import "C"

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"syscall"
	"time"
)

// checkDevice is listen's and connect's check of NCCL's device index (resSuccess, or what
// to return to NCCL after a WARN line).
func checkDevice(dev C.int) C.int {
	n := int(C.mpib_g.nfdevs)
	if n == 0 {
		warnf("called before a successful init")
		return C.int(resInternalError)
	}
	if dev < 0 || int(dev) >= n {
		warnf("device %d does not exist: MPIB has %d fused device%s (0..%d)", int(dev), n, map[bool]string{true: "", false: "s"}[n == 1], n-1)
		return C.int(resInvalidArgument)
	}
	return C.int(resSuccess)
}

// handshakeTimeout bounds a whole handshake (MPIB_HANDSHAKE_TIMEOUT_MS), either side.
func handshakeTimeout() time.Duration {
	return time.Duration(plugin.cfg.HandshakeTimeoutMS) * time.Millisecond
}

// randomNonce is 8 random bytes: a listener's nonce (the hello must name it) and connect
// attempt ids.
func randomNonce() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// isFDShortage says whether err is the process or the host out of file descriptors (EMFILE,
// ENFILE): a shortage that passes, which the accept loop and the connector's dial wait out.
func isFDShortage(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// isPortShortage says whether err is the host out of local ports for a connection
// (EADDRNOTAVAIL at connect, EADDRINUSE at bind): a local limit to name, not the peer's fault.
func isPortShortage(err error) bool {
	return errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EADDRINUSE)
}
