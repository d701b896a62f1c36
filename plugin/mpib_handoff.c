/* Handshake results on their way to NCCL's calls: the pending connect attempts (a handle names
 * one), the queue of fresh connects for the control plane's dispatcher, and the finished
 * handshakes queued on a listen comm for accept. Called by connect() and accept()
 * (abi_common.c) and by the Go control plane (conn.go, listen.go); offers what mpib_handoff.h
 * declares. Bookkeeping only: no verbs. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

#include "mpib.h"
#include "mpib_clock.h"
#include "mpib_handoff.h"

/* No lock here is ever taken by both NCCL's calls and a thread of the control plane: a lock
 * holder the kernel deschedules would hold NCCL's proxy thread with it (a connect() that waited
 * 23 ms behind the dispatcher in the lab's 512-comm run). The free entries and the connect queue
 * are lock-free stacks; a listen comm's queue is pushed lock-free, and accept() only tries the
 * lock its takers share. */
static struct mpib_pending pending_tab[MPIB_PENDING_MAX];
/* The free entries, a stack: its top is tag << 32 | index + 1 (0: empty), the tag counting every
 * change so that a pop that read a stale next cannot succeed (ABA); pending_next holds, under
 * each free entry, the one freed before it. */
static uint64_t pending_free_top;
static uint32_t pending_next[MPIB_PENDING_MAX];
static uint32_t pending_used; /* entries ever handed out: the table's high-water mark */

static uint64_t pending_word(uint32_t gen, int state) { return (uint64_t)gen << 32 | (uint32_t)state; }

/* An entry's first generation is random, so that a corrupt or forged handle cannot name a
 * live attempt (and take its comm) by guessing small numbers. */
static uint32_t pending_first_gen(uint32_t idx1) {
  uint32_t g = 0;
  if (getrandom(&g, sizeof g, GRND_NONBLOCK) != (ssize_t)sizeof g) {
    uint64_t x = mpib_now_ns() ^ ((uint64_t)idx1 << 32);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    g = (uint32_t)(x ^ (x >> 29));
  }
  return g;
}

static void pending_key(const void *handle, uint64_t key[MPIB_HANDLE_KEY_WORDS]) {
  memcpy(key, handle, MPIB_HANDLE_KEY_WORDS * sizeof key[0]);
}

/* The key words are atomics: a poll of a stale handle may read them while the entry is re-armed
 * (it then fails the generation check anyway). */
static int pending_key_matches(const struct mpib_pending *p, const void *handle) {
  uint64_t want[MPIB_HANDLE_KEY_WORDS];
  pending_key(handle, want);
  for (int i = 0; i < MPIB_HANDLE_KEY_WORDS; i++)
    if (__atomic_load_n(&p->key[i], __ATOMIC_RELAXED) != want[i]) return 0;
  return 1;
}

static uint64_t free_top(uint64_t top, uint32_t idx1) { return ((top >> 32) + 1) << 32 | idx1; }

static uint32_t pending_pop_free(void) {
  uint64_t top = __atomic_load_n(&pending_free_top, __ATOMIC_ACQUIRE);
  for (;;) {
    uint32_t idx1 = (uint32_t)top;
    if (idx1 == 0) return 0;
    uint32_t next = __atomic_load_n(&pending_next[idx1 - 1], __ATOMIC_RELAXED);
    if (__atomic_compare_exchange_n(&pending_free_top, &top, free_top(top, next), 1, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      return idx1;
  }
}

static void pending_push_free(uint32_t idx1) {
  uint64_t top = __atomic_load_n(&pending_free_top, __ATOMIC_RELAXED);
  do {
    __atomic_store_n(&pending_next[idx1 - 1], (uint32_t)top, __ATOMIC_RELAXED);
  } while (!__atomic_compare_exchange_n(&pending_free_top, &top, free_top(top, idx1), 1, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED));
}

/* A free entry, else one never used yet: index + 1, 0 when the table is full. */
static uint32_t pending_alloc(void) {
  uint32_t idx1 = pending_pop_free();
  if (idx1) return idx1;
  uint32_t used = __atomic_load_n(&pending_used, __ATOMIC_RELAXED);
  while (used < MPIB_PENDING_MAX &&
         !__atomic_compare_exchange_n(&pending_used, &used, used + 1, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
  return used < MPIB_PENDING_MAX ? used + 1 : 0;
}

uint32_t mpib_pending_acquire(const void *handle, uint32_t *gen) {
  uint32_t idx1 = pending_alloc();
  if (idx1 == 0) return 0;
  struct mpib_pending *p = &pending_tab[idx1 - 1];
  uint32_t last = (uint32_t)(__atomic_load_n(&p->word, __ATOMIC_RELAXED) >> 32);
  *gen = last ? last + 1 : pending_first_gen(idx1);
  if (*gen == 0) *gen = 1; /* 0 never names an entry */
  p->comm = NULL;
  p->result = 0;
  uint64_t key[MPIB_HANDLE_KEY_WORDS];
  pending_key(handle, key);
  for (int i = 0; i < MPIB_HANDLE_KEY_WORDS; i++) __atomic_store_n(&p->key[i], key[i], __ATOMIC_RELAXED);
  __atomic_store_n(&p->word, pending_word(*gen, MPIB_PENDING_RUNNING), __ATOMIC_RELEASE);
  return idx1;
}

void mpib_pending_finish(uint32_t idx1, uint32_t gen, struct mpib_comm *comm, int result) {
  struct mpib_pending *p = &pending_tab[idx1 - 1];
  uint64_t running = pending_word(gen, MPIB_PENDING_RUNNING);
  /* Only the attempt's own generation, still running, is written: a finish that came late for
   * an entry already taken and armed again must not overwrite the next attempt's result. Its
   * one finisher is the only writer while it runs, so the check holds until the swap. */
  if (__atomic_load_n(&p->word, __ATOMIC_ACQUIRE) != running) return;
  p->comm = comm;
  p->result = result;
  __atomic_compare_exchange_n(&p->word, &running, pending_word(gen, MPIB_PENDING_DONE), 0, __ATOMIC_RELEASE,
                              __ATOMIC_RELAXED);
}

int mpib_pending_take(uint32_t idx1, uint32_t gen, struct mpib_comm **comm, int *result) {
  if (idx1 == 0 || idx1 > MPIB_PENDING_MAX) return 0;
  struct mpib_pending *p = &pending_tab[idx1 - 1];
  uint64_t want = pending_word(gen, MPIB_PENDING_DONE);
  if (!__atomic_compare_exchange_n(&p->word, &want, pending_word(gen, MPIB_PENDING_FREE), 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return 0;
  *comm = p->comm;
  *result = p->result;
  pending_push_free(idx1);
  return 1;
}

int mpib_pending_collected(uint32_t idx1, uint32_t gen) {
  if (idx1 == 0 || idx1 > MPIB_PENDING_MAX) return 0;
  uint64_t w = __atomic_load_n(&pending_tab[idx1 - 1].word, __ATOMIC_ACQUIRE);
  return w != pending_word(gen, MPIB_PENDING_RUNNING) && w != pending_word(gen, MPIB_PENDING_DONE);
}

int mpib_pending_poll(const void *handle, struct mpib_comm **comm, int *result) {
  uint32_t idx1, gen;
  memcpy(&idx1, (const uint8_t *)handle + MPIB_HANDLE_PENDING_OFFSET, 4);
  memcpy(&gen, (const uint8_t *)handle + MPIB_HANDLE_PENDING_OFFSET + 4, 4);
  if (idx1 == 0 || idx1 > MPIB_PENDING_MAX) return 0;
  const struct mpib_pending *p = &pending_tab[idx1 - 1];
  uint64_t w = __atomic_load_n(&p->word, __ATOMIC_ACQUIRE);
  if ((w >> 32) != gen || !pending_key_matches(p, handle)) return 0;
  if (w == pending_word(gen, MPIB_PENDING_RUNNING)) return 1;
  return mpib_pending_take(idx1, gen, comm, result) ? 2 : 0;
}

/* The connect queue: connect() pushes onto creq_pushed (newest first, lock-free); the
 * dispatcher takes the whole stack at once and keeps it, oldest first, in creq_taken. creq_mu is
 * the control plane's alone (the eventfd's creation, the taken list). */
static struct mpib_connect_req *creq_pushed;
static pthread_mutex_t creq_mu = PTHREAD_MUTEX_INITIALIZER;
static struct mpib_connect_req *creq_taken;
static int creq_fd = -1;

int mpib_connect_queue_open(void) {
  pthread_mutex_lock(&creq_mu);
  if (__atomic_load_n(&creq_fd, __ATOMIC_RELAXED) < 0)
    __atomic_store_n(&creq_fd, eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), __ATOMIC_RELEASE);
  int fd = creq_fd;
  pthread_mutex_unlock(&creq_mu);
  return fd;
}

int mpib_connect_enqueue(uint64_t ctx, int dev, int traffic_class, void *handle) {
  int fd = __atomic_load_n(&creq_fd, __ATOMIC_ACQUIRE);
  if (fd < 0) return 0;
  struct mpib_connect_req *q = malloc(sizeof *q);
  if (!q) return 0;
  uint32_t gen = 0, idx1 = mpib_pending_acquire(handle, &gen);
  if (idx1 == 0) {
    free(q);
    return 0;
  }
  *q = (struct mpib_connect_req){.ctx = ctx, .dev = dev, .traffic_class = traffic_class, .idx1 = idx1, .gen = gen};
  memcpy(q->handle, handle, sizeof q->handle);
  memcpy((uint8_t *)handle + MPIB_HANDLE_PENDING_OFFSET, &idx1, 4); /* the next connect() polls the entry */
  memcpy((uint8_t *)handle + MPIB_HANDLE_PENDING_OFFSET + 4, &gen, 4);
  q->next = __atomic_load_n(&creq_pushed, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&creq_pushed, &q->next, q, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {}
  uint64_t one = 1;
  ssize_t n = write(fd, &one, sizeof one); /* wakes the dispatcher; EAGAIN: it is awake already */
  (void)n;
  return 1;
}

/* A stack (newest first) reversed: oldest first. */
static struct mpib_connect_req *creq_reversed(struct mpib_connect_req *q) {
  struct mpib_connect_req *out = NULL;
  while (q) {
    struct mpib_connect_req *next = q->next;
    q->next = out;
    out = q;
    q = next;
  }
  return out;
}

int mpib_connect_dequeue(struct mpib_connect_req *out) {
  pthread_mutex_lock(&creq_mu);
  if (!creq_taken) creq_taken = creq_reversed(__atomic_exchange_n(&creq_pushed, NULL, __ATOMIC_ACQUIRE));
  struct mpib_connect_req *q = creq_taken;
  if (q) creq_taken = q->next;
  pthread_mutex_unlock(&creq_mu);
  if (!q) return 0;
  *out = *q;
  out->next = NULL;
  free(q);
  return 1;
}

struct mpib_listen_comm *mpib_listen_comm_new(uint64_t id) {
  struct mpib_listen_comm *lc = calloc(1, sizeof *lc);
  if (!lc) return NULL;
  lc->id = id;
  pthread_mutex_init(&lc->mu, NULL);
  return lc;
}

void mpib_listen_comm_free(struct mpib_listen_comm *lc) {
  if (!lc) return;
  /* The control plane drained the queue when it closed the listener (its comms are Go's to
   * close): nothing is left here but the lock. */
  pthread_mutex_destroy(&lc->mu);
  free(lc);
}

int mpib_listen_push(struct mpib_listen_comm *lc, struct mpib_comm *comm, int result) {
  struct mpib_ready *r = malloc(sizeof *r);
  if (!r) return -ENOMEM;
  *r = (struct mpib_ready){.comm = comm, .result = result};
  r->next = __atomic_load_n(&lc->pushed, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&lc->pushed, &r->next, r, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {}
  __atomic_add_fetch(&lc->ready, 1, __ATOMIC_RELEASE); /* after the push: a taker that sees it finds it */
  return 0;
}

void mpib_listen_close(struct mpib_listen_comm *lc) { __atomic_store_n(&lc->closed, 1, __ATOMIC_RELEASE); }

/* The oldest finished handshake, with lc->mu held. */
static int listen_take(struct mpib_listen_comm *lc, struct mpib_comm **comm, int *result) {
  if (!lc->taken) {
    struct mpib_ready *q = __atomic_exchange_n(&lc->pushed, NULL, __ATOMIC_ACQUIRE), *oldest_first = NULL;
    while (q) { /* pushed newest first */
      struct mpib_ready *next = q->next;
      q->next = oldest_first;
      oldest_first = q;
      q = next;
    }
    lc->taken = oldest_first;
  }
  struct mpib_ready *r = lc->taken;
  if (!r) return 0;
  lc->taken = r->next;
  __atomic_sub_fetch(&lc->ready, 1, __ATOMIC_RELEASE);
  *comm = r->comm;
  *result = r->result;
  free(r);
  return 1;
}

int mpib_listen_pop(struct mpib_listen_comm *lc, struct mpib_comm **comm, int *result) {
  pthread_mutex_lock(&lc->mu);
  int got = listen_take(lc, comm, result);
  pthread_mutex_unlock(&lc->mu);
  return got;
}

int mpib_listen_try_pop(struct mpib_listen_comm *lc, struct mpib_comm **comm, int *result) {
  if (pthread_mutex_trylock(&lc->mu) != 0) return 0;
  int got = listen_take(lc, comm, result);
  pthread_mutex_unlock(&lc->mu);
  return got;
}
