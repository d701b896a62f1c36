//go:build ignore
// link: ../mpib_watch.c

/* The stuck report (mpib_watch.c mpib_watch_stuck_tick) on a fake clock: a comm NCCL keeps
 * calling that completes nothing for 10 s logs one warning saying what it waits for, never
 * before, never twice for one wait, and again for the next wait once something completed.
 * The comms are built by hand; no RDMA device is needed. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_watch.h"

#include "check.h"

struct mpib_global mpib_g;
static uint64_t fake_now = 5000000000ull;
static char logged[4096];
static int warnings;

uint64_t mpib_now_ns(void) { return fake_now; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)file, (void)line;
  if (level != NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(logged, sizeof logged, fmt, ap);
  va_end(ap);
  warnings++;
}
/* The no-progress watch's verdict (mpib_watch_tick): never reached here. */
ncclResult_t mpib_failover_rail_fail(struct mpib_comm *c, int r, const char *reason, const char *detail) {
  return (void)c, (void)r, (void)reason, (void)detail, ncclInternalError;
}

static const uint64_t SEC = 1000000000ull;

static struct mpib_comm *comm(int is_send) {
  struct mpib_comm *c = calloc(1, sizeof *c);
  c->is_send = is_send;
  c->nqps[MPIB_RAIL_SOUT] = c->nqps[MPIB_RAIL_SUP] = 1;
  c->sq_depth = 61;
  c->cts = calloc(MPIB_MAX_REQUESTS, sizeof *c->cts);
  for (int r = 0; r < MPIB_NRAILS; r++) c->rail[r].gen = 1;
  return c;
}

static void free_comm(struct mpib_comm *c) {
  free(c->cts);
  free(c);
}

static void test_sender_waiting_for_cts(void) {
  struct mpib_comm *c = comm(1);
  c->fifo_head = 2484;
  c->rail[MPIB_RAIL_SUP].state = MPIB_RAIL_DEAD;
  c->rail[MPIB_RAIL_SUP].gen = 2;
  c->sq_used[0] = 3;
  warnings = 0;
  mpib_watch_stuck_tick(c); /* arms the wait */
  fake_now += 9 * SEC;
  mpib_watch_stuck_tick(c);
  CHECK(warnings == 0, "reported after 9 s: %s", logged);
  fake_now += 2 * SEC;
  mpib_watch_stuck_tick(c);
  CHECK(warnings == 1, "%d warnings after 11 s, want 1", warnings);
  CHECK(strstr(logged, "send comm: nothing completed for 11 s") != NULL, "what: %s", logged);
  CHECK(strstr(logged, "next request seq 2484 (slot 20): its CTS has not landed") != NULL, "CTS: %s", logged);
  CHECK(strstr(logged, "SOUT up gen 1: 0 signalled pending, send queues 3/61 used") != NULL, "SOUT: %s", logged);
  CHECK(strstr(logged, "SUP dead gen 2") != NULL, "SUP: %s", logged);
  fake_now += 60 * SEC;
  mpib_watch_stuck_tick(c);
  CHECK(warnings == 1, "one wait reported %d times", warnings);
  c->progress_count++; /* something completed: the next wait is a new one */
  mpib_watch_stuck_tick(c);
  fake_now += 10 * SEC + 1;
  c->cts[20][0].seq = 2485; /* the CTS landed, the slot waits for room or its other requests */
  c->slot_posted_seq1[19] = 2484;
  c->slot_rails[19] = 1u << MPIB_RAIL_SOUT;
  mpib_watch_stuck_tick(c);
  CHECK(warnings == 2, "the second wait: %d warnings, want 2", warnings);
  CHECK(strstr(logged, "its CTS landed") != NULL, "CTS: %s", logged);
  CHECK(strstr(logged, "seq 2483 (originals 0x1") != NULL, "in flight: %s", logged);
  free_comm(c);
}

static void test_receiver_with_open_receive(void) {
  struct mpib_comm *c = comm(0);
  struct mpib_request req = {.seq = 99, .have_mask = 1, .expected_mask = 3};
  c->fifo_head = 100;
  c->recvs_open = 1;
  c->slot_reqs[99 % MPIB_MAX_REQUESTS][0] = &req;
  c->cts_rail = MPIB_RAIL_SOUT;
  warnings = 0;
  mpib_watch_stuck_tick(c);
  fake_now += 10 * SEC + 1;
  mpib_watch_stuck_tick(c);
  CHECK(warnings == 1, "%d warnings, want 1", warnings);
  CHECK(strstr(logged, "recv comm: nothing completed for 10 s") != NULL, "what: %s", logged);
  CHECK(strstr(logged, "next receive seq 100, 1 open: seq 99 (ranges 0x1 of 0x3); CTS on SOUT") != NULL, "open: %s",
        logged);
  free_comm(c);
}

int main(void) {
  test_sender_waiting_for_cts();
  test_receiver_with_open_receive();
  if (!failures) printf("stuck_report_test: ok\n");
  return failures != 0;
}
