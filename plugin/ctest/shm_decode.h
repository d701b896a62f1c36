/* Test-only reader entry points of the hint segment: open a file or an image, decode the
 * header, slots and records, resolve at an explicit time (plugin/ctest/shm_decode.c defines
 * them; the C tests, shmfuzz and the agent-side writers call them). Never in the plugin:
 * the product reads only through mpib_shm.h. Return 0 or -errno where they return int. */
#ifndef MPIB_CTEST_SHM_DECODE_H
#define MPIB_CTEST_SHM_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "../mpib_shm.h"
#include "../mpib_shm_hint.h"

/* Decoded header (spec 4.1). */
typedef struct {
  uint32_t version, nslots, npeers, flags, agent_pid, peers_epoch;
  uint64_t total_size, heartbeat_ns, created_ns;
} mpib_shm_header_info;

/* Decoded slot (spec 4.3); the hint is copied raw (an odd seq stays visible). */
typedef struct {
  uint32_t state, owner_pid, gen;
  uint64_t conn_id;
  uint32_t local_sout_ip, peer_sout_ip, peer_island;
  uint8_t path_class, is_send;
  uint16_t nqps_sout, nqps_sup;
  uint32_t pid;
  uint64_t registered_ns;
  uint16_t dev;     /* version 4 */
  uint8_t sup_path; /* version 6 */
  uint8_t port[2];
  char nic[2][MPIB_SHM_NIC_NAME]; /* raw bytes: NUL-padded when the writer follows the spec */
  mpib_shm_record hint;
  uint64_t sout_bytes, sout_requests, sup_bytes, sup_requests;
  uint64_t reads_applied, reads_fallback, reads_stale, clamped;
  uint32_t last_sup_bw, last_source;
  uint64_t last_read_ns;
  uint8_t rail_state[2]; /* per rail: 0 SOUT, 1 SUP */
  uint32_t failovers;
  uint32_t recoveries; /* version 5 */
  uint64_t rail_state_ns[2];
  uint32_t applied_sup_bw; /* version 3 */
  uint64_t flush_wall_ns;
  uint64_t completed_bytes[2], completed_requests[2], inflight_bytes[2], busy_ns[2];
  uint64_t active_ns[2];
} mpib_shm_slot_info;

enum { MPIB_SHM_REC_CLASS = 0, MPIB_SHM_REC_PEER = 1 };

/* A handle with the segment at path attached now. Validates (O_NOFOLLOW, regular file, owner
 * == geteuid(), no group/other access (mode & 077 == 0), size, magic, version, geometry). 0 or
 * -errno; err gets "mpib shm PATH: CODE: detail" (CODE as in the spec's validation table:
 * not_regular, bad_owner, bad_mode, too_small, bad_magic, bad_version, bad_geometry, io). */
int mpib_shm_open(const char *path, mpib_shm **out, char *err, size_t errlen);
/* A handle over a caller-owned segment image (validated like a file, checks 5..9; no file,
 * no locks, no guard). The buffer must outlive the handle. */
int mpib_shm_attach_image(void *buf, size_t len, mpib_shm **out, char *err, size_t errlen);
/* Validates a segment image in memory (the file checks are skipped). Same codes. */
int mpib_shm_validate(const void *buf, size_t len, char *err, size_t errlen);
/* nslots of the attached segment (0 when none). */
uint32_t mpib_shm_nslots(const mpib_shm *shm);
/* Relaxed atomics: adds bytes and one request to the rail (0 SOUT, 1 SUP) of connection id
 * (the plugin publishes in batches with mpib_shm_flush_telemetry). */
void mpib_shm_add_telemetry(mpib_shm *shm, uint32_t id, int rail, uint64_t bytes);

/* By segment slot index, on the attached segment. */
/* Pure resolution at an explicit time (no telemetry written). 1 when a hint applies, else 0;
 * *out is always filled. */
int mpib_shm_resolve(mpib_shm *shm, uint32_t slot, uint64_t now_ns, uint64_t stale_ns, mpib_shm_hint *out);
/* Reads a slot's hint record under the seqlock: 0, -EBUSY (8 attempts failed), -ERANGE. */
int mpib_shm_read_slot_record(mpib_shm *shm, uint32_t slot, mpib_shm_record *r);
/* Field decoders: 0, or -ERANGE / -ENOENT (nothing attached). */
int mpib_shm_decode_header(mpib_shm *shm, mpib_shm_header_info *h);
int mpib_shm_decode_slot(mpib_shm *shm, uint32_t slot, mpib_shm_slot_info *s);
/* Raw (no seqlock) class default (kind CLASS, idx 0..1) or peer entry (kind PEER). */
int mpib_shm_raw_record(mpib_shm *shm, int kind, uint32_t idx, mpib_shm_record *r);

#endif
