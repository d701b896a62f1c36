/*
 * Reader (and minimal writer) of the MPIB shared-memory hint segment, format version 1.
 * The format is specified in docs/shm-format.md; testdata/shm/ pins it.
 * Pure C11: no verbs, no Go, no NCCL. All symbols are hidden (never exported from the plugin).
 *
 * Contract for the plugin:
 *   open once per process (mpib_shm_open; failure = run without hints, vanilla policy),
 *   register each connection at connect/accept, release it at close,
 *   call mpib_shm_read_hint per transfer (nanoseconds: a vDSO clock read and a few loads),
 *   account posted bytes per rail with mpib_shm_add_telemetry.
 * Every function tolerates garbage in the segment: indices are bounds-checked, nothing spins.
 */
#ifndef MPIB_SHM_H
#define MPIB_SHM_H

#include <stddef.h>
#include <stdint.h>

#define MPIB_SHM_HIDDEN __attribute__((visibility("hidden")))

#define MPIB_SHM_VERSION 1u
#define MPIB_SHM_DEFAULT_PATH "/dev/shm/mpib-hints"
#define MPIB_SHM_DEFAULT_STALE_MS 500u
#define MPIB_SHM_SUP_BW_MAX 1024u

typedef struct mpib_shm mpib_shm; /* opaque mapping */

typedef struct {
  uint32_t local_sout_ip, peer_sout_ip; /* IPv4, host byte order */
  uint32_t peer_island;                 /* peer SOUT ip masked by prefix, host order */
  uint8_t path_class;                   /* 0 intra-island, 1 inter-island */
  uint8_t is_send;                      /* 1 send comm, 0 recv comm */
  uint16_t nqps_sout, nqps_sup;
  uint32_t pid; /* 0 = getpid() */
  uint64_t conn_id;
} mpib_conn_desc;

/* Where a resolved hint came from (values of the slot's last_source, docs section 5.3). */
enum {
  MPIB_SHM_SRC_NO_HINT = 0,
  MPIB_SHM_SRC_SLOT = 1,
  MPIB_SHM_SRC_PEER = 2,
  MPIB_SHM_SRC_CLASS = 3,
  MPIB_SHM_SRC_STALE = 4,
  MPIB_SHM_SRC_INACTIVE = 5,
  MPIB_SHM_SRC_BUSY = 6,
  MPIB_SHM_SRC_BAD_SLOT = 7,
};

typedef struct {
  uint32_t sup_bw; /* 0..1024, valid when source is SLOT, PEER or CLASS */
  uint8_t source;  /* MPIB_SHM_SRC_* */
  uint8_t clamped; /* 1 when the stored value was above 1024 */
} mpib_shm_hint;

/* One hint record read consistently under its seqlock. */
typedef struct {
  uint32_t seq, sup_bw, flags, gen;
  uint64_t set_ns;
  uint32_t peer_ip;
  uint8_t prefix_len;
} mpib_shm_record;

/* $MPIB_SHM_PATH or MPIB_SHM_DEFAULT_PATH. */
MPIB_SHM_HIDDEN const char *mpib_shm_default_path(void);
/* $MPIB_AGENT_STALE_MS (default 500, must be 1..3600000) in nanoseconds. */
MPIB_SHM_HIDDEN uint64_t mpib_shm_stale_ns_from_env(void);

/* Opens + validates (regular file, owner == geteuid(), not group/world writable, size, magic,
 * version, geometry). 0 or -errno; err gets "mpib shm PATH: CODE: detail" (CODE as in the
 * spec's validation table: not_regular, bad_owner, bad_mode, too_small, bad_magic,
 * bad_version, bad_geometry, io). */
MPIB_SHM_HIDDEN int mpib_shm_open(const char *path, mpib_shm **out, char *err, size_t errlen);
MPIB_SHM_HIDDEN void mpib_shm_close(mpib_shm *shm);
/* Validates a segment image in memory (the file checks are skipped). Same codes. */
MPIB_SHM_HIDDEN int mpib_shm_validate(const void *buf, size_t len, char *err, size_t errlen);
MPIB_SHM_HIDDEN uint32_t mpib_shm_nslots(const mpib_shm *shm);

/* 0 or -errno (-ENOSPC when full). Not for the data path. */
MPIB_SHM_HIDDEN int mpib_shm_register(mpib_shm *shm, const mpib_conn_desc *d, uint32_t *slot_out);
MPIB_SHM_HIDDEN void mpib_shm_release(mpib_shm *shm, uint32_t slot);

/* Hot path: resolves slot hint, else per-peer default, else path-class default.
 * Returns 1 and *sup_bw (clamped 0..1024) when a hint applies and the agent heartbeat is
 * fresh; 0 when no hint applies or the agent is stale/absent (caller falls back to vanilla). */
MPIB_SHM_HIDDEN int mpib_shm_read_hint(mpib_shm *shm, uint32_t slot, uint64_t stale_ns,
                                       uint32_t *sup_bw);
/* Pure resolution at an explicit time (no telemetry written): for tests and tools.
 * Returns 1 when a hint applies, else 0; *out is always filled. */
MPIB_SHM_HIDDEN int mpib_shm_resolve(mpib_shm *shm, uint32_t slot, uint64_t now_ns,
                                     uint64_t stale_ns, mpib_shm_hint *out);
/* Relaxed atomics: adds bytes and one request to the rail (0 SOUT, 1 SUP). */
MPIB_SHM_HIDDEN void mpib_shm_add_telemetry(mpib_shm *shm, uint32_t slot, int rail,
                                            uint64_t bytes);

/* Reads a slot's hint record under the seqlock: 0, -EBUSY (8 attempts failed), -ERANGE. */
MPIB_SHM_HIDDEN int mpib_shm_read_slot_record(mpib_shm *shm, uint32_t slot, mpib_shm_record *r);

/* Agent-side helpers for C tests and tools. Writers must be serialised by the caller
 * (agents hold flock(LOCK_EX) on the file; see the spec, section 5.5). */
MPIB_SHM_HIDDEN int mpib_shm_create(const char *path, uint32_t nslots, uint32_t npeers,
                                    char *err, size_t errlen);
MPIB_SHM_HIDDEN void mpib_shm_heartbeat(mpib_shm *shm, uint64_t now_ns);
MPIB_SHM_HIDDEN int mpib_shm_write_slot_record(mpib_shm *shm, uint32_t slot,
                                               const mpib_shm_record *r);
/* valid = 0 clears. Values above 1024 are stored clamped; returns 1 when clamped, else 0,
 * or -errno (-ENOENT: slot not ACTIVE; -ERANGE: bad index; -ENOSPC: peer table full). */
MPIB_SHM_HIDDEN int mpib_shm_set_slot_hint(mpib_shm *shm, uint32_t slot, int valid,
                                           uint32_t sup_bw);
MPIB_SHM_HIDDEN int mpib_shm_set_class_hint(mpib_shm *shm, int path_class, int valid,
                                            uint32_t sup_bw);
MPIB_SHM_HIDDEN int mpib_shm_set_peer_hint(mpib_shm *shm, uint32_t peer_ip, uint8_t prefix_len,
                                           int valid, uint32_t sup_bw);
MPIB_SHM_HIDDEN uint64_t mpib_shm_now_ns(void);

#endif
