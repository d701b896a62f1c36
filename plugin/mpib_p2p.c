/*
 * The message path: isend, irecv, test (mpib_p2p.h). Pure C, no Go calls, no allocation.
 * Called by the ABI tables (abi_v*.c); calls failover (mpib_failover.h) when a rail misbehaves
 * and on each progress call, the slots' bookkeeping (mpib_slots.h) and the flush
 * (mpib_flush.h).
 *
 * One message's path: the receiver's irecv RDMA-writes a CTS element per grouped receive
 * into the sender's FIFO slot (fifo_head % 32) on the CTS rail. The sender's isend waits
 * until every element of that slot carries the expected sequence number, matches its tag,
 * and once all grouped sends are present posts, on each ACTIVE rail only, a chain of
 * RDMA_WRITEs (its share of every request) ending in a signalled RDMA_WRITE_WITH_IMM whose
 * imm_data carries the slot, the active-rail mask and the sequence number. The lowest active
 * rail's final write also carries the size records. The receiver consumes one SRQ receive per
 * rail, learns the expected mask from the first immediate and completes when every active
 * rail has reported. A rail that fails leaves service without an error to NCCL
 * (mpib_failover.c, docs/failover.md).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "mpib.h"
#include "mpib_clock.h"
#include "mpib_failover.h"
#include "mpib_flush.h"
#include "mpib_hostile.h"
#include "mpib_p2p.h"
#include "mpib_profiler.h"
#include "mpib_shm.h"
#include "mpib_slots.h"
#include "mpib_srq.h"
#include "mpib_watch.h"

static ncclResult_t progress(struct mpib_comm *c);

/* Runs on calls that find nothing to do (every 16th poll of test and isend): with both devices
 * alive and the peer there it costs a few loads, in line. */
static inline ncclResult_t comm_health(struct mpib_comm *c) {
  if (!mpib_rail_fatal(c, MPIB_RAIL_SOUT) && !mpib_rail_fatal(c, MPIB_RAIL_SUP) &&
      !__atomic_load_n(&c->peer_gone_ns, __ATOMIC_ACQUIRE) && !c->stall_since_ns)
    return ncclSuccess;
  return mpib_failover_health_check(c);
}

static uint32_t cached_hint(struct mpib_comm *c) {
  if (c->hint_due) {
    c->hint_due = 0;
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

/* The policy entry point: the SUP share (parts per 1024) of the slot about to be posted.
 * Order: test override, agent hint (advanced mode, fresh agent), vanilla; then the guard. */
static uint32_t mpib_policy_sup_bw(struct mpib_comm *c) {
  uint32_t bw;
  if (c->force_sup_bw != MPIB_NO_OVERRIDE) {
    bw = c->force_sup_bw;
  } else if (c->mode == MPIB_MODE_ADVANCED && c->shm_slot >= 0) {
    bw = cached_hint(c);
  } else {
    bw = mpib_vanilla_sup_bw(c->path_class);
  }
  if (c->rail[MPIB_RAIL_SUP].state != MPIB_RAIL_UP || mpib_rail_port_down(c, MPIB_RAIL_SUP) ||
      mpib_rail_fatal(c, MPIB_RAIL_SUP))
    return 0;
  uint32_t guarded = mpib_guard_sup_bw(bw, c->path_class, c->sup_relay, c->nqps[MPIB_RAIL_SUP]);
  if (guarded == MPIB_SUP_BW_MAX) return guarded; /* all on SUP already: SOUT's state changes nothing */
  if ((c->rail[MPIB_RAIL_SOUT].state != MPIB_RAIL_UP || mpib_rail_port_down(c, MPIB_RAIL_SOUT) ||
       mpib_rail_fatal(c, MPIB_RAIL_SOUT)) &&
      c->nqps[MPIB_RAIL_SUP])
    return MPIB_SUP_BW_MAX;
  return guarded;
}

/* The agent telemetry of a planned slot: its bytes and requests per rail, which its
 * completion and any replay report too (mpib_tele_complete), and its post time `now` for their
 * latency (the caller reads the clock: one CLOCK_MONOTONIC read per slot, the only one the
 * posting path makes). The slot's ranges count as posted now, on the rails of its plan: a
 * range that does not go out is taken back (mpib_slot_defer_range), and its replay counts it
 * where it goes. sout is the slot's bytes on SOUT of total, nsout and nsup its requests with
 * bytes on each rail. */
static inline void slot_planned(struct mpib_comm *c, int slot, const struct mpib_slot_plan *p, uint64_t total,
                                uint64_t sout, uint8_t nsout, uint8_t nsup, uint64_t now) {
  c->slot_rail_bytes[slot][MPIB_RAIL_SOUT] = sout;
  c->slot_rail_bytes[slot][MPIB_RAIL_SUP] = total - sout;
  c->slot_rail_reqs[slot][MPIB_RAIL_SOUT] = nsout;
  c->slot_rail_reqs[slot][MPIB_RAIL_SUP] = nsup;
  c->slot_post_ns[slot] = now;
  if (p->mask & (1u << MPIB_RAIL_SOUT)) mpib_tele_post(c, slot, MPIB_RAIL_SOUT, MPIB_RAIL_SOUT, now);
  if (p->mask & (1u << MPIB_RAIL_SUP)) mpib_tele_post(c, slot, MPIB_RAIL_SUP, MPIB_RAIL_SUP, now);
  c->tele_slots++;
}

/* slot_planned for a grouped slot: a pass over its requests. */
static __attribute__((noinline)) void
plan_telemetry_grouped(struct mpib_comm *c, int slot, const struct mpib_slot_plan *p, uint64_t total, uint64_t now) {
  uint64_t sout = 0;
  uint8_t nsout = 0, nsup = 0;
  for (int r = 0; r < c->slot_matched[slot]; r++) {
    sout += p->sout[r];
    nsout += p->sout[r] > 0;
    nsup += c->slot_reqs[slot][r]->size > p->sout[r];
  }
  slot_planned(c, slot, p, total, sout, nsout, nsup, now);
}

/* slot_planned, for a comm with an agent slot only: out of line, so that the others keep their
 * frames, and a lone request (the common case) needs no pass over the slot. */
static __attribute__((noinline)) void plan_telemetry(struct mpib_comm *c, int slot, const struct mpib_slot_plan *p,
                                                     uint64_t total, uint64_t now) {
  if (c->slot_matched[slot] != 1) {
    plan_telemetry_grouped(c, slot, p, total, now);
    return;
  }
  uint64_t sout = p->sout[0];
  slot_planned(c, slot, p, total, sout, sout > 0, total > sout, now);
}

/* Decides the slot's split: whole to one rail when the slot's bytes are at most
 * whole_msg_max (deficit-counted, see mpib_whole_message_rail), else cut by the weight. */
static void plan_slot(struct mpib_comm *c, int slot, struct mpib_slot_plan *p) {
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
    c->slot_sout[slot][r] = (uint32_t)p->sout[r];
    if (p->sout[r] > 0) p->mask |= 1u << MPIB_RAIL_SOUT;
    if (size > p->sout[r]) p->mask |= 1u << MPIB_RAIL_SUP;
    c->sizes[slot][r] = (int32_t)size;
  }
  c->tele.applied_sup_bw = sup_bw; /* after the guard and failover: what this slot used */
  if (p->mask == 0)
    p->mask = 1u << (whole >= 0 ? whole : sup_bw >= MPIB_SUP_BW_MAX / 2 ? MPIB_RAIL_SUP : MPIB_RAIL_SOUT);
  if (mpib_tele_on(c)) plan_telemetry(c, slot, p, total, mpib_now_ns()); /* the clock read here: a leaf */
  c->slot_full[slot] = (uint8_t)p->mask;
  p->leader = (p->mask & 1u) ? MPIB_RAIL_SOUT : MPIB_RAIL_SUP;
  /* A lone small request carries its size in the immediate: each rail then posts a single
   * write (its data with the immediate), the common latency-bound case. */
  p->size_in_imm = nreqs == 1 && reqs[0]->size <= MPIB_IMM_MAX_SIZE;
  p->imm = mpib_imm_encode((uint32_t)slot, p->mask, reqs[0]->seq,
                           p->size_in_imm ? (uint32_t)reqs[0]->size : MPIB_IMM_NO_SIZE);
}

/* Whether a new slot's chain may go on `rail`: it is in service, or failover is off (then a
 * failed post is an error, not a replay). post_rail posts there, and slot_fits checks the room
 * there, so both ask this. */
static inline int rail_takes_slots(const struct mpib_comm *c, int rail) {
  return c->rail[rail].state == MPIB_RAIL_UP || !mpib_g.failover;
}

/* Posts one rail's chain of the slot. A rail out of service (a failover under way: its QPs are
 * in the error state, and a chain posted now would be flushed after its fence was settled),
 * one whose send queue is full (back-pressure, not a fault) or one that refuses the post (its
 * device just died, say) does not carry it: the range goes out as a replay, and a refusing
 * rail fails over like any failed rail. A chain taken in part fails the rail over, and the
 * fence settles it (MPIB_POST_PARTIAL). */
static ncclResult_t post_rail(struct mpib_comm *c, int slot, int rail, const struct mpib_slot_plan *p) {
  int rc = rail_takes_slots(c, rail) ? mpib_post_chain(c, slot, rail, p, 1u << rail, 0) : EAGAIN;
  if (rc == 0) return ncclSuccess;
  if (rc == EINVAL) {
    MPIB_WARN("%s rail has no QP for this connection (policy bug)", mpib_rail_name(rail));
    return ncclInternalError;
  }
  if (!mpib_g.failover) {
    MPIB_WARN("%s rail: ibv_post_send failed: %s", mpib_rail_name(rail), strerror(rc));
    return ncclSystemError;
  }
  if (rc == MPIB_POST_PARTIAL)
    return mpib_failover_rail_fail(c, rail, "completion-error", "its send queue took part of a chain");
  mpib_slot_defer_range(c, slot, rail);
  if (rc == EAGAIN || rc == ENOMEM) return ncclSuccess;
  return mpib_failover_rail_fail(c, rail, "completion-error", "posting to it failed");
}

/* Post the slot's matched sends on every active rail (post_rail: a rail that cannot take its
 * range now leaves it to a replay). */
static ncclResult_t post_slot(struct mpib_comm *c, int slot) {
  struct mpib_slot_plan plan;
  plan_slot(c, slot, &plan);
#ifdef MPIB_HOSTILE_TEST
  mpib_hostile_before_post(c, slot, c->slot_matched[slot], plan.size_in_imm); /* the test build only */
#endif
  c->slot_posted_seq1[slot] = c->slot_reqs[slot][0]->seq + 1;
  uint64_t ack = mpib_ack_word(c->slot_posted_seq1[slot], plan.mask, 0,
                               plan.size_in_imm ? (uint32_t)c->slot_reqs[slot][0]->size : MPIB_IMM_NO_SIZE);
  for (int r = 0; r < MPIB_NRAILS; r++) __atomic_store_n(&c->slot_ack[slot][r], ack, __ATOMIC_RELEASE);
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    if (!(plan.mask & (1u << rail))) continue;
    ncclResult_t res = post_rail(c, slot, rail, &plan);
    if (res != ncclSuccess) return res;
  }
  if (mpib_tele_on(c) && mpib_tele_post_due(c)) mpib_telemetry_flush(c);
  return ncclSuccess;
}

/* A CTS carrying our sequence number whose fields do not match its checksum is still being
 * copied in (see mpib_cts_check). Wait for it, but not forever: after a few seconds the peer
 * is sending garbage. Only this rare path reads the clock. */
static ncclResult_t cts_still_landing(struct mpib_comm *c, int slot) {
  uint64_t now = mpib_now_ns();
  if (c->cts_torn_since_ns == 0) {
    c->cts_torn_since_ns = now;
  } else if (now - c->cts_torn_since_ns > 5000000000ull) {
    MPIB_WARN("the CTS in slot %d never became consistent: corrupt data from the peer", slot);
    return ncclRemoteError;
  }
  return ncclSuccess;
}

/* An isend that found no CTS in its slot yet: NCCL calls again. Every 16th such call polls
 * and checks the comm's health (keepalives and failover move on a sender NCCL only asks to
 * send). */
static ncclResult_t cts_not_there(struct mpib_comm *c) {
  if ((++c->cts_waits & 15) != 0) return ncclSuccess;
  ncclResult_t res = progress(c);
  return res != ncclSuccess ? res : comm_health(c);
}

/* Copies a slot's CTS elements out of the FIFO once they have all landed intact; until then
 * leaves cts_snap_seq[slot] behind and NCCL calls isend again. */
static ncclResult_t snapshot_cts(struct mpib_comm *c, int slot, uint64_t want) {
  volatile struct mpib_cts *fifo = c->cts[slot];
  struct mpib_cts *snap = c->cts_snap[slot];
  if (fifo[0].seq != want) return cts_not_there(c);
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

/* Whether every rail that takes slots has room in the QP slot seq would use for the slot's
 * longest chain (a write per grouped request and the final write with the immediate), whether
 * or not the split gives it a part. Replays waiting for room go before any new slot. */
static inline int slot_fits(const struct mpib_comm *c, uint64_t seq, uint32_t nreqs) {
  if (c->replays_waiting) return 0;
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    if (c->nqps[rail] == 0 || !rail_takes_slots(c, rail)) continue;
    int qi = mpib_qp_index(rail, seq, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
    if (qi >= 0 && !mpib_sq_admits(c->sq_used[qi], nreqs + 1, c->sq_depth, MPIB_SQ_CTRL_RESERVE)) return 0;
  }
  return 1;
}

/* A slot whose chain does not fit its send queues yet waits, as one whose CTS has not arrived
 * does: NCCL calls isend again. The completions polled here free the room. */
static ncclResult_t wait_for_room(struct mpib_comm *c, uint64_t seq, uint32_t nreqs, int *fits) {
  *fits = slot_fits(c, seq, nreqs);
  if (*fits) return ncclSuccess;
  ncclResult_t res = progress(c);
  *fits = res == ncclSuccess && slot_fits(c, seq, nreqs);
  return res;
}

/* The slot's previous sequence (32 back) was posted and is not confirmed yet: the receiver has
 * it and may already have sent the CTS of the next one there, but the sender's requests, split
 * and CTS snapshot of that slot stay until its acknowledgements are in, since a failover
 * replays from them. The new sequence waits, as for a CTS not yet there: matching it into the
 * held slot would post the old requests with the new ones (net_ib clears a slot when it posts
 * it; MPIB keeps it for the replay). */
static ncclResult_t slot_still_held(struct mpib_comm *c, int slot) {
  ncclResult_t res = progress(c);
  if (res != ncclSuccess || !c->slot_posted_seq1[slot]) return res;
  return comm_health(c);
}

/* isend once the slot's CTS may be there (or no rail works): match the tag, check the request,
 * post the slot when it is complete. Kept out of line so that the calls that find no CTS,
 * most of them while the receiver is behind, pay for a few loads and not for its frame. */
static __attribute__((noinline)) ncclResult_t isend_slot(struct mpib_comm *c, void *data, size_t size, int tag,
                                                         void *mhandle, void *phandle, void **request) {
  if (c->stall_since_ns) { /* no rail works: nothing can be posted; NCCL calls again */
    ncclResult_t res = progress(c);
    if (res != ncclSuccess || c->stall_since_ns) return res != ncclSuccess ? res : comm_health(c);
  }
  int slot = (int)(c->fifo_head % MPIB_MAX_REQUESTS);
  uint64_t want = c->fifo_head + 1;
  if (c->slot_posted_seq1[slot]) return slot_still_held(c, slot);
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
  ncclResult_t checked = mpib_check_mhandle(c, mhandle, size, "isend");
  if (checked != ncclSuccess) return checked;
  if (c->slot_matched[slot] + 1 == (int)nreqs) { /* this request completes the slot: post it */
    int fits;
    ncclResult_t res = wait_for_room(c, c->fifo_head, nreqs, &fits);
    if (res != ncclSuccess || !fits) return res;
  }
  struct mpib_request *req = mpib_req_alloc(c, MPIB_REQ_SEND);
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
    c->progress_count++;
  }
  *request = req;
  return ncclSuccess;
}

ncclResult_t mpib_isend(void *sendComm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                        void **request) {
  struct mpib_comm *c = sendComm;
  *request = NULL;
  uint64_t want = c->fifo_head + 1;
  int slot = (int)(c->fifo_head % MPIB_MAX_REQUESTS);
  if (!c->stall_since_ns && c->cts_snap_seq[slot] != want && ((volatile struct mpib_cts *)c->cts[slot])->seq != want)
    return cts_not_there(c);
  return isend_slot(c, data, size, tag, mhandle, phandle, request);
}

/* Keeps a rail's receives posted; a rail that refuses them (its device just died) fails over. */
static ncclResult_t srq_refill_or_fail(struct mpib_comm *c, int r) {
  /* A rail being rebuilt is its thread's alone (a provider built without locks would race);
   * recv_rebuilt refills it. */
  if (!c->srq[r] || c->rail[r].state == MPIB_RAIL_DEAD || c->rail[r].rebuild.running) return ncclSuccess;
  if (mpib_srq_refill_rail(c, r) == 0) return ncclSuccess;
  if (c->rail[r].state != MPIB_RAIL_UP) return ncclSuccess; /* already out of service */
  return mpib_failover_rail_fail(c, r, "completion-error", "posting receives to it failed");
}

static ncclResult_t srq_refill_all(struct mpib_comm *c) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    ncclResult_t res = srq_refill_or_fail(c, r);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

ncclResult_t mpib_irecv(void *recvComm, int n, void **data, size_t *sizes, int *tags, void **mhandles, void **phandles,
                        void **request) {
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
  struct mpib_request *req = mpib_req_alloc(c, MPIB_REQ_RECV);
  if (!req) return ncclSuccess;
  req->seq = c->fifo_head;
  req->nreqs = n;
  struct mpib_cts *cts = c->cts[slot];
  for (int r = 0; r < n; r++) {
    struct mpib_mr *mh = mhandles ? mhandles[r] : NULL;
    ncclResult_t checked = mpib_check_mhandle(c, mh, sizes[r], "irecv");
    if (checked != ncclSuccess) {
      mpib_req_free(req);
      return checked;
    }
    memset(&cts[r], 0, sizeof cts[r]);
    cts[r].addr = (uint64_t)(uintptr_t)data[r];
    cts[r].size = sizes[r];
    for (int rail = 0; rail < MPIB_NRAILS; rail++) { /* a rail's first lane: its index */
      struct ibv_mr *mr = mh ? mpib_comm_mr(c, mh, rail) : NULL;
      cts[r].rkey[rail] = mr ? mr->rkey : 0;
    }
    for (int i = 1; c->nqps[MPIB_RAIL_SUP] && i < c->sup_lanes; i++) { /* striped SUP lanes */
      struct ibv_mr *mr = mh ? mpib_comm_mr(c, mh, mpib_lane(MPIB_RAIL_SUP, i)) : NULL;
      cts[r].stripe_rkey[i - 1] = mr ? mr->rkey : 0;
    }
    cts[r].tag = tags[r];
    cts[r].nreqs = (uint32_t)n;
    cts[r].seq = c->fifo_head + 1;
    cts[r].check = mpib_cts_check(&cts[r]);
    req->sizes[r] = 0;
    req->posted[r] = sizes[r];
  }
  /* Every MPIB_CTS_SIGNAL_EVERY-th CTS signalled keeps the CTS QP's send queue drained. The
   * comm stops reading as idle before the CTS can reach the sender: the control plane answers a
   * FAIL for an idle receiver with "nothing open", and the sender then replays all a failed rail
   * carried of this receive, which its data path, not fenced yet, may already have taken. */
  int rail = c->cts_rail;
  int rc = 0;
  uint64_t idle = c->recv_idle_seq1; /* written by this thread only */
  __atomic_store_n(&c->recv_idle_seq1, 0, __ATOMIC_RELEASE);
  if (mpib_g.failover && !mpib_rail_usable(c, rail)) { /* rebuilding, or out: written when a rail is back */
    c->cts_repost_due = 1;
    c->cts_repost_from = 0;
  } else {
    rc = mpib_post_cts(c, slot, rail, n, slot % MPIB_CTS_SIGNAL_EVERY == 0);
  }
  if (rc == ENOMEM) { /* the CTS QP's send queue is full: NCCL calls again, after its completions */
    __atomic_store_n(&c->recv_idle_seq1, idle, __ATOMIC_RELEASE); /* nothing was posted */
    mpib_req_free(req);
    return progress(c);
  }
  if (rc) {
    MPIB_WARN("%s rail: posting the CTS failed: %s", mpib_rail_name(rail), strerror(rc));
    if (!mpib_g.failover || !mpib_rail_usable(c, 1 - rail)) {
      __atomic_store_n(&c->recv_idle_seq1, idle, __ATOMIC_RELEASE);
      mpib_req_free(req);
      return ncclSystemError;
    }
  }
  c->slot_reqs[slot][0] = req;
  c->fifo_head++;
  c->recvs_open++;
  if (mpib_profiling()) mpib_prof_recv_posted(c, req, phandles, sizes);
  ncclResult_t res = rc ? mpib_failover_rail_fail(c, rail, "completion-error", "posting the CTS failed") : ncclSuccess;
  if (res == ncclSuccess) res = srq_refill_all(c);
  if (res != ncclSuccess) return res;
  *request = req;
  return ncclSuccess;
}

/* The agent telemetry of a send completion on `rail` at `now` (after the slot's own
 * bookkeeping), with the batch's publication when it is due: an original chain, which carried
 * the rail's own range, or a replay, which carried the lost `ranges`. Out of line: the
 * completion path of a comm without an agent keeps its frame; the caller reads the clock. */
static __attribute__((noinline)) void tele_chain_done(struct mpib_comm *c, int slot, int rail, uint64_t now) {
  mpib_tele_complete(c, slot, rail, rail, now);
  if (mpib_tele_done_due(c)) mpib_telemetry_flush(c);
}
static __attribute__((noinline)) void tele_replay_done(struct mpib_comm *c, int slot, int rail, uint32_t ranges,
                                                       uint64_t now) {
  for (int range = 0; range < MPIB_NRAILS; range++)
    if (ranges & (1u << range)) mpib_tele_complete(c, slot, rail, range, now);
  if (mpib_tele_done_due(c)) mpib_telemetry_flush(c);
}

static ncclResult_t on_send_completion(struct mpib_comm *c, int rail, uint64_t id) {
  uint64_t seq = id & MPIB_WRID_SEQ_MASK;
  int slot = (int)(seq % MPIB_MAX_REQUESTS);
  if (c->slot_posted_seq1[slot] != seq + 1) return ncclSuccess; /* already settled by a failover */
  uint32_t ranges; /* the byte ranges this rail's chain carried: its own, or the lost ones it replayed */
  if (id & MPIB_WRID_REPLAY) {
    ranges = c->slot_replay_on[slot][rail];
    if (!ranges) return ncclSuccess;
    c->slot_replay_on[slot][rail] = 0;
  } else {
    if (!(c->slot_rails[slot] & (1u << rail))) return ncclSuccess;
    if (mpib_profiling()) mpib_prof_send_rail_done(c, slot, rail);
    c->slot_rails[slot] &= ~(1u << rail);
    ranges = 1u << rail;
  }
  mpib_slot_acked(c, slot, rail, ranges);
  mpib_slot_try_complete(c, slot);
  if (!mpib_tele_on(c)) return ncclSuccess;
  if (id & MPIB_WRID_REPLAY) tele_replay_done(c, slot, rail, ranges, mpib_completion_now(c));
  else tele_chain_done(c, slot, rail, mpib_completion_now(c));
  return ncclSuccess;
}

/* A receive completion of lane `lane` (a lane of `rail`): that lane's NIC placed the ranges it
 * confirms. */
static ncclResult_t on_recv_completion(struct mpib_comm *c, int rail, int lane, const struct ibv_wc *wc) {
  uint32_t slot, mask, seq8, imm_size;
  if (!(wc->wc_flags & IBV_WC_WITH_IMM) || mpib_imm_decode(wc->imm_data, &slot, &mask, &seq8, &imm_size) != 0) {
    MPIB_WARN("%s rail: malformed completion from the peer (imm 0x%x)", mpib_rail_name(rail), wc->imm_data);
    return ncclRemoteError;
  }
  /* A fenced rail's late write: the sender was told the slot lacks it and replays it whole. */
  if (c->rail[rail].state == MPIB_RAIL_DOWN || c->rail[rail].state == MPIB_RAIL_DEAD) return ncclSuccess;
  struct mpib_request *req = c->slot_reqs[slot][0];
  int replay = mpib_imm_is_replay(wc->imm_data);
  /* An original chain on this rail confirms range `rail` of a slot whose full mask is `mask`;
   * a replay names its ranges in `mask` and the full mask apart. */
  uint32_t full = replay ? mpib_imm_replay_full(wc->imm_data) : mask;
  uint32_t ranges = replay ? mask : 1u << rail;
  int complete = req == NULL || (req->seq & 0xFF) != seq8
                     ? -1
                     : mpib_recv_ranges_arrived(&req->expected_mask, &req->have_mask, full, ranges, replay);
  if (complete < 0) { /* never guessed at: a stray write may have landed in a buffer NCCL owns again */
    char open[112];
    if (req == NULL) snprintf(open, sizeof open, "the slot holds no receive");
    else if ((req->seq & 0xFF) != seq8)
      snprintf(open, sizeof open, "the slot's receive is seq %u", (unsigned)(req->seq & 0xFF));
    else
      snprintf(open, sizeof open, "its receive expects ranges %u and has %u%s", req->expected_mask, req->have_mask,
               !replay && (req->have_mask & ranges) ? " (the transport delivered a write twice?)" : "");
    MPIB_WARN(
        "%s rail (generation %u, %s; other rail %s): completion for slot %u (seq %u, mask %u%s, QP %u) matches no "
        "posted receive: %s (next receive seq %llu)",
        mpib_rail_name(rail), c->rail[rail].gen, mpib_rail_state_name(c->rail[rail].state),
        mpib_rail_state_name(c->rail[1 - rail].state), slot, seq8, mask, replay ? ", replay" : "", wc->qp_num, open,
        (unsigned long long)c->fifo_head);
    return ncclRemoteError;
  }
  req->wrote_lanes |= 1u << lane;
  if (mpib_profiling()) mpib_prof_recv_rail_done(req, rail);
  if (!complete) return ncclSuccess;
  return mpib_recv_finish(c, rail, slot, req, imm_size);
}

/* Whether a rail can have completions to deliver: signalled sends outstanding, or (receiver)
 * receives posted that the peer's writes can complete, or it is being fenced (what landed
 * before the fence is handled before the receiver's record). An idle rail costs no poll;
 * neither does a failed one (its CQ is emptied when it is rebuilt). */
static int rail_busy(const struct mpib_comm *c, int rail) {
  int st = c->rail[rail].state;
  if (c->pending[rail] > 0 || (c->srq[rail] && c->recvs_open > 0)) return st != MPIB_RAIL_DOWN && st != MPIB_RAIL_DEAD;
  return st == MPIB_RAIL_FENCING;
}

/* One completion of lane `lane` of rail `rail`: a receive used up that lane's SRQ. */
static ncclResult_t handle_completion(struct mpib_comm *c, int rail, int lane, const struct ibv_wc *wc) {
  uint64_t id = wc->wr_id;
  if (id == MPIB_WRID_RECV) { /* an SRQ receive: they outlive QP generations */
    c->srq_posted[lane]--;
    if (wc->status != IBV_WC_SUCCESS) return mpib_failover_completion_error(c, rail, wc);
    return on_recv_completion(c, rail, lane, wc);
  }
  int st = c->rail[rail].state;
  if (!mpib_wrid_current(c, rail, id)) return ncclSuccess;
  mpib_sq_retire(c, rail, id);
  if (st == MPIB_RAIL_DOWN || st == MPIB_RAIL_DEAD) return ncclSuccess;
  if (wc->status != IBV_WC_SUCCESS) return mpib_failover_completion_error(c, rail, wc);
  if (c->pending[rail]) c->pending[rail]--;
  c->rail[rail].acks++;
  int kind = mpib_wrid_kind(id);
  if (kind == MPIB_WR_PROBE) return mpib_failover_probe_done(c, rail);
  if (kind == MPIB_WR_KEEPALIVE && c->rail[rail].keepalive_out > 0) c->rail[rail].keepalive_out--;
  if (kind == 0 && c->is_send) return on_send_completion(c, rail, id);
  return ncclSuccess; /* a signalled CTS or control write */
}

/* Handles what one lane's CQ yields, 16 at a time while it fills the batch, and counts it in
 * *seen; a failing poll fails the rail. In line in progress: one call level less on every
 * test. */
static inline __attribute__((always_inline)) ncclResult_t poll_lane(struct mpib_comm *c, int rail, int lane,
                                                                    int *seen) {
  struct ibv_wc wcs[16];
  int n;
  do {
    n = ibv_poll_cq(c->cq[lane], 16, wcs);
    if (n == 0) return ncclSuccess;
    if (n < 0) {
      if (c->rail[rail].state != MPIB_RAIL_UP) return ncclSuccess;
      return mpib_failover_rail_fail(c, rail, "completion-error", "ibv_poll_cq failed");
    }
    *seen += n;
    for (int i = 0; i < n; i++) {
      ncclResult_t res = handle_completion(c, rail, lane, &wcs[i]);
      if (res != ncclSuccess) return res;
    }
  } while (n == 16);
  return ncclSuccess;
}

/* Drains the completion queues of the rails that have work, each lane while it yields, then
 * lets the failover state machine move (it relies on this: a rail's record is written after
 * its lanes were polled in the same call). */
static ncclResult_t progress(struct mpib_comm *c) {
  c->tele_now_ns = 0; /* mpib_completion_now reads the clock afresh for this call's completions */
  int seen = 0;
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    /* A busy rail has its CQs: the busy test never reads the CQ pointer, which a waiting standby
     * rail's builder sets on another thread (mpib_comm_build_deferred). */
    if (!rail_busy(c, rail)) continue;
    for (int i = 0, lanes = mpib_lane_count(c, rail); i < lanes; i++) {
      int lane = mpib_lane(rail, i);
      if (i > 0 && !rail_busy(c, rail)) break; /* an earlier lane's completion took the rail out */
      if (__atomic_load_n(&c->nic[lane]->fatal, __ATOMIC_ACQUIRE)) continue; /* a dead device's CQ is never polled */
      ncclResult_t res = poll_lane(c, rail, lane, &seen);
      if (res != ncclSuccess) return res;
    }
    if (c->srq[rail]) { /* a receiver: refilled after all its lanes' receives were consumed */
      ncclResult_t res = srq_refill_or_fail(c, rail);
      if (res != ncclSuccess) return res;
    }
  }
  uint32_t polls = ++c->idle_polls;
  if ((polls & 15) == 0) {
    ncclResult_t res = ncclSuccess;
    if ((polls & 255) == 0) {
      mpib_watch_stuck_tick(c);
      res = mpib_failover_keepalive_tick(c);
    }
    if (res == ncclSuccess) res = mpib_watch_tick(c);
    if (res != ncclSuccess) return res;
  } else if (mpib_failover_quiet(c, seen > 0)) {
    return ncclSuccess;
  }
  return mpib_failover_tick(c);
}

/* Whether a test that found its request still open checks the comm's health: every 16th
 * poll (what it finds takes effect within microseconds while NCCL keeps testing). Never for a
 * flush: its loopback reads need neither the peer nor the data rails, and mpib_flush_test
 * reports what can stop them (a dead device under a lane, a lane that cannot read back); a
 * flush of the job's last receive outlives a peer that has already finished and closed. */
static inline int health_due(const struct mpib_comm *c, const struct mpib_request *req) {
  return (c->idle_polls & 15) == 0 && req->type != MPIB_REQ_FLUSH;
}

ncclResult_t mpib_test(void *request, int *done, int *sizes) {
  struct mpib_request *req = request;
  struct mpib_comm *c = req->comm;
  *done = 0;
  /* A request an earlier call's completions finished is returned without polling, as net_ib
   * returns one whose events are all in: NCCL calls again for the requests still open, and
   * those calls poll. A flush still waiting (a lane that must read again) lets the comm's
   * failover move too: NCCL may be testing nothing else of this comm. */
  if (!req->done) {
    ncclResult_t res;
    if (req->type != MPIB_REQ_FLUSH) {
      res = progress(c);
    } else {
      res = mpib_flush_test(c, req);
      if (res == ncclSuccess && !req->done && req->flush_redo) res = progress(c);
    }
    if (res != ncclSuccess) return res;
    if (!req->done) return health_due(c, req) ? comm_health(c) : ncclSuccess;
  }
  *done = 1;
  if (sizes && req->type == MPIB_REQ_SEND) sizes[0] = (int)req->size;
  if (req->type == MPIB_REQ_RECV) {
    /* What NCCL's iflush right after this call must order: the lanes that placed this
     * receive's bytes alone. A receive NCCL never flushes (LL and LL128, host memory, zero
     * bytes) leaves nothing behind to be read on a lane that may have died since. */
    c->flush_due = req->wrote_lanes;
    if (sizes) memcpy(sizes, req->sizes, (size_t)req->nreqs * sizeof(int));
  }
  mpib_req_free(req);
  return ncclSuccess;
}
