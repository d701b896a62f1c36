// Package shmfuzz exposes the plugin's C segment reader (plugin/mpib_shm_*.c, with the C
// tests' decoders in plugin/ctest/shm_decode.c, compiled into this package through cgo) to Go
// tests: FuzzCReader feeds it arbitrary segment images and compares every verdict with the Go
// agent's decoder. Only tests import it; the plugin does not (one Go runtime per process
// matters for the plugin .so, not for a test binary).
package shmfuzz
