/*
 * Reader (and minimal writer) of the MPIB shared-memory hint segment, format version 6.
 * The format is specified in docs/shm-format.md; testdata/shm/ pins it.
 * Pure C11 + POSIX: no verbs, no Go, no NCCL. All symbols are hidden (never exported).
 *
 * Contract for the plugin:
 *   one handle per process (mpib_shm_handle_new), polled from a non-hot thread at most every
 *   MPIB_SHM_POLL_MS (mpib_shm_poll): the poll attaches the segment when it appears,
 *   re-attaches when the file at the path is replaced (every live connection moves to the
 *   new segment), and detaches when the segment is truncated;
 *   register each connection at connect/accept (an id valid for the handle's life, bound to a
 *   slot of the current segment whenever one is attached), release it at close;
 *   call mpib_shm_read_hint per transfer (no system call: a vDSO clock read and a few loads),
 *   publish the connection's telemetry in batches with mpib_shm_flush_telemetry (posted and
 *   completed bytes and requests per rail, busy time, bytes in flight, the applied split).
 * Liveness: the handle keeps the segment's file open and holds an OFD lock on the first byte
 * of every slot it owns, so agents in any PID namespace see a slot's owner die with it.
 * Safety: a SIGBUS guard turns a truncated mapping into zero pages (no hint), never a crash.
 * Every function tolerates garbage in the segment: indices are bounds-checked, nothing spins.
 */
#ifndef MPIB_SHM_H
#define MPIB_SHM_H

#include <stddef.h>
#include <stdint.h>

#define MPIB_SHM_HIDDEN __attribute__((visibility("hidden")))

#define MPIB_SHM_VERSION 6u
#define MPIB_SHM_NIC_NAME 24 /* bytes of a NIC name field, its NUL included (spec 4.3) */
#define MPIB_SHM_DEFAULT_PREFIX "/dev/shm/mpib-hints-" /* + the effective uid */
#define MPIB_SHM_DEFAULT_STALE_MS 500u
#define MPIB_SHM_SUP_BW_MAX 1024u
#define MPIB_SHM_MAX_CONNS 65536u /* connection ids per handle */
#define MPIB_SHM_POLL_MS 250u     /* how often the plugin polls for a replaced segment */

typedef struct mpib_shm mpib_shm; /* opaque per-process handle */

typedef struct {
  uint32_t local_sout_ip, peer_sout_ip; /* IPv4, host byte order */
  uint32_t peer_island;                 /* peer SOUT ip masked by prefix, host order */
  uint8_t path_class;                   /* 0 intra-island, 1 inter-island */
  uint8_t is_send;                      /* 1 send comm, 0 recv comm */
  uint16_t nqps_sout, nqps_sup;
  uint32_t pid; /* 0 = getpid() */
  uint64_t conn_id;
  uint16_t dev;                         /* the fused device (version 4) */
  uint8_t port[2];                      /* SOUT's, SUP's port */
  char nic[2][MPIB_SHM_NIC_NAME];       /* SOUT's, SUP's NIC name; a longer one is cut */
  uint8_t sup_path;                     /* MPIB_SHM_SUP_PATH_* (version 6) */
} mpib_conn_desc;

/* How the connection's SUP QPs reach the peer (the slot's sup_path, spec 4.3, version 6). */
enum {
  MPIB_SHM_SUP_PATH_NONE = 0,   /* no SUP QPs */
  MPIB_SHM_SUP_PATH_DIRECT = 1, /* the peer's SUP address is in our port's connected prefix */
  MPIB_SHM_SUP_PATH_ROUTED = 2, /* through the fabric's forwarding (MPIB_SUP_RELAY=1) */
  MPIB_SHM_SUP_PATH_ISLAND = 3, /* SUP pair without addresses: the SOUT island says it reaches */
};

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

/* What mpib_shm_poll did. */
enum {
  MPIB_SHM_POLL_NONE = 0,     /* nothing changed */
  MPIB_SHM_POLL_ATTACHED = 1, /* a (new) segment is attached; connections moved to it */
  MPIB_SHM_POLL_DETACHED = 2, /* the segment was truncated: no segment until a valid one appears */
  MPIB_SHM_POLL_FAILED = 3,   /* the file at the path is unusable (message says why; said once) */
};

typedef struct {
  uint32_t sup_bw; /* 0..1024, valid when source is SLOT, PEER or CLASS */
  uint8_t source;  /* MPIB_SHM_SRC_* */
  uint8_t clamped; /* 1 when the stored value was above 1024 */
} mpib_shm_hint;

/* One hint record (read under its seqlock, or raw). */
typedef struct {
  uint32_t seq, sup_bw, flags, gen;
  uint64_t set_ns;
  uint32_t peer_ip;
  uint8_t prefix_len;
} mpib_shm_record;

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
  uint16_t dev; /* version 4 */
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

/* What the plugin publishes for one connection at a telemetry flush (spec 4.3). Counters are
 * deltas since the previous flush; inflight_bytes, applied_sup_bw and wall_ns replace the
 * stored values. */
typedef struct {
  uint64_t posted_bytes, posted_requests;
  uint64_t completed_bytes, completed_requests;
  uint64_t busy_ns;        /* sum of completion - post time over completed_requests */
  uint64_t inflight_bytes; /* gauge: posted and not completed yet */
  uint64_t active_ns;      /* time with at least one request in flight on the rail */
} mpib_shm_rail_batch;
typedef struct {
  mpib_shm_rail_batch rail[2]; /* 0 SOUT, 1 SUP */
  uint32_t applied_sup_bw;     /* the split of the last posted message, after guard and failover */
  uint64_t wall_ns;            /* CLOCK_REALTIME ns of the flush */
} mpib_shm_tele_batch;

enum { MPIB_SHM_REC_CLASS = 0, MPIB_SHM_REC_PEER = 1 };

/* $MPIB_SHM_PATH, or /dev/shm/mpib-hints-<euid>. */
MPIB_SHM_HIDDEN const char *mpib_shm_default_path(void);
/* $MPIB_AGENT_STALE_MS (default 500, must be 1..3600000) in nanoseconds. */
MPIB_SHM_HIDDEN uint64_t mpib_shm_stale_ns_from_env(void);

/* A handle for path with nothing attached yet (mpib_shm_poll attaches). 0 or -errno. */
MPIB_SHM_HIDDEN int mpib_shm_handle_new(const char *path, mpib_shm **out);
/* A handle with the segment at path attached now. Validates (O_NOFOLLOW, regular file, owner
 * == geteuid(), no group/other access (mode & 077 == 0), size, magic, version, geometry). 0 or -errno; err
 * gets "mpib shm PATH: CODE: detail" (CODE as in the spec's validation table: not_regular,
 * bad_owner, bad_mode, too_small, bad_magic, bad_version, bad_geometry, io). */
MPIB_SHM_HIDDEN int mpib_shm_open(const char *path, mpib_shm **out, char *err, size_t errlen);
/* A handle over a caller-owned segment image (validated like a file, checks 5..9; no file,
 * no locks, no guard). The buffer must outlive the handle. Tests, tools and fuzzing. */
MPIB_SHM_HIDDEN int mpib_shm_attach_image(void *buf, size_t len, mpib_shm **out, char *err,
                                          size_t errlen);
/* Releases every slot the handle owns and unmaps. The data path must be quiet. */
MPIB_SHM_HIDDEN void mpib_shm_close(mpib_shm *shm);
/* Validates a segment image in memory (the file checks are skipped). Same codes. */
MPIB_SHM_HIDDEN int mpib_shm_validate(const void *buf, size_t len, char *err, size_t errlen);
/* The watcher (never on the data path). Returns MPIB_SHM_POLL_*; msg says what happened. */
MPIB_SHM_HIDDEN int mpib_shm_poll(mpib_shm *shm, char *msg, size_t msglen);
/* 1 when a segment is attached. */
MPIB_SHM_HIDDEN int mpib_shm_attached(const mpib_shm *shm);
/* nslots of the attached segment (0 when none). */
MPIB_SHM_HIDDEN uint32_t mpib_shm_nslots(const mpib_shm *shm);

/* Connections. register: 0 and an id (bound to a slot now when a segment is attached and a
 * bounded search finds a free slot, else later by the poll), -ENOSPC when the handle has
 * MPIB_SHM_MAX_CONNS connections. Not for the data path. release is O(1): it never waits for
 * a search among slots other processes lease (spec 5.4). */
MPIB_SHM_HIDDEN int mpib_shm_register(mpib_shm *shm, const mpib_conn_desc *d, uint32_t *id_out);
MPIB_SHM_HIDDEN void mpib_shm_release(mpib_shm *shm, uint32_t id);
/* The segment slot and gen a connection is bound to: 0, or -ENOENT when it is not bound. */
MPIB_SHM_HIDDEN int mpib_shm_conn_slot(mpib_shm *shm, uint32_t id, uint32_t *slot, uint32_t *gen);

/* Hot path: resolves connection id's slot hint, else per-peer default, else path-class
 * default. Returns 1 and *sup_bw (clamped 0..1024) when a hint applies and the agent
 * heartbeat is fresh; 0 when no hint applies, the agent is stale/absent or the connection is
 * not bound to a slot (caller falls back to vanilla). No system call. */
MPIB_SHM_HIDDEN int mpib_shm_read_hint(mpib_shm *shm, uint32_t id, uint64_t stale_ns,
                                       uint32_t *sup_bw);
/* Relaxed atomics: adds bytes and one request to the rail (0 SOUT, 1 SUP) of connection id
 * (tests and tools; the plugin publishes with mpib_shm_flush_telemetry). */
MPIB_SHM_HIDDEN void mpib_shm_add_telemetry(mpib_shm *shm, uint32_t id, int rail, uint64_t bytes);
/* Relaxed atomics: publishes a batch to connection id's slot (adds the counters, stores the
 * gauges, the applied split and the wall clock). Not per message: the data path batches. */
MPIB_SHM_HIDDEN void mpib_shm_flush_telemetry(mpib_shm *shm, uint32_t id, const mpib_shm_tele_batch *b);
/* A rail's state in connection id's telemetry (spec 4.3): in service, out of service after a
 * failover (retried), or failed for good (its device is gone); when, in CLOCK_REALTIME ns. */
enum { MPIB_SHM_RAIL_UP = 0, MPIB_SHM_RAIL_DOWN = 1, MPIB_SHM_RAIL_FAILED = 2 };
MPIB_SHM_HIDDEN void mpib_shm_set_rail_state(mpib_shm *shm, uint32_t id, int rail, int state, uint64_t realtime_ns);

/* By segment slot index, on the attached segment (tests and tools). */
/* Pure resolution at an explicit time (no telemetry written). 1 when a hint applies, else 0;
 * *out is always filled. */
MPIB_SHM_HIDDEN int mpib_shm_resolve(mpib_shm *shm, uint32_t slot, uint64_t now_ns,
                                     uint64_t stale_ns, mpib_shm_hint *out);
/* Reads a slot's hint record under the seqlock: 0, -EBUSY (8 attempts failed), -ERANGE. */
MPIB_SHM_HIDDEN int mpib_shm_read_slot_record(mpib_shm *shm, uint32_t slot, mpib_shm_record *r);
/* Field decoders: 0, or -ERANGE / -ENOENT (nothing attached). */
MPIB_SHM_HIDDEN int mpib_shm_decode_header(mpib_shm *shm, mpib_shm_header_info *h);
MPIB_SHM_HIDDEN int mpib_shm_decode_slot(mpib_shm *shm, uint32_t slot, mpib_shm_slot_info *s);
/* Raw (no seqlock) class default (kind CLASS, idx 0..1) or peer entry (kind PEER). */
MPIB_SHM_HIDDEN int mpib_shm_raw_record(mpib_shm *shm, int kind, uint32_t idx, mpib_shm_record *r);

/* Agent-side helpers for C tests and tools. Writers must be serialised by the caller
 * (agents hold flock(LOCK_EX) on the file; see the spec, section 5.5). */
MPIB_SHM_HIDDEN int mpib_shm_create(const char *path, uint32_t nslots, uint32_t npeers,
                                    char *err, size_t errlen);
MPIB_SHM_HIDDEN void mpib_shm_heartbeat(mpib_shm *shm, uint64_t now_ns);
MPIB_SHM_HIDDEN int mpib_shm_write_slot_record(mpib_shm *shm, uint32_t slot,
                                               const mpib_shm_record *r);
/* valid = 0 clears. Values above 1024 are stored clamped; returns 1 when clamped, else 0,
 * or -errno (-ENOENT: slot not ACTIVE; -ESTALE: the slot's gen is not expect_gen;
 * -ERANGE: bad index; -ENOSPC: peer table full). */
MPIB_SHM_HIDDEN int mpib_shm_set_slot_hint(mpib_shm *shm, uint32_t slot, uint32_t expect_gen,
                                           int valid, uint32_t sup_bw);
MPIB_SHM_HIDDEN int mpib_shm_set_class_hint(mpib_shm *shm, int path_class, int valid,
                                            uint32_t sup_bw);
MPIB_SHM_HIDDEN int mpib_shm_set_peer_hint(mpib_shm *shm, uint32_t peer_ip, uint8_t prefix_len,
                                           int valid, uint32_t sup_bw);
MPIB_SHM_HIDDEN uint64_t mpib_shm_now_ns(void);

#endif
