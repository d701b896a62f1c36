/*
 * MPIB shared-memory hint segment, format version 1 (docs/shm-format.md).
 * Every struct below mirrors a table of the spec; the _Static_asserts pin the offsets.
 */
#define _GNU_SOURCE
#include "mpib_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the MPIB hint segment is little-endian and accessed in place: big-endian hosts are unsupported"
#endif

#define SHM_MAGIC "MPIBHINT"
#define SHM_HEADER_SIZE 256u
#define SHM_SLOT_SIZE 256u
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
  uint16_t reserved1;
  _Atomic uint32_t pid;
  _Atomic uint64_t registered_ns;
  uint64_t reserved2;
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
  uint8_t reserved3[48];
};
_Static_assert(sizeof(struct shm_slot) == SHM_SLOT_SIZE, "slot is 256 bytes");
_Static_assert(offsetof(struct shm_slot, conn_id) == 16, "conn_id at +16");
_Static_assert(offsetof(struct shm_slot, path_class) == 36, "path_class at +36");
_Static_assert(offsetof(struct shm_slot, nqps_sup) == 40, "nqps_sup at +40");
_Static_assert(offsetof(struct shm_slot, pid) == 44, "pid at +44");
_Static_assert(offsetof(struct shm_slot, hint) == 64, "hint at +64");
_Static_assert(offsetof(struct shm_slot, sout_bytes) == 128, "telemetry at +128");
_Static_assert(offsetof(struct shm_slot, last_sup_bw) == 192, "last_sup_bw at +192");
_Static_assert(offsetof(struct shm_slot, last_read_ns) == 200, "last_read_ns at +200");

/* Per-slot cache of the matching peer entry, keyed by (peers_epoch, slot gen). */
struct peer_cache {
  _Atomic uint64_t tag;
  _Atomic uint32_t idx;
};

struct mpib_shm {
  struct shm_header *hdr;
  struct shm_slot *slots;
  struct shm_rec *peers;
  size_t map_size;
  uint32_t nslots; /* copies validated at open: the header is never trusted again */
  uint32_t npeers;
  struct peer_cache *cache;
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
  const char *p = getenv("MPIB_SHM_PATH");
  return (p != NULL && p[0] != '\0') ? p : MPIB_SHM_DEFAULT_PATH;
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
    shm_err(err, errlen, "mpib shm %s: bad_version: version %u, this reader implements %u", what,
            h.version, MPIB_SHM_VERSION);
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

/* Checks 1..4: the file itself. */
static int shm_check_file(int fd, const char *path, struct stat *st, char *err, size_t errlen) {
  if (fstat(fd, st) != 0) {
    int e = errno;
    shm_err(err, errlen, "mpib shm %s: io: fstat: %s", path, strerror(e));
    return -e;
  }
  if (!S_ISREG(st->st_mode)) {
    shm_err(err, errlen, "mpib shm %s: not_regular: not a regular file", path);
    return -EINVAL;
  }
  if (st->st_uid != geteuid()) {
    shm_err(err, errlen, "mpib shm %s: bad_owner: owned by uid %u, this process runs as %u",
            path, (unsigned)st->st_uid, (unsigned)geteuid());
    return -EPERM;
  }
  if ((st->st_mode & 0022) != 0) {
    shm_err(err, errlen, "mpib shm %s: bad_mode: mode %04o is group/world writable (want 0600)",
            path, (unsigned)(st->st_mode & 07777));
    return -EPERM;
  }
  return 0;
}

static int shm_map(int fd, const char *path, mpib_shm **out, char *err, size_t errlen) {
  struct stat st;
  int rc = shm_check_file(fd, path, &st, err, errlen);
  if (rc != 0) {
    return rc;
  }
  uint8_t head[SHM_HEADER_SIZE] = {0};
  size_t len = (size_t)st.st_size;
  if (len >= sizeof(head)) {
    ssize_t n = pread(fd, head, sizeof(head), 0);
    if (n < 0) {
      int e = errno;
      shm_err(err, errlen, "mpib shm %s: io: read: %s", path, strerror(e));
      return -e;
    }
    len = (size_t)n < sizeof(head) ? (size_t)n : len; /* shrank under us: too_small */
  }
  rc = shm_check_image(head, len, path, err, errlen);
  if (rc != 0) {
    return rc;
  }
  const struct shm_header *h = (const struct shm_header *)head;
  mpib_shm *shm = calloc(1, sizeof(*shm));
  struct peer_cache *cache = calloc(h->nslots, sizeof(*cache));
  if (shm == NULL || cache == NULL) {
    free(shm);
    free(cache);
    shm_err(err, errlen, "mpib shm %s: io: out of memory", path);
    return -ENOMEM;
  }
  void *base = mmap(NULL, h->total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int e = errno;
    free(shm);
    free(cache);
    shm_err(err, errlen, "mpib shm %s: io: mmap: %s", path, strerror(e));
    return -e;
  }
  shm->hdr = base;
  shm->slots = (struct shm_slot *)((uint8_t *)base + SHM_HEADER_SIZE);
  shm->peers = (struct shm_rec *)((uint8_t *)base + SHM_HEADER_SIZE +
                                  (size_t)h->nslots * SHM_SLOT_SIZE);
  shm->map_size = h->total_size;
  shm->nslots = h->nslots;
  shm->npeers = h->npeers;
  shm->cache = cache;
  *out = shm;
  return 0;
}

int mpib_shm_open(const char *path, mpib_shm **out, char *err, size_t errlen) {
  if (path == NULL || out == NULL) {
    shm_err(err, errlen, "mpib shm: io: null argument");
    return -EINVAL;
  }
  *out = NULL;
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    shm_err(err, errlen, "mpib shm %s: io: open: %s", path, strerror(e));
    return -e;
  }
  int rc = shm_map(fd, path, out, err, errlen);
  close(fd); /* the mapping keeps the file */
  return rc;
}

void mpib_shm_close(mpib_shm *shm) {
  if (shm == NULL) {
    return;
  }
  munmap(shm->hdr, shm->map_size);
  free(shm->cache);
  free(shm);
}

uint32_t mpib_shm_nslots(const mpib_shm *shm) { return shm == NULL ? 0 : shm->nslots; }

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
  if (shm == NULL || slot >= shm->nslots) {
    return -ERANGE;
  }
  return shm_rec_read(&shm->slots[slot].hint, r);
}

int mpib_shm_write_slot_record(mpib_shm *shm, uint32_t slot, const mpib_shm_record *r) {
  if (shm == NULL || slot >= shm->nslots) {
    return -ERANGE;
  }
  shm_rec_write(&shm->slots[slot].hint, r);
  return 0;
}

/* ---- resolution (spec 5.3) ---- */

static int shm_heartbeat_fresh(const mpib_shm *shm, uint64_t now, uint64_t stale_ns) {
  uint64_t hb = atomic_load_explicit(&shm->hdr->heartbeat_ns, memory_order_acquire);
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
static uint32_t shm_peer_scan(mpib_shm *shm, uint32_t ip) {
  uint32_t best = SHM_NO_PEER;
  int best_len = -1;
  for (uint32_t j = 0; j < shm->npeers; j++) {
    mpib_shm_record r;
    if (shm_rec_read(&shm->peers[j], &r) != 0 || !(r.flags & SHM_FLAG_VALID)) {
      continue;
    }
    if (shm_prefix_match(ip, r.peer_ip, r.prefix_len) && (int)r.prefix_len > best_len) {
      best = j;
      best_len = r.prefix_len;
    }
  }
  return best;
}

static uint32_t shm_peer_lookup(mpib_shm *shm, uint32_t slot, uint32_t gen, uint32_t ip) {
  uint32_t epoch = atomic_load_explicit(&shm->hdr->peers_epoch, memory_order_acquire);
  uint64_t tag = ((uint64_t)epoch << 32) | gen;
  struct peer_cache *c = &shm->cache[slot];
  if (atomic_load_explicit(&c->tag, memory_order_acquire) == tag) {
    return atomic_load_explicit(&c->idx, memory_order_relaxed);
  }
  uint32_t idx = shm_peer_scan(shm, ip);
  atomic_store_explicit(&c->idx, idx, memory_order_relaxed);
  atomic_store_explicit(&c->tag, tag, memory_order_release);
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
static int shm_resolve_peer(mpib_shm *shm, uint32_t slot, uint32_t gen, mpib_shm_hint *out) {
  uint32_t ip = atomic_load_explicit(&shm->slots[slot].peer_sout_ip, memory_order_relaxed);
  for (int pass = 0; pass < 2; pass++) {
    uint32_t j = pass == 0 ? shm_peer_lookup(shm, slot, gen, ip) : shm_peer_scan(shm, ip);
    if (j >= shm->npeers) {
      return 0;
    }
    mpib_shm_record r;
    if (shm_rec_read(&shm->peers[j], &r) != 0) {
      return -1;
    }
    if ((r.flags & SHM_FLAG_VALID) && shm_prefix_match(ip, r.peer_ip, r.prefix_len)) {
      return shm_apply(out, r.sup_bw, MPIB_SHM_SRC_PEER);
    }
    /* The cached entry changed without an epoch bump: scan once more, uncached. */
  }
  return 0;
}

int mpib_shm_resolve(mpib_shm *shm, uint32_t slot, uint64_t now_ns, uint64_t stale_ns,
                     mpib_shm_hint *out) {
  if (shm == NULL || slot >= shm->nslots) {
    return shm_none(out, MPIB_SHM_SRC_BAD_SLOT);
  }
  if (!shm_heartbeat_fresh(shm, now_ns, stale_ns)) {
    return shm_none(out, MPIB_SHM_SRC_STALE);
  }
  struct shm_slot *s = &shm->slots[slot];
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
  int p = shm_resolve_peer(shm, slot, gen, out);
  if (p != 0) {
    return p > 0 ? 1 : shm_none(out, MPIB_SHM_SRC_BUSY);
  }
  uint8_t cls = atomic_load_explicit(&s->path_class, memory_order_relaxed);
  if (cls <= 1) {
    if (shm_rec_read(&shm->hdr->cls[cls], &r) != 0) {
      return shm_none(out, MPIB_SHM_SRC_BUSY);
    }
    if (r.flags & SHM_FLAG_VALID) {
      return shm_apply(out, r.sup_bw, MPIB_SHM_SRC_CLASS);
    }
  }
  return shm_none(out, MPIB_SHM_SRC_NO_HINT);
}

int mpib_shm_read_hint(mpib_shm *shm, uint32_t slot, uint64_t stale_ns, uint32_t *sup_bw) {
  uint64_t now = mpib_shm_now_ns();
  mpib_shm_hint h;
  int ok = mpib_shm_resolve(shm, slot, now, stale_ns, &h);
  if (h.source != MPIB_SHM_SRC_BAD_SLOT) {
    struct shm_slot *s = &shm->slots[slot];
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
  }
  if (ok && sup_bw != NULL) {
    *sup_bw = h.sup_bw;
  }
  return ok;
}

void mpib_shm_add_telemetry(mpib_shm *shm, uint32_t slot, int rail, uint64_t bytes) {
  if (shm == NULL || slot >= shm->nslots || (rail != 0 && rail != 1)) {
    return;
  }
  struct shm_slot *s = &shm->slots[slot];
  atomic_fetch_add_explicit(rail == 0 ? &s->sout_bytes : &s->sup_bytes, bytes,
                            memory_order_relaxed);
  atomic_fetch_add_explicit(rail == 0 ? &s->sout_requests : &s->sup_requests, 1,
                            memory_order_relaxed);
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
  _Atomic uint64_t *tel[] = {&s->sout_bytes,    &s->sout_requests,  &s->sup_bytes,
                             &s->sup_requests,  &s->reads_applied,  &s->reads_fallback,
                             &s->reads_stale,   &s->clamped,        &s->last_read_ns};
  for (size_t i = 0; i < sizeof(tel) / sizeof(tel[0]); i++) {
    atomic_store_explicit(tel[i], 0, memory_order_relaxed);
  }
  atomic_store_explicit(&s->last_sup_bw, 0, memory_order_relaxed);
  atomic_store_explicit(&s->last_source, 0, memory_order_relaxed);
}

int mpib_shm_register(mpib_shm *shm, const mpib_conn_desc *d, uint32_t *slot_out) {
  if (shm == NULL || d == NULL || slot_out == NULL) {
    return -EINVAL;
  }
  uint32_t pid = d->pid != 0 ? d->pid : (uint32_t)getpid();
  uint32_t start = (uint32_t)((pid * 31ull + d->conn_id) % shm->nslots);
  for (uint32_t k = 0; k < shm->nslots; k++) {
    uint32_t i = (start + k) % shm->nslots;
    struct shm_slot *s = &shm->slots[i];
    uint64_t expect = 0;
    if (atomic_load_explicit(&s->owner, memory_order_relaxed) != 0 ||
        !atomic_compare_exchange_strong_explicit(&s->owner, &expect,
                                                 SHM_STATE_CLAIMING | (uint64_t)pid << 32,
                                                 memory_order_acq_rel, memory_order_relaxed)) {
      continue;
    }
    shm_slot_fill(s, d, pid);
    atomic_store_explicit(&s->owner, SHM_STATE_ACTIVE | (uint64_t)pid << 32,
                          memory_order_release);
    *slot_out = i;
    return 0;
  }
  return -ENOSPC;
}

void mpib_shm_release(mpib_shm *shm, uint32_t slot) {
  if (shm == NULL || slot >= shm->nslots) {
    return;
  }
  atomic_store_explicit(&shm->slots[slot].owner, 0, memory_order_release);
}

/* ---- agent-side helpers (tests, tools) ---- */

void mpib_shm_heartbeat(mpib_shm *shm, uint64_t now_ns) {
  if (shm == NULL) {
    return;
  }
  atomic_store_explicit(&shm->hdr->agent_pid, (uint32_t)getpid(), memory_order_relaxed);
  atomic_store_explicit(&shm->hdr->heartbeat_ns, now_ns, memory_order_release);
}

static uint32_t shm_clamp(uint32_t v, int *clamped) {
  *clamped = v > MPIB_SHM_SUP_BW_MAX;
  return *clamped ? MPIB_SHM_SUP_BW_MAX : v;
}

int mpib_shm_set_slot_hint(mpib_shm *shm, uint32_t slot, int valid, uint32_t sup_bw) {
  if (shm == NULL || slot >= shm->nslots) {
    return -ERANGE;
  }
  struct shm_slot *s = &shm->slots[slot];
  if ((uint32_t)atomic_load_explicit(&s->owner, memory_order_acquire) != SHM_STATE_ACTIVE) {
    return -ENOENT;
  }
  int clamped;
  mpib_shm_record r = {.sup_bw = shm_clamp(sup_bw, &clamped),
                       .flags = valid ? SHM_FLAG_VALID : 0,
                       .gen = atomic_load_explicit(&s->gen, memory_order_relaxed),
                       .set_ns = mpib_shm_now_ns()};
  shm_rec_write(&s->hint, &r);
  return clamped;
}

int mpib_shm_set_class_hint(mpib_shm *shm, int path_class, int valid, uint32_t sup_bw) {
  if (shm == NULL || path_class < 0 || path_class > 1) {
    return -ERANGE;
  }
  int clamped;
  mpib_shm_record r = {.sup_bw = shm_clamp(sup_bw, &clamped),
                       .flags = valid ? SHM_FLAG_VALID : 0,
                       .set_ns = mpib_shm_now_ns()};
  shm_rec_write(&shm->hdr->cls[path_class], &r);
  return clamped;
}

int mpib_shm_set_peer_hint(mpib_shm *shm, uint32_t peer_ip, uint8_t prefix_len, int valid,
                           uint32_t sup_bw) {
  if (shm == NULL || prefix_len > 32) {
    return -ERANGE;
  }
  uint32_t target = SHM_NO_PEER, free_idx = SHM_NO_PEER;
  for (uint32_t j = 0; j < shm->npeers && target == SHM_NO_PEER; j++) {
    mpib_shm_record r;
    if (shm_rec_read(&shm->peers[j], &r) != 0) {
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
  shm_rec_write(&shm->peers[target], &r);
  atomic_fetch_add_explicit(&shm->hdr->peers_epoch, 1, memory_order_release);
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
  int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
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
