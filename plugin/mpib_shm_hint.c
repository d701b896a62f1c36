/*
 * The hint segment on the data path: the seqlock read (spec 5.1), hint resolution (spec 5.3)
 * with its per-slot peer cache, and the connection's telemetry in its slot (spec 4.3).
 * Callers: mpib_p2p.c (mpib_shm_read_hint once per telemetry batch), mpib_slots.c (telemetry
 * flushes and rail states), mpib_shm_conn.c (mpib_shm_now_ns, shm_bound). Offers what
 * mpib_shm.h and mpib_shm_hint.h declare. No lock, no system call, no allocation: a vDSO clock read, loads
 * and relaxed atomics on the mapping, every index bounds-checked.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "mpib_shm_hint.h"

#include <errno.h>
#include <stdatomic.h>
#include <time.h>

/* Peer-table scans caused by the agent (a new peers_epoch, a cached entry that no longer
 * matches) are rate-limited per segment: up to SHM_PEER_RESCAN_BURST at once, then one per
 * SHM_PEER_RESCAN_NS. An agent that changes peers_epoch on every read then costs a few scans
 * per interval, not one of npeers entries per read; a table that stops changing applies
 * within one interval. A slot's first scan for a registration (its claim leaves the slot's
 * cache unprimed) is never limited; a slot gen that changes while the slot is ours is, and so
 * is the scan that completes one that skipped a busy entry (SHM_PEER_PARTIAL). */
#define SHM_PEER_RESCAN_NS 100000000ull
#define SHM_PEER_RESCAN_BURST 8u

uint64_t mpib_shm_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- seqlock (spec 5.1) ---- */

int shm_rec_read(struct shm_rec *r, mpib_shm_record *o) {
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

/* A peer cache entry's index with this bit set came from a scan that skipped a busy entry. */
#define SHM_PEER_PARTIAL 0x80000000u

/* Longest valid matching prefix, ties to the lowest index; SHM_NO_PEER when none. A busy
 * entry is skipped and the result marked SHM_PEER_PARTIAL: the entry may be the match (or a
 * longer one), and peers_epoch need not change when its write ends (a writer that changes
 * only sup_bw), so the result must not stand for the epoch. */
static uint32_t shm_peer_scan(struct shm_map *m, uint32_t ip) {
  uint32_t best = SHM_NO_PEER;
  uint32_t partial = 0;
  int best_len = -1;
  for (uint32_t j = 0; j < m->npeers; j++) {
    mpib_shm_record r;
    if (shm_rec_read(&m->peers[j], &r) != 0) {
      partial = SHM_PEER_PARTIAL;
      continue;
    }
    if (!(r.flags & SHM_FLAG_VALID)) {
      continue;
    }
    if (shm_prefix_match(ip, r.peer_ip, r.prefix_len) && (int)r.prefix_len > best_len) {
      best = j;
      best_len = r.prefix_len;
    }
  }
  return best | partial;
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
  return atomic_compare_exchange_strong_explicit(&m->rescan_due, &due, base + SHM_PEER_RESCAN_NS, memory_order_relaxed,
                                                 memory_order_relaxed);
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

/* Scans the peer table for ip and keeps the result in cache c under tag (partial or not);
 * returns the index found (>= npeers: none). */
static uint32_t shm_peer_rescan(struct shm_map *m, struct peer_cache *c, uint64_t tag, uint32_t ip) {
  uint32_t idx = shm_peer_scan(m, ip);
  atomic_store_explicit(&c->idx, idx, memory_order_relaxed);
  atomic_store_explicit(&c->tag, tag, memory_order_release);
  return idx & ~SHM_PEER_PARTIAL;
}

static uint32_t shm_peer_lookup(struct shm_map *m, uint32_t slot, uint32_t gen, uint32_t ip, uint64_t now,
                                uint64_t *tag_out) {
  uint64_t tag = ((uint64_t)shm_peers_epoch(m, now) << 32) | gen;
  struct peer_cache *c = &m->cache[slot];
  *tag_out = tag;
  uint64_t cached = atomic_load_explicit(&c->tag, memory_order_acquire);
  if (cached == tag) {
    /* A partial scan's result applies until the limiter grants the scan that completes it. */
    uint32_t idx = atomic_load_explicit(&c->idx, memory_order_relaxed);
    if (!(idx & SHM_PEER_PARTIAL) || !shm_rescan_granted(m, now)) {
      return idx & ~SHM_PEER_PARTIAL;
    }
    return shm_peer_rescan(m, c, tag, ip);
  }
  /* The slot's gen is written once, by the claim, which leaves the cache unprimed. A gen that
   * moves under a primed cache was written by someone else: its scans wait for the limiter,
   * as peers_epoch's do, so that a writer flipping it cannot make every read scan. */
  if (cached != SHM_CACHE_UNPRIMED && (uint32_t)cached != gen && !shm_rescan_granted(m, now)) {
    return SHM_NO_PEER;
  }
  return shm_peer_rescan(m, c, tag, ip);
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
static int shm_resolve_peer(struct shm_map *m, uint32_t slot, uint32_t gen, uint64_t now, mpib_shm_hint *out) {
  uint32_t ip = atomic_load_explicit(&m->slots[slot].peer_sout_ip, memory_order_relaxed);
  uint64_t tag = 0;
  for (int pass = 0; pass < 2; pass++) {
    uint32_t j;
    if (pass == 0) {
      j = shm_peer_lookup(m, slot, gen, ip, now, &tag);
    } else if (shm_rescan_granted(m, now)) {
      j = shm_peer_rescan(m, &m->cache[slot], tag, ip); /* the next reads use what it found */
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

int shm_resolve_map(struct shm_map *m, uint32_t slot, uint64_t now_ns, uint64_t stale_ns, mpib_shm_hint *out) {
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

/* The data path's entry: one acquire load of the binding word. */
struct shm_map *shm_bound(mpib_shm *shm, uint32_t id, uint32_t *slot) {
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

/* The connection's table entry keeps the state first, so that a slot claimed later copies it
 * (mpib_shm_conn.c, shm_rails_settle: the fence pairs with the one there). */
void mpib_shm_set_rail_state(mpib_shm *shm, uint32_t id, int rail, int state, uint64_t realtime_ns) {
  if (shm == NULL || id >= MPIB_SHM_MAX_CONNS || (rail != 0 && rail != 1)) {
    return;
  }
  atomic_store_explicit(&shm->conns[id].rail_state_ns[rail], realtime_ns, memory_order_relaxed);
  atomic_store_explicit(&shm->conns[id].rail_state[rail], (uint8_t)state, memory_order_relaxed);
  atomic_thread_fence(memory_order_seq_cst);
  uint32_t slot = 0;
  struct shm_map *m = shm_bound(shm, id, &slot);
  if (m == NULL) {
    return;
  }
  struct shm_slot *s = &m->slots[slot];
  /* Leaving "up" is a failover and returning to it a recovery; a state set again to the value
   * it has counts nothing. A claim starts from the connection's states with both counts 0. */
  int was_up = atomic_load_explicit(&s->rail_state[rail], memory_order_relaxed) == MPIB_SHM_RAIL_UP;
  if (state != MPIB_SHM_RAIL_UP && was_up) {
    atomic_fetch_add_explicit(&s->failovers, 1, memory_order_relaxed);
  } else if (state == MPIB_SHM_RAIL_UP && !was_up) {
    atomic_fetch_add_explicit(&s->recoveries, 1, memory_order_relaxed);
  }
  atomic_store_explicit(&s->rail_state_ns[rail], realtime_ns, memory_order_relaxed);
  atomic_store_explicit(&s->rail_state[rail], (uint8_t)state, memory_order_relaxed);
}
