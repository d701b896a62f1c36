//go:build mpibhostile

// hostile_on.go: hostileHook for the hostile test build only (-tags mpibhostile), called at
// the points the handshake names (handshake.go).

package main

// The hostile test build (build/test-only/libnccl-net-mpib-hostile-test-only.so, built by
// `go run mage.go test:integration`, never by `build`): only the lab's hostile-input tests load it (integration/hostile_test.go). MPIB_TEST_HOSTILE names
// what it does wrong on purpose: go-panic (a Go panic in the handshake, which the plugin must
// turn into an error), size-overwrite and remote-read (a sender that attacks its receiver over
// RDMA: mpib_hostile.c). The plugin users load has none of this: hostile_off.go, and the C
// hooks compile to nothing without MPIB_HOSTILE_TEST.

/*
#cgo CFLAGS: -DMPIB_HOSTILE_TEST
*/
import "C"

import "os"

func hostileHook(point string) {
	if os.Getenv("MPIB_TEST_HOSTILE") == "go-panic" && point == "handshake" {
		panic("MPIB_TEST_HOSTILE=go-panic: a panic forced in the handshake (test build)")
	}
}
