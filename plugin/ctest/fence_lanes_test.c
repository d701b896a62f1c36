//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_rebuild.c ../mpib_shm_*.c

/* The fence of a striped rail on FAKE verbs (mpib_failover.c and mpib_rebuild.c unchanged,
 * ibv_modify_qp stubbed): the SUP rail stripes over two lanes on two devices (lane 1: SUP port
 * 0, lane 2: SUP port 1; SUP QP q on lane 1 + q mod 2). When one lane's device dies and the
 * rail fails over, the QPs of the lane that lives must reach IBV_QPS_ERR: the fence record
 * reports what has not arrived, a replay re-sends it, and nothing more of the rail may land
 * after the fence. The dead lane's QPs get no command (a dead device takes none). Either lane
 * dead, on either end. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_failover.h"
#include "../mpib_flush.h"
#include "../mpib_p2p.h"
#include "../mpib_profiler.h"

#include "check.h"

struct mpib_global mpib_g;
ncclProfilerCallback_t mpib_prof_fn;
static uint64_t fake_now = 1000000000ull;
uint64_t mpib_now_ns(void) { return fake_now += 1000; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line, (void)fmt;
}
void mpib_comm_destroy(struct mpib_comm *c) { (void)c; }
ncclResult_t mpib_flush_test(struct mpib_comm *c, struct mpib_request *req) {
  return (void)c, (void)req, ncclInternalError;
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
/* Comm setup's QP helpers that rail rebuild links against; no rebuild runs here. */
int mpib_qp_reset_to_init(const struct mpib_comm *c, struct ibv_qp *qp, int lane, int access) {
  return (void)c, (void)qp, (void)lane, (void)access, 0;
}
int mpib_qp_connect(struct mpib_comm *c, struct ibv_qp *qp, int lane, uint32_t rem_qpn,
                    const struct mpib_rail_info *rem, enum ibv_mtu mtu, uint8_t tc, uint32_t psn) {
  return (void)c, (void)qp, (void)lane, (void)rem_qpn, (void)rem, (void)mtu, (void)tc, (void)psn, 0;
}
int mpib_lane_gid_refresh(struct mpib_comm *c, int lane) { return (void)c, (void)lane, 0; }
int mpib_neigh_warm(const uint8_t gid[16]) { return (void)gid, 0; }
uint8_t mpib_qp_traffic_class(const struct mpib_comm *c) { return (void)c, 0; }
int mpib_rail_base(const struct mpib_comm *c, int r) { return r == MPIB_RAIL_SOUT ? 0 : (int)c->nqps[MPIB_RAIL_SOUT]; }

/* ---- fake verbs: lanes 0 (SOUT), 1 and 2 (SUP ports 0 and 1); QP transitions recorded ---- */

enum { NL = 3, NSUP = 4, NQ = 1 + NSUP };
static struct ibv_context ctx;
static struct ibv_qp qp[NQ];
static struct ibv_cq cq[NL];
static struct ibv_mr mr = {.lkey = 1, .rkey = 2};
static int modified[NQ]; /* ibv_modify_qp calls per QP */

int ibv_modify_qp(struct ibv_qp *q, struct ibv_qp_attr *attr, int mask) {
  if (mask & IBV_QP_STATE) q->state = attr->qp_state;
  modified[q - qp]++;
  return 0;
}
static int fake_post_send(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  return (void)q, (void)wr, (void)bad, 0;
}
static int fake_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc) { return (void)c, (void)n, (void)wc, 0; }

/* A vanilla intra-island comm (sender or receiver) whose SUP rail stripes over lanes 1 and 2,
 * every QP in RTS, both rails UP at generation 1, the CTS on SOUT. */
static struct mpib_comm *striped_comm(int is_send) {
  memset(modified, 0, sizeof modified);
  for (int l = 0; l < NL; l++) {
    mpib_g.nic[l] = (struct mpib_nic){0};
    snprintf(mpib_g.nic[l].name, sizeof mpib_g.nic[l].name, "nic%d", l);
  }
  struct mpib_comm *c = calloc(1, sizeof *c);
  c->is_send = is_send;
  c->sup_lanes = 2;
  c->lane_port[2] = 1;
  c->mode = MPIB_MODE_VANILLA;
  c->path_class = MPIB_PATH_INTRA_ISLAND;
  c->force_sup_bw = MPIB_NO_OVERRIDE;
  c->cts_rail = MPIB_RAIL_SOUT;
  c->nreqs_pool = is_send ? MPIB_REQ_POOL_SEND : MPIB_REQ_POOL_RECV;
  c->reqs = calloc((size_t)c->nreqs_pool, sizeof *c->reqs);
  c->sq_depth = is_send ? MPIB_SEND_WR_SENDER : MPIB_SEND_WR_RECEIVER;
  c->cts = aligned_alloc(64, (MPIB_NIC_AREA + 63) / 64 * 64);
  memset(c->cts, 0, MPIB_NIC_AREA);
  c->sizes = (mpib_sizes_row *)((char *)c->cts + MPIB_SIZES_OFFSET);
  c->ctrl_fd = -1;
  c->shm_slot = -1;
  c->recv_idle_seq1 = 1;
  c->nqps[MPIB_RAIL_SOUT] = 1;
  c->nqps[MPIB_RAIL_SUP] = NSUP;
  for (int q = 0; q < NQ; q++) {
    qp[q].context = &ctx;
    qp[q].state = IBV_QPS_RTS;
    int lane = q == 0 ? 0 : 1 + (q - 1) % 2;
    c->qps[q] = (struct mpib_qp){.qp = &qp[q], .rail = mpib_lane_rail(lane), .lane = lane};
  }
  for (int l = 0; l < NL; l++) {
    c->nic[l] = &mpib_g.nic[l];
    cq[l].context = &ctx;
    c->cq[l] = &cq[l];
    c->stage_mr[l] = &mr;
  }
  for (int r = 0; r < MPIB_NRAILS; r++) c->rail[r] = (struct mpib_rail_ctl){.state = MPIB_RAIL_UP, .gen = 1};
  return c;
}

/* Lane `dead`'s device dies; the health check fails SUP over to SOUT. */
static void one_lane_dies(int is_send, int dead) {
  struct mpib_comm *c = striped_comm(is_send);
  mpib_g.nic[dead].fatal = 1;
  ncclResult_t res = mpib_failover_health_check(c);
  CHECK(res == ncclSuccess && c->rail[MPIB_RAIL_SUP].state != MPIB_RAIL_UP,
        "%s, lane %d dead: SUP fails over (res %d, state %d)", is_send ? "sender" : "receiver", dead, res,
        c->rail[MPIB_RAIL_SUP].state);
  int live_err = 0, live = 0, dead_cmds = 0;
  for (int q = 1; q < NQ; q++) {
    if (c->qps[q].lane == dead) {
      dead_cmds += modified[q];
      continue;
    }
    live++;
    live_err += qp[q].state == IBV_QPS_ERR;
  }
  CHECK(live_err == live, "%s, lane %d dead: the live lane's %d SUP QPs must reach IBV_QPS_ERR at the fence, %d did",
        is_send ? "sender" : "receiver", dead, live, live_err);
  CHECK(dead_cmds == 0, "%s, lane %d dead: its QPs got %d commands (a dead device takes none)",
        is_send ? "sender" : "receiver", dead, dead_cmds);
  CHECK(qp[0].state == IBV_QPS_RTS, "SOUT's QP stays in service");
  printf("fence-lanes: side=%s dead_lane=%d live_qps=%d live_qps_in_error=%d\n", is_send ? "send" : "recv", dead, live,
         live_err);
  free(c->reqs);
  free(c->cts);
  free(c);
}

int main(void) {
  ctx.ops.post_send = fake_post_send;
  ctx.ops.poll_cq = fake_poll_cq;
  mpib_g.failover = 1;
  mpib_g.stall_timeout_ms = 30000;
  mpib_g.recovery_backoff_ms = 250;
  mpib_g.recovery_backoff_max_ms = 2000;
  mpib_g.failover_timeout_ms = 5000;
  for (int side = 0; side < 2; side++) {
    one_lane_dies(side, 2);
    one_lane_dies(side, 1);
  }
  return failures ? 1 : 0;
}
