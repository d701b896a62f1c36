/*
 * iflush: orders the NIC's writes before the GPU reads the buffer. Called by the ABI tables
 * (mpib_iflush) and by the message path's test() (mpib_flush_test), both in mpib_flush.h; calls
 * comm setup's QP helpers to reset a loopback flush QP. Pure C, no Go calls.
 *
 * A flush is a 1-byte loopback RDMA read on each lane whose NIC placed bytes of receives
 * completed since the last flush (the lane of the QP that carried a range, original or replay;
 * net_ib reads on every device of the comm). A NIC orders only what it placed itself, and one
 * read after those completions orders all of them, so a flush covers every receive completed
 * before it. A striped lane that placed none of them is neither read nor required alive.
 *
 * A read that fails orders nothing, so it never counts as done: net_ib 2.30 fails the request
 * (test() returns ncclRemoteError); MPIB posts it again on its lane's loopback QP, reset with the
 * flush QP's own access (REMOTE_READ), and fails the request with a message only when the lane
 * cannot read for MPIB_STALL_TIMEOUT_MS (the ride-through budget: a port flap shorter than that costs nothing) or its
 * device died. A reset discards what the QP had queued, and a provider may clean those reads'
 * completions from the CQ at RESET (rdma-core's mlx5 does): every read outstanding on the lane
 * is posted again after a reset, so none waits for a completion that will never come.
 */
#include <errno.h>
#include <string.h>

#include "mpib.h"
#include "mpib_clock.h"
#include "mpib_flush.h"
#include "mpib_qp.h"

/* A lane whose device died after placing bytes of a completed receive cannot order them: the
 * flush fails instead of waiting on a CQ nobody polls (net_ib fails test() when a fatal
 * device's completion shows up). */
static ncclResult_t flush_lane_dead(struct mpib_comm *c, int lane) {
  MPIB_WARN("recv comm: flush: the %s device %s died after writing bytes of a completed receive; they cannot be "
            "ordered before the GPU reads them",
            mpib_rail_name(mpib_lane_rail(lane)), c->nic[lane]->name);
  c->failure_reported = 1;
  return ncclSystemError;
}

/* The flush requests of the comm with a read outstanding on `lane`. */
static void lane_reads_lost(struct mpib_comm *c, int lane) {
  for (int i = 0; i < c->nreqs_pool; i++) {
    struct mpib_request *r = &c->reqs[i];
    if (r->type != MPIB_REQ_FLUSH || !(r->flush_lanes & (1u << lane))) continue;
    r->flush_lanes &= ~(1u << lane);
    r->flush_redo |= 1u << lane;
  }
}

/* Handles the lane's flush completions: each names its request; a failed one (or one flushed
 * by the QP's error state) is posted again. */
static void flush_poll_lane(struct mpib_comm *c, int lane) {
  struct ibv_wc wc;
  while (ibv_poll_cq(c->flush_cq[lane], 1, &wc) > 0) {
    struct mpib_request *r = (struct mpib_request *)(uintptr_t)wc.wr_id;
    if (r->type != MPIB_REQ_FLUSH || !(r->flush_lanes & (1u << lane))) continue; /* its read was already redone */
    r->flush_lanes &= ~(1u << lane);
    if (wc.status == IBV_WC_SUCCESS) continue;
    if (!c->flush_broken[lane])
      MPIB_INFO("%s rail: a flush read failed (%s); its QP is reset and the read posted again",
                mpib_rail_name(mpib_lane_rail(lane)), ibv_wc_status_str(wc.status));
    c->flush_broken[lane] = 1;
    r->flush_redo |= 1u << lane;
    if (!r->flush_failed_ns) r->flush_failed_ns = mpib_now_ns();
  }
}

/* The lane's loopback QP after a read failed on it (it is in the error state): its completions
 * handled, reset and connected to itself again at the lane's GID's index now (a port flap may
 * have moved it); every read it still had is posted again. On the thread that owns the comm;
 * while the lane's rail is being rebuilt, whose thread moves that index too, it waits
 * (-EAGAIN: posted again later). 0 or -errno. */
static int flush_qp_reset(struct mpib_comm *c, int lane) {
  struct ibv_qp *qp = c->flush_qp[lane];
  if (c->rail[mpib_lane_rail(lane)].rebuild.running) return -EAGAIN;
  flush_poll_lane(c, lane);
  int rc = mpib_qp_reset_to_init(c, qp, lane, MPIB_FLUSH_QP_ACCESS);
  lane_reads_lost(c, lane);
  if (rc) return rc;
  if (c->nic[lane]->link_layer == IBV_LINK_LAYER_ETHERNET && (rc = mpib_lane_gid_refresh(c, lane)) != 0) return rc;
  struct mpib_rail_info self;
  mpib_local_rail_info(c, lane, &self);
  rc = mpib_qp_connect(c, qp, lane, qp->qp_num, &self, c->nic[lane]->active_mtu, c->tc, 0);
  if (rc == 0) c->flush_broken[lane] = 0;
  return rc;
}

static int post_flush_read(struct mpib_comm *c, int lane, struct mpib_request *req) {
  if (c->flush_broken[lane]) {
    int e = flush_qp_reset(c, lane);
    if (e) return e;
  }
  struct ibv_sge sge = {.addr = (uintptr_t)c->flush_buf, .length = 1, .lkey = c->flush_mr[lane]->lkey};
  struct ibv_send_wr wr = {.wr_id = (uintptr_t)req,
                           .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = IBV_WR_RDMA_READ,
                           .send_flags = IBV_SEND_SIGNALED};
  wr.wr.rdma.remote_addr = (uintptr_t)req->flush_addr;
  wr.wr.rdma.rkey = mpib_comm_mr(c, req->mh, lane)->rkey;
  struct ibv_send_wr *bad = NULL;
  int e = ibv_post_send(c->flush_qp[lane], &wr, &bad);
  if (e) {
    c->flush_broken[lane] = 1; /* a QP that takes no read is reset before the next one */
    return -e;
  }
  req->flush_lanes |= 1u << lane;
  req->flush_redo &= ~(1u << lane);
  return 0;
}

/* Whether the request's reads have been failing for longer than MPIB_STALL_TIMEOUT_MS. */
static int flush_overdue(const struct mpib_request *req) {
  return req->flush_failed_ns && mpib_now_ns() - req->flush_failed_ns > mpib_g.stall_timeout_ms * 1000000ull;
}

static ncclResult_t flush_timed_out(struct mpib_comm *c, int lane, int err) {
  MPIB_WARN(
      "recv comm: flush: the %s rail's NIC %s could not read back for MPIB_STALL_TIMEOUT_MS=%llu ms (%s): the receive's bytes "
      "cannot be ordered before the GPU reads them",
      mpib_rail_name(mpib_lane_rail(lane)), c->nic[lane]->name, (unsigned long long)mpib_g.stall_timeout_ms,
      err ? strerror(-err) : "its reads keep failing");
  c->failure_reported = 1;
  return ncclSystemError;
}

/* Posts again the request's reads that failed or were lost. Past the deadline (test() only:
 * iflush leaves a lane that cannot take its read now to test(), since a request whose other
 * reads are out cannot be freed) it fails the request, whether the lane refuses the read or
 * takes it and fails it again: a QP that resets and connects but whose reads keep failing (a
 * port that stays down, a read the NIC refuses) would otherwise be retried for ever. */
static ncclResult_t flush_retry(struct mpib_comm *c, struct mpib_request *req, int deadline) {
  for (int lane = 0; lane < MPIB_NLANES; lane++) {
    if (!(req->flush_redo & (1u << lane))) continue;
    if (deadline && flush_overdue(req)) return flush_timed_out(c, lane, 0);
    int e = post_flush_read(c, lane, req);
    if (e == 0) continue;
    if (!req->flush_failed_ns) req->flush_failed_ns = mpib_now_ns();
    if (deadline && flush_overdue(req)) return flush_timed_out(c, lane, e);
  }
  return ncclSuccess;
}

ncclResult_t mpib_flush_test(struct mpib_comm *c, struct mpib_request *req) {
  for (int lane = 0; lane < MPIB_NLANES; lane++) {
    if (!c->flush_cq[lane]) continue;
    if (__atomic_load_n(&c->nic[lane]->fatal, __ATOMIC_ACQUIRE)) {
      if ((req->flush_lanes | req->flush_redo) & (1u << lane)) return flush_lane_dead(c, lane);
      continue;
    }
    flush_poll_lane(c, lane);
  }
  if (req->flush_redo) {
    ncclResult_t res = flush_retry(c, req, 1);
    if (res != ncclSuccess) return res;
  }
  req->done = req->flush_lanes == 0 && req->flush_redo == 0;
  if (req->done && c->flushes_open > 0) c->flushes_open--;
  return ncclSuccess;
}

/* The lanes where a flush still open has a read outstanding, or to post again: the receives
 * they cover are ordered once those reads complete. */
static uint32_t open_flush_lanes(const struct mpib_comm *c) {
  uint32_t lanes = 0;
  for (int i = 0; i < c->nreqs_pool; i++) {
    const struct mpib_request *r = &c->reqs[i];
    if (r->type == MPIB_REQ_FLUSH && !r->done) lanes |= r->flush_lanes | r->flush_redo;
  }
  return lanes;
}

ncclResult_t mpib_iflush(void *recvComm, int n, void **data, int *sizes, void **mhandles, void **request) {
  struct mpib_comm *c = recvComm;
  *request = NULL;
  int last = -1;
  for (int r = 0; r < n; r++) {
    if (sizes[r] > 0) last = r;
  }
  /* The lanes to read on: those that placed bytes of the receive test() returned last
   * (flush_due: NCCL flushes a receive right after the test() that returned it, with no other
   * call on the comm between, in every version from 2.19 to 2.30, net.cc's recvProxyProgress),
   * and the lanes where an open flush still reads. The receive this iflush is for may be one
   * an open flush covers (it completed before that flush's reads were posted), and only their
   * completion orders its bytes: answering "nothing to flush" then would hand NCCL a buffer
   * whose bytes may not be visible yet. A new read behind the open ones orders them all
   * (net_ib reads on every iflush; MPIB skips the read only when nothing is left to order). A
   * lane whose reads all completed is not read again, and a lane that placed nothing is not
   * read at all: a device that died under either (a striped SUP port that carried none of
   * these bytes) does not fail this flush. */
  uint32_t lanes = c->flush_due | (c->flushes_open > 0 ? open_flush_lanes(c) : 0);
  if (!mpib_g.flush_enabled || last < 0 || lanes == 0) return ncclSuccess;
  struct mpib_mr *mh = mhandles ? mhandles[last] : NULL;
  ncclResult_t checked = mpib_check_mhandle(c, mh, (size_t)sizes[last], "iflush");
  if (checked != ncclSuccess) return checked;
  for (int lane = 0; lane < MPIB_NLANES; lane++) {
    if (!(lanes & (1u << lane))) continue;
    if (__atomic_load_n(&c->nic[lane]->fatal, __ATOMIC_ACQUIRE)) return flush_lane_dead(c, lane);
    if (!c->flush_qp[lane]) { /* a lane that placed bytes has a flush QP: a read elsewhere orders nothing of them */
      MPIB_WARN("iflush: no flush QP on %s, which wrote bytes of the receive", c->nic[lane]->name);
      return ncclInternalError;
    }
    if (!mpib_comm_mr(c, mh, lane)) {
      MPIB_WARN("iflush: the receive's buffer is not registered on %s, which wrote bytes of it", c->nic[lane]->name);
      return ncclInvalidArgument;
    }
  }
  struct mpib_request *req = mpib_req_alloc(c, MPIB_REQ_FLUSH);
  if (!req) {
    MPIB_WARN("no free request for a flush");
    return ncclInternalError;
  }
  req->flush_addr = data[last];
  req->mh = mh;
  req->flush_redo = lanes; /* posted now, or by test() when the lane cannot take it yet */
  c->flush_due = 0;
  (void)flush_retry(c, req, 0); /* a lane that cannot read now: test() posts it or fails the flush */
  c->flushes_open++;
  *request = req;
  return ncclSuccess;
}
