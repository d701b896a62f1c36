//go:build ignore
// link: ../mpib_handoff.c ../mpib_log.c ../mpib_clock.c

/* The C side of connect() and accept() (mpib_handoff.c): the table of pending connects, which
 * connect() reads without calling into Go, and the listen comm's queue of finished handshakes,
 * which accept() pops. No RDMA device is needed. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_handoff.h"
#include "check.h"

/* mpib_handoff.c is bookkeeping only: it needs nothing from comm setup or the data path. */

/* The listener every attempt here connects to: handle bytes [0, 24) all zero, as name_entry
 * leaves them. */
static const uint8_t honest_key[128];

static void name_entry(uint8_t handle[128], uint32_t idx1, uint32_t gen) {
  memset(handle, 0, 128);
  memcpy(handle + 32, &idx1, 4);
  memcpy(handle + 36, &gen, 4);
}

static void test_pending_lifecycle(void) {
  uint32_t gen = 0, idx1 = mpib_pending_acquire(honest_key, &gen);
  CHECK(idx1 != 0 && gen != 0, "acquire: entry %u generation %u", idx1, gen);
  uint8_t handle[128];
  name_entry(handle, idx1, gen);
  struct mpib_comm *comm = NULL, *fake = (struct mpib_comm *)(uintptr_t)0x1234;
  int result = -1;
  CHECK(mpib_pending_poll(handle, &comm, &result) == 1, "a running attempt polls as running");
  CHECK(mpib_pending_collected(idx1, gen) == 0, "running is not collected");
  mpib_pending_finish(idx1, gen, fake, 0);
  CHECK(mpib_pending_collected(idx1, gen) == 0, "finished but not taken is not collected");
  CHECK(mpib_pending_poll(handle, &comm, &result) == 2 && comm == fake && result == 0,
        "the first poll after the end takes the comm (got %p, %d)", (void *)comm, result);
  CHECK(mpib_pending_collected(idx1, gen) == 1, "taken is collected");
  comm = NULL;
  CHECK(mpib_pending_poll(handle, &comm, &result) == 0 && comm == NULL, "a second poll goes to Go, takes nothing");
  CHECK(mpib_pending_take(idx1, gen, &comm, &result) == 0, "a reclaim after NCCL took it gets nothing");

  /* The freed entry is handed out again with the next generation: the old handle is stale. */
  uint32_t gen2 = 0, idx2 = mpib_pending_acquire(honest_key, &gen2);
  CHECK(idx2 == idx1 && gen2 == gen + 1, "reuse: entry %u gen %u, want %u gen %u", idx2, gen2, idx1, gen + 1);
  CHECK(mpib_pending_poll(handle, &comm, &result) == 0, "the stale handle does not see the new attempt");
  mpib_pending_finish(idx2, gen2, NULL, 6 /* ncclRemoteError */);
  CHECK(mpib_pending_poll(handle, &comm, &result) == 0, "nor take its result");
  CHECK(mpib_pending_take(idx2, gen2, &comm, &result) == 1 && comm == NULL && result == 6,
        "a reclaim takes an uncollected error (got %d)", result);
  uint8_t h2[128];
  name_entry(h2, idx2, gen2);
  CHECK(mpib_pending_poll(h2, &comm, &result) == 0, "after the reclaim NCCL's poll gets nothing");
}

static void test_pending_bad_handles(void) {
  uint8_t handle[128];
  struct mpib_comm *comm = NULL;
  int result = 0;
  name_entry(handle, 0, 1);
  CHECK(mpib_pending_poll(handle, &comm, &result) == 0, "index 0 names no entry");
  name_entry(handle, MPIB_PENDING_MAX + 1, 1);
  CHECK(mpib_pending_poll(handle, &comm, &result) == 0, "an index past the table names no entry");
  name_entry(handle, 0xFFFFFFFFu, 0xFFFFFFFFu);
  CHECK(mpib_pending_poll(handle, &comm, &result) == 0, "garbage names no entry");
  CHECK(mpib_pending_take(0, 1, &comm, &result) == 0 && mpib_pending_take(MPIB_PENDING_MAX + 1, 1, &comm, &result) == 0,
        "take refuses out-of-range entries");
  /* A fresh entry starts at a random generation: small guesses do not name it. */
  uint32_t gen = 0, idx1 = mpib_pending_acquire(honest_key, &gen);
  int guessed = 0;
  for (uint32_t g = 1; g <= 64; g++) {
    name_entry(handle, idx1, g);
    guessed += mpib_pending_poll(handle, &comm, &result) != 0;
  }
  CHECK(gen > 64 ? guessed == 0 : 1, "generations 1..64 named entry %u (gen %u) %d times", idx1, gen, guessed);
  mpib_pending_finish(idx1, gen, NULL, 0);
  CHECK(mpib_pending_take(idx1, gen, &comm, &result) == 1, "cleanup");
}

/* A handle of another listener (a forged one from a peer rank) that names a live entry with
 * its exact index and generation, copied from the honest handle, neither sees nor takes it;
 * the honest handle still does. */
static void test_pending_forged_key(void) {
  uint32_t gen = 0, idx1 = mpib_pending_acquire(honest_key, &gen);
  uint8_t honest[128], forged[128];
  name_entry(honest, idx1, gen);
  memcpy(forged, honest, sizeof forged);
  forged[0] = 'M', forged[12] = 0x12, forged[16] = 0x77; /* magic, port, nonce of another listener */
  struct mpib_comm *comm = NULL, *fake = (struct mpib_comm *)(uintptr_t)0x4321;
  int result = -1;
  CHECK(mpib_pending_poll(forged, &comm, &result) == 0, "a forged key does not see a running attempt");
  mpib_pending_finish(idx1, gen, fake, 0);
  CHECK(mpib_pending_poll(forged, &comm, &result) == 0 && comm == NULL, "a forged key does not take a finished one");
  CHECK(mpib_pending_poll(honest, &comm, &result) == 2 && comm == fake, "the honest handle takes its comm");
}

/* NCCL's poll and a reclaim race for one result: exactly one gets it, every time. */
struct race {
  uint32_t idx1, gen;
  int got;
  pthread_barrier_t *start; /* both takers leave it together */
};
static void *race_take(void *arg) {
  struct race *r = arg;
  struct mpib_comm *comm;
  int result;
  pthread_barrier_wait(r->start);
  r->got = mpib_pending_take(r->idx1, r->gen, &comm, &result);
  return NULL;
}

static void test_pending_race(void) {
  for (int i = 0; i < 2000; i++) {
    uint32_t gen = 0, idx1 = mpib_pending_acquire(honest_key, &gen);
    mpib_pending_finish(idx1, gen, (struct mpib_comm *)(uintptr_t)0x10, 0);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    struct race a = {idx1, gen, 0, &start}, b = {idx1, gen, 0, &start};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, race_take, &a);
    pthread_create(&tb, NULL, race_take, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&start);
    if (a.got + b.got != 1) {
      CHECK(0, "round %d: %d takers got the result", i, a.got + b.got);
      return;
    }
  }
}

static void test_listen_queue(void) {
  struct mpib_listen_comm *lc = mpib_listen_comm_new(7);
  CHECK(lc && lc->id == 7 && lc->ready == 0 && !lc->closed, "a new listen comm is empty and open");
  struct mpib_comm *comm = NULL;
  int result = -1;
  CHECK(mpib_listen_pop(lc, &comm, &result) == 0, "nothing to accept yet");
  struct mpib_comm *c1 = (struct mpib_comm *)(uintptr_t)0x100, *c3 = (struct mpib_comm *)(uintptr_t)0x300;
  CHECK(mpib_listen_push(lc, c1, 0) == 0 && mpib_listen_push(lc, NULL, 6) == 0 && mpib_listen_push(lc, c3, 0) == 0,
        "push");
  CHECK(lc->ready == 3, "ready counts the queue: %d", lc->ready);
  CHECK(mpib_listen_pop(lc, &comm, &result) == 1 && comm == c1 && result == 0, "oldest first");
  CHECK(mpib_listen_pop(lc, &comm, &result) == 1 && comm == NULL && result == 6, "a failed handshake is an error");
  CHECK(mpib_listen_pop(lc, &comm, &result) == 1 && comm == c3, "then the third");
  CHECK(mpib_listen_pop(lc, &comm, &result) == 0 && lc->ready == 0, "empty again, ready %d", lc->ready);
  mpib_listen_close(lc);
  CHECK(lc->closed == 1, "close marks it for accept()");
  mpib_listen_comm_free(lc);
}

int main(void) {
  test_pending_lifecycle();
  test_pending_bad_handles();
  test_pending_forged_key();
  test_pending_race();
  test_listen_queue();
  if (failures == 0) printf("pending_test: ok\n");
  return failures != 0;
}
