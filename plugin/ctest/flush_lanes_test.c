//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_flush.c ../mpib_shm_*.c ../mpib_profiler.c

/* iflush on a striped receiver, on FAKE verbs (mpib_p2p.c, mpib_failover.c and mpib_flush.c
 * unchanged): the SUP rail stripes over two lanes on two devices (lane 1: SUP port 0, lane 2:
 * SUP port 1; SUP QP q on lane 1 + q mod 2), and a NIC orders only the bytes it placed itself.
 * A flush reads on the lanes whose QPs carried the receive's ranges, never on a striped lane
 * that carried none, and a device that died under such a lane does not fail it:
 *   - a receive's SUP range completes on lane 1, lane 2's device dies before iflush: the flush
 *     reads on lane 1 alone and completes;
 *   - lane 2 alive at iflush, dead while lane 1's read is outstanding: the flush completes;
 *   - a range that lane 2 carried, lane 2 dead before iflush: an error naming lane 2's NIC
 *     (its bytes cannot be ordered), and one whose read is outstanding when lane 2 dies fails
 *     test();
 *   - a range whose completion was lost and that the sender's confirm record completed: the
 *     lane of the QP that carried it (lane 1) is read, and lane 2's death does not fail it. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_flush.h"
#include "../mpib_p2p.h"
#include "../mpib_slots.h"

#include "check.h"

struct mpib_global mpib_g;
static uint64_t now_ns = 1000000000ull;
uint64_t mpib_now_ns(void) { return now_ns; }
static char last_warning[512];
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)file, (void)line;
  if (level != NCCL_LOG_WARN) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_warning, sizeof last_warning, fmt, ap);
  va_end(ap);
}
const char *ibv_wc_status_str(enum ibv_wc_status status) { return status == IBV_WC_SUCCESS ? "ok" : "error"; }
void mpib_comm_destroy(struct mpib_comm *c) { (void)c; }
int mpib_rail_to_error(struct mpib_comm *c, int rail) { return (void)c, (void)rail, 0; }
int mpib_rail_reconnect(struct mpib_comm *c, int rail, uint32_t psn) { return (void)c, (void)rail, (void)psn, 0; }
int mpib_rail_rebuild_start(struct mpib_comm *c, int rail, uint32_t psn) {
  return (void)c, (void)rail, (void)psn, -EAGAIN;
}
int mpib_rail_rebuild_poll(struct mpib_comm *c, int rail, int *err) { return (void)c, (void)rail, *err = -EAGAIN, 1; }
int mpib_qp_reset_to_init(const struct mpib_comm *c, struct ibv_qp *qp, int lane, int access) {
  return (void)c, (void)qp, (void)lane, (void)access, 0;
}
int mpib_qp_connect(struct mpib_comm *c, struct ibv_qp *qp, int lane, uint32_t rem_qpn,
                    const struct mpib_rail_info *rem, enum ibv_mtu mtu, uint8_t tc, uint32_t psn) {
  return (void)c, (void)qp, (void)lane, (void)rem_qpn, (void)rem, (void)mtu, (void)tc, (void)psn, 0;
}
int mpib_lane_gid_refresh(struct mpib_comm *c, int lane) { return (void)c, (void)lane, 0; }
void mpib_local_rail_info(const struct mpib_comm *c, int lane, struct mpib_rail_info *ri) {
  (void)c, (void)lane, memset(ri, 0, sizeof *ri);
}

/* ---- fake verbs: lanes 0 (SOUT), 1 and 2 (SUP ports 0 and 1), each its own device ---- */

enum { NL = 3, NQ = 3, SIZE = 100 };
static struct ibv_context ctx;
static struct ibv_qp qp[NQ], fqp[NL];
static struct ibv_cq cq[NL], fcq[NL];
static struct ibv_srq srq[NL];
static struct ibv_mr mr = {.lkey = 1, .rkey = 2};
static uint64_t reads[NL][8];
static int nreads[NL], posted_reads[NL];
static struct ibv_wc wcs[2 * NL][8]; /* data CQs 0..2, flush CQs 3..5 */
static int nwc[2 * NL];

static int fake_post_send(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  (void)bad;
  if (q >= fqp && q < fqp + NL) {
    int l = (int)(q - fqp);
    reads[l][nreads[l]++] = wr->wr_id;
    posted_reads[l]++;
  }
  return 0; /* CTS writes on the data QPs: never signalled back here */
}
static int fake_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc) {
  int i = c >= fcq && c < fcq + NL ? NL + (int)(c - fcq) : (int)(c - cq), k = 0;
  for (; k < n && nwc[i] > 0; k++) {
    wc[k] = wcs[i][0];
    memmove(&wcs[i][0], &wcs[i][1], (size_t)--nwc[i] * sizeof wcs[i][0]);
  }
  return k;
}
static int fake_post_srq(struct ibv_srq *s, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  return (void)s, (void)wr, (void)bad, 0;
}

/* The sender's write with immediate of slot seq % 32 arrives on `lane`. */
static void arrives(int lane, uint64_t seq) {
  uint32_t slot = (uint32_t)(seq % MPIB_MAX_REQUESTS);
  wcs[lane][nwc[lane]++] = (struct ibv_wc){.wr_id = MPIB_WRID_RECV,
                                           .status = IBV_WC_SUCCESS,
                                           .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
                                           .wc_flags = IBV_WC_WITH_IMM,
                                           .imm_data = mpib_imm_encode(slot, 1u << MPIB_RAIL_SUP, seq, SIZE)};
}
/* The NIC of `lane` finishes its outstanding flush reads. */
static void reads_complete(int lane) {
  for (int i = 0; i < nreads[lane]; i++)
    wcs[NL + lane][nwc[NL + lane]++] = (struct ibv_wc){.wr_id = reads[lane][i], .status = IBV_WC_SUCCESS};
  nreads[lane] = 0;
}

/* A vanilla intra-island recv comm striped over two SUP lanes, whose next receive is `seq`. */
static struct mpib_comm *striped_comm(uint64_t seq) {
  memset(nreads, 0, sizeof nreads);
  memset(posted_reads, 0, sizeof posted_reads);
  memset(nwc, 0, sizeof nwc);
  for (int l = 0; l < NL; l++) {
    mpib_g.nic[l] = (struct mpib_nic){0};
    snprintf(mpib_g.nic[l].name, sizeof mpib_g.nic[l].name, "nic%d", l);
  }
  struct mpib_comm *c = calloc(1, sizeof *c);
  c->sup_lanes = 2;
  c->lane_port[1] = 0;
  c->lane_port[2] = 1;
  c->mode = MPIB_MODE_VANILLA;
  c->path_class = MPIB_PATH_INTRA_ISLAND;
  c->cts_rail = MPIB_RAIL_SUP;
  c->nreqs_pool = MPIB_REQ_POOL_RECV;
  c->reqs = calloc((size_t)c->nreqs_pool, sizeof *c->reqs);
  c->sq_depth = MPIB_SEND_WR_RECEIVER;
  c->cts = aligned_alloc(64, (MPIB_NIC_AREA + 63) / 64 * 64);
  memset(c->cts, 0, MPIB_NIC_AREA);
  c->sizes = (mpib_sizes_row *)((char *)c->cts + MPIB_SIZES_OFFSET);
  c->flush_buf = calloc(1, MPIB_PAGE);
  c->ctrl_fd = -1;
  c->shm_slot = -1;
  c->fifo_head = seq;
  c->recv_idle_seq1 = seq + 1;
  c->nqps[MPIB_RAIL_SOUT] = 1;
  c->nqps[MPIB_RAIL_SUP] = 2;
  for (int q = 0; q < NQ; q++) {
    qp[q].context = &ctx;
    c->qps[q] = (struct mpib_qp){.qp = &qp[q], .rail = mpib_lane_rail(q), .lane = q}; /* SUP QP i on lane 1 + i */
  }
  for (int l = 0; l < NL; l++) {
    c->nic[l] = &mpib_g.nic[l];
    cq[l].context = fcq[l].context = fqp[l].context = srq[l].context = &ctx;
    c->cq[l] = &cq[l];
    c->srq[l] = &srq[l];
    c->srq_posted[l] = MPIB_SRQ_DEPTH;
    c->stage_mr[l] = &mr;
    c->flush_qp[l] = &fqp[l];
    c->flush_cq[l] = &fcq[l];
    c->flush_mr[l] = &mr;
  }
  for (int r = 0; r < MPIB_NRAILS; r++) c->rail[r] = (struct mpib_rail_ctl){.state = MPIB_RAIL_UP, .gen = 1};
  return c;
}

static void free_comm(struct mpib_comm *c) {
  free(c->flush_buf);
  free(c->cts);
  free(c->reqs);
  free(c);
}

/* NCCL's buffer, registered on SOUT and both SUP ports. */
static char buf[4096];
static struct ibv_mr port_mr[MPIB_MR_SLOTS];
static struct mpib_mr mh;

/* irecv of the comm's next receive; its request. */
static void *post_recv(struct mpib_comm *c) {
  void *data = buf, *mhp = &mh, *req = NULL;
  size_t size = SIZE;
  int tag = 7;
  CHECK(mpib_irecv(c, 1, &data, &size, &tag, &mhp, NULL, &req) == ncclSuccess && req != NULL, "irecv");
  return req;
}
/* test() of a request: 1 done, 0 open, -1 an error. */
static int tested(void *req) {
  int done = 0, sizes[1] = {0};
  if (mpib_test(req, &done, sizes) != ncclSuccess) return -1;
  return done;
}
static ncclResult_t flush(struct mpib_comm *c, void **req) {
  void *data = buf, *mhp = &mh;
  int size = SIZE;
  *req = NULL;
  return mpib_iflush(c, 1, &data, &size, &mhp, req);
}

/* Seq 0 goes on SUP QP 0 (lane 1); lane 2 dies before iflush, or with lane 1's read out. */
static void unused_lane_dies(int before_iflush) {
  struct mpib_comm *c = striped_comm(0);
  void *req = post_recv(c), *freq = NULL;
  arrives(1, 0);
  CHECK(tested(req) == 1, "the receive completes on lane 1");
  if (before_iflush) mpib_g.nic[2].fatal = 1;
  ncclResult_t res = flush(c, &freq);
  if (!before_iflush) mpib_g.nic[2].fatal = 1;
  CHECK(
      res == ncclSuccess && freq != NULL && posted_reads[1] == 1 && posted_reads[2] == 0,
      "lane 2 (which placed nothing) dead %s iflush: want a read on lane 1 alone, got res=%d request=%p reads lane1=%d "
      "lane2=%d (%s)",
      before_iflush ? "before" : "after", res, freq, posted_reads[1], posted_reads[2], last_warning);
  int done = freq ? tested(freq) : -1;
  CHECK(done == 0, "the flush waits for lane 1's read (got %d)", done);
  reads_complete(1);
  done = freq ? tested(freq) : -1;
  CHECK(done == 1, "lane 1's read completes the flush although lane 2 died (got %d: %s)", done, last_warning);
  printf("flush-lanes: lane2-dead=%s-iflush wrote=lane1 reads_lane1=%d reads_lane2=%d outcome=%s\n",
         before_iflush ? "before" : "during", posted_reads[1], posted_reads[2], done == 1 ? "completed" : "error");
  free_comm(c);
}

/* Seq 1 goes on SUP QP 1 (lane 2): lane 2's death must fail its flush, before iflush or with
 * the read outstanding. */
static void writing_lane_dies(void) {
  struct mpib_comm *c = striped_comm(1);
  void *req = post_recv(c), *freq = NULL;
  arrives(2, 1);
  CHECK(tested(req) == 1, "the receive completes on lane 2");
  mpib_g.nic[2].fatal = 1;
  last_warning[0] = 0;
  ncclResult_t res = flush(c, &freq);
  CHECK(res == ncclSystemError && freq == NULL && strstr(last_warning, "nic2") != NULL,
        "lane 2 placed the bytes and died: want ncclSystemError naming nic2, got res=%d request=%p (%s)", res, freq,
        last_warning);
  free_comm(c);

  c = striped_comm(1);
  req = post_recv(c);
  arrives(2, 1);
  CHECK(tested(req) == 1, "the receive completes on lane 2");
  CHECK(flush(c, &freq) == ncclSuccess && freq != NULL && posted_reads[2] == 1 && posted_reads[1] == 0,
        "a read on lane 2 alone (lane1 %d lane2 %d)", posted_reads[1], posted_reads[2]);
  mpib_g.nic[2].fatal = 1;
  CHECK(freq != NULL && tested(freq) == -1, "lane 2 died with its read outstanding: test() fails the flush");
  free_comm(c);
}

/* Seq 2 (SUP QP 0, lane 1): its completion was lost when the receiver fenced SUP; the sender's
 * confirm record completes it. Lane 1 placed it; lane 2 then dies. */
static void confirmed_range(void) {
  struct mpib_comm *c = striped_comm(2);
  void *req = post_recv(c), *freq = NULL;
  c->rail[MPIB_RAIL_SUP].state = MPIB_RAIL_DOWN; /* fenced, its record written, the completion lost */
  struct mpib_confirm_rec *rec = mpib_confirm_area(c, MPIB_RAIL_SUP);
  rec->gen = 1;
  rec->seq1[2] = 3;
  rec->ranges[2] = rec->full[2] = 1u << MPIB_RAIL_SUP;
  rec->imm_size[2] = SIZE;
  rec->check = mpib_confirm_check(rec);
  CHECK(tested(req) == 1, "the confirm completes the receive");
  mpib_g.nic[2].fatal = 1;
  ncclResult_t res = flush(c, &freq);
  CHECK(res == ncclSuccess && freq != NULL && posted_reads[1] == 1 && posted_reads[2] == 0,
        "a confirmed range of lane 1, lane 2 dead: want a read on lane 1 alone, got res=%d request=%p reads lane1=%d "
        "lane2=%d (%s)",
        res, freq, posted_reads[1], posted_reads[2], last_warning);
  reads_complete(1);
  CHECK(freq != NULL && tested(freq) == 1, "the flush completes");
  printf("flush-lanes: confirmed wrote=lane1 lane2-dead reads_lane1=%d reads_lane2=%d outcome=%s\n", posted_reads[1],
         posted_reads[2], res == ncclSuccess ? "completed" : "error");
  free_comm(c);
}

int main(void) {
  ctx.ops.post_send = fake_post_send;
  ctx.ops.poll_cq = fake_poll_cq;
  ctx.ops.post_srq_recv = fake_post_srq;
  mpib_g.flush_enabled = 1;
  mpib_g.failover = 1;
  mpib_g.stall_timeout_ms = 30000;
  mpib_g.failover_timeout_ms = 5000;
  mpib_g.recovery_backoff_ms = 250;
  mpib_g.recovery_backoff_max_ms = 2000;
  mpib_g.nfdevs = 1;
  for (int s = 0; s < 3; s++) port_mr[s] = (struct ibv_mr){.lkey = 1, .rkey = 10 + (uint32_t)s}, mh.mr[s] = &port_mr[s];
  unused_lane_dies(1);
  unused_lane_dies(0);
  writing_lane_dies();
  confirmed_range();
  return failures ? 1 : 0;
}
