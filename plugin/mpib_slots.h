/* A slot's work requests and bookkeeping (mpib_slots.c): posting chains, CTS and control
 * writes within each QP's send-queue depth, a slot's and a receive's completion, and the
 * agent telemetry of both. Called by the message path (mpib_p2p.c) and by failover
 * (mpib_failover.c), and by comm teardown (mpib_comm_close in mpib_comm.h, for the last
 * telemetry); calls only verbs and the agent segment. */
#ifndef MPIB_SLOTS_H
#define MPIB_SLOTS_H

#include "mpib.h"
#include "mpib_clock.h"

/* Advanced mode reads the agent's hint (a clock read and a seqlock) and posts the comm's
 * telemetry to the segment in batches, not per message: once MPIB_HINT_REFRESH slots or
 * MPIB_TELEMETRY_BYTES bytes were posted, or as many completed, since the last batch,
 * whichever comes first, and when a comm NCCL keeps polling has gone idle
 * (mpib_failover_keepalive_tick). Small messages then write the segment's shared cache lines 16 times less often; large ones
 * still report every megabyte, so an agent sampling every 0.5 s sees current rates, and a new
 * hint takes effect within 16 messages or 1 MiB. */
#define MPIB_HINT_REFRESH 16
#define MPIB_TELEMETRY_BYTES (1u << 20)

/* How a slot's requests are spread over the rails. */
struct mpib_slot_plan {
  size_t sout[MPIB_MAX_RECVS]; /* bytes of each request on SOUT; SUP carries the rest */
  uint32_t mask;               /* rails carrying something (at least one) */
  int leader;                  /* the rail whose final write carries the size records */
  int size_in_imm;
  uint32_t imm;
};

/* Work request ids: see MPIB_WRID_* in mpib.h. */
static inline uint64_t mpib_wrid_data(const struct mpib_comm *c, int rail, uint64_t seq, int replay) {
  return (replay ? MPIB_WRID_REPLAY : 0) | (uint64_t)(c->rail[rail].gen & 0x3Fu) << MPIB_WRID_GEN_SHIFT |
         (seq & MPIB_WRID_SEQ_MASK);
}
static inline uint64_t mpib_wrid_special(const struct mpib_comm *c, int rail, int kind) {
  return MPIB_WRID_SPECIAL | (uint64_t)(c->rail[rail].gen & 0xFFFFFFu) << 8 | (uint64_t)kind;
}
static inline int mpib_wrid_current(const struct mpib_comm *c, int rail, uint64_t id) {
  if (id & MPIB_WRID_SPECIAL) return ((id >> 8) & 0xFFFFFFu) == (c->rail[rail].gen & 0xFFFFFFu);
  return ((id >> MPIB_WRID_GEN_SHIFT) & 0x3Fu) == (c->rail[rail].gen & 0x3Fu);
}
static inline int mpib_wrid_kind(uint64_t id) { return (id & MPIB_WRID_SPECIAL) ? (int)(id & 0xFFu) : 0; }

/* A chain the provider took in part (its first writes, then an error): those writes may still
 * land, so the chain counts as carried by the rail, and only the rail's fence (both ends' QPs
 * in the error state, then the receiver's record) may hand its ranges to a replay. */
#define MPIB_POST_PARTIAL (-1)

/* Whether a rail can carry this connection's traffic right now. */
static inline int mpib_rail_usable(const struct mpib_comm *c, int r) {
  return c->nqps[r] && c->rail[r].state == MPIB_RAIL_UP && !mpib_rail_fatal(c, r) && !mpib_rail_port_down(c, r);
}

/* The receiver's fence record of a rail: the sender's copy (written by the receiver) or the
 * receiver's staging, after the CTS FIFO. The sender's notice word follows the size records. */
static inline struct mpib_fence_rec *mpib_fence_area(struct mpib_comm *c, int r) {
  return (struct mpib_fence_rec *)((char *)c->cts + MPIB_CTS_BYTES) + r;
}
static inline uint64_t *mpib_notice_area(struct mpib_comm *c, int r) {
  return (uint64_t *)((char *)c->sizes + MPIB_SIZES_BYTES) + r;
}

/* Sender -> receiver: its confirm record of rail r (mpib_policy.h), like the notices: RDMA on
 * the other rail and the control socket ('C'). */
static inline struct mpib_confirm_rec *mpib_confirm_area(struct mpib_comm *c, int r) {
  return (struct mpib_confirm_rec *)((char *)c->sizes + MPIB_CONFIRM_OFFSET) + r;
}

/* Whether the comm keeps agent telemetry: only one with an agent slot publishes it, and the
 * calls below are made only for such a comm (a comm's slot is set before its first message). */
static inline int mpib_tele_on(const struct mpib_comm *c) { return c->shm_slot >= 0; }
/* Publishes the comm's telemetry batch to its agent slot and starts the next: the message path
 * when a batch is due, failover's keepalive tick when a comm went idle, mpib_comm_close last. */
void mpib_telemetry_flush(struct mpib_comm *c);

/* The telemetry below runs once or twice per message of a comm with an agent slot: in line.
 * Each slot remembers its bytes and requests per range (the rail that first carried them) and
 * its post time. */

/* Whether the batch is due after a post: MPIB_HINT_REFRESH slots or MPIB_TELEMETRY_BYTES
 * bytes posted since the last one. A post moves only these counters, so it checks only them. */
static inline int mpib_tele_post_due(const struct mpib_comm *c) {
  const mpib_shm_rail_batch *t = c->tele.rail;
  return c->tele_slots >= MPIB_HINT_REFRESH || t[0].posted_bytes + t[1].posted_bytes >= MPIB_TELEMETRY_BYTES;
}
/* Whether the batch is due after a completion: as many slots or bytes completed. */
static inline int mpib_tele_done_due(const struct mpib_comm *c) {
  const mpib_shm_rail_batch *t = c->tele.rail;
  return c->tele_done >= MPIB_HINT_REFRESH || t[0].completed_bytes + t[1].completed_bytes >= MPIB_TELEMETRY_BYTES;
}

/* Range `range` of the slot posted on rail `carrier` (the same rail, or another one for a
 * replay) at `now`: its bytes count as posted there and in flight until mpib_tele_complete or
 * mpib_tele_leave, and the rail's active time begins with its first part in flight. */
static inline void mpib_tele_post(struct mpib_comm *c, int slot, int carrier, int range, uint64_t now) {
  mpib_shm_rail_batch *t = &c->tele.rail[carrier];
  t->posted_bytes += c->slot_rail_bytes[slot][range];
  t->posted_requests += c->slot_rail_reqs[slot][range];
  if (c->rail_parts[carrier]++ == 0) c->rail_active_since[carrier] = now;
}

/* The bytes in flight on `rail`: the gauge at the batch's start (tele.rail[].inflight_bytes)
 * with the batch's posted bytes added and its completed and lost ones taken away, worked out
 * when a batch is published instead of kept per message. */
static inline uint64_t mpib_tele_inflight(const struct mpib_comm *c, int rail) {
  const mpib_shm_rail_batch *t = &c->tele.rail[rail];
  uint64_t in = t->inflight_bytes + t->posted_bytes, out = t->completed_bytes + c->tele_lost_bytes[rail];
  return in > out ? in - out : 0;
}

/* Range `rail` of the slot, counted as posted at its plan, did not go out on its rail (a
 * replay counts it where it goes): taken back, with the rail's active time when it was the
 * only part there. No batch is published between the two. */
static inline void mpib_tele_unpost(struct mpib_comm *c, int slot, int rail) {
  mpib_shm_rail_batch *t = &c->tele.rail[rail];
  uint64_t bytes = c->slot_rail_bytes[slot][rail];
  uint32_t reqs = c->slot_rail_reqs[slot][rail];
  t->posted_bytes = t->posted_bytes > bytes ? t->posted_bytes - bytes : 0;
  t->posted_requests = t->posted_requests > reqs ? t->posted_requests - reqs : 0;
  if (c->rail_parts[rail] > 0 && --c->rail_parts[rail] == 0) c->rail_active_since[rail] = 0;
}

/* A part leaves `rail` at `now` (completed, or lost): the rail's active time ends when it was
 * the last part there. */
static inline void mpib_tele_part_ends(struct mpib_comm *c, int rail, uint64_t now) {
  if (c->rail_parts[rail] == 0 || --c->rail_parts[rail] > 0) return;
  uint64_t since = c->rail_active_since[rail]; /* set (a clock reading) while parts are in flight */
  if (now > since) c->tele.rail[rail].active_ns += now - since;
  c->rail_active_since[rail] = 0;
}

/* A part of `bytes` is lost on `rail` at `now` (a failover: a replay carries it again): its
 * bytes leave the in-flight gauge without counting as completed. */
static inline void mpib_tele_leave(struct mpib_comm *c, int rail, uint64_t bytes, uint64_t now) {
  c->tele_lost_bytes[rail] += bytes;
  mpib_tele_part_ends(c, rail, now);
}

/* The completion clock: one CLOCK_MONOTONIC read per progress call that completes a slot's
 * part (shared by the completions it handles; progress clears tele_now_ns), and none without
 * an agent segment. */
static inline uint64_t mpib_completion_now(struct mpib_comm *c) {
  if (c->shm_slot < 0) return 0;
  if (c->tele_now_ns == 0) c->tele_now_ns = mpib_now_ns();
  return c->tele_now_ns;
}

/* The slot's range `range` completed on `carrier` at `now` (mpib_completion_now): its requests
 * spent now - post time there. */
static inline void mpib_tele_complete(struct mpib_comm *c, int slot, int carrier, int range, uint64_t now) {
  uint64_t posted = c->slot_post_ns[slot];
  uint32_t reqs = c->slot_rail_reqs[slot][range];
  mpib_shm_rail_batch *t = &c->tele.rail[carrier];
  t->completed_bytes += c->slot_rail_bytes[slot][range];
  t->completed_requests += reqs;
  if (now > posted) t->busy_ns += reqs * (now - posted); /* posted: set at the slot's plan */
  mpib_tele_part_ends(c, carrier, now);
}

/* The QP that carries rail `rail`'s chains of the slot of sequence `seq`, its original and any
 * replay alike (-1: the rail has no QP). The receiver's QP of the same index is its peer and
 * lives on the lane of the same index: what such a chain carried, that lane's NIC placed. */
static inline int mpib_chain_qp(const struct mpib_comm *c, int rail, uint64_t seq) {
  return mpib_qp_index(rail, seq, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
}

/* Posts nwr work requests on QP qi within its send-queue depth: 0, ENOMEM (none posted: the
 * queue is full), another errno (none posted) or MPIB_POST_PARTIAL. */
int mpib_qp_post(struct mpib_comm *c, int qi, struct ibv_send_wr *first, int nwr);
/* A signalled send of rail `rail`'s current generation completed (or was flushed): the places
 * its batch held in its QP's send queue are free again. Once per message: in line. */
static inline void mpib_sq_retire(struct mpib_comm *c, int rail, uint64_t id) {
  int special = (id & MPIB_WRID_SPECIAL) != 0;
  int qi = special ? (int)((id >> MPIB_WRID_SPECIAL_QP_SHIFT) & 0xFFu)
                   : mpib_qp_index(rail, id & MPIB_WRID_SEQ_MASK, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
  uint16_t batch = (uint16_t)((id >> (special ? MPIB_WRID_SPECIAL_BATCH_SHIFT : MPIB_WRID_BATCH_SHIFT)) & 0xFFu);
  if (qi < 0 || qi >= MPIB_MAX_QPS) return;
  c->sq_used[qi] = c->sq_used[qi] > batch ? (uint16_t)(c->sq_used[qi] - batch) : 0;
}
/* Rail r's QPs were reset: their send queues are empty. */
void mpib_sq_reset_rail(struct mpib_comm *c, int r);
/* One rail's chain of a slot carrying byte ranges `ranges` (an original or a replay): 0, the
 * errno of a post none of which went out, or MPIB_POST_PARTIAL. */
int mpib_post_chain(struct mpib_comm *c, int slot, int rail, const struct mpib_slot_plan *p, uint32_t ranges,
                    int replay);
/* A slot's range that could not go out on its rail waits for a replay (its telemetry taken
 * back: mpib_tele_unpost). */
void mpib_slot_defer_range(struct mpib_comm *c, int slot, int rail);
/* The receiver's CTS elements of a slot on `rail`: 0 or an errno (ENOMEM: none posted). */
int mpib_post_cts(struct mpib_comm *c, int slot, int rail, int n, int signalled);
/* Every lane's SRQ of rail r refilled: 0 or the first -errno. */
int mpib_srq_refill_rail(struct mpib_comm *c, int r);
/* Publishes a rail's state to the agent's telemetry. */
void mpib_publish_rail_state(struct mpib_comm *c, int r);
/* Sender: completes the slot's requests once every byte range is confirmed. */
void mpib_slot_try_complete(struct mpib_comm *c, int slot);
/* Sender: the slot's ranges `ranges` were acknowledged on `rail` (their carrier completed;
 * mpib_ack_word). */
static inline void mpib_slot_acked(struct mpib_comm *c, int slot, int rail, uint32_t ranges) {
  uint64_t w = c->slot_ack[slot][rail];
  __atomic_store_n(&c->slot_ack[slot][rail], w | (uint64_t)(ranges & 3u) << 18, __ATOMIC_RELEASE);
}
/* CLOCK_REALTIME in ms (log lines that agents correlate across nodes). */
uint64_t mpib_wall_ms(void);
/* Rail r's lane `lane` (out of service): its CQ emptied before its QPs are reset. */
void mpib_lane_discard(struct mpib_comm *c, int r, int lane);
/* Receiver: the receive in `slot` has every range: its sizes checked, it completes. */
ncclResult_t mpib_recv_finish(struct mpib_comm *c, int rail, uint32_t slot, struct mpib_request *req,
                              uint32_t imm_size);

#endif
