// Package emulate plays the plugin's side of a hint segment in Go: it claims and releases
// slots under leases (spec 5.4, 5.7), publishes telemetry (spec 4.3) and records hint reads
// (spec 5.3) the way plugin/mpib_shm.c does. It exists for the simulator (agent/go/sim),
// tests and tools that need connections on a segment without NCCL; it is not what the plugin
// runs, and an agent never needs it.
//
// A Plugin maps the segment through its own open file description, as a plugin process does,
// so an agent's Segment in the same process sees its leases as another process's.
package emulate
