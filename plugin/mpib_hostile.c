/* A sender that attacks its receiver, for the lab's hostile-input tests only: compiled into
 * the test build (-DMPIB_HOSTILE_TEST through `go build -tags mpibhostile`, built for the lab
 * suite only as build/test-only/libnccl-net-mpib-hostile-test-only.so) and empty in the plugin
 * users load. MPIB_TEST_HOSTILE names the attack, made once, on the first slot a comm posts:
 *   size-overwrite: RDMA-writes a CTS element with a larger size into the receiver's own CTS
 *     copy (which the receiver must not take its bound from), then reports more bytes than the
 *     receiver posted in every size record. The receiver must refuse the size.
 *   remote-read: RDMA-reads the receiver's posted buffer through the data QP. The receiver's
 *     data QPs must refuse it.
 * Each prints one "hostile-test:" line with what the device answered. Called by the message
 * path (mpib_p2p.c) before it posts a slot; offers what mpib_hostile.h declares. */
#include "mpib.h"
#include "mpib_hostile.h"

#ifdef MPIB_HOSTILE_TEST
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>

#include "mpib_clock.h"
#include "mpib_slots.h"

static int hostile_done;

/* Posts one signalled work request on rail's first QP and waits (2 s at most) for its
 * completion: only before the comm's first slot, when nothing else is due on the CQ. */
static int hostile_run(struct mpib_comm *c, int rail, struct ibv_send_wr *wr, enum ibv_wc_status *status) {
  int qi = mpib_qp_index(rail, 0, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
  struct ibv_send_wr *bad = NULL;
  wr->wr_id = 0x4854534C; /* "HTSL" */
  wr->send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(c->qps[qi].qp, wr, &bad) != 0) return -1;
  uint64_t deadline = mpib_now_ns() + 2000000000ull;
  struct ibv_wc wc;
  while (mpib_now_ns() < deadline) {
    int n = ibv_poll_cq(c->cq[rail], 1, &wc);
    if (n < 0) return -1;
    if (n == 1 && wc.wr_id == wr->wr_id) {
      *status = wc.status;
      return 0;
    }
  }
  return -1;
}

static void hostile_remote_read(struct mpib_comm *c, int slot, int rail) {
  static uint64_t sink;
  struct ibv_mr *mr = ibv_reg_mr(c->nic[rail]->pd, &sink, sizeof sink, IBV_ACCESS_LOCAL_WRITE);
  if (mr == NULL) return;
  struct ibv_sge sge = {.addr = (uintptr_t)&sink, .length = sizeof sink, .lkey = mr->lkey};
  struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ};
  wr.wr.rdma.remote_addr = c->cts_snap[slot][0].addr;
  wr.wr.rdma.rkey = c->cts_snap[slot][0].rkey[rail];
  enum ibv_wc_status st = IBV_WC_GENERAL_ERR;
  int rc = hostile_run(c, rail, &wr, &st);
  MPIB_WARN("hostile-test: case=remote-read rail=%s posted=%d status=%d denied=%s (%s)", mpib_rail_name(rail), rc == 0,
            rc == 0 ? (int)st : -1, rc == 0 && st == IBV_WC_SUCCESS ? "false" : "true",
            rc == 0 ? ibv_wc_status_str(st) : "no completion within 2 s");
  ibv_dereg_mr(mr);
}

static void hostile_size_overwrite(struct mpib_comm *c, int slot, int rail, int nreqs) {
  static struct mpib_cts forged;
  forged = c->cts_snap[slot][0];
  uint64_t posted = forged.size;
  forged.size = posted + 4096;
  forged.check = mpib_cts_check(&forged);
  struct ibv_mr *mr = ibv_reg_mr(c->nic[rail]->pd, &forged, sizeof forged, IBV_ACCESS_LOCAL_WRITE);
  if (mr == NULL) return;
  struct ibv_sge sge = {.addr = (uintptr_t)&forged, .length = sizeof forged, .lkey = mr->lkey};
  struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
  /* The receiver's CTS copy lies MPIB_SIZES_OFFSET before the size records it advertised. */
  wr.wr.rdma.remote_addr = c->rem_addr - MPIB_SIZES_OFFSET + (uint64_t)slot * sizeof(mpib_cts_row);
  wr.wr.rdma.rkey = c->rem_rkey[rail];
  /* Unsignalled, not waited for: earlier slots' completions may be due on this CQ, and they
   * belong to the data path. Refused, it fails the rail like any remote access error. The MR
   * stays (a few bytes, once per process): the write may still be in flight. */
  int qi = mpib_qp_index(rail, 0, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
  struct ibv_send_wr *bad = NULL;
  int rc = ibv_post_send(c->qps[qi].qp, &wr, &bad);
  for (int r = 0; r < nreqs; r++) c->sizes[slot][r] = (int32_t)(posted + 4096);
  MPIB_WARN("hostile-test: case=peer-size-overwrite rail=%s cts_write=%s posted_bytes=%llu reported_bytes=%llu",
            mpib_rail_name(rail), rc == 0 ? "posted" : "refused-locally", (unsigned long long)posted,
            (unsigned long long)(posted + 4096));
}

/* The attack waits for the first slot it can make: size-overwrite needs one whose sizes go in
 * size records (messages over MPIB_IMM_MAX_SIZE bytes), not in the immediate. */
void mpib_hostile_before_post(struct mpib_comm *c, int slot, int nreqs, int size_in_imm) {
  const char *mode = getenv("MPIB_TEST_HOSTILE");
  if (mode == NULL || !c->is_send || __atomic_load_n(&hostile_done, __ATOMIC_RELAXED)) return;
  int read = strcmp(mode, "remote-read") == 0, overwrite = strcmp(mode, "size-overwrite") == 0;
  if (!(read || (overwrite && !size_in_imm)) || __atomic_exchange_n(&hostile_done, 1, __ATOMIC_RELAXED)) return;
  int rail = mpib_rail_usable(c, MPIB_RAIL_SOUT) ? MPIB_RAIL_SOUT : MPIB_RAIL_SUP;
  if (read) hostile_remote_read(c, slot, rail);
  else hostile_size_overwrite(c, slot, rail, nreqs);
}
#else
typedef int mpib_hostile_unused; /* ISO C: a translation unit is not empty */
#endif
