//go:build ignore

// link: ../mpib_shm_*.c shm_agent.c shm_decode.c
/*
 * A hint record whose writer died between its two seq stores stays odd: the plugin reads it
 * as busy (no hint, and no fall-through to the peer or class default, spec 5.1 and 5.3), for
 * every registration of its slot, since a claim leaves hint records alone (the plugin never
 * writes one). Agents repair it under the writer lock (spec 5.1): the C test agent's
 * mpib_shm_repair and peer writer show the rule, and after it the defaults apply again.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "../mpib_shm.h"
#include "../mpib_shm_conn.h"
#include "shm_agent.h"

#include "check.h"

#define PEER 0x0A000207u
#define STALE 500000000ull

static uint32_t source_of(mpib_shm *h, uint32_t id, uint32_t *bw) {
  uint32_t slot = 0;
  *bw = 0;
  mpib_shm_heartbeat(h, mpib_shm_now_ns());
  if (mpib_shm_conn_slot(h, id, &slot, NULL) != 0) return UINT32_MAX;
  mpib_shm_read_hint(h, id, STALE, bw);
  return atomic_load(&shm_cur(h)->slots[slot].last_source);
}

int main(void) {
  char path[64], err[256];
  snprintf(path, sizeof path, "/dev/shm/mpib-ctest-odd-%d", (int)getpid());
  if (mpib_shm_create(path, 1, 2, err, sizeof err) != 0) {
    fprintf(stderr, "create: %s\n", err);
    return 1;
  }
  mpib_shm *h = NULL;
  if (mpib_shm_handle_new(path, &h) != 0 || mpib_shm_poll(h, NULL, 0) != MPIB_SHM_POLL_ATTACHED) return 1;
  struct shm_map *m = shm_cur(h);
  mpib_conn_desc d = {.peer_sout_ip = PEER, .path_class = 0, .is_send = 1, .conn_id = 1};
  uint32_t id = 0, bw = 0;
  CHECK(mpib_shm_set_class_hint(h, 0, 1, 300) == 0, "class default");
  CHECK(mpib_shm_register(h, &d, &id) == 0, "register");
  CHECK(source_of(h, id, &bw) == MPIB_SHM_SRC_CLASS && bw == 300, "class default applies");

  /* A writer of slot 0's hint dies after its first seq store. */
  atomic_store(&m->slots[0].hint.seq, 1);
  CHECK(source_of(h, id, &bw) == MPIB_SHM_SRC_BUSY, "odd slot hint: busy");
  for (int k = 0; k < 3; k++) { /* later registrations of the slot: the claim leaves it */
    mpib_shm_release(h, id);
    d.conn_id++;
    CHECK(mpib_shm_register(h, &d, &id) == 0, "re-register");
    CHECK(source_of(h, id, &bw) == MPIB_SHM_SRC_BUSY, "registration %d: busy", k + 2);
  }
  CHECK(mpib_shm_repair(h) == 1, "repair: one record");
  CHECK(atomic_load(&m->slots[0].hint.seq) == 2 && atomic_load(&m->slots[0].hint.flags) == 0, "cleared, even");
  CHECK(source_of(h, id, &bw) == MPIB_SHM_SRC_CLASS && bw == 300, "after the repair: class default");

  /* A peer entry's writer dies mid-write: the next peer write repairs it, never writing the
   * key a second time, and bumps peers_epoch. */
  CHECK(mpib_shm_set_peer_hint(h, PEER, 32, 1, 700) == 0, "peer default");
  CHECK(source_of(h, id, &bw) == MPIB_SHM_SRC_PEER && bw == 700, "peer default applies");
  atomic_store(&m->peers[0].seq, atomic_load(&m->peers[0].seq) + 1);
  atomic_store(&m->peers[0].sup_bw, 9999); /* torn: never published as it stands */
  uint32_t epoch = atomic_load(&m->hdr->peers_epoch);
  CHECK(mpib_shm_set_peer_hint(h, PEER, 32, 1, 800) == 0, "peer write over a dead writer's entry");
  CHECK(atomic_load(&m->hdr->peers_epoch) != epoch, "peers_epoch bumped");
  int keyed = 0;
  for (uint32_t j = 0; j < 2; j++) {
    keyed += atomic_load(&m->peers[j].peer_ip) == PEER && (atomic_load(&m->peers[j].flags) & 1u);
  }
  CHECK(keyed == 1, "%d entries with the key, want 1", keyed);
  CHECK(source_of(h, id, &bw) == MPIB_SHM_SRC_PEER && bw == 800, "peer default %u after the repair", bw);

  mpib_shm_close(h);
  unlink(path);
  return failures != 0;
}
