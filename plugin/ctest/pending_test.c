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
  uint8_t h2[128];
  name_entry(h2, idx2, gen2);
  mpib_pending_finish(idx1, gen, fake, 0); /* the old attempt's finish, come late */
  CHECK(mpib_pending_poll(h2, &comm, &result) == 1, "a late finish of the old generation leaves the new one running");
  mpib_pending_finish(idx2, gen2, NULL, 6 /* ncclRemoteError */);
  mpib_pending_finish(idx1, gen, fake, 0); /* and once more, after the new one ended */
  CHECK(mpib_pending_poll(handle, &comm, &result) == 0, "nor take its result");
  CHECK(mpib_pending_take(idx2, gen2, &comm, &result) == 1 && comm == NULL && result == 6,
        "a reclaim takes an uncollected error (got %d)", result);
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

/* Four threads take and free entries at once, 5,000 times each, through the lock-free free
 * stack: no entry is ever held by two of them, and none is lost (the table's high-water mark
 * stays at the most held at once). */
#define CHURN_THREADS 4
static uint32_t churn_owner[MPIB_PENDING_MAX];
static int churn_dups;
static void *churn(void *arg) {
  uint32_t me = (uint32_t)(uintptr_t)arg;
  for (int i = 0; i < 5000; i++) {
    uint32_t gen = 0, idx1 = mpib_pending_acquire(honest_key, &gen);
    uint32_t free_owner = 0;
    if (idx1 == 0 ||
        !__atomic_compare_exchange_n(&churn_owner[idx1 - 1], &free_owner, me, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      __atomic_add_fetch(&churn_dups, 1, __ATOMIC_RELAXED);
      continue;
    }
    mpib_pending_finish(idx1, gen, (struct mpib_comm *)(uintptr_t)0x20, 0);
    __atomic_store_n(&churn_owner[idx1 - 1], 0, __ATOMIC_RELEASE);
    struct mpib_comm *comm;
    int result;
    if (!mpib_pending_take(idx1, gen, &comm, &result)) __atomic_add_fetch(&churn_dups, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

static void test_pending_concurrent_free_list(void) {
  pthread_t t[CHURN_THREADS];
  for (int i = 0; i < CHURN_THREADS; i++) pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1));
  for (int i = 0; i < CHURN_THREADS; i++) pthread_join(t[i], NULL);
  CHECK(churn_dups == 0, "%d entries handed out twice at once, lost or not taken", churn_dups);
  /* Every entry is free again: as many acquires as threads find entries below the high-water
   * mark the threads could reach (the earlier tests hold none). */
  uint32_t held[CHURN_THREADS + 8], gens[CHURN_THREADS + 8], most = 0;
  for (int i = 0; i < CHURN_THREADS + 8; i++) {
    held[i] = mpib_pending_acquire(honest_key, &gens[i]);
    most = held[i] > most ? held[i] : most;
  }
  CHECK(most <= CHURN_THREADS + 8 + 4, "entries leaked from the free list: entry %u handed out", most);
  for (int i = 0; i < CHURN_THREADS + 8; i++) {
    struct mpib_comm *comm;
    int result;
    mpib_pending_finish(held[i], gens[i], NULL, 0);
    mpib_pending_take(held[i], gens[i], &comm, &result);
  }
}

/* Connects queued from three threads at once reach the dispatcher each exactly once, each
 * thread's in the order it queued them. */
#define CQ_THREADS 3
#define CQ_EACH 300
static void *queue_connects(void *arg) {
  int producer = (int)(uintptr_t)arg;
  for (int i = 0; i < CQ_EACH; i++) {
    uint8_t handle[128] = {0};
    if (!mpib_connect_enqueue((uint64_t)producer, i, 0, handle)) return (void *)1;
  }
  return NULL;
}

static void test_connect_queue(void) {
  CHECK(mpib_connect_queue_open() >= 0, "the connect queue's eventfd");
  pthread_t t[CQ_THREADS];
  for (int i = 0; i < CQ_THREADS; i++) pthread_create(&t[i], NULL, queue_connects, (void *)(uintptr_t)i);
  int next[CQ_THREADS] = {0}, got = 0, bad = 0, done = 0;
  while (done < CQ_THREADS || got < CQ_THREADS * CQ_EACH) { /* the dispatcher, while they queue */
    struct mpib_connect_req req;
    if (!mpib_connect_dequeue(&req)) {
      if (done < CQ_THREADS) {
        for (int i = 0; i < CQ_THREADS; i++) pthread_join(t[i], NULL);
        done = CQ_THREADS;
        continue;
      }
      break;
    }
    got++;
    if (req.ctx >= CQ_THREADS || req.dev != next[req.ctx]++) bad++;
    struct mpib_comm *comm;
    int result;
    mpib_pending_finish(req.idx1, req.gen, NULL, 0);
    mpib_pending_take(req.idx1, req.gen, &comm, &result);
  }
  CHECK(got == CQ_THREADS * CQ_EACH && bad == 0, "dequeued %d of %d, %d out of order", got, CQ_THREADS * CQ_EACH, bad);
}

/* accept() never waits for the queue's lock: while another taker holds it, it finds nothing
 * (NCCL calls again), and then gets the handshake. */
static void test_listen_try_pop(void) {
  struct mpib_listen_comm *lc = mpib_listen_comm_new(8);
  struct mpib_comm *comm = NULL, *c1 = (struct mpib_comm *)(uintptr_t)0x100;
  int result = -1;
  CHECK(mpib_listen_push(lc, c1, 0) == 0 && lc->ready == 1, "pushed");
  pthread_mutex_lock(&lc->mu);
  CHECK(mpib_listen_try_pop(lc, &comm, &result) == 0 && lc->ready == 1, "the lock held: nothing, and nothing lost");
  pthread_mutex_unlock(&lc->mu);
  CHECK(mpib_listen_try_pop(lc, &comm, &result) == 1 && comm == c1, "then the handshake");
  mpib_listen_comm_free(lc);
}

/* Handshakes pushed from three threads at once, accept() taking them meanwhile: each once,
 * each thread's in the order it pushed them. */
struct lq_arg {
  struct mpib_listen_comm *lc;
  int producer;
};
static void *push_handshakes(void *arg) {
  struct lq_arg *a = arg;
  for (int i = 0; i < CQ_EACH; i++)
    mpib_listen_push(a->lc, (struct mpib_comm *)(uintptr_t)(0x1000 + i * 8), a->producer);
  return NULL;
}

static void test_listen_concurrent(void) {
  struct mpib_listen_comm *lc = mpib_listen_comm_new(9);
  pthread_t t[CQ_THREADS];
  struct lq_arg args[CQ_THREADS];
  for (int i = 0; i < CQ_THREADS; i++) {
    args[i] = (struct lq_arg){lc, i};
    pthread_create(&t[i], NULL, push_handshakes, &args[i]);
  }
  int next[CQ_THREADS] = {0}, got = 0, bad = 0;
  for (int spins = 0; got < CQ_THREADS * CQ_EACH && spins < 100000000; spins++) {
    struct mpib_comm *comm;
    int producer;
    if (!mpib_listen_try_pop(lc, &comm, &producer)) continue;
    got++;
    if (producer < 0 || producer >= CQ_THREADS ||
        comm != (struct mpib_comm *)(uintptr_t)(0x1000 + next[producer]++ * 8))
      bad++;
  }
  for (int i = 0; i < CQ_THREADS; i++) pthread_join(t[i], NULL);
  CHECK(got == CQ_THREADS * CQ_EACH && bad == 0 && lc->ready == 0, "accepted %d of %d, %d out of order, ready %d", got,
        CQ_THREADS * CQ_EACH, bad, lc->ready);
  mpib_listen_comm_free(lc);
}

int main(void) {
  test_pending_lifecycle();
  test_pending_bad_handles();
  test_pending_forged_key();
  test_pending_race();
  test_pending_concurrent_free_list();
  test_connect_queue();
  test_listen_queue();
  test_listen_try_pop();
  test_listen_concurrent();
  if (failures == 0) printf("pending_test: ok\n");
  return failures != 0;
}
