//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_shm_*.c shm_agent.c shm_decode.c

/* The sender's confirm record of a fenced rail reaches the receiver in two copies, an RDMA
 * write and the control socket, which keep their last records. When the two hold different
 * records (a newer confirm went over the control socket only, during a ride-through), each is
 * applied once, not one after the other at every tick for as long as the rail stays out of
 * service (for good, once it is dead): a 512-byte copy, a hash, a pass over the slots and an
 * INFO line per tick. On fake verbs: a receive open in slot 0, its rail dead, a confirm of
 * one of its two ranges in each copy; the ticks' "confirmed by the sender" lines are
 * counted. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_failover.h"
#include "../mpib_p2p.h"
#include "../mpib_profiler.h"
#include "../mpib_slots.h"

#include "check.h"

struct mpib_global mpib_g;
ncclProfilerCallback_t mpib_prof_fn;
static int confirmed_lines;
uint64_t mpib_now_ns(void) { return 5000000000ull; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line;
  if (strstr(fmt, "confirmed by the sender")) confirmed_lines++;
}
#include "p2p_stubs.h"

static struct ibv_context ctx;
static struct ibv_qp qp;
static struct ibv_cq cq;
static struct ibv_mr mr;
static struct mpib_comm *c;

/* A confirm of fenced generation gen: range 1 of slot 0's two (sequence 0). */
static void confirm(volatile struct mpib_confirm_rec *out, uint64_t gen) {
  struct mpib_confirm_rec r;
  memset(&r, 0, sizeof r);
  r.gen = gen;
  r.seq1[0] = 1;
  r.ranges[0] = 1;
  r.full[0] = 3;
  r.imm_size[0] = MPIB_IMM_NO_SIZE;
  r.check = mpib_confirm_check(&r);
  memcpy((void *)out, &r, sizeof r);
}

int main(void) {
  fake_failover_defaults();
  c = fake_recv_comm(&ctx, fake_post_taken, fake_poll_empty, &qp, &cq, &mr);
  struct mpib_mr mh = {.mr = {&mr}, .fdev = 0};
  static char buf[4096];
  void *data[1] = {buf}, *mhs[1] = {&mh}, *req = NULL;
  size_t sizes[1] = {sizeof buf};
  int tags[1] = {7};
  CHECK(mpib_irecv(c, 1, data, sizes, tags, mhs, NULL, &req) == ncclSuccess && req != NULL, "the receive");
  c->rail[MPIB_RAIL_SOUT].state = MPIB_RAIL_DEAD;
  confirm(mpib_confirm_area(c, MPIB_RAIL_SOUT), 1);
  confirm(&c->tcp_confirm[MPIB_RAIL_SOUT], 2);
  for (int tick = 0; tick < 10; tick++) CHECK(mpib_failover_tick(c) == ncclSuccess, "tick %d", tick);
  CHECK(confirmed_lines >= 1 && confirmed_lines <= 2, "%d ticks applied a confirm, want each copy's once (at most 2)",
        confirmed_lines);
  if (failures == 0) printf("confirm_copies: ok (%d applied)\n", confirmed_lines);
  return failures != 0;
}
