//go:build ignore

/*
 * Test-only reader entry points of the hint segment (declared in shm_decode.h): opening a
 * file or an image, field decoders, resolution at an explicit time, per-message telemetry.
 * Callers: the C tests of plugin/ctest (each names this file on its link: line) and shmfuzz
 * (compiled into its cgo). Built on the plugin's own map, registration and hint code, so the
 * decoders see exactly what the plugin reads; never linked into the plugin (the symbol test
 * in symbols_test.go checks).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "shm_decode.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "../mpib_shm_conn.h"
#include "../mpib_shm_hint.h"
#include "../mpib_shm_map.h"

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

int mpib_shm_validate(const void *buf, size_t len, char *err, size_t errlen) {
  return shm_check_image(buf, len, "(buffer)", err, errlen);
}

uint32_t mpib_shm_nslots(const mpib_shm *shm) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  return m == NULL ? 0 : m->nslots;
}

void mpib_shm_add_telemetry(mpib_shm *shm, uint32_t id, int rail, uint64_t bytes) {
  uint32_t slot = 0;
  struct shm_map *m = shm_bound(shm, id, &slot);
  if (m == NULL || (rail != 0 && rail != 1)) {
    return;
  }
  struct shm_slot *s = &m->slots[slot];
  atomic_fetch_add_explicit(rail == 0 ? &s->sout_bytes : &s->sup_bytes, bytes, memory_order_relaxed);
  atomic_fetch_add_explicit(rail == 0 ? &s->sout_requests : &s->sup_requests, 1, memory_order_relaxed);
}

int mpib_shm_resolve(mpib_shm *shm, uint32_t slot, uint64_t now_ns, uint64_t stale_ns, mpib_shm_hint *out) {
  return shm_resolve_map(shm == NULL ? NULL : shm_cur(shm), slot, now_ns, stale_ns, out);
}

int mpib_shm_read_slot_record(mpib_shm *shm, uint32_t slot, mpib_shm_record *r) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || slot >= m->nslots) {
    return -ERANGE;
  }
  return shm_rec_read(&m->slots[slot].hint, r);
}

/* One record without its seqlock (a write in progress stays visible: an odd seq). */
static void shm_rec_raw(struct shm_rec *r, mpib_shm_record *o) {
  o->seq = atomic_load_explicit(&r->seq, memory_order_relaxed);
  o->sup_bw = atomic_load_explicit(&r->sup_bw, memory_order_relaxed);
  o->flags = atomic_load_explicit(&r->flags, memory_order_relaxed);
  o->gen = atomic_load_explicit(&r->gen, memory_order_relaxed);
  o->set_ns = atomic_load_explicit(&r->set_ns, memory_order_relaxed);
  o->peer_ip = atomic_load_explicit(&r->peer_ip, memory_order_relaxed);
  o->prefix_len = atomic_load_explicit(&r->prefix_len, memory_order_relaxed);
}

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
