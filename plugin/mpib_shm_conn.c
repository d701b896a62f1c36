/*
 * The per-process handle of the hint segment and its connections' slots (spec 5.4): the
 * connection table, the binding words the data path loads, slot claims under OFD leases,
 * registration, release and close.
 * Callers: agent.go (handle, register, conn_slot, close), mpib_comm_close (mpib_comm.h: release
 * at a comm's close), mpib_shm_watch.c (searches for waiting connections, unbinding). Offers what
 * mpib_shm.h and mpib_shm_conn.h declare. Never on the data path.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "mpib_shm_conn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpib_shm_hint.h"

int mpib_shm_attached(const mpib_shm *shm) { return shm != NULL && shm_cur(shm) != NULL; }

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

int shm_add_map(mpib_shm *shm, struct shm_map *m) {
  if (shm->nmaps >= SHM_MAX_MAPS) {
    return -ENOSPC;
  }
  atomic_store_explicit(&shm->maps[shm->nmaps], m, memory_order_release);
  shm->nmaps++;
  return shm->nmaps; /* index + 1 */
}

/* ---- registration (spec 5.4) ---- */

/* Copies connection c's rail states and their times into slot s. */
static void shm_rails_copy(struct shm_slot *s, const struct shm_conn *c) {
  for (int r = 0; r < 2; r++) {
    atomic_store_explicit(&s->rail_state_ns[r], atomic_load_explicit(&c->rail_state_ns[r], memory_order_relaxed),
                          memory_order_relaxed);
    atomic_store_explicit(&s->rail_state[r], atomic_load_explicit(&c->rail_state[r], memory_order_relaxed),
                          memory_order_relaxed);
  }
}

static int shm_rails_same(const struct shm_slot *s, const struct shm_conn *c) {
  for (int r = 0; r < 2; r++) {
    if (atomic_load_explicit(&s->rail_state[r], memory_order_relaxed) !=
            atomic_load_explicit(&c->rail_state[r], memory_order_relaxed) ||
        atomic_load_explicit(&s->rail_state_ns[r], memory_order_relaxed) !=
            atomic_load_explicit(&c->rail_state_ns[r], memory_order_relaxed)) {
      return 0;
    }
  }
  return 1;
}

/* After connection c was bound to slot s: leaves in s the rail states c holds now. The data
 * path stores c's states, then (seq_cst fence) loads the binding and writes the slot it finds
 * (mpib_shm_set_rail_state); the binding was stored before this function's fence. So either
 * the data path saw this binding and writes s itself, later in each field's modification order
 * than the copy checked here, or the check below sees its store and copies it again. The
 * bound only stops a data path changing states without pause, which failover never does. */
static void shm_rails_settle(struct shm_slot *s, const struct shm_conn *c) {
  for (int k = 0; k < 64; k++) {
    atomic_thread_fence(memory_order_seq_cst);
    if (shm_rails_same(s, c)) {
      return;
    }
    shm_rails_copy(s, c);
  }
}

/* A claim's slot: a new gen, connection c's descriptor and rail states, zero telemetry. */
static void shm_slot_fill(struct shm_slot *s, const struct shm_conn *c) {
  const mpib_conn_desc *d = &c->d;
  uint32_t pid = d->pid;
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
  _Atomic uint64_t *tel[] = {&s->sout_bytes,     &s->sout_requests, &s->sup_bytes, &s->sup_requests, &s->reads_applied,
                             &s->reads_fallback, &s->reads_stale,   &s->clamped,   &s->last_read_ns, &s->flush_wall_ns};
  for (size_t i = 0; i < sizeof(tel) / sizeof(tel[0]); i++) {
    atomic_store_explicit(tel[i], 0, memory_order_relaxed);
  }
  atomic_store_explicit(&s->last_sup_bw, 0, memory_order_relaxed);
  atomic_store_explicit(&s->last_source, 0, memory_order_relaxed);
  atomic_store_explicit(&s->failovers, 0, memory_order_relaxed);
  atomic_store_explicit(&s->recoveries, 0, memory_order_relaxed);
  atomic_store_explicit(&s->applied_sup_bw, 0, memory_order_relaxed);
  shm_rails_copy(s, c);
  for (int r = 0; r < 2; r++) {
    atomic_store_explicit(&s->done[r].bytes, 0, memory_order_relaxed);
    atomic_store_explicit(&s->done[r].requests, 0, memory_order_relaxed);
    atomic_store_explicit(&s->done[r].inflight_bytes, 0, memory_order_relaxed);
    atomic_store_explicit(&s->done[r].busy_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&s->active_ns[r], 0, memory_order_relaxed);
  }
}

/* Frees our slot: owner back to 0 (only if still ours), then the lease. */
static void shm_unclaim(struct shm_map *m, uint32_t slot, uint32_t pid) {
  if (m->retired || slot >= m->nslots) {
    return;
  }
  uint64_t mine = SHM_STATE_ACTIVE | (uint64_t)pid << 32;
  atomic_compare_exchange_strong_explicit(&m->slots[slot].owner, &mine, 0, memory_order_acq_rel, memory_order_relaxed);
  shm_map_hold(m, slot, 0);
  shm_lock_byte(m->fd, shm_slot_lock_off(slot), F_UNLCK);
}

/* Whether connection id waits for a slot of the current map: used, and bound to no map or to
 * the one an attach is replacing (under mu). shm->unbound counts them. */
int shm_waiting(mpib_shm *shm, uint32_t id) {
  if (!shm->conns[id].used) {
    return 0;
  }
  uint64_t b = atomic_load_explicit(&shm->bind[id], memory_order_relaxed);
  return b == 0 || (int)(b >> 32) != atomic_load_explicit(&shm->cur, memory_order_relaxed);
}

/* Drops connection id's binding and frees its slot (under mu). */
void shm_unbind(mpib_shm *shm, uint32_t id) {
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
  if (shm_map_holds(m, i)) {
    return -EBUSY; /* ours already, for another connection: its lease stays */
  }
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
  if (!atomic_compare_exchange_strong_explicit(&s->owner, &expect, SHM_STATE_CLAIMING | (uint64_t)d->pid << 32,
                                               memory_order_acq_rel, memory_order_relaxed)) {
    shm_lock_byte(m->fd, off, F_UNLCK);
    return -EBUSY;
  }
  shm_slot_fill(s, &shm->conns[id]);
  shm_map_hold(m, i, 1);
  shm_peer_cache_reset(m, i);
  atomic_store_explicit(&s->owner, SHM_STATE_ACTIVE | (uint64_t)d->pid << 32, memory_order_release);
  int waited = shm_waiting(shm, id);
  uint64_t old = atomic_load_explicit(&shm->bind[id], memory_order_relaxed);
  atomic_store_explicit(&shm->bind[id], (uint64_t)mi << 32 | i, memory_order_release);
  shm_rails_settle(s, &shm->conns[id]);
  if (old != 0) {
    struct shm_map *om = atomic_load_explicit(&shm->maps[(old >> 32) - 1], memory_order_relaxed);
    shm_unclaim(om, (uint32_t)old, d->pid);
  }
  if (waited) {
    shm->unbound--;
  }
  return 0;
}

/* The lease attempts on slots other processes hold happen here, without mu; only a slot whose
 * lease was won takes mu, for O(1) work. Looks at slots from the map's cursor on. */
int shm_search(mpib_shm *shm, int mi, uint32_t id, struct shm_budget *b) {
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
    if (atomic_load_explicit(&m->slots[i].owner, memory_order_relaxed) != 0 || shm_map_holds(m, i)) {
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
  for (int r = 0; r < 2; r++) { /* every rail is in service when a connection registers */
    atomic_store_explicit(&shm->conns[id].rail_state[r], MPIB_SHM_RAIL_UP, memory_order_relaxed);
    atomic_store_explicit(&shm->conns[id].rail_state_ns[r], 0, memory_order_relaxed);
  }
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
