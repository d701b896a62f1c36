/*
 * MPIB shared-memory hint segment, format version 6 (docs/shm-format.md).
 * Every struct below mirrors a table of the spec; the _Static_asserts pin the offsets.
 *
 * Process model: one handle (struct mpib_shm) per process holds a table of connections and
 * the segments it attached over time (maps). A connection id is bound to (map, slot) by one
 * 64-bit word the data path loads; re-attaching to a replaced segment re-registers every
 * connection there and swaps these words. A map is never unmapped while the handle lives:
 * retiring one replaces its pages with anonymous zero pages (a late reader sees "no agent").
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "mpib_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
#define SHM_NO_PEER UINT32_MAX

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
  _Atomic uint8_t port[2]; /* version 4: SOUT's, SUP's */
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
  _Atomic uint32_t recoveries; /* version 5: times a rail came back into service */
  _Atomic uint64_t flush_wall_ns; /* CLOCK_REALTIME ns */
  uint64_t reserved5;
  struct shm_rail_done {
    _Atomic uint64_t bytes, requests;
    _Atomic uint64_t inflight_bytes; /* a gauge */
    _Atomic uint64_t busy_ns;        /* sum of completion - post time over the requests */
  } done[2];
  _Atomic uint64_t active_ns[2]; /* time with a request in flight on the rail */
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
#define SHM_MAX_MAPS 64   /* segments one handle may attach in its life */
#define SHM_MAX_GUARDS 256

/* What one search for free slots may spend (spec 5.4 lets the start be any spreading value).
 * An agent can make every free-looking slot refuse its lease (one lock over the whole slot
 * area, owner words left 0) and can fill every owner word, so without a bound each search
 * costs nslots loads and as many fcntl calls, for every connection waiting. A search that
 * runs out of its budget leaves the connection waiting, as a full segment does, and the next
 * one goes on where it stopped (the map's cursor), so that successive searches cover every
 * slot. */
#define SHM_PASS_PROBES 8192u       /* owner words looked at per search */
#define SHM_PASS_LOCKS_POLL 256u    /* lease attempts per poll, for every waiting connection */
#define SHM_PASS_LOCKS_REGISTER 32u /* lease attempts per registration */
#define SHM_WAIT_BATCH 32u          /* waiting connections picked per round of a poll */

/* Peer-table scans caused by the agent (a new peers_epoch, a cached entry that no longer
 * matches) are rate-limited per segment: up to SHM_PEER_RESCAN_BURST at once, then one per
 * SHM_PEER_RESCAN_NS. An agent that changes peers_epoch on every read then costs a few scans
 * per interval, not one of npeers entries per read; a table that stops changing applies
 * within one interval. A slot's first scan for a registration (a new gen) is never limited. */
#define SHM_PEER_RESCAN_NS 100000000ull
#define SHM_PEER_RESCAN_BURST 8u

/* Per-slot cache of the matching peer entry, keyed by (peers_epoch, slot gen). */
struct peer_cache {
  _Atomic uint64_t tag;
  _Atomic uint32_t idx;
};

/* One attached segment. Immutable after publication except retired. */
struct shm_map {
  struct shm_header *hdr;
  struct shm_slot *slots;
  struct shm_rec *peers;
  size_t map_size;
  uint32_t nslots; /* copies validated at open: the header is never trusted again */
  uint32_t npeers;
  struct peer_cache *cache;
  int fd;        /* the segment file (its OFD holds our locks); -1 for an image */
  dev_t dev;
  ino_t ino;
  int guard;     /* its entry in the SIGBUS guard's table (g_guard), -1 for none */
  int retired;   /* pages replaced by zeros, fd closed */
  uint32_t cursor; /* the slot the next search looks at first (under claim_mu) */
  _Atomic uint32_t epoch_seen; /* the peers_epoch the per-slot caches are keyed on */
  _Atomic uint64_t rescan_due; /* the peer-rescan limiter's theoretical arrival time (ns) */
};

struct shm_conn {
  mpib_conn_desc d;
  int used;
};

/* Locks. mu guards the connection table and the bindings; it is held only for table updates
 * and O(1) work per connection (at most one fcntl on a lease of our own), never across a
 * search for free slots, so that mpib_shm_release (NCCL's close path) never waits for
 * fcntl calls on leases other processes hold. claim_mu serialises the searches (they run
 * under it, without mu) with one another and with retiring a map (which closes the fd they
 * lock through); it is taken before mu, by registration and the poll, never by release. */
struct mpib_shm {
  pthread_mutex_t claim_mu;
  pthread_mutex_t mu; /* registration, release, poll; never taken by the data path */
  char path[4096];
  _Atomic(struct shm_map *) maps[SHM_MAX_MAPS];
  int nmaps;
  _Atomic int cur; /* index + 1 of the attached map, 0 = none */
  struct shm_conn *conns;   /* [MPIB_SHM_MAX_CONNS], under mu */
  _Atomic uint64_t *bind;   /* [MPIB_SHM_MAX_CONNS]: (map index + 1) << 32 | slot, 0 = unbound */
  uint32_t conn_hi; /* ids at or above it were never used: loops stop there */
  uint32_t unbound; /* used connections without a slot of the current map (shm_waiting) */
  uint32_t wait_cursor; /* the id the poll's next pass over waiting connections starts at
                         * (under claim_mu) */
  /* The last file the poll refused, so that an unchanged bad file is neither re-read nor
   * reported again. */
  dev_t bad_dev;
  ino_t bad_ino;
  off_t bad_size;
  struct timespec bad_mtime;
  int bad_errno;
  int bad_retry; /* the refusal may pass without a change of the file (a lease): try again */
  char last_msg[512];
};

static uint64_t shm_expected_size(uint64_t nslots, uint64_t npeers) {
  return SHM_HEADER_SIZE + nslots * SHM_SLOT_SIZE + npeers * SHM_PEER_SIZE;
}

__attribute__((format(printf, 3, 4))) static void shm_err(char *err, size_t errlen,
                                                          const char *fmt, ...) {
  if (err == NULL || errlen == 0) {
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

uint64_t mpib_shm_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

const char *mpib_shm_default_path(void) {
  static char buf[64];
  const char *p = getenv("MPIB_SHM_PATH");
  if (p != NULL && p[0] != '\0') {
    return p;
  }
  snprintf(buf, sizeof(buf), "%s%u", MPIB_SHM_DEFAULT_PREFIX, (unsigned)geteuid());
  return buf;
}

uint64_t mpib_shm_stale_ns_from_env(void) {
  uint64_t ms = MPIB_SHM_DEFAULT_STALE_MS;
  const char *v = getenv("MPIB_AGENT_STALE_MS");
  if (v != NULL && v[0] != '\0') {
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (end != NULL && *end == '\0' && x >= 1 && x <= 3600000ull) {
      ms = x;
    }
  }
  return ms * 1000000ull;
}

/* ---- OFD locks (spec 5.7) ---- */

/* type F_RDLCK/F_WRLCK takes (never waits), F_UNLCK drops. 0 or -errno (-EAGAIN: held). */
static int shm_lock_byte(int fd, off_t off, short type) {
  if (fd < 0) {
    return 0;
  }
  struct flock lk;
  memset(&lk, 0, sizeof(lk));
  lk.l_type = type;
  lk.l_whence = SEEK_SET;
  lk.l_start = off;
  lk.l_len = 1;
  if (fcntl(fd, F_OFD_SETLK, &lk) != 0) {
    return errno == EACCES ? -EAGAIN : -errno;
  }
  return 0;
}

static off_t shm_slot_lock_off(uint32_t slot) {
  return (off_t)SHM_HEADER_SIZE + (off_t)slot * SHM_SLOT_SIZE;
}

/* ---- SIGBUS guard (spec 5.9) ---- */

/* The guarded address ranges. The handler reads only this table, never a struct shm_map, so
 * that a handle closing on another thread cannot free what it reads. base 0: a free entry. */
static struct shm_guard {
  _Atomic uintptr_t base;
  _Atomic size_t size;
  _Atomic int faulted; /* the handler replaced the pages (the file was truncated) */
} g_guard[SHM_MAX_GUARDS];
static _Atomic int g_guard_running; /* handlers between their first and last table access */
static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_guard_installed;
static struct sigaction g_prev_bus;

static void shm_sigbus_chain(int sig, siginfo_t *si, void *uctx) {
  const struct sigaction *p = &g_prev_bus;
  if (p->sa_flags & SA_SIGINFO) {
    if (p->sa_sigaction != NULL) {
      p->sa_sigaction(sig, si, uctx);
      return;
    }
  } else if (p->sa_handler == SIG_IGN && si->si_code <= 0) {
    return; /* a sent SIGBUS the process ignores */
  } else if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN) {
    p->sa_handler(sig);
    return;
  }
  /* Default action: restore it; a fault then re-executes and takes it, a sent signal is
   * sent again. */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  if (si->si_code <= 0) {
    raise(sig);
  }
}

/* A truncated segment makes loads and stores beyond its new end raise SIGBUS. When the
 * faulting address is inside a mapping of ours, replace the whole mapping with anonymous zero
 * pages and return: the instruction re-executes on zeros (heartbeat 0: no hint). mmap is a
 * plain system call (async-signal-safe in practice on Linux/glibc). */
static void shm_sigbus(int sig, siginfo_t *si, void *uctx) {
  int saved = errno;
  int handled = 0;
  atomic_fetch_add(&g_guard_running, 1); /* seq_cst: shm_guard_remove waits for it */
  if (si != NULL && si->si_code > 0) {
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < SHM_MAX_GUARDS && !handled; i++) {
      struct shm_guard *g = &g_guard[i];
      uintptr_t base = atomic_load(&g->base);
      size_t size = atomic_load(&g->size);
      if (base == 0 || a - base >= size) {
        continue;
      }
      if (mmap((void *)base, size, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
        atomic_store_explicit(&g->faulted, 1, memory_order_release);
        handled = 1;
      }
    }
  }
  atomic_fetch_sub(&g_guard_running, 1);
  errno = saved;
  if (!handled) {
    shm_sigbus_chain(sig, si, uctx);
  }
}

/* Whether the SIGBUS guard found m's file truncated. */
static int shm_map_faulted(const struct shm_map *m) {
  return m->guard >= 0 && atomic_load_explicit(&g_guard[m->guard].faulted, memory_order_acquire);
}

static void shm_guard_add(struct shm_map *m) {
  pthread_mutex_lock(&g_guard_mu);
  if (!g_guard_installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = shm_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART; /* SA_ONSTACK: required beside Go */
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_prev_bus) == 0) {
      g_guard_installed = 1;
    }
  }
  for (int i = 0; i < SHM_MAX_GUARDS; i++) {
    struct shm_guard *g = &g_guard[i];
    if (atomic_load(&g->base) == 0) {
      atomic_store(&g->faulted, 0);
      atomic_store(&g->size, m->map_size);
      atomic_store(&g->base, (uintptr_t)m->hdr); /* last: publishes the entry */
      m->guard = i;
      break;
    }
  }
  pthread_mutex_unlock(&g_guard_mu);
}

/* Takes m's range out of the guard before it is unmapped: once this returns, no handler
 * still holds the range, so none can map zeros over whatever the address space puts there
 * next. */
static void shm_guard_remove(struct shm_map *m) {
  if (m->guard < 0) {
    return;
  }
  pthread_mutex_lock(&g_guard_mu);
  atomic_store(&g_guard[m->guard].base, 0);
  while (atomic_load(&g_guard_running) != 0) {
    sched_yield(); /* a handler of another thread is between its loads and its mmap */
  }
  m->guard = -1;
  pthread_mutex_unlock(&g_guard_mu);
}

/* ---- validation (spec 6) ---- */

/* Checks 5..9 of the spec's validation table on a header image of len bytes (file size). */
static int shm_check_image(const void *buf, size_t len, const char *what, char *err,
                           size_t errlen) {
  if (len < SHM_HEADER_SIZE) {
    shm_err(err, errlen, "mpib shm %s: too_small: %zu bytes, a header needs %u", what, len,
            SHM_HEADER_SIZE);
    return -EINVAL;
  }
  struct shm_header h;
  memcpy(&h, buf, sizeof(h));
  if (memcmp(h.magic, SHM_MAGIC, 8) != 0) {
    shm_err(err, errlen, "mpib shm %s: bad_magic: not an MPIB hint segment", what);
    return -EPROTO;
  }
  if (h.version != MPIB_SHM_VERSION) {
    shm_err(err, errlen,
            "mpib shm %s: bad_version: format version %u, this reader implements %u%s", what,
            h.version, MPIB_SHM_VERSION,
            h.version < MPIB_SHM_VERSION
                ? " (a segment made by an older agent: re-create it with the current agent)"
                : " (a segment made by a newer agent: upgrade the plugin and agents)");
    return -EPROTONOSUPPORT;
  }
  if (h.header_size != SHM_HEADER_SIZE || h.slot_size != SHM_SLOT_SIZE ||
      h.peer_size != SHM_PEER_SIZE || h.nslots < 1 || h.nslots > SHM_MAX_SLOTS ||
      h.npeers > SHM_MAX_PEERS || h.total_size != shm_expected_size(h.nslots, h.npeers)) {
    shm_err(err, errlen,
            "mpib shm %s: bad_geometry: header_size=%u slot_size=%u peer_size=%u nslots=%u "
            "npeers=%u total_size=%llu",
            what, h.header_size, h.slot_size, h.peer_size, h.nslots, h.npeers,
            (unsigned long long)h.total_size);
    return -EINVAL;
  }
  if (len < h.total_size) {
    shm_err(err, errlen, "mpib shm %s: too_small: %zu bytes, the header declares %llu", what,
            len, (unsigned long long)h.total_size);
    return -EINVAL;
  }
  return 0;
}

int mpib_shm_validate(const void *buf, size_t len, char *err, size_t errlen) {
  return shm_check_image(buf, len, "(buffer)", err, errlen);
}

/* Checks 2..4 on a file's status (from fstatat before the open, from fstat after it). */
static int shm_check_stat(const struct stat *st, const char *path, char *err, size_t errlen) {
  if (!S_ISREG(st->st_mode)) {
    shm_err(err, errlen, "mpib shm %s: not_regular: not a regular file", path);
    return -EINVAL;
  }
  if (st->st_uid != geteuid()) {
    shm_err(err, errlen, "mpib shm %s: bad_owner: owned by uid %u, this process runs as %u",
            path, (unsigned)st->st_uid, (unsigned)geteuid());
    return -EPERM;
  }
  /* Group or other access of any kind is refused: a readable segment shows every peer's
   * address and rates to other users, a writable one lets them steer the traffic. */
  if ((st->st_mode & 0077) != 0) {
    shm_err(err, errlen,
            "mpib shm %s: bad_mode: mode %04o grants group/other access (want 0600: chmod 600)",
            path, (unsigned)(st->st_mode & 07777));
    return -EPERM;
  }
  return 0;
}

/* Checks 1..4: the file itself. */
static int shm_check_file(int fd, const char *path, struct stat *st, char *err, size_t errlen) {
  if (fstat(fd, st) != 0) {
    int e = errno;
    shm_err(err, errlen, "mpib shm %s: io: fstat: %s", path, strerror(e));
    return -e;
  }
  return shm_check_stat(st, path, err, errlen);
}

/* Opens the segment file for reading and writing without ever waiting: O_NONBLOCK makes the
 * open of a file another process holds a lease on fail at once (EWOULDBLOCK) instead of
 * waiting up to the lease break time (45 s by default), and the file is checked (type, owner,
 * mode) before it is opened at all, so a device, a FIFO or another user's file is never
 * opened. The file checks run again on the descriptor (the path may change in between).
 * The descriptor or -errno. */
static int shm_open_file(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    int e = errno;
    shm_err(err, errlen, "mpib shm %s: io: stat: %s", path, strerror(e));
    return -e;
  }
  if (S_ISLNK(st.st_mode)) {
    shm_err(err, errlen, "mpib shm %s: not_regular: a symbolic link (refused: O_NOFOLLOW)", path);
    return -ELOOP;
  }
  int rc = shm_check_stat(&st, path, err, errlen);
  if (rc != 0) {
    return rc;
  }
  int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP) {
      shm_err(err, errlen, "mpib shm %s: not_regular: a symbolic link (refused: O_NOFOLLOW)", path);
    } else if (e == EWOULDBLOCK) {
      shm_err(err, errlen,
              "mpib shm %s: io: open: another process holds a lease on the file (EWOULDBLOCK): "
              "not used (vanilla policy), tried again at every poll", path);
    } else {
      shm_err(err, errlen, "mpib shm %s: io: open: %s", path, strerror(e));
    }
    return -e;
  }
  return fd;
}

static struct shm_map *shm_map_new(void *mem, size_t size, uint32_t nslots, uint32_t npeers) {
  struct shm_map *m = calloc(1, sizeof(*m));
  struct peer_cache *cache = calloc(nslots, sizeof(*cache));
  if (m == NULL || cache == NULL) {
    free(m);
    free(cache);
    return NULL;
  }
  m->hdr = mem;
  m->slots = (struct shm_slot *)((uint8_t *)mem + SHM_HEADER_SIZE);
  m->peers = (struct shm_rec *)((uint8_t *)mem + SHM_HEADER_SIZE + (size_t)nslots * SHM_SLOT_SIZE);
  m->map_size = size;
  m->nslots = nslots;
  m->npeers = npeers;
  m->cache = cache;
  m->fd = -1;
  for (uint32_t i = 0; i < nslots; i++) {
    atomic_init(&cache[i].tag, UINT64_MAX); /* never a valid (epoch, gen) tag: gen 0 is unused */
    atomic_init(&cache[i].idx, SHM_NO_PEER);
  }
  m->guard = -1;
  m->cursor = (uint32_t)(((uint64_t)getpid() * 31u) % nslots); /* spreads processes */
  atomic_init(&m->epoch_seen,
              atomic_load_explicit(&m->hdr->peers_epoch, memory_order_relaxed));
  atomic_init(&m->rescan_due, 0);
  return m;
}

/* Opens, validates and maps the file at path; takes the attach lock; registers the guard. */
static int shm_map_file(const char *path, struct shm_map **out, struct stat *st_out, char *err,
                        size_t errlen) {
  int fd = shm_open_file(path, err, errlen);
  if (fd < 0) {
    return fd;
  }
  struct stat st;
  int rc = shm_check_file(fd, path, &st, err, errlen);
  if (st_out != NULL) {
    *st_out = st;
  }
  if (rc != 0) {
    close(fd);
    return rc;
  }
  uint8_t head[SHM_HEADER_SIZE] = {0};
  size_t len = (size_t)st.st_size;
  if (len >= sizeof(head)) {
    ssize_t n = pread(fd, head, sizeof(head), 0);
    if (n < 0) {
      int e = errno;
      shm_err(err, errlen, "mpib shm %s: io: read: %s", path, strerror(e));
      close(fd);
      return -e;
    }
    len = (size_t)n < sizeof(head) ? (size_t)n : len; /* shrank under us: too_small */
  }
  rc = shm_check_image(head, len, path, err, errlen);
  if (rc != 0) {
    close(fd);
    return rc;
  }
  const struct shm_header *h = (const struct shm_header *)head;
  void *mem = mmap(NULL, (size_t)h->total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    int e = errno;
    shm_err(err, errlen, "mpib shm %s: io: mmap: %s", path, strerror(e));
    close(fd);
    return -e;
  }
  struct shm_map *m = shm_map_new(mem, (size_t)h->total_size, h->nslots, h->npeers);
  if (m == NULL) {
    munmap(mem, (size_t)h->total_size);
    close(fd);
    shm_err(err, errlen, "mpib shm %s: io: out of memory", path);
    return -ENOMEM;
  }
  m->fd = fd;
  m->dev = st.st_dev;
  m->ino = st.st_ino;
  (void)shm_lock_byte(fd, SHM_LOCK_ATTACH, F_RDLCK); /* best effort: only agents' create reads it */
  shm_guard_add(m);
  *out = m;
  return 0;
}

/* Frees a map that no binding references any more (handle close). */
static void shm_map_free(struct shm_map *m) {
  shm_guard_remove(m);
  if (m->fd >= 0 || m->retired) {
    munmap(m->hdr, m->map_size);
  }
  if (m->fd >= 0) {
    close(m->fd);
  }
  free(m->cache);
  free(m);
}

/* The data path may still hold the map: keep the addresses, drop the file. */
static void shm_map_retire(struct shm_map *m) {
  if (m->retired || m->fd < 0) {
    return;
  }
  mmap(m->hdr, m->map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
       0);
  close(m->fd); /* drops the attach lock and every slot lease of this handle */
  m->fd = -1;
  m->retired = 1;
}

static struct shm_map *shm_cur(const mpib_shm *shm) {
  int c = atomic_load_explicit(&((mpib_shm *)shm)->cur, memory_order_acquire);
  return c > 0 ? atomic_load_explicit(&((mpib_shm *)shm)->maps[c - 1], memory_order_relaxed)
               : NULL;
}

int mpib_shm_attached(const mpib_shm *shm) { return shm != NULL && shm_cur(shm) != NULL; }

uint32_t mpib_shm_nslots(const mpib_shm *shm) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  return m == NULL ? 0 : m->nslots;
}

int mpib_shm_handle_new(const char *path, mpib_shm **out) {
  if (out == NULL) {
    return -EINVAL;
  }
  *out = NULL;
  mpib_shm *shm = calloc(1, sizeof(*shm));
  if (shm == NULL) {
    return -ENOMEM;
  }
  if (path != NULL && strlen(path) >= sizeof(shm->path)) {
    free(shm);
    return -ENAMETOOLONG;
  }
  shm->conns = calloc(MPIB_SHM_MAX_CONNS, sizeof(*shm->conns));
  shm->bind = calloc(MPIB_SHM_MAX_CONNS, sizeof(*shm->bind));
  if (shm->conns == NULL || shm->bind == NULL) {
    free(shm->conns);
    free((void *)shm->bind);
    free(shm);
    return -ENOMEM;
  }
  pthread_mutex_init(&shm->claim_mu, NULL);
  pthread_mutex_init(&shm->mu, NULL);
  if (path != NULL) {
    strcpy(shm->path, path);
  }
  atomic_init(&shm->cur, 0);
  for (int i = 0; i < SHM_MAX_MAPS; i++) {
    atomic_init(&shm->maps[i], NULL);
  }
  *out = shm;
  return 0;
}

/* Adds m as the handle's attached map (under mu, or before the handle is shared). */
static int shm_add_map(mpib_shm *shm, struct shm_map *m) {
  if (shm->nmaps >= SHM_MAX_MAPS) {
    return -ENOSPC;
  }
  atomic_store_explicit(&shm->maps[shm->nmaps], m, memory_order_release);
  shm->nmaps++;
  return shm->nmaps; /* index + 1 */
}

int mpib_shm_open(const char *path, mpib_shm **out, char *err, size_t errlen) {
  if (path == NULL || out == NULL) {
    return -EINVAL;
  }
  *out = NULL;
  mpib_shm *shm;
  int rc = mpib_shm_handle_new(path, &shm);
  if (rc != 0) {
    shm_err(err, errlen, "mpib shm %s: io: %s", path, strerror(-rc));
    return rc;
  }
  struct shm_map *m;
  rc = shm_map_file(path, &m, NULL, err, errlen);
  if (rc != 0) {
    mpib_shm_close(shm);
    return rc;
  }
  atomic_store_explicit(&shm->cur, shm_add_map(shm, m), memory_order_release);
  *out = shm;
  return 0;
}

int mpib_shm_attach_image(void *buf, size_t len, mpib_shm **out, char *err, size_t errlen) {
  if (buf == NULL || out == NULL) {
    return -EINVAL;
  }
  *out = NULL;
  int rc = shm_check_image(buf, len, "(buffer)", err, errlen);
  if (rc != 0) {
    return rc;
  }
  const struct shm_header *h = buf;
  mpib_shm *shm;
  if ((rc = mpib_shm_handle_new(NULL, &shm)) != 0) {
    return rc;
  }
  struct shm_map *m = shm_map_new(buf, (size_t)h->total_size, h->nslots, h->npeers);
  if (m == NULL) {
    mpib_shm_close(shm);
    return -ENOMEM;
  }
  atomic_store_explicit(&shm->cur, shm_add_map(shm, m), memory_order_release);
  *out = shm;
  return 0;
}

/* ---- seqlock (spec 5.1) ---- */

static int shm_rec_read(struct shm_rec *r, mpib_shm_record *o) {
  for (int i = 0; i < SHM_SEQ_ATTEMPTS; i++) {
    uint32_t s1 = atomic_load_explicit(&r->seq, memory_order_acquire);
    if (s1 & 1u) {
      continue;
    }
    o->sup_bw = atomic_load_explicit(&r->sup_bw, memory_order_relaxed);
    o->flags = atomic_load_explicit(&r->flags, memory_order_relaxed);
    o->gen = atomic_load_explicit(&r->gen, memory_order_relaxed);
    o->set_ns = atomic_load_explicit(&r->set_ns, memory_order_relaxed);
    o->peer_ip = atomic_load_explicit(&r->peer_ip, memory_order_relaxed);
    o->prefix_len = atomic_load_explicit(&r->prefix_len, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&r->seq, memory_order_relaxed) == s1) {
      o->seq = s1;
      return 0;
    }
  }
  return -EBUSY;
}

static void shm_rec_raw(struct shm_rec *r, mpib_shm_record *o) {
  o->seq = atomic_load_explicit(&r->seq, memory_order_relaxed);
  o->sup_bw = atomic_load_explicit(&r->sup_bw, memory_order_relaxed);
  o->flags = atomic_load_explicit(&r->flags, memory_order_relaxed);
  o->gen = atomic_load_explicit(&r->gen, memory_order_relaxed);
  o->set_ns = atomic_load_explicit(&r->set_ns, memory_order_relaxed);
  o->peer_ip = atomic_load_explicit(&r->peer_ip, memory_order_relaxed);
  o->prefix_len = atomic_load_explicit(&r->prefix_len, memory_order_relaxed);
}

static void shm_rec_write(struct shm_rec *r, const mpib_shm_record *v) {
  uint32_t w = atomic_load_explicit(&r->seq, memory_order_relaxed) | 1u;
  atomic_store_explicit(&r->seq, w, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  atomic_store_explicit(&r->sup_bw, v->sup_bw, memory_order_relaxed);
  atomic_store_explicit(&r->flags, v->flags, memory_order_relaxed);
  atomic_store_explicit(&r->gen, v->gen, memory_order_relaxed);
  atomic_store_explicit(&r->set_ns, v->set_ns, memory_order_relaxed);
  atomic_store_explicit(&r->peer_ip, v->peer_ip, memory_order_relaxed);
  atomic_store_explicit(&r->prefix_len, v->prefix_len, memory_order_relaxed);
  atomic_store_explicit(&r->seq, w + 1u, memory_order_release);
}

int mpib_shm_read_slot_record(mpib_shm *shm, uint32_t slot, mpib_shm_record *r) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || slot >= m->nslots) {
    return -ERANGE;
  }
  return shm_rec_read(&m->slots[slot].hint, r);
}

int mpib_shm_write_slot_record(mpib_shm *shm, uint32_t slot, const mpib_shm_record *r) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || slot >= m->nslots) {
    return -ERANGE;
  }
  shm_rec_write(&m->slots[slot].hint, r);
  return 0;
}

/* ---- decoding (tests, tools) ---- */

int mpib_shm_decode_header(mpib_shm *shm, mpib_shm_header_info *o) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || o == NULL) {
    return -ENOENT;
  }
  struct shm_header *h = m->hdr;
  o->version = h->version;
  o->total_size = h->total_size;
  o->nslots = h->nslots;
  o->npeers = h->npeers;
  o->flags = h->flags;
  o->heartbeat_ns = atomic_load_explicit(&h->heartbeat_ns, memory_order_acquire);
  o->agent_pid = atomic_load_explicit(&h->agent_pid, memory_order_relaxed);
  o->peers_epoch = atomic_load_explicit(&h->peers_epoch, memory_order_relaxed);
  o->created_ns = atomic_load_explicit(&h->created_ns, memory_order_relaxed);
  return 0;
}

/* The rail states and the version 3 completion telemetry of a slot. */
static void shm_decode_rails(struct shm_slot *s, mpib_shm_slot_info *o) {
  for (int r = 0; r < 2; r++) {
    o->rail_state[r] = atomic_load_explicit(&s->rail_state[r], memory_order_relaxed);
    o->rail_state_ns[r] = atomic_load_explicit(&s->rail_state_ns[r], memory_order_relaxed);
    o->completed_bytes[r] = atomic_load_explicit(&s->done[r].bytes, memory_order_relaxed);
    o->completed_requests[r] = atomic_load_explicit(&s->done[r].requests, memory_order_relaxed);
    o->inflight_bytes[r] = atomic_load_explicit(&s->done[r].inflight_bytes, memory_order_relaxed);
    o->busy_ns[r] = atomic_load_explicit(&s->done[r].busy_ns, memory_order_relaxed);
    o->active_ns[r] = atomic_load_explicit(&s->active_ns[r], memory_order_relaxed);
  }
  o->failovers = atomic_load_explicit(&s->failovers, memory_order_relaxed);
  o->recoveries = atomic_load_explicit(&s->recoveries, memory_order_relaxed);
  o->applied_sup_bw = atomic_load_explicit(&s->applied_sup_bw, memory_order_relaxed);
  o->flush_wall_ns = atomic_load_explicit(&s->flush_wall_ns, memory_order_relaxed);
}

int mpib_shm_decode_slot(mpib_shm *shm, uint32_t slot, mpib_shm_slot_info *o) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || o == NULL) {
    return -ENOENT;
  }
  if (slot >= m->nslots) {
    return -ERANGE;
  }
  struct shm_slot *s = &m->slots[slot];
  uint64_t owner = atomic_load_explicit(&s->owner, memory_order_acquire);
  o->state = (uint32_t)owner;
  o->owner_pid = (uint32_t)(owner >> 32);
  o->gen = atomic_load_explicit(&s->gen, memory_order_relaxed);
  o->conn_id = atomic_load_explicit(&s->conn_id, memory_order_relaxed);
  o->local_sout_ip = atomic_load_explicit(&s->local_sout_ip, memory_order_relaxed);
  o->peer_sout_ip = atomic_load_explicit(&s->peer_sout_ip, memory_order_relaxed);
  o->peer_island = atomic_load_explicit(&s->peer_island, memory_order_relaxed);
  o->path_class = atomic_load_explicit(&s->path_class, memory_order_relaxed);
  o->is_send = atomic_load_explicit(&s->is_send, memory_order_relaxed);
  o->nqps_sout = atomic_load_explicit(&s->nqps_sout, memory_order_relaxed);
  o->nqps_sup = atomic_load_explicit(&s->nqps_sup, memory_order_relaxed);
  o->pid = atomic_load_explicit(&s->pid, memory_order_relaxed);
  o->registered_ns = atomic_load_explicit(&s->registered_ns, memory_order_relaxed);
  o->dev = atomic_load_explicit(&s->dev, memory_order_relaxed);
  o->sup_path = atomic_load_explicit(&s->sup_path, memory_order_relaxed);
  for (int r = 0; r < 2; r++) {
    o->port[r] = atomic_load_explicit(&s->port[r], memory_order_relaxed);
    for (int i = 0; i < MPIB_SHM_NIC_NAME; i++) {
      o->nic[r][i] = (char)atomic_load_explicit(&s->nic[r][i], memory_order_relaxed);
    }
  }
  shm_rec_raw(&s->hint, &o->hint);
  o->sout_bytes = atomic_load_explicit(&s->sout_bytes, memory_order_relaxed);
  o->sout_requests = atomic_load_explicit(&s->sout_requests, memory_order_relaxed);
  o->sup_bytes = atomic_load_explicit(&s->sup_bytes, memory_order_relaxed);
  o->sup_requests = atomic_load_explicit(&s->sup_requests, memory_order_relaxed);
  o->reads_applied = atomic_load_explicit(&s->reads_applied, memory_order_relaxed);
  o->reads_fallback = atomic_load_explicit(&s->reads_fallback, memory_order_relaxed);
  o->reads_stale = atomic_load_explicit(&s->reads_stale, memory_order_relaxed);
  o->clamped = atomic_load_explicit(&s->clamped, memory_order_relaxed);
  o->last_sup_bw = atomic_load_explicit(&s->last_sup_bw, memory_order_relaxed);
  o->last_source = atomic_load_explicit(&s->last_source, memory_order_relaxed);
  o->last_read_ns = atomic_load_explicit(&s->last_read_ns, memory_order_relaxed);
  shm_decode_rails(s, o);
  return 0;
}

int mpib_shm_raw_record(mpib_shm *shm, int kind, uint32_t idx, mpib_shm_record *r) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || r == NULL) {
    return -ENOENT;
  }
  if (kind == MPIB_SHM_REC_CLASS && idx < 2) {
    shm_rec_raw(&m->hdr->cls[idx], r);
  } else if (kind == MPIB_SHM_REC_PEER && idx < m->npeers) {
    shm_rec_raw(&m->peers[idx], r);
  } else {
    return -ERANGE;
  }
  return 0;
}

/* ---- resolution (spec 5.3) ---- */

static int shm_heartbeat_fresh(const struct shm_map *m, uint64_t now, uint64_t stale_ns) {
  uint64_t hb = atomic_load_explicit(&m->hdr->heartbeat_ns, memory_order_acquire);
  if (hb == 0) {
    return 0;
  }
  if (now >= hb) {
    return now - hb <= stale_ns;
  }
  return hb - now <= stale_ns;
}

static int shm_prefix_match(uint32_t ip, uint32_t key, uint8_t prefix_len) {
  if (prefix_len > 32) {
    return 0;
  }
  uint32_t mask = prefix_len == 0 ? 0 : ~0u << (32 - prefix_len);
  return (ip & mask) == (key & mask);
}

/* Longest valid matching prefix, ties to the lowest index; SHM_NO_PEER when none. */
static uint32_t shm_peer_scan(struct shm_map *m, uint32_t ip) {
  uint32_t best = SHM_NO_PEER;
  int best_len = -1;
  for (uint32_t j = 0; j < m->npeers; j++) {
    mpib_shm_record r;
    if (shm_rec_read(&m->peers[j], &r) != 0 || !(r.flags & SHM_FLAG_VALID)) {
      continue;
    }
    if (shm_prefix_match(ip, r.peer_ip, r.prefix_len) && (int)r.prefix_len > best_len) {
      best = j;
      best_len = r.prefix_len;
    }
  }
  return best;
}

/* 1 when the agent may cost a peer-table scan now (SHM_PEER_RESCAN_*), a generic cell rate
 * limiter: lock-free, one CAS per granted scan, nothing while peers_epoch is unchanged. A
 * clock earlier than any grant could have produced (callers of mpib_shm_resolve pass their
 * own) starts the limiter again. */
static int shm_rescan_granted(struct shm_map *m, uint64_t now) {
  const uint64_t span = (uint64_t)SHM_PEER_RESCAN_BURST * SHM_PEER_RESCAN_NS;
  uint64_t due = atomic_load_explicit(&m->rescan_due, memory_order_relaxed);
  uint64_t base = due > now && due - now <= span ? due : now;
  if (base - now > span - SHM_PEER_RESCAN_NS) {
    return 0;
  }
  return atomic_compare_exchange_strong_explicit(&m->rescan_due, &due, base + SHM_PEER_RESCAN_NS,
                                                 memory_order_relaxed, memory_order_relaxed);
}

/* The peers_epoch the caches follow: the segment's, adopted when the limiter grants it. */
static uint32_t shm_peers_epoch(struct shm_map *m, uint64_t now) {
  uint32_t epoch = atomic_load_explicit(&m->hdr->peers_epoch, memory_order_acquire);
  uint32_t seen = atomic_load_explicit(&m->epoch_seen, memory_order_relaxed);
  if (epoch == seen || !shm_rescan_granted(m, now)) {
    return seen;
  }
  atomic_store_explicit(&m->epoch_seen, epoch, memory_order_relaxed);
  return epoch;
}

static void shm_peer_cache_put(struct peer_cache *c, uint64_t tag, uint32_t idx) {
  atomic_store_explicit(&c->idx, idx, memory_order_relaxed);
  atomic_store_explicit(&c->tag, tag, memory_order_release);
}

static uint32_t shm_peer_lookup(struct shm_map *m, uint32_t slot, uint32_t gen, uint32_t ip,
                                uint64_t now, uint64_t *tag_out) {
  uint64_t tag = ((uint64_t)shm_peers_epoch(m, now) << 32) | gen;
  struct peer_cache *c = &m->cache[slot];
  *tag_out = tag;
  if (atomic_load_explicit(&c->tag, memory_order_acquire) == tag) {
    return atomic_load_explicit(&c->idx, memory_order_relaxed);
  }
  uint32_t idx = shm_peer_scan(m, ip);
  shm_peer_cache_put(c, tag, idx);
  return idx;
}

static int shm_apply(mpib_shm_hint *out, uint32_t sup_bw, uint8_t source) {
  out->clamped = sup_bw > MPIB_SHM_SUP_BW_MAX;
  out->sup_bw = out->clamped ? MPIB_SHM_SUP_BW_MAX : sup_bw;
  out->source = source;
  return 1;
}

static int shm_none(mpib_shm_hint *out, uint8_t reason) {
  out->sup_bw = 0;
  out->clamped = 0;
  out->source = reason;
  return 0;
}

/* Peer level: 1 applied, 0 nothing, -1 busy. */
static int shm_resolve_peer(struct shm_map *m, uint32_t slot, uint32_t gen, uint64_t now,
                            mpib_shm_hint *out) {
  uint32_t ip = atomic_load_explicit(&m->slots[slot].peer_sout_ip, memory_order_relaxed);
  uint64_t tag = 0;
  for (int pass = 0; pass < 2; pass++) {
    uint32_t j;
    if (pass == 0) {
      j = shm_peer_lookup(m, slot, gen, ip, now, &tag);
    } else if (shm_rescan_granted(m, now)) {
      j = shm_peer_scan(m, ip);
      shm_peer_cache_put(&m->cache[slot], tag, j); /* the next reads use what it found */
    } else {
      return 0; /* no peer hint until the limiter grants a scan */
    }
    if (j >= m->npeers) {
      return 0;
    }
    mpib_shm_record r;
    if (shm_rec_read(&m->peers[j], &r) != 0) {
      return -1;
    }
    if ((r.flags & SHM_FLAG_VALID) && shm_prefix_match(ip, r.peer_ip, r.prefix_len)) {
      return shm_apply(out, r.sup_bw, MPIB_SHM_SRC_PEER);
    }
    /* The cached entry changed under an epoch the cache still follows: scan once more. */
  }
  return 0;
}

static int shm_resolve_map(struct shm_map *m, uint32_t slot, uint64_t now_ns, uint64_t stale_ns,
                           mpib_shm_hint *out) {
  if (m == NULL || slot >= m->nslots) {
    return shm_none(out, MPIB_SHM_SRC_BAD_SLOT);
  }
  if (!shm_heartbeat_fresh(m, now_ns, stale_ns)) {
    return shm_none(out, MPIB_SHM_SRC_STALE);
  }
  struct shm_slot *s = &m->slots[slot];
  uint64_t owner = atomic_load_explicit(&s->owner, memory_order_acquire);
  if ((uint32_t)owner != SHM_STATE_ACTIVE) {
    return shm_none(out, MPIB_SHM_SRC_INACTIVE);
  }
  uint32_t gen = atomic_load_explicit(&s->gen, memory_order_relaxed);
  mpib_shm_record r;
  if (shm_rec_read(&s->hint, &r) != 0) {
    return shm_none(out, MPIB_SHM_SRC_BUSY);
  }
  if ((r.flags & SHM_FLAG_VALID) && r.gen == gen) {
    return shm_apply(out, r.sup_bw, MPIB_SHM_SRC_SLOT);
  }
  int p = shm_resolve_peer(m, slot, gen, now_ns, out);
  if (p != 0) {
    return p > 0 ? 1 : shm_none(out, MPIB_SHM_SRC_BUSY);
  }
  uint8_t cls = atomic_load_explicit(&s->path_class, memory_order_relaxed);
  if (cls <= 1) {
    if (shm_rec_read(&m->hdr->cls[cls], &r) != 0) {
      return shm_none(out, MPIB_SHM_SRC_BUSY);
    }
    if (r.flags & SHM_FLAG_VALID) {
      return shm_apply(out, r.sup_bw, MPIB_SHM_SRC_CLASS);
    }
  }
  return shm_none(out, MPIB_SHM_SRC_NO_HINT);
}

int mpib_shm_resolve(mpib_shm *shm, uint32_t slot, uint64_t now_ns, uint64_t stale_ns,
                     mpib_shm_hint *out) {
  return shm_resolve_map(shm == NULL ? NULL : shm_cur(shm), slot, now_ns, stale_ns, out);
}

/* The (map, slot) connection id is bound to, or NULL. Lock-free: the data path's entry. */
static struct shm_map *shm_bound(mpib_shm *shm, uint32_t id, uint32_t *slot) {
  if (shm == NULL || id >= MPIB_SHM_MAX_CONNS) {
    return NULL;
  }
  uint64_t b = atomic_load_explicit(&shm->bind[id], memory_order_acquire);
  uint32_t mi = (uint32_t)(b >> 32);
  if (mi == 0 || mi > SHM_MAX_MAPS) {
    return NULL;
  }
  struct shm_map *m = atomic_load_explicit(&shm->maps[mi - 1], memory_order_relaxed);
  *slot = (uint32_t)b;
  return (m != NULL && *slot < m->nslots) ? m : NULL;
}

int mpib_shm_read_hint(mpib_shm *shm, uint32_t id, uint64_t stale_ns, uint32_t *sup_bw) {
  uint32_t slot = 0;
  struct shm_map *m = shm_bound(shm, id, &slot);
  if (m == NULL) {
    return 0;
  }
  uint64_t now = mpib_shm_now_ns();
  mpib_shm_hint h;
  int ok = shm_resolve_map(m, slot, now, stale_ns, &h);
  struct shm_slot *s = &m->slots[slot];
  if (ok) {
    atomic_fetch_add_explicit(&s->reads_applied, 1, memory_order_relaxed);
    atomic_store_explicit(&s->last_sup_bw, h.sup_bw, memory_order_relaxed);
  } else {
    atomic_fetch_add_explicit(&s->reads_fallback, 1, memory_order_relaxed);
    if (h.source == MPIB_SHM_SRC_STALE) {
      atomic_fetch_add_explicit(&s->reads_stale, 1, memory_order_relaxed);
    }
  }
  if (h.clamped) {
    atomic_fetch_add_explicit(&s->clamped, 1, memory_order_relaxed);
  }
  atomic_store_explicit(&s->last_source, h.source, memory_order_relaxed);
  atomic_store_explicit(&s->last_read_ns, now, memory_order_relaxed);
  if (ok && sup_bw != NULL) {
    *sup_bw = h.sup_bw;
  }
  return ok;
}

void mpib_shm_add_telemetry(mpib_shm *shm, uint32_t id, int rail, uint64_t bytes) {
  uint32_t slot = 0;
  struct shm_map *m = shm_bound(shm, id, &slot);
  if (m == NULL || (rail != 0 && rail != 1)) {
    return;
  }
  struct shm_slot *s = &m->slots[slot];
  atomic_fetch_add_explicit(rail == 0 ? &s->sout_bytes : &s->sup_bytes, bytes,
                            memory_order_relaxed);
  atomic_fetch_add_explicit(rail == 0 ? &s->sout_requests : &s->sup_requests, 1,
                            memory_order_relaxed);
}

void mpib_shm_flush_telemetry(mpib_shm *shm, uint32_t id, const mpib_shm_tele_batch *b) {
  uint32_t slot = 0;
  struct shm_map *m = shm_bound(shm, id, &slot);
  if (m == NULL || b == NULL) {
    return;
  }
  struct shm_slot *s = &m->slots[slot];
  for (int r = 0; r < 2; r++) {
    const mpib_shm_rail_batch *rb = &b->rail[r];
    if (rb->posted_bytes || rb->posted_requests) {
      atomic_fetch_add_explicit(r == 0 ? &s->sout_bytes : &s->sup_bytes, rb->posted_bytes, memory_order_relaxed);
      atomic_fetch_add_explicit(r == 0 ? &s->sout_requests : &s->sup_requests, rb->posted_requests,
                                memory_order_relaxed);
    }
    if (rb->completed_bytes || rb->completed_requests || rb->busy_ns) {
      atomic_fetch_add_explicit(&s->done[r].bytes, rb->completed_bytes, memory_order_relaxed);
      atomic_fetch_add_explicit(&s->done[r].requests, rb->completed_requests, memory_order_relaxed);
      atomic_fetch_add_explicit(&s->done[r].busy_ns, rb->busy_ns, memory_order_relaxed);
    }
    if (rb->active_ns) {
      atomic_fetch_add_explicit(&s->active_ns[r], rb->active_ns, memory_order_relaxed);
    }
    atomic_store_explicit(&s->done[r].inflight_bytes, rb->inflight_bytes, memory_order_relaxed);
  }
  atomic_store_explicit(&s->applied_sup_bw, b->applied_sup_bw, memory_order_relaxed);
  atomic_store_explicit(&s->flush_wall_ns, b->wall_ns, memory_order_relaxed);
}

void mpib_shm_set_rail_state(mpib_shm *shm, uint32_t id, int rail, int state, uint64_t realtime_ns) {
  uint32_t slot = 0;
  struct shm_map *m = shm_bound(shm, id, &slot);
  if (m == NULL || (rail != 0 && rail != 1)) {
    return;
  }
  struct shm_slot *s = &m->slots[slot];
  /* Every rail is up at registration, so leaving "up" is a failover and returning to it a
   * recovery; a state set again to the value it has counts nothing. */
  int was_up = atomic_load_explicit(&s->rail_state[rail], memory_order_relaxed) == MPIB_SHM_RAIL_UP;
  if (state != MPIB_SHM_RAIL_UP && was_up) {
    atomic_fetch_add_explicit(&s->failovers, 1, memory_order_relaxed);
  } else if (state == MPIB_SHM_RAIL_UP && !was_up) {
    atomic_fetch_add_explicit(&s->recoveries, 1, memory_order_relaxed);
  }
  atomic_store_explicit(&s->rail_state_ns[rail], realtime_ns, memory_order_relaxed);
  atomic_store_explicit(&s->rail_state[rail], (uint8_t)state, memory_order_relaxed);
}

/* ---- registration (spec 5.4) ---- */

static void shm_slot_fill(struct shm_slot *s, const mpib_conn_desc *d, uint32_t pid) {
  uint32_t gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1u;
  atomic_store_explicit(&s->gen, gen == 0 ? 1u : gen, memory_order_relaxed);
  atomic_store_explicit(&s->conn_id, d->conn_id, memory_order_relaxed);
  atomic_store_explicit(&s->local_sout_ip, d->local_sout_ip, memory_order_relaxed);
  atomic_store_explicit(&s->peer_sout_ip, d->peer_sout_ip, memory_order_relaxed);
  atomic_store_explicit(&s->peer_island, d->peer_island, memory_order_relaxed);
  atomic_store_explicit(&s->path_class, d->path_class, memory_order_relaxed);
  atomic_store_explicit(&s->is_send, d->is_send, memory_order_relaxed);
  atomic_store_explicit(&s->nqps_sout, d->nqps_sout, memory_order_relaxed);
  atomic_store_explicit(&s->nqps_sup, d->nqps_sup, memory_order_relaxed);
  atomic_store_explicit(&s->pid, pid, memory_order_relaxed);
  atomic_store_explicit(&s->registered_ns, mpib_shm_now_ns(), memory_order_relaxed);
  atomic_store_explicit(&s->dev, d->dev, memory_order_relaxed);
  atomic_store_explicit(&s->sup_path, d->sup_path, memory_order_relaxed);
  for (int r = 0; r < 2; r++) {
    atomic_store_explicit(&s->port[r], d->port[r], memory_order_relaxed);
    int end = 0; /* a NUL from the first one on, and at the last byte: a longer name is cut */
    for (int i = 0; i < MPIB_SHM_NIC_NAME; i++) {
      end |= d->nic[r][i] == 0 || i == MPIB_SHM_NIC_NAME - 1;
      atomic_store_explicit(&s->nic[r][i], end ? 0 : (uint8_t)d->nic[r][i], memory_order_relaxed);
    }
  }
  _Atomic uint64_t *tel[] = {&s->sout_bytes,    &s->sout_requests,  &s->sup_bytes,
                             &s->sup_requests,  &s->reads_applied,  &s->reads_fallback,
                             &s->reads_stale,   &s->clamped,        &s->last_read_ns,
                             &s->flush_wall_ns};
  for (size_t i = 0; i < sizeof(tel) / sizeof(tel[0]); i++) {
    atomic_store_explicit(tel[i], 0, memory_order_relaxed);
  }
  atomic_store_explicit(&s->last_sup_bw, 0, memory_order_relaxed);
  atomic_store_explicit(&s->last_source, 0, memory_order_relaxed);
  atomic_store_explicit(&s->failovers, 0, memory_order_relaxed);
  atomic_store_explicit(&s->recoveries, 0, memory_order_relaxed);
  atomic_store_explicit(&s->applied_sup_bw, 0, memory_order_relaxed);
  for (int r = 0; r < 2; r++) {
    atomic_store_explicit(&s->rail_state[r], MPIB_SHM_RAIL_UP, memory_order_relaxed);
    atomic_store_explicit(&s->rail_state_ns[r], 0, memory_order_relaxed);
    atomic_store_explicit(&s->done[r].bytes, 0, memory_order_relaxed);
    atomic_store_explicit(&s->done[r].requests, 0, memory_order_relaxed);
    atomic_store_explicit(&s->done[r].inflight_bytes, 0, memory_order_relaxed);
    atomic_store_explicit(&s->done[r].busy_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&s->active_ns[r], 0, memory_order_relaxed);
  }
}

/* What one search for free slots may still spend (SHM_PASS_*). */
struct shm_budget {
  uint32_t probes; /* owner words to look at */
  uint32_t locks;  /* lease attempts (fcntl) */
};

/* Frees our slot: owner back to 0 (only if still ours), then the lease. */
static void shm_unclaim(struct shm_map *m, uint32_t slot, uint32_t pid) {
  if (m->retired || slot >= m->nslots) {
    return;
  }
  uint64_t mine = SHM_STATE_ACTIVE | (uint64_t)pid << 32;
  atomic_compare_exchange_strong_explicit(&m->slots[slot].owner, &mine, 0, memory_order_acq_rel,
                                          memory_order_relaxed);
  shm_lock_byte(m->fd, shm_slot_lock_off(slot), F_UNLCK);
}

/* Whether connection id waits for a slot of the current map: used, and bound to no map or to
 * the one an attach is replacing (under mu). shm->unbound counts them. */
static int shm_waiting(mpib_shm *shm, uint32_t id) {
  if (!shm->conns[id].used) {
    return 0;
  }
  uint64_t b = atomic_load_explicit(&shm->bind[id], memory_order_relaxed);
  return b == 0 || (int)(b >> 32) != atomic_load_explicit(&shm->cur, memory_order_relaxed);
}

/* Drops connection id's binding and frees its slot (under mu). */
static void shm_unbind(mpib_shm *shm, uint32_t id) {
  uint64_t b = atomic_load_explicit(&shm->bind[id], memory_order_relaxed);
  if (b == 0) {
    return;
  }
  atomic_store_explicit(&shm->bind[id], 0, memory_order_release);
  struct shm_map *m = atomic_load_explicit(&shm->maps[(b >> 32) - 1], memory_order_relaxed);
  shm_unclaim(m, (uint32_t)b, shm->conns[id].d.pid);
}

/* Claims slot i of map index mi for the waiting connection id and binds it there, freeing
 * the slot it leaves (under mu). The search took slot i's lease without mu; it is taken again
 * here, because a release of ours may have freed slot i and dropped its lease in between (the
 * OFD locks of one open file description never conflict, so the search could not tell) and
 * another process may hold it now. Then the owner CAS, so that a claimed slot always has a
 * live lease (spec 5.4). 0 bound; -EBUSY not ours to take (the search goes on); -ENOENT the
 * connection was released meanwhile. */
static int shm_take(mpib_shm *shm, int mi, uint32_t i, uint32_t id) {
  struct shm_map *m = atomic_load_explicit(&shm->maps[mi - 1], memory_order_relaxed);
  off_t off = shm_slot_lock_off(i);
  if (!shm->conns[id].used) {
    shm_lock_byte(m->fd, off, F_UNLCK);
    return -ENOENT;
  }
  if (shm_lock_byte(m->fd, off, F_WRLCK) != 0) {
    return -EBUSY;
  }
  const mpib_conn_desc *d = &shm->conns[id].d;
  struct shm_slot *s = &m->slots[i];
  uint64_t expect = 0;
  if (!atomic_compare_exchange_strong_explicit(&s->owner, &expect,
                                               SHM_STATE_CLAIMING | (uint64_t)d->pid << 32,
                                               memory_order_acq_rel, memory_order_relaxed)) {
    shm_lock_byte(m->fd, off, F_UNLCK);
    return -EBUSY;
  }
  shm_slot_fill(s, d, d->pid);
  atomic_store_explicit(&s->owner, SHM_STATE_ACTIVE | (uint64_t)d->pid << 32, memory_order_release);
  int waited = shm_waiting(shm, id);
  uint64_t old = atomic_load_explicit(&shm->bind[id], memory_order_relaxed);
  atomic_store_explicit(&shm->bind[id], (uint64_t)mi << 32 | i, memory_order_release);
  if (old != 0) {
    struct shm_map *om = atomic_load_explicit(&shm->maps[(old >> 32) - 1], memory_order_relaxed);
    shm_unclaim(om, (uint32_t)old, d->pid);
  }
  if (waited) {
    shm->unbound--;
  }
  return 0;
}

/* Searches map index mi (the current one) for a free slot for connection id and binds it
 * there, spending b (under claim_mu, without mu: the lease attempts on slots other processes
 * hold happen here, and only a slot whose lease was won takes mu, for O(1) work). Looks at
 * slots from the map's cursor on. 0 bound; -ENOENT released meanwhile; -EAGAIN b is spent;
 * -ENOSPC every slot was looked at and none could be claimed. */
static int shm_search(mpib_shm *shm, int mi, uint32_t id, struct shm_budget *b) {
  struct shm_map *m = atomic_load_explicit(&shm->maps[mi - 1], memory_order_relaxed);
  if (m->retired || shm_map_faulted(m)) {
    return -ENOSPC;
  }
  for (uint32_t k = 0; k < m->nslots; k++) {
    if (b->probes == 0 || b->locks == 0) {
      return -EAGAIN;
    }
    b->probes--;
    uint32_t i = m->cursor;
    m->cursor = i + 1 < m->nslots ? i + 1 : 0;
    if (atomic_load_explicit(&m->slots[i].owner, memory_order_relaxed) != 0) {
      continue;
    }
    b->locks--;
    if (shm_lock_byte(m->fd, shm_slot_lock_off(i), F_WRLCK) != 0) {
      continue; /* leased by another process (releasing it right now, or an agent's lock) */
    }
    pthread_mutex_lock(&shm->mu);
    int rc = shm_take(shm, mi, i, id);
    pthread_mutex_unlock(&shm->mu);
    if (rc != -EBUSY) {
      return rc;
    }
  }
  return -ENOSPC;
}

int mpib_shm_register(mpib_shm *shm, const mpib_conn_desc *d, uint32_t *id_out) {
  if (shm == NULL || d == NULL || id_out == NULL) {
    return -EINVAL;
  }
  pthread_mutex_lock(&shm->claim_mu);
  pthread_mutex_lock(&shm->mu);
  uint32_t id = shm->conn_hi;
  for (uint32_t i = 0; i < shm->conn_hi; i++) {
    if (!shm->conns[i].used) {
      id = i;
      break;
    }
  }
  if (id >= MPIB_SHM_MAX_CONNS) {
    pthread_mutex_unlock(&shm->mu);
    pthread_mutex_unlock(&shm->claim_mu);
    return -ENOSPC;
  }
  if (id == shm->conn_hi) {
    shm->conn_hi++;
  }
  shm->conns[id].d = *d;
  if (shm->conns[id].d.pid == 0) {
    shm->conns[id].d.pid = (uint32_t)getpid();
  }
  shm->conns[id].used = 1;
  shm->unbound++; /* waiting until the search below binds it */
  int cur = atomic_load_explicit(&shm->cur, memory_order_relaxed);
  pthread_mutex_unlock(&shm->mu);
  if (cur != 0) {
    struct shm_budget b = {SHM_PASS_PROBES, SHM_PASS_LOCKS_REGISTER};
    (void)shm_search(shm, cur, id, &b); /* not bound: the poll goes on searching */
  }
  pthread_mutex_unlock(&shm->claim_mu);
  *id_out = id;
  return 0;
}

/* O(1) under mu, and mu is never held across a search (shm_search): the close path waits for
 * no fcntl call on a lease another process holds. */
void mpib_shm_release(mpib_shm *shm, uint32_t id) {
  if (shm == NULL || id >= MPIB_SHM_MAX_CONNS) {
    return;
  }
  pthread_mutex_lock(&shm->mu);
  if (shm->conns[id].used) {
    if (shm_waiting(shm, id)) {
      shm->unbound--;
    }
    shm_unbind(shm, id);
    shm->conns[id].used = 0;
  }
  pthread_mutex_unlock(&shm->mu);
}

int mpib_shm_conn_slot(mpib_shm *shm, uint32_t id, uint32_t *slot, uint32_t *gen) {
  uint32_t s = 0;
  struct shm_map *m = shm_bound(shm, id, &s);
  if (m == NULL) {
    return -ENOENT;
  }
  if (slot != NULL) {
    *slot = s;
  }
  if (gen != NULL) {
    *gen = atomic_load_explicit(&m->slots[s].gen, memory_order_relaxed);
  }
  return 0;
}

/* ---- the watcher (spec 5.8) ---- */

__attribute__((format(printf, 4, 5))) static void shm_say(mpib_shm *shm, char *msg, size_t len,
                                                          const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(shm->last_msg, sizeof(shm->last_msg), fmt, ap);
  va_end(ap);
  if (msg != NULL && len > 0) {
    snprintf(msg, len, "%s", shm->last_msg);
  }
}

static int shm_same_bad(const mpib_shm *shm, const struct stat *st) {
  return shm->bad_errno != 0 && !shm->bad_retry && st->st_dev == shm->bad_dev && st->st_ino == shm->bad_ino &&
         st->st_size == shm->bad_size && st->st_mtim.tv_sec == shm->bad_mtime.tv_sec &&
         st->st_mtim.tv_nsec == shm->bad_mtime.tv_nsec;
}

/* A segment truncated under us: the SIGBUS guard saw it, or the file is now shorter than
 * the mapping (no access faulted yet). */
static int shm_map_truncated(struct shm_map *m) {
  struct stat st;
  return m != NULL && m->fd >= 0 &&
         (shm_map_faulted(m) ||
          (fstat(m->fd, &st) == 0 && (uint64_t)st.st_size < m->map_size));
}

/* Remembers the file st as refused (with err) until it changes (shm_same_bad). */
static void shm_refuse(mpib_shm *shm, int err, const struct stat *st) {
  shm->bad_retry = 0;
  shm->bad_errno = err;
  shm->bad_dev = st->st_dev;
  shm->bad_ino = st->st_ino;
  shm->bad_size = st->st_size;
  shm->bad_mtime = st->st_mtim;
}

/* Drops the truncated segment cur (under mu): every connection waits for the next one. */
static void shm_detach(mpib_shm *shm, struct shm_map *cur, char *msg, size_t msglen) {
  atomic_store_explicit(&shm->cur, 0, memory_order_release);
  for (uint32_t id = 0; id < shm->conn_hi; id++) {
    if (shm->conns[id].used && atomic_load_explicit(&shm->bind[id], memory_order_relaxed) != 0) {
      shm_unbind(shm, id);
      shm->unbound++;
    }
  }
  /* The truncated file stays at the path: remember it as refused until it changes. */
  struct stat tst;
  if (fstatat(AT_FDCWD, shm->path, &tst, AT_SYMLINK_NOFOLLOW) == 0 && tst.st_dev == cur->dev &&
      tst.st_ino == cur->ino) {
    shm_refuse(shm, EINVAL, &tst);
  }
  shm_map_retire(cur);
  shm_say(shm, msg, msglen,
          "agent segment %s was truncated: detached, vanilla policy until a valid segment "
          "appears", shm->path);
}

/* Gives slots of map index mi (the current one) to waiting connections within one budget,
 * taking the connections in turns from where the previous pass stopped (under claim_mu,
 * without mu). */
static void shm_bind_waiting(mpib_shm *shm, int mi, struct shm_budget *b) {
  uint32_t visited = 0;
  for (;;) {
    uint32_t ids[SHM_WAIT_BATCH], n = 0;
    pthread_mutex_lock(&shm->mu);
    uint32_t hi = shm->conn_hi;
    while (n < SHM_WAIT_BATCH && visited < hi && shm->unbound > 0) {
      uint32_t id = shm->wait_cursor < hi ? shm->wait_cursor : 0;
      shm->wait_cursor = id + 1;
      visited++;
      if (shm_waiting(shm, id)) {
        ids[n++] = id;
      }
    }
    pthread_mutex_unlock(&shm->mu);
    if (n == 0) {
      return;
    }
    for (uint32_t j = 0; j < n; j++) {
      int rc = shm_search(shm, mi, ids[j], b);
      if (rc == -EAGAIN || rc == -ENOSPC) {
        shm->wait_cursor = ids[j]; /* the next pass starts with the first one not served */
        return;
      }
    }
  }
}

/* Attaches m, a new segment mapped outside the locks, in place of the current one (under
 * claim_mu): every connection waits for a slot of m, one budgeted pass gives slots to them
 * (each leaves its old slot as it takes a new one), the rest leave their old slots and wait
 * for the next polls, and the old segment is retired. 0; 1 when that file is attached
 * already (another poll did it meanwhile); or -errno with the file st refused until it
 * changes. */
static int shm_attach(mpib_shm *shm, struct shm_map *m, const struct stat *st, char *msg,
                      size_t msglen) {
  pthread_mutex_lock(&shm->mu);
  struct shm_map *cur = shm_cur(shm);
  if (cur != NULL && cur->dev == m->dev && cur->ino == m->ino) {
    pthread_mutex_unlock(&shm->mu);
    shm_map_free(m);
    return 1;
  }
  if (shm->nmaps >= SHM_MAX_MAPS) {
    shm_refuse(shm, ENOSPC, st);
    shm_say(shm, msg, msglen,
            "mpib shm %.300s: io: attached %d segments already, no more in this process (the "
            "limit of docs/shm-format.md 5.8): vanilla policy until it restarts",
            shm->path, SHM_MAX_MAPS);
    pthread_mutex_unlock(&shm->mu);
    shm_map_free(m);
    return -ENOSPC;
  }
  int mi = shm_add_map(shm, m);
  atomic_store_explicit(&shm->cur, mi, memory_order_release);
  shm->unbound = 0;
  for (uint32_t id = 0; id < shm->conn_hi; id++) {
    shm->unbound += shm->conns[id].used != 0;
  }
  pthread_mutex_unlock(&shm->mu);
  struct shm_budget b = {SHM_PASS_PROBES, SHM_PASS_LOCKS_POLL};
  shm_bind_waiting(shm, mi, &b);
  pthread_mutex_lock(&shm->mu);
  uint32_t used = 0;
  for (uint32_t id = 0; id < shm->conn_hi; id++) {
    if (shm->conns[id].used) {
      used++;
      if (shm_waiting(shm, id)) {
        shm_unbind(shm, id); /* its slot in the old segment; it stays waiting */
      }
    }
  }
  if (cur != NULL) {
    shm_map_retire(cur);
  }
  shm->bad_errno = 0;
  shm_say(shm, msg, msglen, "agent segment %s %s: %u connection(s) registered%s", shm->path,
          cur != NULL ? "replaced: re-attached" : "attached", (unsigned)(used - shm->unbound),
          shm->unbound ? " (some wait for a free slot)" : "");
  pthread_mutex_unlock(&shm->mu);
  return 0;
}

/* Records a file at the path that could not be opened or mapped (under mu). A file another
 * process holds a lease on is tried again at every poll (the lease may go without the file
 * changing), and said once; any other refusal holds until the file changes. 1 when said. */
static int shm_open_failed(mpib_shm *shm, int rc, const struct stat *st, const char *err,
                           char *msg, size_t msglen) {
  if (rc == -EWOULDBLOCK) {
    int said = shm->bad_retry && shm->bad_errno == EWOULDBLOCK && shm->bad_dev == st->st_dev &&
               shm->bad_ino == st->st_ino;
    shm_refuse(shm, EWOULDBLOCK, st);
    shm->bad_retry = 1;
    if (said) {
      return 0;
    }
  } else {
    shm_refuse(shm, -rc, st);
  }
  shm_say(shm, msg, msglen, "%s", err);
  return 1;
}

/* Step 1 and 2 of the poll (under claim_mu and mu): detaches a truncated segment, then looks
 * at the path. 1 when the file there (st) must be opened and attached, else 0; *ret says what
 * happened. */
static int shm_poll_look(mpib_shm *shm, struct stat *st, int *ret, char *msg, size_t msglen) {
  int ci = atomic_load_explicit(&shm->cur, memory_order_relaxed);
  struct shm_map *cur = ci > 0 ? atomic_load_explicit(&shm->maps[ci - 1], memory_order_relaxed) : NULL;
  /* 1. A truncated segment (seen by the guard, or by its size): detach. */
  if (shm_map_truncated(cur)) {
    shm_detach(shm, cur, msg, msglen);
    cur = NULL;
    *ret = MPIB_SHM_POLL_DETACHED;
  }
  /* 2. A different file at the path (or the first one): attach it. */
  int have = fstatat(AT_FDCWD, shm->path, st, AT_SYMLINK_NOFOLLOW) == 0;
  if (!have && cur == NULL && *ret == MPIB_SHM_POLL_NONE && shm->bad_errno != errno) {
    shm->bad_errno = errno;
    shm->bad_retry = 0;
    shm->bad_ino = 0;
    shm_say(shm, msg, msglen, "mpib shm %s: io: %s", shm->path, strerror(errno));
    *ret = MPIB_SHM_POLL_FAILED;
  }
  return have && (cur == NULL || st->st_dev != cur->dev || st->st_ino != cur->ino) &&
         !shm_same_bad(shm, st);
}

int mpib_shm_poll(mpib_shm *shm, char *msg, size_t msglen) {
  if (msg != NULL && msglen > 0) {
    msg[0] = '\0';
  }
  if (shm == NULL || shm->path[0] == '\0') {
    return MPIB_SHM_POLL_NONE;
  }
  int ret = MPIB_SHM_POLL_NONE;
  struct stat st;
  pthread_mutex_lock(&shm->claim_mu);
  pthread_mutex_lock(&shm->mu);
  int attach = shm_poll_look(shm, &st, &ret, msg, msglen);
  int ci = atomic_load_explicit(&shm->cur, memory_order_relaxed);
  int waiting = !attach && ci != 0 && shm->unbound > 0;
  pthread_mutex_unlock(&shm->mu);
  if (waiting) {
    /* 3. Connections that found the segment full, or whose search ran out of its budget. */
    struct shm_budget b = {SHM_PASS_PROBES, SHM_PASS_LOCKS_POLL};
    shm_bind_waiting(shm, ci, &b);
  }
  pthread_mutex_unlock(&shm->claim_mu);
  if (!attach) {
    return ret;
  }
  /* Open, check and map the new file without the lock, so that registrations and closes never
   * wait for it (spec 5.8); the open itself never blocks (shm_open_file). */
  char err[384] = "";
  struct shm_map *m = NULL;
  int rc = shm_map_file(shm->path, &m, NULL, err, sizeof(err));
  pthread_mutex_lock(&shm->claim_mu);
  int said = 1;
  if (rc == 0) {
    rc = shm_attach(shm, m, &st, msg, msglen);
  } else {
    pthread_mutex_lock(&shm->mu);
    said = shm_open_failed(shm, rc, &st, err, msg, msglen);
    pthread_mutex_unlock(&shm->mu);
  }
  pthread_mutex_unlock(&shm->claim_mu);
  if (rc >= 0) {
    return rc == 0 ? MPIB_SHM_POLL_ATTACHED : ret;
  }
  return ret == MPIB_SHM_POLL_NONE && said ? MPIB_SHM_POLL_FAILED : ret;
}

void mpib_shm_close(mpib_shm *shm) {
  if (shm == NULL) {
    return;
  }
  pthread_mutex_lock(&shm->claim_mu);
  pthread_mutex_lock(&shm->mu);
  for (uint32_t id = 0; id < shm->conn_hi; id++) {
    if (shm->conns[id].used) {
      shm_unbind(shm, id);
    }
  }
  pthread_mutex_unlock(&shm->mu);
  pthread_mutex_unlock(&shm->claim_mu);
  for (int i = 0; i < shm->nmaps; i++) {
    struct shm_map *m = atomic_load_explicit(&shm->maps[i], memory_order_relaxed);
    if (m != NULL) {
      shm_map_free(m);
    }
  }
  pthread_mutex_destroy(&shm->mu);
  pthread_mutex_destroy(&shm->claim_mu);
  free(shm->conns);
  free((void *)shm->bind);
  free(shm);
}

/* ---- agent-side helpers (tests, tools) ---- */

void mpib_shm_heartbeat(mpib_shm *shm, uint64_t now_ns) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL) {
    return;
  }
  atomic_store_explicit(&m->hdr->agent_pid, (uint32_t)getpid(), memory_order_relaxed);
  atomic_store_explicit(&m->hdr->heartbeat_ns, now_ns, memory_order_release);
}

static uint32_t shm_clamp(uint32_t v, int *clamped) {
  *clamped = v > MPIB_SHM_SUP_BW_MAX;
  return *clamped ? MPIB_SHM_SUP_BW_MAX : v;
}

int mpib_shm_set_slot_hint(mpib_shm *shm, uint32_t slot, uint32_t expect_gen, int valid,
                           uint32_t sup_bw) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || slot >= m->nslots) {
    return -ERANGE;
  }
  struct shm_slot *s = &m->slots[slot];
  if ((uint32_t)atomic_load_explicit(&s->owner, memory_order_acquire) != SHM_STATE_ACTIVE) {
    return -ENOENT;
  }
  uint32_t gen = atomic_load_explicit(&s->gen, memory_order_relaxed);
  if (gen != expect_gen) {
    return -ESTALE;
  }
  int clamped;
  mpib_shm_record r = {.sup_bw = shm_clamp(sup_bw, &clamped),
                       .flags = valid ? SHM_FLAG_VALID : 0,
                       .gen = gen,
                       .set_ns = mpib_shm_now_ns()};
  shm_rec_write(&s->hint, &r);
  return clamped;
}

int mpib_shm_set_class_hint(mpib_shm *shm, int path_class, int valid, uint32_t sup_bw) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || path_class < 0 || path_class > 1) {
    return -ERANGE;
  }
  int clamped;
  mpib_shm_record r = {.sup_bw = shm_clamp(sup_bw, &clamped),
                       .flags = valid ? SHM_FLAG_VALID : 0,
                       .set_ns = mpib_shm_now_ns()};
  shm_rec_write(&m->hdr->cls[path_class], &r);
  return clamped;
}

int mpib_shm_set_peer_hint(mpib_shm *shm, uint32_t peer_ip, uint8_t prefix_len, int valid,
                           uint32_t sup_bw) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || prefix_len > 32) {
    return -ERANGE;
  }
  uint32_t target = SHM_NO_PEER, free_idx = SHM_NO_PEER;
  for (uint32_t j = 0; j < m->npeers && target == SHM_NO_PEER; j++) {
    mpib_shm_record r;
    if (shm_rec_read(&m->peers[j], &r) != 0) {
      continue;
    }
    if (!(r.flags & SHM_FLAG_VALID)) {
      free_idx = free_idx == SHM_NO_PEER ? j : free_idx;
    } else if (r.peer_ip == peer_ip && r.prefix_len == prefix_len) {
      target = j;
    }
  }
  if (target == SHM_NO_PEER) {
    if (!valid) {
      return 0; /* nothing to clear */
    }
    if (free_idx == SHM_NO_PEER) {
      return -ENOSPC;
    }
    target = free_idx;
  }
  int clamped;
  mpib_shm_record r = {.sup_bw = shm_clamp(sup_bw, &clamped),
                       .flags = valid ? SHM_FLAG_VALID : 0,
                       .set_ns = mpib_shm_now_ns(),
                       .peer_ip = peer_ip,
                       .prefix_len = prefix_len};
  shm_rec_write(&m->peers[target], &r);
  atomic_fetch_add_explicit(&m->hdr->peers_epoch, 1, memory_order_release);
  return clamped;
}

int mpib_shm_create(const char *path, uint32_t nslots, uint32_t npeers, char *err,
                    size_t errlen) {
  if (path == NULL || nslots < 1 || nslots > SHM_MAX_SLOTS || npeers > SHM_MAX_PEERS) {
    shm_err(err, errlen, "mpib shm: bad_geometry: nslots=%u npeers=%u", nslots, npeers);
    return -EINVAL;
  }
  char tmp[4096];
  if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp)) {
    shm_err(err, errlen, "mpib shm %s: io: path too long", path);
    return -ENAMETOOLONG;
  }
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    int e = errno;
    shm_err(err, errlen, "mpib shm %s: io: create: %s", tmp, strerror(e));
    return -e;
  }
  struct shm_header h;
  memset(&h, 0, sizeof(h));
  memcpy(h.magic, SHM_MAGIC, 8);
  h.version = MPIB_SHM_VERSION;
  h.header_size = SHM_HEADER_SIZE;
  h.total_size = shm_expected_size(nslots, npeers);
  h.nslots = nslots;
  h.slot_size = SHM_SLOT_SIZE;
  h.npeers = npeers;
  h.peer_size = SHM_PEER_SIZE;
  atomic_init(&h.created_ns, mpib_shm_now_ns());
  int rc = 0;
  if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)h.total_size) != 0 ||
      pwrite(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) || rename(tmp, path) != 0) {
    rc = -errno;
    shm_err(err, errlen, "mpib shm %s: io: create: %s", path, strerror(errno));
    unlink(tmp);
  }
  close(fd);
  return rc;
}
