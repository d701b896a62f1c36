/*
 * The plugin's side of the MPIB shared-memory hint segment, format version 6: the one header
 * its callers include (the Go control plane's cgo files, mpib.h, mpib_comm.h, mpib_p2p.c,
 * mpib_slots.c).
 * The format is specified in docs/shm-format.md; testdata/shm/ pins it.
 * Pure C11 + POSIX: no verbs, no Go, no NCCL. All symbols are hidden (never exported).
 * The path and the stale limit come from the caller (plugin/internal/config parses
 * MPIB_SHM_PATH and MPIB_AGENT_STALE_MS); this code reads no environment.
 *
 * Contract for the plugin:
 *   one handle per process (mpib_shm_handle_new), polled from a non-hot thread at most every
 *   MPIB_SHM_POLL_MS (mpib_shm_poll): the poll attaches the segment when it appears,
 *   re-attaches when the file at the path is replaced (every live connection moves to the
 *   new segment), and detaches when the segment is truncated;
 *   register each connection at connect/accept (an id valid for the handle's life, bound to a
 *   slot of the current segment whenever one is attached), release it at close;
 *   call mpib_shm_read_hint before a connection's first message and after each telemetry batch,
 *   keeping the result until the next (no system call: a vDSO clock read and a few loads),
 *   publish the connection's telemetry in batches with mpib_shm_flush_telemetry (posted and
 *   completed bytes and requests per rail, busy time, bytes in flight, the applied split).
 * Liveness: the handle keeps the segment's file open and holds an OFD lock on the first byte
 * of every slot it owns, so agents in any PID namespace see a slot's owner die with it.
 * Safety: a SIGBUS guard turns a truncated mapping into zero pages (no hint), never a crash.
 * Every function tolerates garbage in the segment: indices are bounds-checked, nothing spins.
 *
 * Files (each internal header declares its file's entry points for the others):
 *   mpib_shm_layout.h  the segment's structs and their pinned offsets
 *   mpib_shm_guard.c   OFD lock bytes and the SIGBUS guard (mpib_shm_guard.h)
 *   mpib_shm_map.c     validation, open and mapping of a segment file (mpib_shm_map.h)
 *   mpib_shm_hint.c    the data path: seqlock read, hint resolution, telemetry (mpib_shm_hint.h)
 *   mpib_shm_conn.c    the handle, slot claims, registration and release (mpib_shm_conn.h)
 *   mpib_shm_watch.c   the poll: attach, re-attach, detach, waiting connections
 * Test-only decoders and the agent-side writers are C test code (plugin/ctest/shm_decode.c,
 * plugin/ctest/shm_agent.c), never linked into the plugin.
 */
#ifndef MPIB_SHM_H
#define MPIB_SHM_H

#include <stddef.h>
#include <stdint.h>

#define MPIB_SHM_HIDDEN __attribute__((visibility("hidden")))

#define MPIB_SHM_VERSION 6u
#define MPIB_SHM_NIC_NAME 24 /* bytes of a NIC name field, its NUL included (spec 4.3) */
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
  uint16_t dev;                   /* the fused device (version 4) */
  uint8_t port[2];                /* SOUT's, SUP's port */
  char nic[2][MPIB_SHM_NIC_NAME]; /* SOUT's, SUP's NIC name; a longer one is cut */
  uint8_t sup_path;               /* MPIB_SHM_SUP_PATH_* (version 6) */
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

/* ---- mpib_shm_conn.c ---- */

/* A handle for path with nothing attached yet (mpib_shm_poll attaches). 0 or -errno. */
MPIB_SHM_HIDDEN int mpib_shm_handle_new(const char *path, mpib_shm **out);
/* Releases every slot the handle owns and unmaps. The data path must be quiet. */
MPIB_SHM_HIDDEN void mpib_shm_close(mpib_shm *shm);
/* 1 when a segment is attached. */
MPIB_SHM_HIDDEN int mpib_shm_attached(const mpib_shm *shm);
/* Connections. register: 0 and an id (bound to a slot now when a segment is attached and a
 * bounded search finds a free slot, else later by the poll), -ENOSPC when the handle has
 * MPIB_SHM_MAX_CONNS connections. Not for the data path. release is O(1): it never waits for
 * a search among slots other processes lease (spec 5.4). */
MPIB_SHM_HIDDEN int mpib_shm_register(mpib_shm *shm, const mpib_conn_desc *d, uint32_t *id_out);
MPIB_SHM_HIDDEN void mpib_shm_release(mpib_shm *shm, uint32_t id);
/* The segment slot and gen a connection is bound to: 0, or -ENOENT when it is not bound. */
MPIB_SHM_HIDDEN int mpib_shm_conn_slot(mpib_shm *shm, uint32_t id, uint32_t *slot, uint32_t *gen);

/* ---- mpib_shm_watch.c ---- */

/* The watcher (never on the data path). Returns MPIB_SHM_POLL_*; msg says what happened. */
MPIB_SHM_HIDDEN int mpib_shm_poll(mpib_shm *shm, char *msg, size_t msglen);

/* ---- mpib_shm_hint.c ---- */

/* Hot path: resolves connection id's slot hint, else per-peer default, else path-class
 * default. Returns 1 and *sup_bw (clamped 0..1024) when a hint applies and the agent
 * heartbeat is fresh; 0 when no hint applies, the agent is stale/absent or the connection is
 * not bound to a slot (caller falls back to vanilla). No system call. */
MPIB_SHM_HIDDEN int mpib_shm_read_hint(mpib_shm *shm, uint32_t id, uint64_t stale_ns, uint32_t *sup_bw);
/* Relaxed atomics: publishes a batch to connection id's slot (adds the counters, stores the
 * gauges, the applied split and the wall clock). Not per message: the data path batches. */
MPIB_SHM_HIDDEN void mpib_shm_flush_telemetry(mpib_shm *shm, uint32_t id, const mpib_shm_tele_batch *b);
/* A rail's state in connection id's telemetry (spec 4.3): in service, out of service after a
 * failover (retried), or failed for good (its device is gone); when, in CLOCK_REALTIME ns. */
enum { MPIB_SHM_RAIL_UP = 0, MPIB_SHM_RAIL_DOWN = 1, MPIB_SHM_RAIL_FAILED = 2 };
MPIB_SHM_HIDDEN void mpib_shm_set_rail_state(mpib_shm *shm, uint32_t id, int rail, int state, uint64_t realtime_ns);

/* CLOCK_MONOTONIC in ns (the clock of heartbeat_ns and the resolution's now). */
MPIB_SHM_HIDDEN uint64_t mpib_shm_now_ns(void);

#endif
