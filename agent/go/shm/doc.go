// Package shm reads and writes the MPIB shared-memory hint segment (format version 6,
// specified in docs/shm-format.md): the agent side of MPIB's run-time policy.
//
// Two levels:
//   - Decode/Encode work on a byte image of a segment (no file, no atomics): vectors, fuzzing,
//     offline inspection.
//   - Segment is a live read-write mapping (Create, Open): list connections, read telemetry,
//     set hints per connection, peer or path class, beat the heartbeat, reclaim dead slots.
//
// The library never logs or prints; every failure is an error wrapping one of the sentinels
// in errors.go.
package shm
