//go:build ignore

// link: ../mpib_shm_*.c
/*
 * A peer-table scan that skips an entry caught mid-write must not stand as the answer for the
 * (peers_epoch, gen) it ran under. A writer may change an entry's sup_bw alone without a new
 * peers_epoch (the spec asked for one only when a key or VALID changes), so nothing else would
 * make the reader look again: the slot would get no peer hint, or a shorter prefix's, for as
 * long as its registration and the epoch last. The reader scans again (under its limiter).
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib_shm_hint.h"
#include "../mpib_shm_map.h"

#include "check.h"

#define NSLOTS 2u
#define NPEERS 4u
#define PEER 0x0A000207u   /* 10.0.2.7 */
#define STALE 500000000ull /* ns */
#define MINUTE 60000000000ull

static void put(struct shm_rec *r, uint32_t seq, uint32_t bw, uint32_t ip, uint8_t plen) {
  atomic_store(&r->seq, seq);
  atomic_store(&r->sup_bw, bw);
  atomic_store(&r->flags, SHM_FLAG_VALID);
  atomic_store(&r->peer_ip, ip);
  atomic_store(&r->prefix_len, plen);
}

/* Slot 0 as a new registration (gen) of ours: ACTIVE, peer PEER, class 0, cache unprimed. */
static void claim(struct shm_map *m, uint32_t gen) {
  struct shm_slot *s = &m->slots[0];
  atomic_store(&s->owner, 0);
  atomic_store(&s->gen, gen);
  atomic_store(&s->peer_sout_ip, PEER);
  atomic_store(&s->path_class, 0);
  shm_peer_cache_reset(m, 0);
  atomic_store(&s->owner, SHM_STATE_ACTIVE | 1234ull << 32);
}

static void expect(struct shm_map *m, uint64_t now, uint8_t source, uint32_t bw, const char *when) {
  mpib_shm_hint o;
  atomic_store(&m->hdr->heartbeat_ns, now);
  shm_resolve_map(m, 0, now, STALE, &o);
  CHECK(o.source == source && o.sup_bw == bw, "%s: source %u sup_bw %u, want %u %u", when, o.source, o.sup_bw, source,
        bw);
}

/* The /32 entry is mid-write when a new registration first scans; its write ends without a
 * new peers_epoch. beside: a valid /24 entry for the peer's island at index 1, or none. */
static void scenario(int beside) {
  size_t size = shm_expected_size(NSLOTS, NPEERS);
  void *mem = aligned_alloc(64, size);
  memset(mem, 0, size);
  struct shm_map *m = shm_map_new(mem, size, NSLOTS, NPEERS);
  if (m == NULL) exit(1);
  uint64_t now = 10000000000ull;
  put(&m->hdr->cls[0], 2, 100, 0, 0);
  put(&m->peers[0], 2, 700, PEER, 32);
  if (beside) put(&m->peers[1], 2, 500, PEER & 0xFFFFFF00u, 24);
  atomic_store(&m->hdr->peers_epoch, 1);
  claim(m, 1);
  expect(m, now, MPIB_SHM_SRC_PEER, 700, "before");

  claim(m, 2);
  atomic_store(&m->peers[0].seq, 3); /* the writer's first seq store */
  expect(m, now, beside ? MPIB_SHM_SRC_PEER : MPIB_SHM_SRC_CLASS, beside ? 500 : 100, "entry mid-write");
  put(&m->peers[0], 4, 800, PEER, 32); /* its last: sup_bw changed, key and VALID not */
  for (int k = 1; k <= 3; k++) {
    char when[64];
    snprintf(when, sizeof when, "%d min after the write (beside %d)", k, beside);
    expect(m, now + (uint64_t)k * MINUTE, MPIB_SHM_SRC_PEER, 800, when);
  }

  /* An entry that stays busy (its writer died): what the scans found applies, reads go on. */
  claim(m, 3);
  atomic_store(&m->peers[0].seq, 5);
  for (int k = 0; k < 32; k++) {
    expect(m, now + 4 * MINUTE, beside ? MPIB_SHM_SRC_PEER : MPIB_SHM_SRC_CLASS, beside ? 500 : 100, "left busy");
  }
  shm_map_free(m);
  free(mem);
}

int main(void) {
  scenario(0);
  scenario(1);
  return failures != 0;
}
