//go:build ignore
// link: ../mpib_watch.c

/* The no-progress watch (mpib_watch.c mpib_watch_tick) on a fake clock, against the path word
 * it shares with the process's other comms on the same NIC and peer. Another comm may run on
 * another thread (each NCCL communicator has its own proxy thread): its acknowledgement can
 * land in the word between this tick's clock read and its load of the word, a time later than
 * the tick's own. That is progress on the path, never a wait of 2^64 ns. And the watch still
 * fails a rail whose path is silent past the limit. The comm is built by hand. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_watch.h"

#include "check.h"

struct mpib_global mpib_g;
static uint64_t fake_now = 5000000000ull;
static uint64_t path_word;
static uint64_t other_thread_acks_at; /* when not 0: the other comm's ack lands right after our clock read */
static int verdicts;
static char why[256];

uint64_t mpib_now_ns(void) {
  uint64_t t = fake_now;
  if (other_thread_acks_at) __atomic_store_n(&path_word, t + other_thread_acks_at, __ATOMIC_RELAXED);
  return t;
}
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line, (void)fmt;
}
ncclResult_t mpib_failover_rail_fail(struct mpib_comm *c, int r, const char *reason, const char *detail) {
  (void)c;
  verdicts++;
  snprintf(why, sizeof why, "rail %d %s: %s", r, reason, detail);
  return ncclSuccess;
}

/* A sender with one signalled write outstanding on SOUT, its path word shared. */
static struct mpib_comm *busy_sender(void) {
  static struct mpib_nic nic;
  struct mpib_comm *c = calloc(1, sizeof *c);
  c->nic[MPIB_RAIL_SOUT] = c->nic[MPIB_RAIL_SUP] = &nic;
  c->is_send = 1;
  c->nqps[MPIB_RAIL_SOUT] = 1;
  c->rail[MPIB_RAIL_SOUT] = (struct mpib_rail_ctl){.state = MPIB_RAIL_UP, .gen = 1};
  c->path_ack_ns[MPIB_RAIL_SOUT] = &path_word;
  c->pending[MPIB_RAIL_SOUT] = 1;
  return c;
}

static void another_thread_acks_after_our_clock_read(void) {
  struct mpib_comm *c = busy_sender();
  verdicts = 0;
  path_word = 0;
  other_thread_acks_at = 1000; /* 1 us after this thread read the clock */
  CHECK(mpib_watch_tick(c) == ncclSuccess, "first sight of the work");
  for (int i = 0; i < 100; i++) {
    fake_now += 3000; /* 3 us between ticks: 16 progress calls, no ack of this comm's own */
    CHECK(mpib_watch_tick(c) == ncclSuccess, "tick %d", i);
  }
  CHECK(verdicts == 0, "the path acked 1 us after each tick's clock read: want no verdict, got %d (%s)", verdicts, why);
  printf("watch: path-word-ahead-of-clock verdicts=%d\n", verdicts);
  other_thread_acks_at = 0;
  free(c);
}

static void a_silent_path_fails(void) {
  struct mpib_comm *c = busy_sender();
  verdicts = 0;
  path_word = fake_now - 100000000ull; /* the other comm's last ack, 100 ms ago */
  CHECK(mpib_watch_tick(c) == ncclSuccess, "first sight of the work");
  int ticks = 0;
  for (; ticks < 2000 && verdicts == 0; ticks++) {
    fake_now += 1000000ull; /* 1 ms between ticks, nothing acked anywhere */
    CHECK(mpib_watch_tick(c) == ncclSuccess, "tick");
  }
  CHECK(verdicts == 1 && ticks >= 500 && ticks <= 700,
        "a path silent past the 600 ms limit: want one verdict after about 600 ms, got %d after %d ms", verdicts,
        ticks);
  printf("watch: silent-path verdict_after_ms=%d\n", ticks);
  free(c);
}

int main(void) {
  mpib_g.detect_ms = 600;
  another_thread_acks_after_our_clock_read();
  a_silent_path_fails();
  return failures ? 1 : 0;
}
