/* One mapped hint segment (struct shm_map) and its validation (mpib_shm_map.c defines the
 * functions; registration, the data path, the watcher and the C tests use them). Return 0 or
 * -errno where they return int; err gets "mpib shm PATH: CODE: detail" with CODE from the
 * spec's validation table (section 6): not_regular, bad_owner, bad_mode, too_small,
 * bad_magic, bad_version, bad_geometry, io. */
#ifndef MPIB_SHM_MAP_H
#define MPIB_SHM_MAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "mpib_shm_guard.h"
#include "mpib_shm_layout.h"

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
  /* The slots this process holds, one bit each (written under mu): a slot whose owner word
   * was cleared or rewritten under its holder (a file rewritten in place, an agent's reclaim)
   * reads free, and our own lease never stops us, so only this keeps two of our connections
   * off one slot. */
  _Atomic uint64_t *held;
  int fd; /* the segment file (its OFD holds our locks); -1 for an image */
  dev_t dev;
  ino_t ino;
  int guard;                   /* its entry in the SIGBUS guard's table (shm_guard_add), -1 for none */
  int retired;                 /* pages replaced by zeros, fd closed */
  uint32_t cursor;             /* the slot the next search looks at first (under claim_mu) */
  _Atomic uint32_t epoch_seen; /* the peers_epoch the per-slot caches are keyed on */
  _Atomic uint64_t rescan_due; /* the peer-rescan limiter's theoretical arrival time (ns) */
};

/* snprintf into err when err is not NULL and errlen > 0. */
__attribute__((format(printf, 3, 4))) MPIB_SHM_HIDDEN void shm_err(char *err, size_t errlen, const char *fmt, ...);
/* Checks 5..9 of the validation table on an image of len bytes (the file's size); what names
 * it in err. */
MPIB_SHM_HIDDEN int shm_check_image(const void *buf, size_t len, const char *what, char *err, size_t errlen);
/* A map over mem (size bytes, nslots and npeers already validated): no file (fd -1), no
 * guard, peer caches empty. NULL when out of memory. */
MPIB_SHM_HIDDEN struct shm_map *shm_map_new(void *mem, size_t size, uint32_t nslots, uint32_t npeers);
/* Opens (never waiting for a lease), checks (checks 1..9), maps the file at path read-write
 * and shared, takes the attach lock and guards the mapping. st_out (may be NULL) gets the
 * file's status as checked. */
MPIB_SHM_HIDDEN int shm_map_file(const char *path, struct shm_map **out, struct stat *st_out, char *err, size_t errlen);
/* Unguards, unmaps, closes and frees a map no binding references any more. */
MPIB_SHM_HIDDEN void shm_map_free(struct shm_map *m);
/* Replaces the map's pages with anonymous zero pages and closes its file (dropping every lock
 * of this handle on it), keeping the addresses valid for a data path that may still read. */
MPIB_SHM_HIDDEN void shm_map_retire(struct shm_map *m);

/* The tag of a slot's peer cache that its claim left for the first read to fill: never a
 * valid (epoch, gen) tag (gen 0 is unused). */
#define SHM_CACHE_UNPRIMED UINT64_MAX

/* Empties slot i's peer cache for the connection that claims it (its first read scans). */
static inline void shm_peer_cache_reset(struct shm_map *m, uint32_t i) {
  atomic_store_explicit(&m->cache[i].tag, SHM_CACHE_UNPRIMED, memory_order_release);
}

/* Whether this process holds slot i of m (shm_map_hold). */
static inline int shm_map_holds(const struct shm_map *m, uint32_t i) {
  return (atomic_load_explicit(&m->held[i / 64], memory_order_relaxed) >> (i % 64)) & 1;
}
/* Marks slot i held (hold 1) or not (under mu). */
static inline void shm_map_hold(struct shm_map *m, uint32_t i, int hold) {
  uint64_t bit = 1ull << (i % 64);
  if (hold) atomic_fetch_or_explicit(&m->held[i / 64], bit, memory_order_relaxed);
  else atomic_fetch_and_explicit(&m->held[i / 64], ~bit, memory_order_relaxed);
}

/* Whether the SIGBUS guard found m's file truncated. */
static inline int shm_map_faulted(const struct shm_map *m) { return shm_guard_faulted(m->guard); }

#endif
