/*
 * The MPIB hint segment's bytes, format version 6 (docs/shm-format.md; testdata/shm pins it).
 * Included by every mpib_shm_*.c file and by the agent-side writers of plugin/ctest: each
 * struct mirrors a table of the spec and the _Static_asserts pin its offsets, so a layout
 * change fails the build instead of the wire. No code, no state.
 */
#ifndef MPIB_SHM_LAYOUT_H
#define MPIB_SHM_LAYOUT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "mpib_shm.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the MPIB hint segment is little-endian and accessed in place: big-endian hosts are unsupported"
#endif

#define SHM_MAGIC "MPIBHINT"
#define SHM_HEADER_SIZE 256u
#define SHM_SLOT_SIZE 384u
#define SHM_PEER_SIZE 64u
#define SHM_MAX_SLOTS 65536u
#define SHM_MAX_PEERS 4096u
#define SHM_SEQ_ATTEMPTS 8
#define SHM_FLAG_VALID 1u
#define SHM_STATE_FREE 0u
#define SHM_STATE_CLAIMING 1u
#define SHM_STATE_ACTIVE 2u
#define SHM_NO_PEER 0x7FFFFFFFu /* no peer entry: never an index (npeers <= 4096); bit 31 stays free */

/* Hint record (spec 4.2); also the peer entry (4.4). */
struct shm_rec {
  _Atomic uint32_t seq;
  _Atomic uint32_t sup_bw;
  _Atomic uint32_t flags;
  _Atomic uint32_t gen;
  _Atomic uint64_t set_ns;
  _Atomic uint32_t peer_ip;
  _Atomic uint8_t prefix_len;
  uint8_t reserved[35];
};
_Static_assert(sizeof(struct shm_rec) == 64, "hint record is 64 bytes");
_Static_assert(offsetof(struct shm_rec, set_ns) == 16, "set_ns at +16");
_Static_assert(offsetof(struct shm_rec, peer_ip) == 24, "peer_ip at +24");
_Static_assert(offsetof(struct shm_rec, prefix_len) == 28, "prefix_len at +28");

/* Header (spec 4.1). Fields before heartbeat_ns never change after creation. */
struct shm_header {
  char magic[8];
  uint32_t version;
  uint32_t header_size;
  uint64_t total_size;
  uint32_t nslots;
  uint32_t slot_size;
  uint32_t npeers;
  uint32_t peer_size;
  uint32_t flags;
  uint8_t reserved0[20];
  _Atomic uint64_t heartbeat_ns;
  _Atomic uint32_t agent_pid;
  _Atomic uint32_t peers_epoch;
  _Atomic uint64_t created_ns;
  uint8_t reserved1[40];
  struct shm_rec cls[2];
};
_Static_assert(sizeof(struct shm_header) == SHM_HEADER_SIZE, "header is 256 bytes");
_Static_assert(offsetof(struct shm_header, nslots) == 24, "nslots at 24");
_Static_assert(offsetof(struct shm_header, flags) == 40, "flags at 40");
_Static_assert(offsetof(struct shm_header, heartbeat_ns) == 64, "heartbeat at 64");
_Static_assert(offsetof(struct shm_header, created_ns) == 80, "created_ns at 80");
_Static_assert(offsetof(struct shm_header, cls) == 128, "class records at 128");

/* Slot (spec 4.3). */
struct shm_slot {
  _Atomic uint64_t owner; /* state | pid << 32 */
  _Atomic uint32_t gen;
  uint32_t reserved0;
  _Atomic uint64_t conn_id;
  _Atomic uint32_t local_sout_ip;
  _Atomic uint32_t peer_sout_ip;
  _Atomic uint32_t peer_island;
  _Atomic uint8_t path_class;
  _Atomic uint8_t is_send;
  _Atomic uint16_t nqps_sout;
  _Atomic uint16_t nqps_sup;
  _Atomic uint16_t dev; /* version 4: the fused device */
  _Atomic uint32_t pid;
  _Atomic uint64_t registered_ns;
  _Atomic uint8_t port[2];  /* version 4: SOUT's, SUP's */
  _Atomic uint8_t sup_path; /* version 6: MPIB_SHM_SUP_PATH_* */
  uint8_t reserved2[5];
  struct shm_rec hint;
  _Atomic uint64_t sout_bytes;
  _Atomic uint64_t sout_requests;
  _Atomic uint64_t sup_bytes;
  _Atomic uint64_t sup_requests;
  _Atomic uint64_t reads_applied;
  _Atomic uint64_t reads_fallback;
  _Atomic uint64_t reads_stale;
  _Atomic uint64_t clamped;
  _Atomic uint32_t last_sup_bw;
  _Atomic uint32_t last_source;
  _Atomic uint64_t last_read_ns;
  _Atomic uint8_t rail_state[2]; /* MPIB_SHM_RAIL_* per rail (0 SOUT, 1 SUP) */
  uint16_t reserved3;
  _Atomic uint32_t failovers;
  _Atomic uint64_t rail_state_ns[2]; /* CLOCK_REALTIME ns of the last change, 0 = never */
  /* Version 3: what the plugin applied and when it last flushed, then per rail what completed. */
  _Atomic uint32_t applied_sup_bw;
  _Atomic uint32_t recoveries;    /* version 5: times a rail came back into service */
  _Atomic uint64_t flush_wall_ns; /* CLOCK_REALTIME ns */
  uint64_t reserved5;
  struct shm_rail_done {
    _Atomic uint64_t bytes, requests;
    _Atomic uint64_t inflight_bytes; /* a gauge */
    _Atomic uint64_t busy_ns;        /* sum of completion - post time over the requests */
  } done[2];
  _Atomic uint64_t active_ns[2];             /* time with a request in flight on the rail */
  _Atomic uint8_t nic[2][MPIB_SHM_NIC_NAME]; /* version 4: SOUT's, SUP's name, NUL-padded */
};
_Static_assert(sizeof(struct shm_slot) == SHM_SLOT_SIZE, "slot is 384 bytes");
_Static_assert(offsetof(struct shm_slot, conn_id) == 16, "conn_id at +16");
_Static_assert(offsetof(struct shm_slot, path_class) == 36, "path_class at +36");
_Static_assert(offsetof(struct shm_slot, nqps_sup) == 40, "nqps_sup at +40");
_Static_assert(offsetof(struct shm_slot, pid) == 44, "pid at +44");
_Static_assert(offsetof(struct shm_slot, dev) == 42, "dev at +42");
_Static_assert(offsetof(struct shm_slot, port) == 56, "ports at +56");
_Static_assert(offsetof(struct shm_slot, sup_path) == 58, "sup_path at +58");
_Static_assert(offsetof(struct shm_slot, nic) == 336, "NIC names at +336");
_Static_assert(offsetof(struct shm_slot, hint) == 64, "hint at +64");
_Static_assert(offsetof(struct shm_slot, sout_bytes) == 128, "telemetry at +128");
_Static_assert(offsetof(struct shm_slot, last_sup_bw) == 192, "last_sup_bw at +192");
_Static_assert(offsetof(struct shm_slot, last_read_ns) == 200, "last_read_ns at +200");
_Static_assert(offsetof(struct shm_slot, rail_state) == 208, "rail states at +208");
_Static_assert(offsetof(struct shm_slot, failovers) == 212, "failovers at +212");
_Static_assert(offsetof(struct shm_slot, rail_state_ns) == 216, "rail state times at +216");
_Static_assert(offsetof(struct shm_slot, applied_sup_bw) == 232, "applied_sup_bw at +232");
_Static_assert(offsetof(struct shm_slot, recoveries) == 236, "recoveries at +236");
_Static_assert(offsetof(struct shm_slot, flush_wall_ns) == 240, "flush_wall_ns at +240");
_Static_assert(offsetof(struct shm_slot, done) == 256, "completion telemetry at +256");
_Static_assert(offsetof(struct shm_slot, done[1].busy_ns) == 312, "sup busy_ns at +312");
_Static_assert(offsetof(struct shm_slot, active_ns) == 320, "active time at +320");

/* Lock bytes (spec 5.7): OFD locks on these file offsets, never on data. */
#define SHM_LOCK_ATTACH 0 /* shared: a plugin process has the segment attached */
#define SHM_LOCK_AGENT 1  /* exclusive: the one agent that beats the heartbeat */

/* The size a header declaring nslots and npeers must declare as total_size (spec 4.1). */
static inline uint64_t shm_expected_size(uint64_t nslots, uint64_t npeers) {
  return SHM_HEADER_SIZE + nslots * SHM_SLOT_SIZE + npeers * SHM_PEER_SIZE;
}

#endif
