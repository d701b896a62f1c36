//go:build ignore

// link: ../mpib_shm_*.c shm_agent.c shm_decode.c
/*
 * A rail's state reaches the slot a connection gets after the rail changed: the data path
 * publishes a state once, when it changes (a failed rail is never retried, so "failed" is
 * never published again), and a connection may have no slot at that moment: the agent
 * started after NCCL, the segment was full, or it was replaced (create --force) and the
 * connection waits for the next poll. The claim must show the connection's states and their
 * times, not "up", with failovers and recoveries counted from 0 for the new registration.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include "../mpib_shm.h"
#include "../mpib_shm_conn.h"
#include "shm_agent.h"

#include "check.h"

static struct shm_slot *slot_of(mpib_shm *h, uint32_t id) {
  uint32_t slot = 0;
  struct shm_map *m = shm_cur(h);
  return m != NULL && mpib_shm_conn_slot(h, id, &slot, NULL) == 0 ? &m->slots[slot] : NULL;
}

static void check_rail(mpib_shm *h, uint32_t id, int rail, int state, uint64_t ns, const char *when) {
  struct shm_slot *s = slot_of(h, id);
  CHECK(s != NULL, "%s: connection %u bound", when, id);
  if (s == NULL) return;
  CHECK(atomic_load(&s->rail_state[rail]) == state, "%s: rail %d state %u, want %d", when, rail,
        atomic_load(&s->rail_state[rail]), state);
  CHECK(atomic_load(&s->rail_state_ns[rail]) == ns, "%s: rail %d state_ns %llu, want %llu", when, rail,
        (unsigned long long)atomic_load(&s->rail_state_ns[rail]), (unsigned long long)ns);
  CHECK(atomic_load(&s->failovers) == 0 && atomic_load(&s->recoveries) == 0, "%s: counts %u/%u, want 0/0", when,
        atomic_load(&s->failovers), atomic_load(&s->recoveries));
}

int main(void) {
  char path[64], err[256];
  snprintf(path, sizeof path, "/dev/shm/mpib-ctest-rail-%d", (int)getpid());
  unlink(path);
  mpib_shm *h = NULL;
  if (mpib_shm_handle_new(path, &h) != 0) return 1;
  mpib_conn_desc d = {.is_send = 1, .nqps_sout = 1, .nqps_sup = 1, .conn_id = 1};
  uint32_t a = 0, b = 0;

  /* The agent starts after NCCL: SUP fails while the connection has no slot. */
  CHECK(mpib_shm_poll(h, NULL, 0) == MPIB_SHM_POLL_FAILED, "no segment yet (said once)");
  CHECK(mpib_shm_register(h, &d, &a) == 0, "register a");
  mpib_shm_set_rail_state(h, a, 1, MPIB_SHM_RAIL_FAILED, 123456789ull);
  if (mpib_shm_create(path, 1, 0, err, sizeof err) != 0) {
    fprintf(stderr, "create: %s\n", err);
    return 1;
  }
  CHECK(mpib_shm_poll(h, NULL, 0) == MPIB_SHM_POLL_ATTACHED, "attach");
  check_rail(h, a, 1, MPIB_SHM_RAIL_FAILED, 123456789ull, "bound after the failure");
  check_rail(h, a, 0, MPIB_SHM_RAIL_UP, 0, "bound after the failure");

  /* The segment is replaced: the connection moves to a slot of the new one. */
  if (mpib_shm_create(path, 1, 0, err, sizeof err) != 0) return 1;
  CHECK(mpib_shm_poll(h, NULL, 0) == MPIB_SHM_POLL_ATTACHED, "re-attach");
  check_rail(h, a, 1, MPIB_SHM_RAIL_FAILED, 123456789ull, "moved to a replaced segment");

  /* A full segment: b waits while SOUT goes down, then gets a's slot. */
  d.conn_id = 2;
  CHECK(mpib_shm_register(h, &d, &b) == 0 && slot_of(h, b) == NULL, "b waits: the one slot is a's");
  mpib_shm_set_rail_state(h, b, 0, MPIB_SHM_RAIL_DOWN, 555ull);
  mpib_shm_release(h, a);
  mpib_shm_poll(h, NULL, 0);
  check_rail(h, b, 0, MPIB_SHM_RAIL_DOWN, 555ull, "bound once a slot freed");
  check_rail(h, b, 1, MPIB_SHM_RAIL_UP, 0, "bound once a slot freed");

  /* Once bound, changes go on being counted in the slot. */
  mpib_shm_set_rail_state(h, b, 0, MPIB_SHM_RAIL_UP, 666ull);
  struct shm_slot *s = slot_of(h, b);
  CHECK(s != NULL && atomic_load(&s->rail_state[0]) == MPIB_SHM_RAIL_UP && atomic_load(&s->recoveries) == 1,
        "recovery after the claim counted");

  /* A new connection that reuses a released id starts with every rail up. */
  mpib_shm_set_rail_state(h, b, 1, MPIB_SHM_RAIL_FAILED, 777ull);
  mpib_shm_release(h, b);
  uint32_t c = 0;
  d.conn_id = 3;
  CHECK(mpib_shm_register(h, &d, &c) == 0, "register c");
  check_rail(h, c, 1, MPIB_SHM_RAIL_UP, 0, "a new connection on a reused id");

  mpib_shm_close(h);
  unlink(path);
  return failures != 0;
}
