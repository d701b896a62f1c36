/*
 * A slot's work requests and bookkeeping: posting chains, CTS and control writes within each
 * QP's send-queue depth, a slot's and a receive's completion, and their agent telemetry. Called
 * by the message path (mpib_p2p.c), failover (mpib_failover.c) and comm teardown
 * (mpib_comm_close); offers what mpib_slots.h declares. Pure C, no Go calls.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "mpib_clock.h"
#include "mpib_profiler.h"
#include "mpib_shm.h"
#include "mpib_slots.h"
#include "mpib_srq.h"

static uint64_t mpib_wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A rail that still has parts in flight at a flush publishes its active time so far: the
 * bottleneck rail may never go idle, and its rate is what the agent needs most. */
static void tele_active_until_now(struct mpib_comm *c) {
  uint64_t now = 0;
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    uint64_t since = c->rail_active_since[rail];
    if (!c->rail_parts[rail] || !since) continue;
    if (!now) now = mpib_now_ns();
    if (now > since) c->tele.rail[rail].active_ns += now - since;
    c->rail_active_since[rail] = now;
  }
}

/* Publishes the batch (send comms: a recv comm's telemetry is its rail states only) with the
 * wall clock, one CLOCK_REALTIME read per batch, so that agents correlate nodes. */
void mpib_telemetry_flush(struct mpib_comm *c) {
  mpib_shm *shm = __atomic_load_n(&mpib_g.shm, __ATOMIC_ACQUIRE);
  for (int rail = 0; rail < MPIB_NRAILS; rail++) c->tele.rail[rail].inflight_bytes = mpib_tele_inflight(c, rail);
  if (shm && c->shm_slot >= 0 && c->is_send) {
    c->tele.wall_ns = mpib_wall_ns();
    tele_active_until_now(c);
    mpib_shm_flush_telemetry(shm, (uint32_t)c->shm_slot, &c->tele);
  }
  for (int rail = 0; rail < MPIB_NRAILS; rail++) { /* the in-flight gauge carries over */
    c->tele.rail[rail] = (mpib_shm_rail_batch){.inflight_bytes = c->tele.rail[rail].inflight_bytes};
    c->tele_lost_bytes[rail] = 0;
  }
  c->tele_slots = 0;
  c->tele_done = 0;
  c->hint_due = 1;
}

/* Posts the work requests `first` .. `last` (nwr of them, only the last possibly signalled) on
 * QP qi when its send queue has room for all of them, else none (ENOMEM): a full queue is
 * back-pressure, and a chain the provider took in part could land after its range was
 * replayed elsewhere. The signalled one carries the batch it retires (MPIB_WRID_*). 0 or an
 * errno; a provider that still refuses part of the list returns MPIB_POST_PARTIAL (below). In
 * line in the message's chain (mpib_post_chain), out of line for the rest (mpib_qp_post). */
static inline __attribute__((always_inline)) int qp_post(struct mpib_comm *c, int qi, struct ibv_send_wr *first,
                                                         struct ibv_send_wr *last, int nwr) {
  if (c->sq_used[qi] + nwr > c->sq_depth) return ENOMEM;
  int signalled = (last->send_flags & IBV_SEND_SIGNALED) != 0;
  if (signalled) {
    uint64_t batch = (uint64_t)(c->sq_batch[qi] + nwr);
    last->wr_id |= (last->wr_id & MPIB_WRID_SPECIAL)
                       ? batch << MPIB_WRID_SPECIAL_BATCH_SHIFT | (uint64_t)qi << MPIB_WRID_SPECIAL_QP_SHIFT
                       : batch << MPIB_WRID_BATCH_SHIFT;
  }
  struct ibv_send_wr *bad = NULL;
  int rc = ibv_post_send(c->qps[qi].qp, first, &bad);
  if (rc && bad == first) return rc;
  c->sq_used[qi] = (uint16_t)(c->sq_used[qi] + nwr);
  c->sq_batch[qi] = signalled ? 0 : (uint16_t)(c->sq_batch[qi] + nwr);
  return rc ? MPIB_POST_PARTIAL : 0;
}

int mpib_qp_post(struct mpib_comm *c, int qi, struct ibv_send_wr *first, int nwr) {
  struct ibv_send_wr *last = first;
  while (last->next) last = last->next;
  return qp_post(c, qi, first, last, nwr);
}

/* A rail's QPs were reset (rebuilt): their send queues are empty. */
void mpib_sq_reset_rail(struct mpib_comm *c, int r) {
  int base = r == MPIB_RAIL_SOUT ? 0 : (int)c->nqps[MPIB_RAIL_SOUT];
  for (uint32_t i = 0; i < c->nqps[r]; i++) c->sq_used[base + i] = c->sq_batch[base + i] = 0;
}

/* Where a request's byte ranges lie: range SOUT is its first sout bytes, range SUP the rest;
 * both together are the whole request. */
static void range_span(uint32_t ranges, size_t size, size_t sout, size_t *off, size_t *len) {
  *off = (ranges & (1u << MPIB_RAIL_SOUT)) ? 0 : sout;
  size_t end = (ranges & (1u << MPIB_RAIL_SUP)) ? size : sout;
  *len = end > *off ? end - *off : 0;
}

/* An unsignalled RDMA write of `sge` (none: zero bytes) to remote_addr, with every byte of the
 * work request written: the message path builds one or two per message, and clearing all
 * 128 bytes first (a rep stos) cost more than filling the fields it uses. */
static inline void rdma_write_wr(struct ibv_send_wr *wr, struct ibv_sge *sge, uint64_t remote_addr, uint32_t rkey) {
  wr->wr_id = 0;
  wr->next = NULL;
  wr->sg_list = sge;
  wr->num_sge = sge != NULL;
  wr->opcode = IBV_WR_RDMA_WRITE;
  wr->send_flags = 0;
  wr->imm_data = 0;
  memset(&wr->wr, 0, sizeof wr->wr);
  wr->wr.rdma.remote_addr = remote_addr;
  wr->wr.rdma.rkey = rkey;
  memset(&wr->qp_type, 0, sizeof wr->qp_type);
  memset(&wr->bind_mw, 0, sizeof wr->bind_mw); /* the larger member of its union (tso) */
}
_Static_assert(sizeof(((struct ibv_send_wr *)0)->bind_mw) >= sizeof(((struct ibv_send_wr *)0)->tso),
               "rdma_write_wr clears the bind_mw/tso union through bind_mw");

/* Finishes a rail's chain of a slot (the writes wrs[0] .. last, nwr of them) and posts it on QP
 * qi: the last write carries the immediate and is signalled, the others are chained in order
 * unsignalled. Records what the rail carries: range `rail` for an original chain, the lost
 * `ranges` for a replay. 0, the errno of a post none of which went out, or MPIB_POST_PARTIAL. */
static inline __attribute__((always_inline)) int chain_post(struct mpib_comm *c, int slot, int rail,
                                                            const struct mpib_slot_plan *p, uint32_t ranges, int replay,
                                                            int qi, struct ibv_send_wr *wrs, struct ibv_send_wr *last,
                                                            int nwr) {
  last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  last->send_flags |= IBV_SEND_SIGNALED;
  last->imm_data = p->imm;
  last->wr_id = mpib_wrid_data(c, rail, c->slot_reqs[slot][0]->seq, replay);
  if (nwr > 1) { /* the writes before the last: unsignalled, chained in order */
    uint64_t unsignalled = mpib_wrid_special(c, rail, MPIB_WR_UNSIGNALLED);
    for (int i = 0; i + 1 < nwr; i++) {
      wrs[i].wr_id = unsignalled;
      wrs[i].next = &wrs[i + 1];
    }
  }
  if (!replay && mpib_profiling()) mpib_prof_send_posting(c, slot, rail, p->mask, p->sout);
  int rc = qp_post(c, qi, &wrs[0], last, nwr);
  if (rc > 0) return rc; /* nothing of it went out */
  if (!replay) c->slot_rails[slot] |= 1u << rail;
  else c->slot_replay_on[slot][rail] |= (uint8_t)ranges;
  if (rc) return MPIB_POST_PARTIAL;
  c->pending[rail]++;
  return 0;
}

/* The chain of a lone request whose size travels in the immediate: one write, its part of the
 * request's bytes (none: a zero-byte write to the size records' place, for the immediate
 * alone). The common, latency-bound case: no loop and no records. */
static int post_lone(struct mpib_comm *c, int slot, int rail, const struct mpib_slot_plan *p, uint32_t ranges,
                     int replay, int qi) {
  const struct mpib_request *req = c->slot_reqs[slot][0];
  int lane = c->qps[qi].lane;
  struct ibv_send_wr wr;
  struct ibv_sge sge;
  size_t off, len;
  range_span(ranges, req->size, p->sout[0], &off, &len);
  if (len > 0) {
    const struct mpib_cts *cts = &c->cts_snap[slot][0];
    const struct ibv_mr *mr = mpib_comm_mr(c, req->mh, lane);
    if (mr == NULL) return ENODEV; /* registered after the lane's device died (mr_register skips it) */
    sge = (struct ibv_sge){.addr = (uintptr_t)req->data + off, .length = (uint32_t)len, .lkey = mr->lkey};
    rdma_write_wr(&wr, &sge, cts->addr + off, mpib_cts_rkey(cts, lane));
  } else {
    rdma_write_wr(&wr, NULL, c->rem_addr + (uint64_t)slot * sizeof c->sizes[0], c->rem_rkey[lane]);
  }
  return chain_post(c, slot, rail, p, ranges, replay, qi, &wr, &wr, 1);
}

/* The chain of a grouped slot, or of a request too large for the immediate: a write per
 * request part of `ranges`, then a final write with the immediate, which on the leader rail
 * carries the size records. */
static int post_grouped(struct mpib_comm *c, int slot, int rail, const struct mpib_slot_plan *p, uint32_t ranges,
                        int replay, int qi) {
  int nreqs = c->slot_matched[slot];
  struct mpib_request **reqs = c->slot_reqs[slot];
  const struct mpib_cts *cts = c->cts_snap[slot];
  int lane = c->qps[qi].lane; /* its NIC: the registrations and the peer's rkeys of that port */
  struct ibv_send_wr wrs[MPIB_MAX_RECVS + 1];
  struct ibv_sge sges[MPIB_MAX_RECVS + 1];
  int nwr = 0;
  for (int r = 0; r < nreqs; r++) {
    size_t off, len;
    range_span(ranges, reqs[r]->size, p->sout[r], &off, &len);
    if (len == 0) continue;
    const struct ibv_mr *mr = mpib_comm_mr(c, reqs[r]->mh, lane);
    if (mr == NULL) return ENODEV; /* as post_lone's */
    sges[nwr] = (struct ibv_sge){.addr = (uintptr_t)reqs[r]->data + off, .length = (uint32_t)len, .lkey = mr->lkey};
    rdma_write_wr(&wrs[nwr], &sges[nwr], cts[r].addr + off, mpib_cts_rkey(&cts[r], lane));
    nwr++;
  }
  struct ibv_sge *records = NULL; /* the leader's final write carries the size records */
  if (rail == p->leader) {        /* a size in the immediate is a lone request's: post_lone's */
    records = &sges[nwr];
    *records = (struct ibv_sge){.addr = (uintptr_t)c->sizes[slot],
                                .length = (uint32_t)(nreqs * sizeof(int32_t)),
                                .lkey = c->stage_mr[lane]->lkey};
  }
  rdma_write_wr(&wrs[nwr], records, c->rem_addr + (uint64_t)slot * sizeof c->sizes[0], c->rem_rkey[lane]);
  nwr++;
  return chain_post(c, slot, rail, p, ranges, replay, qi, wrs, &wrs[nwr - 1], nwr);
}

/* Posts one rail's chain for a slot: a write per request part of the byte ranges `ranges`,
 * the last one (or a final write carrying the size records) with the immediate and
 * signalled. An original chain carries range `rail`; a replay carries the lost ranges on a
 * surviving rail. Returns 0, the errno of ibv_post_send when none of it was posted, ENODEV
 * (none posted) when a request's buffer has no registration on the rail's NIC (registered after
 * that device died), or MPIB_POST_PARTIAL. */
int mpib_post_chain(struct mpib_comm *c, int slot, int rail, const struct mpib_slot_plan *p, uint32_t ranges,
                    int replay) {
  int qi = mpib_chain_qp(c, rail, c->slot_reqs[slot][0]->seq);
  if (qi < 0 || c->qps[qi].qp == NULL) return EINVAL;
  if (c->slot_matched[slot] == 1 && p->size_in_imm) return post_lone(c, slot, rail, p, ranges, replay, qi);
  return post_grouped(c, slot, rail, p, ranges, replay, qi);
}

/* A range of the slot that could not go out on its rail waits for a replay (post_replays), on
 * whichever rail can carry it first; its telemetry, counted as posted at the slot's plan,
 * counts where the replay goes. */
void mpib_slot_defer_range(struct mpib_comm *c, int slot, int rail) {
  if (mpib_tele_on(c)) mpib_tele_unpost(c, slot, rail);
  if (c->slot_replay_wait[slot] == 0) c->replays_waiting++;
  c->slot_replay_wait[slot] |= (uint8_t)(1u << rail);
}

/* RDMA-writes a slot's CTS elements into the sender's FIFO on `rail`. Writing them again
 * (after the CTS rail failed) is harmless: the same bytes land in the same place. */
int mpib_post_cts(struct mpib_comm *c, int slot, int rail, int n, int signalled) {
  int qi = mpib_qp_index(rail, 0, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
  int lane = c->qps[qi].lane;
  struct mpib_cts *cts = c->cts[slot];
  struct ibv_sge sge = {.addr = (uintptr_t)cts, .length = (uint32_t)(n * sizeof *cts), .lkey = c->stage_mr[lane]->lkey};
  struct ibv_send_wr wr;
  rdma_write_wr(&wr, &sge, c->rem_addr + (uint64_t)slot * sizeof c->cts[0], c->rem_rkey[lane]);
  wr.wr_id = mpib_wrid_special(c, rail, signalled ? MPIB_WR_CTS : MPIB_WR_UNSIGNALLED);
  if (signalled) wr.send_flags = IBV_SEND_SIGNALED;
  if (sge.length <= c->max_inline) wr.send_flags |= IBV_SEND_INLINE; /* NCCL_IB_USE_INLINE */
  int rc = mpib_qp_post(c, qi, &wr, 1);
  if (rc == 0 && signalled) c->pending[rail]++;
  return rc;
}

/* Every lane's SRQ of rail r refilled: 0 or the first -errno. */
int mpib_srq_refill_rail(struct mpib_comm *c, int r) {
  for (int i = 0; i < mpib_lane_count(c, r); i++) {
    int rc = mpib_srq_refill(c, mpib_lane(r, i));
    if (rc) return rc;
  }
  return 0;
}

/* ---- Failover: a rail leaves service, the connection goes on (docs/failover.md) ---- */

uint64_t mpib_wall_ms(void) { return mpib_wall_ns() / 1000000u; }

/* Publishes a rail's state to the agent's telemetry (docs/shm-format.md 4.3). */
void mpib_publish_rail_state(struct mpib_comm *c, int r) {
  mpib_shm *shm = __atomic_load_n(&mpib_g.shm, __ATOMIC_ACQUIRE);
  if (shm == NULL || c->shm_slot < 0) return;
  int st = c->rail[r].state;
  int pub = st == MPIB_RAIL_UP ? MPIB_SHM_RAIL_UP : st == MPIB_RAIL_DEAD ? MPIB_SHM_RAIL_FAILED : MPIB_SHM_RAIL_DOWN;
  mpib_shm_set_rail_state(shm, (uint32_t)c->shm_slot, r, pub, mpib_wall_ms() * 1000000ull);
}

/* A sender's slot completes once every byte range is confirmed: no original chain, replay
 * chain or replay waiting to be posted is left. */
static int slot_unconfirmed(const struct mpib_comm *c, int slot) {
  uint32_t live = c->slot_rails[slot] | c->slot_replay_wait[slot];
  for (int r = 0; r < MPIB_NRAILS; r++) live |= c->slot_replay_on[slot][r];
  return live != 0;
}

void mpib_slot_try_complete(struct mpib_comm *c, int slot) {
  if (slot_unconfirmed(c, slot)) return;
  c->progress_count++;
  c->tele_done++;
  for (int r = 0; r < c->slot_matched[slot]; r++) {
    c->slot_reqs[slot][r]->done = 1;
    c->slot_reqs[slot][r] = NULL;
  }
  c->slot_matched[slot] = 0;
  c->slot_posted_seq1[slot] = 0;
}

/* A receive's sizes, from the immediate or the size records, checked against its buffers. */
ncclResult_t mpib_recv_finish(struct mpib_comm *c, int rail, uint32_t slot, struct mpib_request *req,
                              uint32_t imm_size) {
  if (imm_size != MPIB_IMM_NO_SIZE && req->nreqs != 1) {
    MPIB_WARN("%s rail: size in the immediate for a grouped receive of %d", mpib_rail_name(rail), req->nreqs);
    return ncclRemoteError;
  }
  volatile int32_t *rec = c->sizes[slot];
  for (int r = 0; r < req->nreqs; r++) {
    int32_t got = imm_size != MPIB_IMM_NO_SIZE ? (int32_t)imm_size : rec[r];
    if (got < 0 || (uint64_t)got > req->posted[r]) {
      MPIB_WARN("peer reported %d bytes for a %zu-byte receive", got, req->posted[r]);
      return ncclRemoteError;
    }
    req->sizes[r] = got;
  }
  req->done = 1;
  c->slot_reqs[slot][0] = NULL;
  if (--c->recvs_open == 0) __atomic_store_n(&c->recv_idle_seq1, c->fifo_head + 1, __ATOMIC_RELEASE);
  c->progress_count++;
  return ncclSuccess;
}

/* Everything lane `lane` of rail r (out of service) holds in its CQ, thrown away before its QPs
 * are reset: a receive completion gives its SRQ place back, a send of the current generation
 * its send-queue places; what they carried was settled by the fence. A dead device's CQ is
 * not touched. */
void mpib_lane_discard(struct mpib_comm *c, int r, int lane) {
  struct ibv_wc wcs[16];
  int n;
  if (!c->cq[lane] || __atomic_load_n(&c->nic[lane]->fatal, __ATOMIC_ACQUIRE)) return;
  while ((n = ibv_poll_cq(c->cq[lane], 16, wcs)) > 0) {
    for (int i = 0; i < n; i++) {
      if (wcs[i].wr_id == MPIB_WRID_RECV) c->srq_posted[lane]--;
      else if (mpib_wrid_current(c, r, wcs[i].wr_id)) mpib_sq_retire(c, r, wcs[i].wr_id);
    }
  }
}
