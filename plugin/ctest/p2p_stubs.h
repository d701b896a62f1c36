/* What the message path (mpib_p2p.c with failover, watch and slots) needs from the rest of the
 * plugin, for a C test program that links the path alone on fake verbs: comm teardown, QP
 * transitions and rebuilds that do nothing, no flushes, no profiler; and a vanilla send comm
 * on the program's fake QPs and CQs. Defines them: include it in one file of the program.
 * The program defines mpib_g, mpib_prof_fn, mpib_now_ns and mpib_log itself (its clock and its
 * logging). */
#ifndef MPIB_CTEST_P2P_STUBS_H
#define MPIB_CTEST_P2P_STUBS_H

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpib.h"
#include "mpib_flush.h"
#include "mpib_profiler.h"

void mpib_comm_destroy(struct mpib_comm *c) { (void)c; } /* mpib_comm_close's last step (comm setup) */
int mpib_rail_to_error(struct mpib_comm *c, int rail) { return (void)c, (void)rail, 0; }
int mpib_rail_reconnect(struct mpib_comm *c, int rail, uint32_t psn) { return (void)c, (void)rail, (void)psn, 0; }
/* no flushes here */
ncclResult_t mpib_flush_test(struct mpib_comm *c, struct mpib_request *req) {
  return (void)c, (void)req, ncclInternalError;
}
/* No rebuild thread here: a recovery takes its in-line path (these programs keep recovery off
 * with a long back-off; the lab's fault tests run the thread), unless the program sets
 * stub_rebuild: STUB_REBUILD_RUNS starts a rebuild that is still running at every poll (its QPs
 * between RESET and RTS), STUB_REBUILD_DONE has the next poll find it finished. */
enum { STUB_REBUILD_INLINE, STUB_REBUILD_RUNS, STUB_REBUILD_DONE };
static int stub_rebuild;
int mpib_rail_rebuild_start(struct mpib_comm *c, int rail, uint32_t psn) {
  (void)psn;
  if (stub_rebuild == STUB_REBUILD_INLINE) return -EAGAIN;
  c->rail[rail].rebuild.running = 1;
  return 0;
}
int mpib_rail_rebuild_poll(struct mpib_comm *c, int rail, int *err) {
  if (stub_rebuild == STUB_REBUILD_RUNS) return 0;
  c->rail[rail].rebuild.running = 0;
  *err = stub_rebuild == STUB_REBUILD_DONE ? 0 : -EAGAIN;
  return 1;
}
const char *ibv_wc_status_str(enum ibv_wc_status status) { return (void)status, "fake"; }
void mpib_prof_send_posting(struct mpib_comm *c, int slot, int rail, uint32_t mask, const size_t *sout) {
  (void)c, (void)slot, (void)rail, (void)mask, (void)sout;
}
void mpib_prof_send_rail_done(struct mpib_comm *c, int slot, int rail) { (void)c, (void)slot, (void)rail; }
void mpib_prof_recv_posted(struct mpib_comm *c, struct mpib_request *req, void **ph, const size_t *sizes) {
  (void)c, (void)req, (void)ph, (void)sizes;
}
void mpib_prof_recv_rail_done(struct mpib_request *req, int rail) { (void)req, (void)rail; }

/* A vanilla intra-island send comm of fused device 0 (NICs 0 and 1): one QP and one lane per
 * rail, QP r on qp[r] and cq[r] of the program's fake context ctx, whose provider posts with
 * post_send and polls with poll_cq; registrations mr, both rails in service, no agent slot.
 * The program sets the policy it tests. */
static __attribute__((unused)) struct mpib_comm *
fake_send_comm(struct ibv_context *ctx, int (*post_send)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **),
               int (*poll_cq)(struct ibv_cq *, int, struct ibv_wc *), struct ibv_qp *qp, struct ibv_cq *cq,
               struct ibv_mr *mr) {
  ctx->ops.post_send = post_send;
  ctx->ops.poll_cq = poll_cq;
  struct mpib_comm *c = calloc(1, sizeof *c);
  for (int n = 0; n < MPIB_NRAILS; n++) c->nic[n] = &mpib_g.nic[n];
  c->sup_lanes = 1; /* one lane per rail: lane r is rail r's */
  c->is_send = 1;
  c->mode = MPIB_MODE_VANILLA;
  c->path_class = MPIB_PATH_INTRA_ISLAND;
  c->force_sup_bw = MPIB_NO_OVERRIDE;
  c->nreqs_pool = MPIB_REQ_POOL_SEND;
  c->sq_depth = MPIB_SEND_WR_SENDER;
  c->reqs = calloc((size_t)c->nreqs_pool, sizeof *c->reqs);
  c->cts = aligned_alloc(64, (MPIB_CTS_AREA + 63) / 64 * 64);
  memset(c->cts, 0, MPIB_CTS_AREA);
  c->sizes = calloc(1, MPIB_SIZES_AREA);
  c->ctrl_fd = -1;
  c->shm_slot = -1;
  c->hint_due = 1; /* as mpib_comm_create leaves it */
  for (int r = 0; r < MPIB_NRAILS; r++) {
    qp[r].context = cq[r].context = ctx;
    c->nqps[r] = 1;
    c->qps[mpib_qp_index(r, 0, 1, 1)] = (struct mpib_qp){.qp = &qp[r], .rail = r, .lane = r};
    c->cq[r] = &cq[r];
    c->stage_mr[r] = mr;
    c->rail[r] = (struct mpib_rail_ctl){.state = MPIB_RAIL_UP, .gen = 1};
  }
  return c;
}

/* A provider that takes every post and never completes anything, for programs that count
 * nothing on the NIC's side. */
static __attribute__((unused)) int fake_post_taken(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  return (void)q, (void)wr, (void)bad, 0;
}
static __attribute__((unused)) int fake_poll_empty(struct ibv_cq *q, int n, struct ibv_wc *wc) {
  return (void)q, (void)n, (void)wc, 0;
}

/* A vanilla inter-island receive comm of fused device 0: SOUT only, one QP on qp and cq of
 * the program's fake context ctx (provider as above), registrations mr, UP at generation 1,
 * idle, its control socket /dev/null (its messages are not read here). */
static __attribute__((unused)) struct mpib_comm *
fake_recv_comm(struct ibv_context *ctx, int (*post_send)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **),
               int (*poll_cq)(struct ibv_cq *, int, struct ibv_wc *), struct ibv_qp *qp, struct ibv_cq *cq,
               struct ibv_mr *mr) {
  ctx->ops.post_send = post_send;
  ctx->ops.poll_cq = poll_cq;
  qp->context = cq->context = ctx;
  struct mpib_comm *c = calloc(1, sizeof *c);
  for (int n = 0; n < MPIB_NRAILS; n++) c->nic[n] = &mpib_g.nic[n];
  c->sup_lanes = 1;
  c->mode = MPIB_MODE_VANILLA;
  c->path_class = MPIB_PATH_INTER_ISLAND;
  c->nreqs_pool = MPIB_REQ_POOL_RECV;
  c->reqs = calloc((size_t)c->nreqs_pool, sizeof *c->reqs);
  c->sq_depth = MPIB_SEND_WR_RECEIVER;
  c->cts = aligned_alloc(64, (MPIB_CTS_AREA + 63) / 64 * 64);
  memset(c->cts, 0, MPIB_CTS_AREA);
  c->sizes = calloc(1, MPIB_SIZES_AREA);
  c->ctrl_fd = open("/dev/null", O_WRONLY);
  c->shm_slot = -1;
  c->recv_idle_seq1 = 1;
  c->cts_rail = MPIB_RAIL_SOUT;
  c->nqps[MPIB_RAIL_SOUT] = 1;
  c->qps[0] = (struct mpib_qp){.qp = qp, .rail = MPIB_RAIL_SOUT, .lane = 0};
  c->cq[0] = cq;
  c->stage_mr[0] = mr;
  for (int r = 0; r < MPIB_NRAILS; r++) c->rail[r] = (struct mpib_rail_ctl){.state = MPIB_RAIL_UP, .gen = 1};
  return c;
}

/* Failover on, with the configuration's defaults (docs/configuration.md). */
static __attribute__((unused)) void fake_failover_defaults(void) {
  mpib_g.failover = 1;
  mpib_g.stall_timeout_ms = 30000;
  mpib_g.recovery_backoff_ms = 250;
  mpib_g.recovery_backoff_max_ms = 2000;
  mpib_g.failover_timeout_ms = 5000;
}

/* Frees a comm of fake_send_comm or fake_recv_comm. */
static __attribute__((unused)) void fake_comm_free(struct mpib_comm *c) {
  if (c->ctrl_fd >= 0) close(c->ctrl_fd);
  free(c->reqs);
  free(c->cts);
  free(c->sizes);
  free(c);
}

#endif
