/* NCCL profiler events for MPIB's rails (docs/nccl-loading.md). Called by init (abi_common.c:
 * the callback NCCL hands it), the message path (mpib_p2p.c), the slots' completions
 * (mpib_slots.c) and failover (mpib_failover.c); offers what mpib_profiler.h declares. */
#include "mpib_profiler.h"

ncclProfilerCallback_t mpib_prof_fn;

void mpib_prof_set(ncclProfilerCallback_t fn) {
  if (fn != NULL) __atomic_store_n(&mpib_prof_fn, fn, __ATOMIC_RELAXED);
}

/* The profiler's result is ignored: a failed event must never fail a transfer (NCCL's own
 * callback always succeeds), and an event the profiler did not open leaves the handle NULL. */
static void prof_start(void **event, void *phandle, int rail, uint64_t wr_id, int opcode, const struct ibv_qp *qp,
                       size_t length) {
  ncclProfilerNetIbDescr_v1_t d = {.type = ncclProfileQp};
  d.qp.device = rail;
  d.qp.wr_id = wr_id;
  d.qp.opcode = opcode;
  d.qp.qpNum = qp ? (int)qp->qp_num : -1;
  d.qp.length = length;
  /* d lives only for the call, as net_ib's reused descriptor does: profilers copy it. */
  (void)mpib_prof_fn(event, ncclProfilerNetEventStart, phandle, MPIB_PROF_PLUGIN_ID, &d);
}

/* A NULL handle means no event is open (none started, the profiler filtered it, or stopped). */
static void prof_stop(void **event) {
  if (*event == NULL) return;
  (void)mpib_prof_fn(event, ncclProfilerNetEventStop, NULL, 0, NULL);
  *event = NULL;
}

static const struct ibv_qp *rail_qp(const struct mpib_comm *c, int rail, uint64_t seq) {
  int qi = mpib_qp_index(rail, seq, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
  return qi < 0 ? NULL : c->qps[qi].qp;
}

void mpib_prof_send_posting(struct mpib_comm *c, int slot, int rail, uint32_t rail_mask, const size_t *sout_bytes) {
  struct mpib_request **reqs = c->slot_reqs[slot];
  int nreqs = c->slot_matched[slot];
  /* Zero-byte requests ride on the rail that writes the size records (the lowest active). */
  int size_rail = (rail_mask & (1u << MPIB_RAIL_SOUT)) ? MPIB_RAIL_SOUT : MPIB_RAIL_SUP;
  /* A lone small request's data write itself carries the immediate (see post_slot). */
  int data_has_imm = nreqs == 1 && reqs[0]->size <= MPIB_IMM_MAX_SIZE;
  const struct ibv_qp *qp = rail_qp(c, rail, reqs[0]->seq);
  for (int r = 0; r < nreqs; r++) {
    struct mpib_request *req = reqs[r];
    size_t len = rail == MPIB_RAIL_SOUT ? sout_bytes[r] : req->size - sout_bytes[r];
    if (req->prof_phandle == NULL || (len == 0 && (req->size != 0 || rail != size_rail))) continue;
    int opcode = (len == 0 || data_has_imm) ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    prof_start(&c->prof_event[slot][r][rail], req->prof_phandle, rail, (uint64_t)slot, opcode, qp, len);
  }
}

void mpib_prof_send_rail_done(struct mpib_comm *c, int slot, int rail) {
  for (int r = 0; r < c->slot_matched[slot]; r++) prof_stop(&c->prof_event[slot][r][rail]);
}

void mpib_prof_recv_posted(struct mpib_comm *c, struct mpib_request *req, void **phandles, const size_t *sizes) {
  if (phandles == NULL) return;
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    if (c->nqps[rail] == 0) continue;
    const struct ibv_qp *qp = rail_qp(c, rail, req->seq);
    for (int r = 0; r < req->nreqs; r++) {
      /* wr_id: the rail's SRQ receives carry the rail; length: the posted size, the most the
       * rail can carry (the split is the sender's). */
      if (phandles[r])
        prof_start(&c->prof_event[req->seq % MPIB_MAX_REQUESTS][r][rail], phandles[r], rail, (uint64_t)rail,
                   IBV_WC_RECV_RDMA_WITH_IMM, qp, sizes[r]);
    }
  }
}

void mpib_prof_recv_rail_done(struct mpib_request *req, int rail) {
  void *(*events)[MPIB_NRAILS] = req->comm->prof_event[req->seq % MPIB_MAX_REQUESTS];
  int complete = req->expected_mask && (req->have_mask & req->expected_mask) == req->expected_mask;
  for (int r = 0; r < req->nreqs; r++) {
    for (int k = 0; k < MPIB_NRAILS; k++) {
      if (k == rail || complete) prof_stop(&events[r][k]);
    }
  }
}
