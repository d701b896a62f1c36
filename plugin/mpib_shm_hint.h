/* The data path's side of the hint segment: the seqlock read and hint resolution
 * (mpib_shm_hint.c defines them; registration and the C tests use them too). The public entry
 * points (mpib_shm_read_hint, mpib_shm_flush_telemetry, mpib_shm_set_rail_state,
 * mpib_shm_now_ns) are in mpib_shm.h. */
#ifndef MPIB_SHM_HINT_H
#define MPIB_SHM_HINT_H

#include <stdint.h>

#include "mpib_shm.h"
#include "mpib_shm_conn.h"
#include "mpib_shm_layout.h"

/* One hint record (read under its seqlock, or raw). */
typedef struct {
  uint32_t seq, sup_bw, flags, gen;
  uint64_t set_ns;
  uint32_t peer_ip;
  uint8_t prefix_len;
} mpib_shm_record;

/* A resolved hint: what applies to a slot now and where it came from. */
typedef struct {
  uint32_t sup_bw; /* 0..1024, valid when source is SLOT, PEER or CLASS */
  uint8_t source;  /* MPIB_SHM_SRC_* */
  uint8_t clamped; /* 1 when the stored value was above 1024 */
} mpib_shm_hint;

/* Reads record r under its seqlock (spec 5.1): 0, or -EBUSY when SHM_SEQ_ATTEMPTS reads
 * each saw a write in progress. Never spins longer. */
MPIB_SHM_HIDDEN int shm_rec_read(struct shm_rec *r, mpib_shm_record *o);
/* Resolves slot's hint on map m at now_ns (spec 5.3): slot hint, else the longest matching
 * peer entry, else the path-class default. 1 when a hint applies, else 0; *out is always
 * filled (MPIB_SHM_SRC_*). m NULL or slot out of range: BAD_SLOT. No telemetry written. */
MPIB_SHM_HIDDEN int shm_resolve_map(struct shm_map *m, uint32_t slot, uint64_t now_ns, uint64_t stale_ns,
                                    mpib_shm_hint *out);
/* The map and slot connection id is bound to, or NULL (lock-free). */
MPIB_SHM_HIDDEN struct shm_map *shm_bound(mpib_shm *shm, uint32_t id, uint32_t *slot);

#endif
