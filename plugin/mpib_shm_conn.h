/* The per-process handle (struct mpib_shm) and the slot claims of its connections
 * (mpib_shm_conn.c defines the functions; the watcher, the data path and the C tests use
 * them). The public entry points (handle, register, release, conn_slot) are in mpib_shm.h. */
#ifndef MPIB_SHM_CONN_H
#define MPIB_SHM_CONN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "mpib_shm.h"
#include "mpib_shm_map.h"

#define SHM_MAX_MAPS 64 /* segments one handle may attach in its life */

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

struct shm_conn {
  mpib_conn_desc d;
  int used;
  /* The connection's rail states (MPIB_SHM_RAIL_*) and the CLOCK_REALTIME ns of their last
   * store, per rail (0 SOUT, 1 SUP): the data path stores them (mpib_shm_set_rail_state)
   * whether or not the connection has a slot, and every claim copies them into its slot, so
   * that a rail that failed while the connection had none (no segment yet, a full or
   * replaced one) does not read "up" once it has one. Reset by registration. */
  _Atomic uint8_t rail_state[2];
  _Atomic uint64_t rail_state_ns[2];
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
  _Atomic int cur;        /* index + 1 of the attached map, 0 = none */
  struct shm_conn *conns; /* [MPIB_SHM_MAX_CONNS], under mu */
  _Atomic uint64_t *bind; /* [MPIB_SHM_MAX_CONNS]: (map index + 1) << 32 | slot, 0 = unbound */
  uint32_t conn_hi;       /* ids at or above it were never used: loops stop there */
  uint32_t unbound;       /* used connections without a slot of the current map (shm_waiting) */
  uint32_t wait_cursor;   /* the id the poll's next pass over waiting connections starts at
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

/* What one search for free slots may still spend (SHM_PASS_*). */
struct shm_budget {
  uint32_t probes; /* owner words to look at */
  uint32_t locks;  /* lease attempts (fcntl) */
};

/* The attached map, or NULL. */
static inline struct shm_map *shm_cur(const mpib_shm *shm) {
  int c = atomic_load_explicit(&((mpib_shm *)shm)->cur, memory_order_acquire);
  return c > 0 ? atomic_load_explicit(&((mpib_shm *)shm)->maps[c - 1], memory_order_relaxed) : NULL;
}

/* Adds m to the handle's maps (under mu, or before the handle is shared): its index + 1, or
 * -ENOSPC when SHM_MAX_MAPS are there. The caller makes it current. */
MPIB_SHM_HIDDEN int shm_add_map(mpib_shm *shm, struct shm_map *m);
/* Whether connection id waits for a slot of the current map: used, and bound to no map or to
 * the one an attach is replacing (under mu). shm->unbound counts them. */
MPIB_SHM_HIDDEN int shm_waiting(mpib_shm *shm, uint32_t id);
/* Drops connection id's binding and frees its slot (under mu). */
MPIB_SHM_HIDDEN void shm_unbind(mpib_shm *shm, uint32_t id);
/* Searches map index mi (the current one) for a free slot for connection id and binds it
 * there, spending b (under claim_mu, without mu). 0 bound; -ENOENT released meanwhile;
 * -EAGAIN b is spent; -ENOSPC every slot was looked at and none could be claimed. */
MPIB_SHM_HIDDEN int shm_search(mpib_shm *shm, int mi, uint32_t id, struct shm_budget *b);

#endif
