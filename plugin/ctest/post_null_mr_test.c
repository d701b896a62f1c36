//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_shm_*.c

/* A buffer registered after one NIC of its fused device died has no registration on that NIC
 * (mr_register skips a dead device). A send whose chain goes on that NIC's rail, before the
 * comm's health check has taken the rail out of service, must not post with a NULL
 * registration (a crash): the rail refuses the chain, and it fails over (failover on) or the
 * send fails with a message (failover off). FAKE verbs: a vanilla intra-island sender whose
 * 4 KiB message goes whole to SUP. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_p2p.h"

#include "check.h"

struct mpib_global mpib_g;
ncclProfilerCallback_t mpib_prof_fn;
static uint64_t fake_now = 1000000000ull;
uint64_t mpib_now_ns(void) { return fake_now += 1000; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line, (void)fmt;
}
#include "p2p_stubs.h"

static struct ibv_context ctx;
static struct ibv_qp qp[MPIB_NRAILS];
static struct ibv_cq cq[MPIB_NRAILS];
static struct ibv_mr mr = {.lkey = 1, .rkey = 2};
static int posted[MPIB_NRAILS];

static int count_post(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  (void)wr, (void)bad;
  posted[q - qp]++;
  return 0;
}

/* One isend of 4 KiB whose CTS has landed, with a handle registered on SOUT only. */
static ncclResult_t send_without_sup_registration(struct mpib_comm *c, void **req) {
  static char buf[4096];
  static struct mpib_mr mh = {.mr = {&mr, NULL}}; /* SUP's device died before the registration */
  struct mpib_cts *e = &c->cts[c->fifo_head % MPIB_MAX_REQUESTS][0];
  *e = (struct mpib_cts){
      .addr = 0x10000, .size = sizeof buf, .rkey = {11, 12}, .tag = 7, .nreqs = 1, .seq = c->fifo_head + 1};
  e->check = mpib_cts_check(e);
  return mpib_isend(c, buf, sizeof buf, 7, &mh, NULL, req);
}

int main(void) {
  fake_failover_defaults();
  struct mpib_comm *c = fake_send_comm(&ctx, count_post, fake_poll_empty, qp, cq, &mr);
  c->whole_msg_max = 65536;
  void *req = NULL;
  ncclResult_t res = send_without_sup_registration(c, &req);
  CHECK(res == ncclSuccess && req != NULL && posted[MPIB_RAIL_SUP] == 0 && c->rail[MPIB_RAIL_SUP].state != MPIB_RAIL_UP,
        "failover on: want the send taken and SUP out of service with nothing posted there, got res %d, request %p, "
        "%d posts on SUP, SUP state %d",
        res, req, posted[MPIB_RAIL_SUP], c->rail[MPIB_RAIL_SUP].state);
  printf("post-null-mr: failover=on res=%d sup_state=%d sup_posts=%d\n", res, c->rail[MPIB_RAIL_SUP].state,
         posted[MPIB_RAIL_SUP]);

  mpib_g.failover = 0;
  struct mpib_comm *d = fake_send_comm(&ctx, count_post, fake_poll_empty, qp, cq, &mr);
  d->whole_msg_max = 65536;
  posted[MPIB_RAIL_SUP] = 0;
  req = NULL;
  res = send_without_sup_registration(d, &req);
  CHECK(res == ncclSystemError && posted[MPIB_RAIL_SUP] == 0,
        "failover off: want ncclSystemError with nothing posted, got res %d, %d posts on SUP", res,
        posted[MPIB_RAIL_SUP]);
  printf("post-null-mr: failover=off res=%d\n", res);
  fake_comm_free(c);
  fake_comm_free(d);
  return failures ? 1 : 0;
}
