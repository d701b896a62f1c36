//go:build ignore

/*
 * Agent-side writers of the hint segment (declared in shm_agent.h): what an agent does to a
 * segment (docs/shm-format.md 5.1, 5.5), for the C tests of plugin/ctest, which name this
 * file on their link: line. The seqlock writer lives here: the plugin never writes a record.
 * Never linked into the plugin (the symbol test in symbols_test.go checks).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "shm_agent.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../mpib_shm_conn.h"
#include "../mpib_shm_hint.h"
#include "../mpib_shm_map.h"

/* The seqlock writer (spec 5.1): seq odd, the fields, seq even again. */
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

/* Clears record r if a dead writer left its seq odd (spec 5.1, repair; the caller holds the
 * writer lock, so no live writer is mid-write): 1 when it did. */
static int shm_rec_repair(struct shm_rec *r) {
  if (!(atomic_load_explicit(&r->seq, memory_order_relaxed) & 1u)) {
    return 0;
  }
  const mpib_shm_record none = {0};
  shm_rec_write(r, &none); /* reuses the odd seq, zeroes every field, then even */
  return 1;
}

int mpib_shm_repair(mpib_shm *shm) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL) {
    return -ERANGE;
  }
  int n = shm_rec_repair(&m->hdr->cls[0]) + shm_rec_repair(&m->hdr->cls[1]);
  for (uint32_t i = 0; i < m->nslots; i++) {
    n += shm_rec_repair(&m->slots[i].hint);
  }
  int peers = 0;
  for (uint32_t j = 0; j < m->npeers; j++) {
    peers += shm_rec_repair(&m->peers[j]);
  }
  if (peers > 0) {
    atomic_fetch_add_explicit(&m->hdr->peers_epoch, 1, memory_order_release);
  }
  return n + peers;
}

int mpib_shm_write_slot_record(mpib_shm *shm, uint32_t slot, const mpib_shm_record *r) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || slot >= m->nslots) {
    return -ERANGE;
  }
  shm_rec_write(&m->slots[slot].hint, r);
  return 0;
}

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

int mpib_shm_set_slot_hint(mpib_shm *shm, uint32_t slot, uint32_t expect_gen, int valid, uint32_t sup_bw) {
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
  mpib_shm_record r = {
      .sup_bw = shm_clamp(sup_bw, &clamped), .flags = valid ? SHM_FLAG_VALID : 0, .set_ns = mpib_shm_now_ns()};
  shm_rec_write(&m->hdr->cls[path_class], &r);
  return clamped;
}

int mpib_shm_set_peer_hint(mpib_shm *shm, uint32_t peer_ip, uint8_t prefix_len, int valid, uint32_t sup_bw) {
  struct shm_map *m = shm == NULL ? NULL : shm_cur(shm);
  if (m == NULL || prefix_len > 32) {
    return -ERANGE;
  }
  uint32_t mask = prefix_len == 0 ? 0 : ~0u << (32 - prefix_len);
  peer_ip &= mask; /* the key is stored masked to its prefix, and entries match by it (spec 5.6) */
  uint32_t target = SHM_NO_PEER, free_idx = SHM_NO_PEER;
  int repaired = 0;
  for (uint32_t j = 0; j < m->npeers && target == SHM_NO_PEER; j++) {
    mpib_shm_record r;
    repaired |= shm_rec_repair(&m->peers[j]); /* an odd entry is neither the key nor free */
    if (shm_rec_read(&m->peers[j], &r) != 0) {
      continue;
    }
    if (!(r.flags & SHM_FLAG_VALID)) {
      free_idx = free_idx == SHM_NO_PEER ? j : free_idx;
    } else if ((r.peer_ip & mask) == peer_ip && r.prefix_len == prefix_len) {
      target = j;
    }
  }
  if (target == SHM_NO_PEER) {
    if (!valid) {
      if (repaired) {
        atomic_fetch_add_explicit(&m->hdr->peers_epoch, 1, memory_order_release);
      }
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

int mpib_shm_create(const char *path, uint32_t nslots, uint32_t npeers, char *err, size_t errlen) {
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
