//go:build !mpibhostile

// hostile_off.go: hostileHook in the plugin users load: a no-op (hostile_on.go is the test
// build's).

package main

// hostileHook is a no-op in the plugin users load. The test build (-tags mpibhostile,
// hostile_on.go) makes it misbehave on purpose when MPIB_TEST_HOSTILE names the point.
func hostileHook(point string) {}
