// Package shm reads and writes the MPIB shared-memory hint segment (format version 6,
// specified in docs/shm-format.md): the agent side of MPIB's run-time policy.
//
// Two levels:
//   - Decode/Encode work on a byte image of a segment (no file, no atomics): vectors, fuzzing,
//     offline inspection.
//   - Segment is a live read-write mapping (Create, Open): list connections, read telemetry,
//     set hints per connection, peer or path class, beat the heartbeat, reclaim dead slots.
//
// The plugin's side of the segment (claiming slots, publishing telemetry, recording hint
// reads) is not here: package shm/emulate plays it for simulators and tests.
//
// Files: layout.go (format constants and value types' names), types.go (decoded values),
// decode.go (validation, Decode, Encode), record.go (the hint record seqlock), resolve.go
// (spec 5.3), telemetry.go (rates between samples), errors.go; on Linux segment_linux.go
// (creating, opening, mapping, reattaching), lease_linux.go (liveness, agent lock, leases,
// GC), read_linux.go and write_linux.go (the Segment's readers and writers). The byte offsets
// live in internal/wire, shared with shm/emulate.
//
// The library never logs or prints; every failure is an error wrapping one of the sentinels
// in errors.go.
package shm
