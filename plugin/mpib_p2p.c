/*
 * The data path: isend, irecv, test, iflush. Pure C, no Go calls, no allocation.
 *
 * One message's path: the receiver's irecv RDMA-writes a CTS element per grouped receive
 * into the sender's FIFO slot (fifo_head % 32) on the CTS rail. The sender's isend waits
 * until every element of that slot carries the expected sequence number, matches its tag,
 * and once all grouped sends are present posts, on each ACTIVE rail only, a chain of
 * RDMA_WRITEs (its share of every request) ending in a signalled RDMA_WRITE_WITH_IMM whose
 * imm_data carries the slot, the active-rail mask and the sequence number. The lowest active
 * rail's final write also carries the size records. The receiver consumes one SRQ receive per
 * rail, learns the expected mask from the first immediate and completes when every active
 * rail has reported.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "mpib.h"
#include "mpib_profiler.h"
#include "mpib_shm.h"

static const char *rail_name(int rail) { return rail == MPIB_RAIL_SOUT ? "SOUT" : "SUP"; }

static struct mpib_request *req_alloc(struct mpib_comm *c, int type) {
  for (int i = 0; i < c->nreqs_pool; i++) {
    int k = (c->req_cursor + i) % c->nreqs_pool;
    struct mpib_request *r = &c->reqs[k];
    if (r->type == MPIB_REQ_FREE) {
      memset(r, 0, sizeof *r);
      r->type = type;
      r->comm = c;
      c->req_cursor = (k + 1) % c->nreqs_pool;
      return r;
    }
  }
  return NULL;
}

/* A port the device reported down (async event) is not scheduled while the other rail can
 * carry the request. */
static int rail_down(int rail) { return __atomic_load_n(&mpib_g.dev[rail].port_down, __ATOMIC_RELAXED); }

/* Why a comm can make no more progress, checked only while a caller waits for it: a fatal
 * device under any of its rails, or a peer whose control socket closed longer ago than the
 * grace period (a peer that exits right after its last completion must not fail requests
 * whose completions are already on their way). The reason is logged once per comm. */
#define MPIB_PEER_GONE_GRACE_NS 1000000000ull

static ncclResult_t comm_failed(struct mpib_comm *c, const char *why, const char *what) {
  if (!c->failure_reported) {
    c->failure_reported = 1;
    MPIB_WARN("%s comm: %s%s", c->is_send ? "send" : "recv", why, what);
  }
  return ncclRemoteError;
}

static ncclResult_t comm_health(struct mpib_comm *c) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (c->nqps[r] && __atomic_load_n(&mpib_g.dev[r].fatal, __ATOMIC_ACQUIRE)) {
      if (!c->failure_reported) MPIB_WARN("%s comm: device %s (%s rail) failed fatally", c->is_send ? "send" : "recv",
                                          mpib_g.dev[r].name, rail_name(r));
      c->failure_reported = 1;
      return ncclSystemError;
    }
  }
  uint64_t gone = __atomic_load_n(&c->peer_gone_ns, __ATOMIC_ACQUIRE);
  if (gone && mpib_now_ns() - gone > MPIB_PEER_GONE_GRACE_NS)
    return comm_failed(c, "the peer closed the connection with requests still waiting", " (its process exited or aborted)");
  return ncclSuccess;
}

/* Advanced mode reads the agent's hint (a clock read and a seqlock) once every
 * MPIB_HINT_REFRESH slots per comm, not per message: a hint takes effect within that many
 * messages. A comm also posts its telemetry to the segment in batches of that many slots
 * (mpib_telemetry_flush), so the segment's shared cache lines are written that much less. */
#define MPIB_HINT_REFRESH 16

static uint32_t cached_hint(struct mpib_comm *c) {
  if (c->hint_uses++ % MPIB_HINT_REFRESH == 0) {
    mpib_shm *shm = __atomic_load_n(&mpib_g.shm, __ATOMIC_ACQUIRE);
    uint32_t bw;
    if (shm && mpib_shm_read_hint(shm, (uint32_t)c->shm_slot, mpib_g.agent_stale_ns, &bw) == 1) {
      c->hint_bw = bw;
    } else {
      c->hint_bw = mpib_vanilla_sup_bw(c->path_class); /* no agent, stale agent or bad segment */
    }
  }
  return c->hint_bw;
}

void mpib_telemetry_flush(struct mpib_comm *c) {
  mpib_shm *shm = __atomic_load_n(&mpib_g.shm, __ATOMIC_ACQUIRE);
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    if (shm && c->shm_slot >= 0 && c->tele_bytes[rail])
      mpib_shm_add_telemetry(shm, (uint32_t)c->shm_slot, rail, c->tele_bytes[rail]);
    c->tele_bytes[rail] = 0;
  }
  c->tele_slots = 0;
}

/* The policy entry point: the SUP share (parts per 1024) of the slot about to be posted.
 * Order: test override, agent hint (advanced mode, fresh agent), vanilla; then the guard. */
uint32_t mpib_policy_sup_bw(struct mpib_comm *c) {
  uint32_t bw;
  if (c->force_sup_bw != MPIB_NO_OVERRIDE) {
    bw = c->force_sup_bw;
  } else if (c->mode == MPIB_MODE_ADVANCED && c->shm_slot >= 0) {
    bw = cached_hint(c);
  } else {
    bw = mpib_vanilla_sup_bw(c->path_class);
  }
  if (c->rail_failed[MPIB_RAIL_SUP] || rail_down(MPIB_RAIL_SUP)) return 0;
  if ((c->rail_failed[MPIB_RAIL_SOUT] || rail_down(MPIB_RAIL_SOUT)) && c->nqps[MPIB_RAIL_SUP]) return MPIB_SUP_BW_MAX;
  return mpib_guard_sup_bw(bw, c->path_class, c->sup_relay, c->nqps[MPIB_RAIL_SUP]);
}

/* How a slot's requests are spread over the rails. */
struct slot_plan {
  size_t sout[MPIB_MAX_RECVS]; /* bytes of each request on SOUT; SUP carries the rest */
  uint32_t mask;               /* rails carrying something (at least one) */
  int leader;                  /* the rail whose final write carries the size records */
  int size_in_imm;
  uint32_t imm;
};

/* Decides the slot's split: whole to one rail when the slot's bytes are at most
 * whole_msg_max (deficit-counted, see mpib_whole_message_rail), else cut by the weight. */
static void plan_slot(struct mpib_comm *c, int slot, struct slot_plan *p) {
  int nreqs = c->slot_matched[slot];
  struct mpib_request **reqs = c->slot_reqs[slot];
  uint32_t sup_bw = mpib_policy_sup_bw(c);
  uint64_t total = 0;
  for (int r = 0; r < nreqs; r++) total += reqs[r]->size;
  int whole = total <= c->whole_msg_max ? mpib_whole_message_rail(total, sup_bw, &c->sup_owed) : -1;
  p->mask = 0;
  for (int r = 0; r < nreqs; r++) {
    size_t size = reqs[r]->size;
    p->sout[r] = whole < 0 ? mpib_split_sout_bytes(size, sup_bw) : whole == MPIB_RAIL_SOUT ? size : 0;
    if (p->sout[r] > 0) p->mask |= 1u << MPIB_RAIL_SOUT;
    if (size > p->sout[r]) p->mask |= 1u << MPIB_RAIL_SUP;
    c->sizes[slot][r] = (int32_t)size;
    c->tele_bytes[MPIB_RAIL_SOUT] += p->sout[r];
    c->tele_bytes[MPIB_RAIL_SUP] += size - p->sout[r];
  }
  if (p->mask == 0) p->mask = 1u << (whole >= 0 ? whole : sup_bw >= MPIB_SUP_BW_MAX / 2 ? MPIB_RAIL_SUP : MPIB_RAIL_SOUT);
  p->leader = (p->mask & 1u) ? MPIB_RAIL_SOUT : MPIB_RAIL_SUP;
  /* A lone small request carries its size in the immediate: each rail then posts a single
   * write (its data with the immediate), the common latency-bound case. */
  p->size_in_imm = nreqs == 1 && reqs[0]->size <= MPIB_IMM_MAX_SIZE;
  p->imm = mpib_imm_encode((uint32_t)slot, p->mask, reqs[0]->seq,
                           p->size_in_imm ? (uint32_t)reqs[0]->size : MPIB_IMM_NO_SIZE);
}

/* Posts one rail's chain for a slot: a write per request part, the last one (or a final
 * write carrying the size records) with the immediate and signalled. */
static ncclResult_t post_rail(struct mpib_comm *c, int slot, int rail, const struct slot_plan *p) {
  int nreqs = c->slot_matched[slot];
  struct mpib_request **reqs = c->slot_reqs[slot];
  const struct mpib_cts *cts = c->cts_snap[slot];
  int qi = mpib_qp_index(rail, reqs[0]->seq, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
  if (qi < 0 || c->qps[qi].qp == NULL) {
    MPIB_WARN("%s rail has no QP for this connection (policy bug)", rail_name(rail));
    return ncclInternalError;
  }
  struct ibv_send_wr wrs[MPIB_MAX_RECVS + 1];
  struct ibv_sge sges[MPIB_MAX_RECVS + 1];
  int nwr = 0;
  for (int r = 0; r < nreqs; r++) {
    size_t off = rail == MPIB_RAIL_SOUT ? 0 : p->sout[r];
    size_t len = rail == MPIB_RAIL_SOUT ? p->sout[r] : reqs[r]->size - p->sout[r];
    if (len == 0) continue;
    sges[nwr] = (struct ibv_sge){.addr = (uintptr_t)reqs[r]->data + off, .length = (uint32_t)len,
                                 .lkey = reqs[r]->mh->mr[rail]->lkey};
    wrs[nwr] = (struct ibv_send_wr){.wr_id = (uint64_t)slot, .sg_list = &sges[nwr], .num_sge = 1,
                                    .opcode = IBV_WR_RDMA_WRITE};
    wrs[nwr].wr.rdma.remote_addr = cts[r].addr + off;
    wrs[nwr].wr.rdma.rkey = cts[r].rkey[rail];
    nwr++;
  }
  struct ibv_send_wr *last;
  if (p->size_in_imm && nwr == 1) {
    last = &wrs[0]; /* the data write itself carries the immediate */
  } else {
    last = &wrs[nwr];
    *last = (struct ibv_send_wr){.wr_id = (uint64_t)slot};
    last->wr.rdma.remote_addr = c->rem_addr + (uint64_t)slot * sizeof c->sizes[0];
    last->wr.rdma.rkey = c->rem_rkey[rail];
    if (rail == p->leader && !p->size_in_imm) {
      sges[nwr] = (struct ibv_sge){.addr = (uintptr_t)c->sizes[slot], .length = (uint32_t)(nreqs * sizeof(int32_t)),
                                   .lkey = c->sizes_mr[rail]->lkey};
      last->sg_list = &sges[nwr];
      last->num_sge = 1;
      if (sges[nwr].length <= c->max_inline) last->send_flags = IBV_SEND_INLINE;
    }
    nwr++;
  }
  last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  last->send_flags |= IBV_SEND_SIGNALED;
  last->imm_data = p->imm;
  for (int i = 0; i + 1 < nwr; i++) wrs[i].next = &wrs[i + 1];
  if (mpib_profiling()) mpib_prof_send_posting(c, slot, rail, p->mask, p->sout);
  struct ibv_send_wr *bad = NULL;
  int rc = ibv_post_send(c->qps[qi].qp, &wrs[0], &bad);
  if (rc) {
    MPIB_WARN("%s rail: ibv_post_send failed: %s", rail_name(rail), strerror(rc));
    return ncclSystemError;
  }
  c->slot_rails[slot] |= 1u << rail;
  c->pending[rail]++;
  return ncclSuccess;
}

/* Post the slot's matched sends on every active rail. */
static ncclResult_t post_slot(struct mpib_comm *c, int slot) {
  struct slot_plan plan;
  plan_slot(c, slot, &plan);
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    if (!(plan.mask & (1u << rail))) continue;
    ncclResult_t res = post_rail(c, slot, rail, &plan);
    if (res != ncclSuccess) return res;
  }
  if (++c->tele_slots >= MPIB_HINT_REFRESH) mpib_telemetry_flush(c);
  return ncclSuccess;
}

/* A CTS carrying our sequence number whose fields do not match its checksum is still being
 * copied in (see mpib_cts_check). Wait for it, but not forever: after a few seconds the peer
 * is sending garbage. Only this rare path reads the clock. */
static ncclResult_t cts_still_landing(struct mpib_comm *c, int slot) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  if (c->cts_torn_since_ns == 0) {
    c->cts_torn_since_ns = now;
  } else if (now - c->cts_torn_since_ns > 5000000000ull) {
    MPIB_WARN("the CTS in slot %d never became consistent: corrupt data from the peer", slot);
    return ncclRemoteError;
  }
  return ncclSuccess;
}

/* Copies a slot's CTS elements out of the FIFO once they have all landed intact; until then
 * leaves cts_snap_seq[slot] behind and NCCL calls isend again. */
static ncclResult_t snapshot_cts(struct mpib_comm *c, int slot, uint64_t want) {
  volatile struct mpib_cts *fifo = c->cts[slot];
  struct mpib_cts *snap = c->cts_snap[slot];
  if (fifo[0].seq != want) return comm_health(c); /* no CTS yet: NCCL retries */
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  mpib_cts_snapshot(&fifo[0], &snap[0]);
  if (!mpib_cts_landed(&snap[0], want)) return cts_still_landing(c, slot);
  uint32_t nreqs = snap[0].nreqs;
  if (nreqs < 1 || nreqs > MPIB_MAX_RECVS) {
    MPIB_WARN("peer sent a CTS with %u grouped receives (max %d)", nreqs, MPIB_MAX_RECVS);
    return ncclRemoteError;
  }
  for (uint32_t r = 1; r < nreqs; r++) {
    mpib_cts_snapshot(&fifo[r], &snap[r]);
    if (!mpib_cts_landed(&snap[r], want)) return cts_still_landing(c, slot);
  }
  c->cts_torn_since_ns = 0;
  c->cts_snap_seq[slot] = want;
  return ncclSuccess;
}

ncclResult_t mpib_isend(void *sendComm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                        void **request) {
  struct mpib_comm *c = sendComm;
  *request = NULL;
  int slot = (int)(c->fifo_head % MPIB_MAX_REQUESTS);
  uint64_t want = c->fifo_head + 1;
  if (c->cts_snap_seq[slot] != want) { /* the slot's CTS is read and checked once */
    ncclResult_t res = snapshot_cts(c, slot, want);
    if (res != ncclSuccess || c->cts_snap_seq[slot] != want) return res;
  }
  const struct mpib_cts *cts = c->cts_snap[slot];
  uint32_t nreqs = cts[0].nreqs;
  int match = -1;
  for (uint32_t r = 0; r < nreqs; r++) {
    if (cts[r].tag == tag && c->slot_reqs[slot][r] == NULL) {
      match = (int)r;
      break;
    }
  }
  if (match < 0) return ncclSuccess; /* this tag belongs to a later slot */
  if (size > cts[match].size) {
    MPIB_WARN("cannot send %zu bytes: the receive buffer for tag %d holds %lu", size, tag,
              (unsigned long)cts[match].size);
    return ncclInvalidUsage;
  }
  if (size > INT32_MAX) {
    MPIB_WARN("message of %zu bytes exceeds the 2 GiB per-request limit", size);
    return ncclInvalidUsage;
  }
  if (size > 0 && mhandle == NULL) {
    MPIB_WARN("isend of %zu bytes without a memory handle", size);
    return ncclInvalidArgument;
  }
  struct mpib_request *req = req_alloc(c, MPIB_REQ_SEND);
  if (!req) return ncclSuccess; /* pool exhausted: retry after completions */
  req->data = data;
  req->size = size;
  req->tag = tag;
  req->mh = mhandle;
  req->prof_phandle = phandle;
  req->seq = c->fifo_head;
  req->nreqs = (int)nreqs;
  c->slot_reqs[slot][match] = req;
  if (++c->slot_matched[slot] == (int)nreqs) {
    ncclResult_t res = post_slot(c, slot);
    if (res != ncclSuccess) return res;
    c->fifo_head++;
  }
  *request = req;
  return ncclSuccess;
}

/* Keeps the rail's SRQ full, posting the missing receives as one chain (one call). At most
 * MPIB_MAX_REQUESTS slots are in flight, each consuming one receive per rail, so refilling
 * once MPIB_SRQ_REFILL are gone keeps MPIB_SRQ_DEPTH - MPIB_SRQ_REFILL > MPIB_MAX_REQUESTS
 * posted: the sender never meets an empty queue (RNR). */
int mpib_srq_refill(struct mpib_comm *c, int rail) {
  int missing = MPIB_SRQ_DEPTH - c->srq_posted[rail];
  if (missing < MPIB_SRQ_REFILL) return 0;
  struct ibv_recv_wr wrs[MPIB_SRQ_DEPTH];
  for (int i = 0; i < missing; i++) {
    wrs[i] = (struct ibv_recv_wr){.wr_id = (uint64_t)rail, .num_sge = 0, .next = i + 1 < missing ? &wrs[i + 1] : NULL};
  }
  struct ibv_recv_wr *bad = NULL;
  int rc = ibv_post_srq_recv(c->srq[rail], &wrs[0], &bad);
  for (struct ibv_recv_wr *w = &wrs[0]; w != NULL && w != bad; w = w->next) c->srq_posted[rail]++;
  if (rc) {
    MPIB_WARN("%s rail: ibv_post_srq_recv failed: %s", rail_name(rail), strerror(rc));
    return -rc;
  }
  return 0;
}

ncclResult_t mpib_irecv(void *recvComm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                        void **phandles, void **request) {
  struct mpib_comm *c = recvComm;
  *request = NULL;
  ncclResult_t health = comm_health(c);
  if (health != ncclSuccess) return health;
  if (n < 1 || n > MPIB_MAX_RECVS) {
    MPIB_WARN("irecv of %d grouped receives (1..%d supported)", n, MPIB_MAX_RECVS);
    return ncclInvalidArgument;
  }
  int slot = (int)(c->fifo_head % MPIB_MAX_REQUESTS);
  if (c->slot_reqs[slot][0] != NULL) return ncclSuccess; /* slot still busy */
  struct mpib_request *req = req_alloc(c, MPIB_REQ_RECV);
  if (!req) return ncclSuccess;
  req->seq = c->fifo_head;
  req->nreqs = n;
  struct mpib_cts *cts = c->cts[slot];
  for (int r = 0; r < n; r++) {
    struct mpib_mr *mh = mhandles ? mhandles[r] : NULL;
    if (sizes[r] > 0 && mh == NULL) {
      MPIB_WARN("irecv of %zu bytes without a memory handle", sizes[r]);
      req->type = MPIB_REQ_FREE;
      return ncclInvalidArgument;
    }
    memset(&cts[r], 0, sizeof cts[r]);
    cts[r].addr = (uint64_t)(uintptr_t)data[r];
    cts[r].size = sizes[r];
    for (int rail = 0; rail < MPIB_NRAILS; rail++) cts[r].rkey[rail] = (mh && mh->mr[rail]) ? mh->mr[rail]->rkey : 0;
    cts[r].tag = tags[r];
    cts[r].nreqs = (uint32_t)n;
    cts[r].seq = c->fifo_head + 1;
    cts[r].check = mpib_cts_check(&cts[r]);
    req->sizes[r] = 0;
  }
  int rail = c->cts_rail;
  int qi = mpib_qp_index(rail, 0, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
  struct ibv_sge sge = {.addr = (uintptr_t)cts, .length = (uint32_t)(n * sizeof *cts), .lkey = c->cts_mr[rail]->lkey};
  struct ibv_send_wr wr = {.wr_id = UINT64_MAX, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
  /* One signalled CTS per FIFO lap keeps the CTS QP's send queue drained. */
  if (slot == 0) wr.send_flags = IBV_SEND_SIGNALED;
  if (sge.length <= c->max_inline) wr.send_flags |= IBV_SEND_INLINE; /* NCCL_IB_USE_INLINE */
  wr.wr.rdma.remote_addr = c->rem_addr + (uint64_t)slot * sizeof c->cts[0];
  wr.wr.rdma.rkey = c->rem_rkey[rail];
  struct ibv_send_wr *bad = NULL;
  int rc = ibv_post_send(c->qps[qi].qp, &wr, &bad);
  if (rc) {
    MPIB_WARN("%s rail: posting the CTS failed: %s", rail_name(rail), strerror(rc));
    req->type = MPIB_REQ_FREE;
    return ncclSystemError;
  }
  c->slot_reqs[slot][0] = req;
  c->fifo_head++;
  c->recvs_open++;
  if (slot == 0) c->pending[rail]++;
  if (mpib_profiling()) mpib_prof_recv_posted(c, req, phandles, sizes);
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (c->srq[r] && mpib_srq_refill(c, r)) return ncclSystemError;
  }
  *request = req;
  return ncclSuccess;
}

ncclResult_t mpib_iflush(void *recvComm, int n, void **data, int *sizes, void **mhandles, void **request) {
  struct mpib_comm *c = recvComm;
  *request = NULL;
  int last = -1;
  for (int r = 0; r < n; r++) {
    if (sizes[r] > 0) last = r;
  }
  if (!mpib_g.flush_enabled || last < 0) return ncclSuccess;
  struct mpib_request *req = req_alloc(c, MPIB_REQ_FLUSH);
  if (!req) {
    MPIB_WARN("no free request for a flush");
    return ncclInternalError;
  }
  struct mpib_mr *mh = mhandles[last];
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    if (!c->flush_qp[rail]) continue;
    struct ibv_sge sge = {.addr = (uintptr_t)c->flush_buf, .length = 1, .lkey = c->flush_mr[rail]->lkey};
    struct ibv_send_wr wr = {.wr_id = (uintptr_t)req, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED};
    wr.wr.rdma.remote_addr = (uintptr_t)data[last];
    wr.wr.rdma.rkey = mh->mr[rail]->rkey;
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(c->flush_qp[rail], &wr, &bad);
    if (rc) {
      MPIB_WARN("%s rail: posting the flush read failed: %s", rail_name(rail), strerror(rc));
      req->type = MPIB_REQ_FREE;
      return ncclSystemError;
    }
    req->flush_pending++;
  }
  *request = req;
  return ncclSuccess;
}

ncclResult_t mpib_irecv_consumed(void *recvComm, int n, void *request) {
  (void)recvComm, (void)n, (void)request;
  return ncclSuccess; /* only meaningful for device offload, which MPIB does not do */
}

static ncclResult_t completion_error(struct mpib_comm *c, int rail, const struct ibv_wc *wc) {
  c->rail_failed[rail] = 1;
  MPIB_WARN("%s rail: completion error on QP %u: %s (status %d, vendor error %u, opcode %d)",
            rail_name(rail), wc->qp_num, ibv_wc_status_str(wc->status), wc->status, wc->vendor_err,
            wc->opcode);
  return ncclRemoteError;
}

static ncclResult_t on_send_completion(struct mpib_comm *c, int rail, const struct ibv_wc *wc) {
  uint64_t slot = wc->wr_id;
  if (slot >= MPIB_MAX_REQUESTS) return ncclSuccess;
  if (mpib_profiling()) mpib_prof_send_rail_done(c, (int)slot, rail);
  c->slot_rails[slot] &= ~(1u << rail);
  if (c->slot_rails[slot] != 0) return ncclSuccess;
  for (int r = 0; r < c->slot_matched[slot]; r++) {
    c->slot_reqs[slot][r]->done = 1;
    c->slot_reqs[slot][r] = NULL;
  }
  c->slot_matched[slot] = 0;
  return ncclSuccess;
}

static ncclResult_t on_recv_completion(struct mpib_comm *c, int rail, const struct ibv_wc *wc) {
  uint32_t slot, mask, seq8, imm_size;
  c->srq_posted[rail]--;
  if (!(wc->wc_flags & IBV_WC_WITH_IMM) || mpib_imm_decode(wc->imm_data, &slot, &mask, &seq8, &imm_size) != 0) {
    MPIB_WARN("%s rail: malformed completion from the peer (imm 0x%x)", rail_name(rail), wc->imm_data);
    return ncclRemoteError;
  }
  struct mpib_request *req = c->slot_reqs[slot][0];
  if (req == NULL || (req->seq & 0xFF) != seq8 || (mask & ~(1u << MPIB_RAIL_SOUT | 1u << MPIB_RAIL_SUP)) ||
      (req->expected_mask && req->expected_mask != mask) || (req->seen_mask & (1u << rail))) {
    MPIB_WARN("%s rail: completion for slot %u (seq %u, mask %u) matches no posted receive", rail_name(rail),
              slot, seq8, mask);
    return ncclRemoteError;
  }
  req->expected_mask = mask;
  req->seen_mask |= 1u << rail;
  if (mpib_profiling()) mpib_prof_recv_rail_done(req, rail);
  if (req->seen_mask != req->expected_mask) return ncclSuccess;
  if (imm_size != MPIB_IMM_NO_SIZE && req->nreqs != 1) {
    MPIB_WARN("%s rail: size in the immediate for a grouped receive of %d", rail_name(rail), req->nreqs);
    return ncclRemoteError;
  }
  volatile int32_t *rec = c->sizes[slot];
  for (int r = 0; r < req->nreqs; r++) {
    int32_t got = imm_size != MPIB_IMM_NO_SIZE ? (int32_t)imm_size : rec[r];
    if (got < 0 || (uint64_t)got > c->cts[slot][r].size) {
      MPIB_WARN("peer reported %d bytes for a %lu-byte receive", got, (unsigned long)c->cts[slot][r].size);
      return ncclRemoteError;
    }
    req->sizes[r] = got;
  }
  req->done = 1;
  c->slot_reqs[slot][0] = NULL;
  c->recvs_open--;
  return ncclSuccess;
}

/* Whether a rail can have completions to deliver: signalled sends outstanding, or (receiver)
 * receives posted that the peer's writes can complete. An idle rail costs no poll. */
static int rail_busy(const struct mpib_comm *c, int rail) {
  return c->pending[rail] > 0 || (c->srq[rail] && c->recvs_open > 0);
}

static ncclResult_t handle_completion(struct mpib_comm *c, int rail, const struct ibv_wc *wc) {
  if (wc->status != IBV_WC_SUCCESS) return completion_error(c, rail, wc);
  if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) return on_recv_completion(c, rail, wc);
  c->pending[rail]--;
  if (c->is_send) return on_send_completion(c, rail, wc);
  return ncclSuccess; /* a signalled CTS write */
}

/* Drains the completion queues of the rails that have work, each while it yields. */
static ncclResult_t progress(struct mpib_comm *c) {
  struct ibv_wc wcs[16];
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    if (!c->cq[rail] || !rail_busy(c, rail)) continue;
    int n;
    do {
      n = ibv_poll_cq(c->cq[rail], 16, wcs);
      if (n < 0) {
        MPIB_WARN("%s rail: ibv_poll_cq failed", rail_name(rail));
        return ncclSystemError;
      }
      for (int i = 0; i < n; i++) {
        ncclResult_t res = handle_completion(c, rail, &wcs[i]);
        if (res != ncclSuccess) return res;
      }
    } while (n == 16);
    if (c->srq[rail] && mpib_srq_refill(c, rail)) return ncclSystemError;
  }
  return ncclSuccess;
}

static ncclResult_t flush_progress(struct mpib_comm *c) {
  struct ibv_wc wc;
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    if (!c->flush_cq[rail]) continue;
    int n;
    while ((n = ibv_poll_cq(c->flush_cq[rail], 1, &wc)) > 0) {
      if (wc.status != IBV_WC_SUCCESS) return completion_error(c, rail, &wc);
      ((struct mpib_request *)(uintptr_t)wc.wr_id)->flush_pending--;
    }
    if (n < 0) return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t mpib_test(void *request, int *done, int *sizes) {
  struct mpib_request *req = request;
  struct mpib_comm *c = req->comm;
  *done = 0;
  ncclResult_t res = req->type == MPIB_REQ_FLUSH ? flush_progress(c) : progress(c);
  if (res != ncclSuccess) return res;
  if (req->type == MPIB_REQ_FLUSH) req->done = req->flush_pending == 0;
  if (!req->done) return comm_health(c);
  *done = 1;
  if (sizes && req->type == MPIB_REQ_SEND) sizes[0] = (int)req->size;
  if (sizes && req->type == MPIB_REQ_RECV) memcpy(sizes, req->sizes, (size_t)req->nreqs * sizeof(int));
  req->type = MPIB_REQ_FREE;
  return ncclSuccess;
}
