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
 *
 * A rail that fails (an error completion of any status, a port that went down, a dead device,
 * or the peer saying so) leaves service for the connection without an error to NCCL: both
 * ends fence it (its QPs forced to the error state), the receiver tells the sender which of
 * the open slots it already has, the sender replays the others whole on the surviving rail,
 * and the CTS moves there too. The sender then retries the rail with back-off: QPs reset and
 * reconnected, a probe write per QP, back in service. Protocol and timeline: docs/failover.md.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#include "mpib.h"
#include "mpib_flush.h"
#include "mpib_srq.h"
#include "mpib_profiler.h"
#include "mpib_shm.h"

static const char *rail_name(int rail) { return rail == MPIB_RAIL_SOUT ? "SOUT" : "SUP"; }
static const char *rail_state_name(int st) {
  static const char *const names[] = {"up", "fencing", "down", "recovering", "probing", "dead"};
  return st >= 0 && st <= MPIB_RAIL_DEAD ? names[st] : "?";
}

/* A port the device reported down (async event) is not scheduled while the other rail can
 * carry the request. */
static int rail_down(const struct mpib_comm *c, int rail) { return mpib_rail_port_down(c, rail); }

/* Why a comm can make no more progress, checked only while a caller waits for it: a fatal
 * device under any of its rails, or a peer whose control socket closed longer ago than the
 * grace period (a peer that exits right after its last completion must not fail requests
 * whose completions are already on their way). The reason is logged once per comm. */
#define MPIB_PEER_GONE_GRACE_NS 1000000000ull
/* After fencing a rail the receiver waits this long before reporting what it has, so that a
 * write the NIC was processing at the fence has produced its completion (net_ib's probe waits
 * 10 ms too). */
#define MPIB_FENCE_SETTLE_NS 10000000ull

static ncclResult_t comm_failed(struct mpib_comm *c, const char *why, const char *what) {
  if (!c->failure_reported) {
    c->failure_reported = 1;
    MPIB_WARN("%s comm: %s%s", c->is_send ? "send" : "recv", why, what);
  }
  return ncclRemoteError;
}

static ncclResult_t rail_fail(struct mpib_comm *c, int r, const char *reason, const char *detail);
static void publish_rail_state(struct mpib_comm *c, int r);
static int rail_usable(const struct mpib_comm *c, int r);
static ncclResult_t progress(struct mpib_comm *c);

static int rail_fatal(const struct mpib_comm *c, int rail) { return mpib_rail_fatal(c, rail); }
static void notify_peer_failed(struct mpib_comm *c);

static ncclResult_t comm_health_check(struct mpib_comm *c) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (c->nqps[r] && rail_fatal(c, r) && c->rail[r].state != MPIB_RAIL_DEAD) {
      if (c->rail[r].state == MPIB_RAIL_DOWN) {
        c->rail[r].state = MPIB_RAIL_DEAD; /* already failed over: it just never comes back */
        publish_rail_state(c, r);
        continue;
      }
      if (c->rail[r].state == MPIB_RAIL_FENCING) continue;
      ncclResult_t res = rail_fail(c, r, "device-fatal", mpib_rail_fault_nic(c, r));
      if (res != ncclSuccess) return ncclSystemError;
    }
  }
  uint64_t gone = __atomic_load_n(&c->peer_gone_ns, __ATOMIC_ACQUIRE);
  /* With no rail working nothing is on its way: a peer gone then fails the requests at once. */
  if (gone && (c->stall_since_ns || mpib_now_ns() - gone > MPIB_PEER_GONE_GRACE_NS))
    return comm_failed(c, "the peer closed the connection with requests still waiting", " (its process exited or aborted)");
  if (c->stall_since_ns && mpib_now_ns() - c->stall_since_ns > mpib_g.stall_timeout_ms * 1000000ull) {
    if (!c->failure_reported)
      MPIB_WARN("ride-through: side=%s no rail of this connection came back within MPIB_STALL_TIMEOUT_MS=%llu: failing it",
                c->is_send ? "send" : "recv", (unsigned long long)mpib_g.stall_timeout_ms);
    c->failure_reported = 1;
    notify_peer_failed(c);
    return ncclRemoteError;
  }
  return ncclSuccess;
}

/* Runs on every call that finds nothing to do: with both devices alive and the peer there it
 * costs three loads, in line. */
static inline ncclResult_t comm_health(struct mpib_comm *c) {
  if (!rail_fatal(c, MPIB_RAIL_SOUT) && !rail_fatal(c, MPIB_RAIL_SUP) && !__atomic_load_n(&c->peer_gone_ns, __ATOMIC_ACQUIRE) &&
      !c->stall_since_ns)
    return ncclSuccess;
  return comm_health_check(c);
}

/* Advanced mode reads the agent's hint (a clock read and a seqlock) and posts the comm's
 * telemetry to the segment in batches, not per message: once MPIB_HINT_REFRESH slots or
 * MPIB_TELEMETRY_BYTES bytes were posted, or as many completed, since the last batch,
 * whichever comes first, and when a comm NCCL keeps polling has gone idle (keepalive_tick).
 * Small messages then write the segment's shared cache lines 16 times less often; large ones
 * still report every megabyte, so an agent sampling every 0.5 s sees current rates, and a new
 * hint takes effect within 16 messages or 1 MiB. */
#define MPIB_HINT_REFRESH 16
#define MPIB_TELEMETRY_BYTES (1u << 20)

static uint32_t cached_hint(struct mpib_comm *c) {
  if (c->hint_uses++ == 0 || c->hint_due) {
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

static uint64_t wall_ns(void);

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
  if (shm && c->shm_slot >= 0 && c->is_send) {
    c->tele.wall_ns = wall_ns();
    tele_active_until_now(c);
    mpib_shm_flush_telemetry(shm, (uint32_t)c->shm_slot, &c->tele);
  }
  for (int rail = 0; rail < MPIB_NRAILS; rail++) /* the in-flight gauge carries over */
    c->tele.rail[rail] = (mpib_shm_rail_batch){.inflight_bytes = c->tele.rail[rail].inflight_bytes};
  c->tele_slots = 0;
  c->tele_done = 0;
  c->hint_due = 1;
}

/* The comm's end: its last telemetry published and its agent slot released, then its verbs
 * resources freed (mpib_comm_destroy). Every close of a comm the control plane built goes here. */
void mpib_comm_close(struct mpib_comm *c) {
  if (!c) return;
  mpib_shm *shm = __atomic_load_n(&mpib_g.shm, __ATOMIC_ACQUIRE);
  if (c->shm_slot >= 0 && shm) {
    mpib_telemetry_flush(c);
    mpib_shm_release(shm, (uint32_t)c->shm_slot);
  }
  mpib_comm_destroy(c);
}

static int telemetry_due(const struct mpib_comm *c) {
  const mpib_shm_rail_batch *t = c->tele.rail;
  return c->tele_slots >= MPIB_HINT_REFRESH || c->tele_done >= MPIB_HINT_REFRESH ||
         t[0].posted_bytes + t[1].posted_bytes >= MPIB_TELEMETRY_BYTES ||
         t[0].completed_bytes + t[1].completed_bytes >= MPIB_TELEMETRY_BYTES;
}

/* Telemetry of a slot's bytes. Each slot remembers its bytes and requests per range (the
 * rail that first carried them) and its post time; the bytes of range `range` count as posted
 * on `carrier` (the same rail, or another one for a replay) and in flight there until
 * tele_complete. */
static void tele_post(struct mpib_comm *c, int slot, int carrier, int range, uint64_t now) {
  mpib_shm_rail_batch *t = &c->tele.rail[carrier];
  t->posted_bytes += c->slot_rail_bytes[slot][range];
  t->posted_requests += c->slot_rail_reqs[slot][range];
  t->inflight_bytes += c->slot_rail_bytes[slot][range];
  if (c->rail_parts[carrier]++ == 0) c->rail_active_since[carrier] = now; /* the rail's work begins */
}

/* A part leaves `rail` at `now` (completed, or lost to a failover): its bytes leave the
 * in-flight gauge, and the rail's active time ends when it was the last part there. */
static void tele_leave(struct mpib_comm *c, int rail, uint64_t bytes, uint64_t now) {
  mpib_shm_rail_batch *t = &c->tele.rail[rail];
  t->inflight_bytes = t->inflight_bytes > bytes ? t->inflight_bytes - bytes : 0;
  if (c->rail_parts[rail] == 0 || --c->rail_parts[rail] > 0) return;
  uint64_t since = c->rail_active_since[rail];
  if (since && now > since) t->active_ns += now - since;
  c->rail_active_since[rail] = 0;
}

/* The completion clock: one CLOCK_MONOTONIC read per progress call that completes a slot's
 * part (shared by the completions it handles), and none without an agent segment. */
static uint64_t completion_now(struct mpib_comm *c) {
  if (c->shm_slot < 0) return 0;
  if (c->tele_now_ns == 0) c->tele_now_ns = mpib_now_ns();
  return c->tele_now_ns;
}

/* The slot's range `range` completed on `carrier`: its requests spent now - post time there. */
static void tele_complete(struct mpib_comm *c, int slot, int carrier, int range) {
  uint64_t now = completion_now(c), posted = c->slot_post_ns[slot];
  mpib_shm_rail_batch *t = &c->tele.rail[carrier];
  t->completed_bytes += c->slot_rail_bytes[slot][range];
  t->completed_requests += c->slot_rail_reqs[slot][range];
  if (now > posted && posted) t->busy_ns += c->slot_rail_reqs[slot][range] * (now - posted);
  tele_leave(c, carrier, c->slot_rail_bytes[slot][range], now);
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
  if (c->rail[MPIB_RAIL_SUP].state != MPIB_RAIL_UP || rail_down(c, MPIB_RAIL_SUP) || rail_fatal(c, MPIB_RAIL_SUP)) return 0;
  if ((c->rail[MPIB_RAIL_SOUT].state != MPIB_RAIL_UP || rail_down(c, MPIB_RAIL_SOUT) || rail_fatal(c, MPIB_RAIL_SOUT)) &&
      c->nqps[MPIB_RAIL_SUP])
    return MPIB_SUP_BW_MAX;
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
  uint64_t *bytes = c->slot_rail_bytes[slot];
  uint8_t *rreqs = c->slot_rail_reqs[slot];
  bytes[MPIB_RAIL_SOUT] = bytes[MPIB_RAIL_SUP] = 0;
  rreqs[MPIB_RAIL_SOUT] = rreqs[MPIB_RAIL_SUP] = 0;
  for (int r = 0; r < nreqs; r++) {
    size_t size = reqs[r]->size;
    p->sout[r] = whole < 0 ? mpib_split_sout_bytes(size, sup_bw) : whole == MPIB_RAIL_SOUT ? size : 0;
    c->slot_sout[slot][r] = (uint32_t)p->sout[r];
    if (p->sout[r] > 0) p->mask |= 1u << MPIB_RAIL_SOUT;
    if (size > p->sout[r]) p->mask |= 1u << MPIB_RAIL_SUP;
    c->sizes[slot][r] = (int32_t)size;
    bytes[MPIB_RAIL_SOUT] += p->sout[r];
    bytes[MPIB_RAIL_SUP] += size - p->sout[r];
    rreqs[MPIB_RAIL_SOUT] += p->sout[r] > 0;
    rreqs[MPIB_RAIL_SUP] += size > p->sout[r];
  }
  c->tele.applied_sup_bw = sup_bw; /* after the guard and failover: what this slot used */
  if (p->mask == 0) p->mask = 1u << (whole >= 0 ? whole : sup_bw >= MPIB_SUP_BW_MAX / 2 ? MPIB_RAIL_SUP : MPIB_RAIL_SOUT);
  c->slot_full[slot] = (uint8_t)p->mask;
  p->leader = (p->mask & 1u) ? MPIB_RAIL_SOUT : MPIB_RAIL_SUP;
  /* A lone small request carries its size in the immediate: each rail then posts a single
   * write (its data with the immediate), the common latency-bound case. */
  p->size_in_imm = nreqs == 1 && reqs[0]->size <= MPIB_IMM_MAX_SIZE;
  p->imm = mpib_imm_encode((uint32_t)slot, p->mask, reqs[0]->seq,
                           p->size_in_imm ? (uint32_t)reqs[0]->size : MPIB_IMM_NO_SIZE);
}

/* Work request ids: see MPIB_WRID_* in mpib.h. */
static uint64_t wrid_data(const struct mpib_comm *c, int rail, uint64_t seq, int replay) {
  return (replay ? MPIB_WRID_REPLAY : 0) | (uint64_t)(c->rail[rail].gen & 0x3Fu) << MPIB_WRID_GEN_SHIFT |
         (seq & MPIB_WRID_SEQ_MASK);
}
static uint64_t wrid_special(const struct mpib_comm *c, int rail, int kind) {
  return MPIB_WRID_SPECIAL | (uint64_t)(c->rail[rail].gen & 0xFFFFFFu) << 8 | (uint64_t)kind;
}
static int wrid_current(const struct mpib_comm *c, int rail, uint64_t id) {
  if (id & MPIB_WRID_SPECIAL) return ((id >> 8) & 0xFFFFFFu) == (c->rail[rail].gen & 0xFFFFFFu);
  return ((id >> MPIB_WRID_GEN_SHIFT) & 0x3Fu) == (c->rail[rail].gen & 0x3Fu);
}
static int wrid_kind(uint64_t id) { return (id & MPIB_WRID_SPECIAL) ? (int)(id & 0xFFu) : 0; }

/* A chain the provider took in part (its first writes, then an error): those writes may still
 * land, so the chain counts as carried by the rail, and only the rail's fence (both ends' QPs
 * in the error state, then the receiver's record) may hand its ranges to a replay. */
#define MPIB_POST_PARTIAL (-1)

/* Posts the work requests `first` (nwr of them, only the last possibly signalled) on QP qi when
 * its send queue has room for all of them, else none (ENOMEM): a full queue is back-pressure,
 * and a chain the provider took in part could land after its range was replayed elsewhere.
 * The signalled one carries the batch it retires (MPIB_WRID_*). 0 or an errno; a provider
 * that still refuses part of the list returns MPIB_POST_PARTIAL (below). */
static int qp_post(struct mpib_comm *c, int qi, struct ibv_send_wr *first, int nwr) {
  if (c->sq_used[qi] + nwr > c->sq_depth) return ENOMEM;
  struct ibv_send_wr *last = first;
  while (last->next) last = last->next;
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

/* A signalled send completed (or was flushed) on rail `rail` in the current generation: the
 * places its batch held in its QP's send queue are free again. */
static void sq_retire(struct mpib_comm *c, int rail, uint64_t id) {
  int special = (id & MPIB_WRID_SPECIAL) != 0;
  int qi = special ? (int)((id >> MPIB_WRID_SPECIAL_QP_SHIFT) & 0xFFu)
                   : mpib_qp_index(rail, id & MPIB_WRID_SEQ_MASK, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
  uint16_t batch = (uint16_t)((id >> (special ? MPIB_WRID_SPECIAL_BATCH_SHIFT : MPIB_WRID_BATCH_SHIFT)) & 0xFFu);
  if (qi < 0 || qi >= MPIB_MAX_QPS) return;
  c->sq_used[qi] = c->sq_used[qi] > batch ? (uint16_t)(c->sq_used[qi] - batch) : 0;
}

/* A rail's QPs were reset (rebuilt): their send queues are empty. */
static void sq_reset_rail(struct mpib_comm *c, int r) {
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


/* Posts one rail's chain for a slot: a write per request part of the byte ranges `ranges`,
 * the last one (or a final write carrying the size records) with the immediate and
 * signalled. An original chain carries range `rail`; a replay carries the lost ranges on a
 * surviving rail. Returns 0, the errno of ibv_post_send when none of it was posted, or
 * MPIB_POST_PARTIAL. */
static int post_chain(struct mpib_comm *c, int slot, int rail, const struct slot_plan *p, uint32_t ranges, int replay) {
  int nreqs = c->slot_matched[slot];
  struct mpib_request **reqs = c->slot_reqs[slot];
  const struct mpib_cts *cts = c->cts_snap[slot];
  int qi = mpib_qp_index(rail, reqs[0]->seq, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
  if (qi < 0 || c->qps[qi].qp == NULL) return EINVAL;
  int lane = c->qps[qi].lane; /* its NIC: the registrations and the peer's rkeys of that port */
  struct ibv_send_wr wrs[MPIB_MAX_RECVS + 1];
  struct ibv_sge sges[MPIB_MAX_RECVS + 1];
  int nwr = 0;
  for (int r = 0; r < nreqs; r++) {
    size_t off, len;
    range_span(ranges, reqs[r]->size, p->sout[r], &off, &len);
    if (len == 0) continue;
    sges[nwr] = (struct ibv_sge){.addr = (uintptr_t)reqs[r]->data + off, .length = (uint32_t)len,
                                 .lkey = mpib_comm_mr(c, reqs[r]->mh, lane)->lkey};
    wrs[nwr] = (struct ibv_send_wr){.wr_id = wrid_special(c, rail, MPIB_WR_UNSIGNALLED), .sg_list = &sges[nwr],
                                    .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
    wrs[nwr].wr.rdma.remote_addr = cts[r].addr + off;
    wrs[nwr].wr.rdma.rkey = mpib_cts_rkey(&cts[r], lane);
    nwr++;
  }
  struct ibv_send_wr *last;
  if (p->size_in_imm && nwr == 1) {
    last = &wrs[0]; /* the data write itself carries the immediate */
  } else {
    last = &wrs[nwr];
    *last = (struct ibv_send_wr){0};
    last->wr.rdma.remote_addr = c->rem_addr + (uint64_t)slot * sizeof c->sizes[0];
    last->wr.rdma.rkey = c->rem_rkey[lane];
    if (rail == p->leader && !p->size_in_imm) {
      sges[nwr] = (struct ibv_sge){.addr = (uintptr_t)c->sizes[slot], .length = (uint32_t)(nreqs * sizeof(int32_t)),
                                   .lkey = c->stage_mr[lane]->lkey};
      last->sg_list = &sges[nwr];
      last->num_sge = 1;
    }
    nwr++;
  }
  last->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  last->send_flags |= IBV_SEND_SIGNALED;
  last->imm_data = p->imm;
  last->wr_id = wrid_data(c, rail, reqs[0]->seq, replay);
  for (int i = 0; i + 1 < nwr; i++) wrs[i].next = &wrs[i + 1];
  if (!replay && mpib_profiling()) mpib_prof_send_posting(c, slot, rail, p->mask, p->sout);
  int rc = qp_post(c, qi, &wrs[0], nwr);
  if (rc > 0) return rc; /* nothing of it went out */
  if (!replay) c->slot_rails[slot] |= 1u << rail;
  else c->slot_replay_on[slot][rail] |= (uint8_t)ranges;
  if (rc) return MPIB_POST_PARTIAL;
  c->pending[rail]++;
  return 0;
}

/* A range of the slot that could not go out on its rail waits for a replay (post_replays), on
 * whichever rail can carry it first. */
static void defer_range(struct mpib_comm *c, int slot, int rail) {
  if (c->slot_replay_wait[slot] == 0) c->replays_waiting++;
  c->slot_replay_wait[slot] |= (uint8_t)(1u << rail);
}

/* Posts one rail's chain of the slot. A rail out of service (a failover under way: its QPs are
 * in the error state, and a chain posted now would be flushed after its fence was settled),
 * one whose send queue is full (back-pressure, not a fault) or one that refuses the post (its
 * device just died, say) does not carry it: the range goes out as a replay, and a refusing
 * rail fails over like any failed rail. A chain taken in part fails the rail over, and the
 * fence settles it (MPIB_POST_PARTIAL). */
static ncclResult_t post_rail(struct mpib_comm *c, int slot, int rail, const struct slot_plan *p) {
  int in_service = c->rail[rail].state == MPIB_RAIL_UP || !mpib_g.failover;
  int rc = in_service ? post_chain(c, slot, rail, p, 1u << rail, 0) : EAGAIN;
  if (rc == 0) {
    tele_post(c, slot, rail, rail, c->slot_post_ns[slot]);
    return ncclSuccess;
  }
  if (rc == EINVAL) {
    MPIB_WARN("%s rail has no QP for this connection (policy bug)", rail_name(rail));
    return ncclInternalError;
  }
  if (!mpib_g.failover) {
    MPIB_WARN("%s rail: ibv_post_send failed: %s", rail_name(rail), strerror(rc));
    return ncclSystemError;
  }
  if (rc == MPIB_POST_PARTIAL) return rail_fail(c, rail, "completion-error", "its send queue took part of a chain");
  defer_range(c, slot, rail);
  if (rc == EAGAIN || rc == ENOMEM) return ncclSuccess;
  return rail_fail(c, rail, "completion-error", "posting to it failed");
}

/* Post the slot's matched sends on every active rail (post_rail: a rail that cannot take its
 * range now leaves it to a replay). */
static ncclResult_t post_slot(struct mpib_comm *c, int slot) {
  struct slot_plan plan;
  plan_slot(c, slot, &plan);
#ifdef MPIB_HOSTILE_TEST
  mpib_hostile_before_post(c, slot, c->slot_matched[slot], plan.size_in_imm); /* the test build only */
#endif
  c->slot_posted_seq1[slot] = c->slot_reqs[slot][0]->seq + 1;
  uint64_t ack = mpib_ack_word(c->slot_posted_seq1[slot], plan.mask,
                               0, plan.size_in_imm ? (uint32_t)c->slot_reqs[slot][0]->size : MPIB_IMM_NO_SIZE);
  for (int r = 0; r < MPIB_NRAILS; r++) __atomic_store_n(&c->slot_ack[slot][r], ack, __ATOMIC_RELEASE);
  /* The post time for the completion latency: the path reads no clock per message otherwise,
   * so this is one CLOCK_MONOTONIC read (vDSO) per posted slot, only with an agent segment. */
  c->slot_post_ns[slot] = c->shm_slot >= 0 ? mpib_now_ns() : 0;
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    if (!(plan.mask & (1u << rail))) continue;
    ncclResult_t res = post_rail(c, slot, rail, &plan);
    if (res != ncclSuccess) return res;
  }
  c->tele_slots++;
  if (telemetry_due(c)) mpib_telemetry_flush(c);
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
  if (fifo[0].seq != want) { /* no CTS yet: NCCL retries; now and then poll (keepalive, failover) */
    ncclResult_t res = (++c->idle_polls & 15) == 0 ? progress(c) : ncclSuccess;
    return res != ncclSuccess ? res : comm_health(c);
  }
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
  if (c->stall_since_ns) { /* no rail works: nothing can be posted; NCCL calls again */
    ncclResult_t res = progress(c);
    if (res != ncclSuccess || c->stall_since_ns) return res != ncclSuccess ? res : comm_health(c);
  }
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
  if (mhandle != NULL && ((struct mpib_mr *)mhandle)->fdev != c->fdev) {
    MPIB_WARN("isend with a memory handle registered on device %d, on a connection of device %d",
              ((struct mpib_mr *)mhandle)->fdev, c->fdev);
    return ncclInvalidArgument;
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

/* RDMA-writes a slot's CTS elements into the sender's FIFO on `rail`. Writing them again
 * (after the CTS rail failed) is harmless: the same bytes land in the same place. */
static int post_cts(struct mpib_comm *c, int slot, int rail, int n, int signalled) {
  int qi = mpib_qp_index(rail, 0, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
  int lane = c->qps[qi].lane;
  struct mpib_cts *cts = c->cts[slot];
  struct ibv_sge sge = {.addr = (uintptr_t)cts, .length = (uint32_t)(n * sizeof *cts), .lkey = c->stage_mr[lane]->lkey};
  struct ibv_send_wr wr = {.wr_id = wrid_special(c, rail, signalled ? MPIB_WR_CTS : MPIB_WR_UNSIGNALLED),
                           .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE};
  if (signalled) wr.send_flags = IBV_SEND_SIGNALED;
  if (sge.length <= c->max_inline) wr.send_flags |= IBV_SEND_INLINE; /* NCCL_IB_USE_INLINE */
  wr.wr.rdma.remote_addr = c->rem_addr + (uint64_t)slot * sizeof c->cts[0];
  wr.wr.rdma.rkey = c->rem_rkey[lane];
  int rc = qp_post(c, qi, &wr, 1);
  if (rc == 0 && signalled) c->pending[rail]++;
  return rc;
}

/* Every lane's SRQ of rail r refilled: 0 or the first -errno. */
static int srq_refill_rail(struct mpib_comm *c, int r) {
  for (int i = 0; i < mpib_lane_count(c, r); i++) {
    int rc = mpib_srq_refill(c, mpib_lane(r, i));
    if (rc) return rc;
  }
  return 0;
}

/* Keeps a rail's receives posted; a rail that refuses them (its device just died) fails over. */
static ncclResult_t srq_refill_or_fail(struct mpib_comm *c, int r) {
  /* A rail being rebuilt is its thread's alone (a provider built without locks would race);
   * recv_rebuilt refills it. */
  if (!c->srq[r] || c->rail[r].state == MPIB_RAIL_DEAD || c->rail[r].rebuild.running) return ncclSuccess;
  if (srq_refill_rail(c, r) == 0) return ncclSuccess;
  if (c->rail[r].state != MPIB_RAIL_UP) return ncclSuccess; /* already out of service */
  return rail_fail(c, r, "completion-error", "posting receives to it failed");
}

static ncclResult_t srq_refill_all(struct mpib_comm *c) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    ncclResult_t res = srq_refill_or_fail(c, r);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
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
  struct mpib_request *req = mpib_req_alloc(c, MPIB_REQ_RECV);
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
    if (mh != NULL && mh->fdev != c->fdev) {
      MPIB_WARN("irecv with a memory handle registered on device %d, on a connection of device %d", mh->fdev, c->fdev);
      req->type = MPIB_REQ_FREE;
      return ncclInvalidArgument;
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
  /* One signalled CTS per FIFO lap keeps the CTS QP's send queue drained. */
  int rail = c->cts_rail;
  int rc = 0;
  if (c->stall_since_ns && !rail_usable(c, rail)) c->cts_repost_due = 1; /* written when a rail is back */
  else rc = post_cts(c, slot, rail, n, slot == 0);
  if (rc == ENOMEM) { /* the CTS QP's send queue is full: NCCL calls again, after its completions */
    req->type = MPIB_REQ_FREE;
    return progress(c);
  }
  if (rc) {
    MPIB_WARN("%s rail: posting the CTS failed: %s", rail_name(rail), strerror(rc));
    if (!mpib_g.failover || !rail_usable(c, 1 - rail)) {
      req->type = MPIB_REQ_FREE;
      return ncclSystemError;
    }
  }
  c->slot_reqs[slot][0] = req;
  c->fifo_head++;
  c->recvs_open++;
  __atomic_store_n(&c->recv_idle_seq1, 0, __ATOMIC_RELEASE);
  if (mpib_profiling()) mpib_prof_recv_posted(c, req, phandles, sizes);
  ncclResult_t res = rc ? rail_fail(c, rail, "completion-error", "posting the CTS failed") : ncclSuccess;
  if (res == ncclSuccess) res = srq_refill_all(c);
  if (res != ncclSuccess) return res;
  *request = req;
  return ncclSuccess;
}

ncclResult_t mpib_irecv_consumed(void *recvComm, int n, void *request) {
  (void)recvComm, (void)n, (void)request;
  return ncclSuccess; /* only meaningful for device offload, which MPIB does not do */
}

/* ---- Failover: a rail leaves service, the connection goes on (docs/failover.md) ---- */

static uint64_t wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static uint64_t wall_ms(void) { return wall_ns() / 1000000u; }

/* Publishes a rail's state to the agent's telemetry (docs/shm-format.md 4.3). */
static void publish_rail_state(struct mpib_comm *c, int r) {
  mpib_shm *shm = __atomic_load_n(&mpib_g.shm, __ATOMIC_ACQUIRE);
  if (shm == NULL || c->shm_slot < 0) return;
  int st = c->rail[r].state;
  int pub = st == MPIB_RAIL_UP ? MPIB_SHM_RAIL_UP : st == MPIB_RAIL_DEAD ? MPIB_SHM_RAIL_FAILED : MPIB_SHM_RAIL_DOWN;
  mpib_shm_set_rail_state(shm, (uint32_t)c->shm_slot, r, pub, wall_ms() * 1000000ull);
}

/* Whether a rail can carry this connection's traffic right now. */
static int rail_usable(const struct mpib_comm *c, int r) {
  return c->nqps[r] && c->rail[r].state == MPIB_RAIL_UP && !rail_fatal(c, r) && !rail_down(c, r);
}

/* Sends what a short write left on the control socket; 0 once nothing is left. The socket is
 * non-blocking for the data path: a full one keeps the bytes for a later progress call. */
static int ctrl_flush_locked(struct mpib_comm *c) {
  while (c->ctrl_out_n > 0) {
    ssize_t n = send(c->ctrl_fd, c->ctrl_out, c->ctrl_out_n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) return -1;
    memmove(c->ctrl_out, c->ctrl_out + n, c->ctrl_out_n - (size_t)n);
    c->ctrl_out_n -= (uint32_t)n;
  }
  return 0;
}

static void ctrl_flush(struct mpib_comm *c) {
  pthread_mutex_lock(&c->ctrl_mu);
  (void)ctrl_flush_locked(c);
  pthread_mutex_unlock(&c->ctrl_mu);
}

/* Queues one whole message for the control socket and sends what it can: the peer's reader
 * (lifecycle.go) frames messages by their kind byte, so a message is never cut or dropped in
 * part. One that does not fit behind a stuck socket is dropped whole: notices and records are
 * the newest state, also RDMA-written, and a later one supersedes it. */
static void ctrl_send(struct mpib_comm *c, const void *msg, size_t len) {
  if (c->ctrl_fd < 0) return;
  pthread_mutex_lock(&c->ctrl_mu);
  if (c->ctrl_out_n + len > sizeof c->ctrl_out) {
    MPIB_INFO("%s comm: the control socket has %u bytes unsent; a %zu-byte message is dropped", c->is_send ? "send" : "recv",
              c->ctrl_out_n, len);
  } else {
    memcpy(c->ctrl_out + c->ctrl_out_n, msg, len);
    c->ctrl_out_n += (uint32_t)len;
    (void)ctrl_flush_locked(c);
  }
  pthread_mutex_unlock(&c->ctrl_mu);
}

/* The control plane's thread (its answers, below): queues msg and sends until the socket took
 * everything queued, for up to about 2 s. It may wait; the data path's thread never does, and
 * holds the lock only for one non-blocking send, so neither waits long for the other. */
static void ctrl_send_wait(struct mpib_comm *c, const void *msg, size_t len) {
  ctrl_send(c, msg, len);
  for (int i = 0; i < 200; i++) {
    pthread_mutex_lock(&c->ctrl_mu);
    int left = ctrl_flush_locked(c) != 0;
    pthread_mutex_unlock(&c->ctrl_mu);
    if (!left) return;
    struct pollfd p = {.fd = c->ctrl_fd, .events = POLLOUT};
    (void)poll(&p, 1, 10);
  }
}

/* The peer's requests would otherwise wait for their own timeouts: one byte on the control
 * socket makes its watcher fail them at once (lifecycle.go). */
static void notify_peer_failed(struct mpib_comm *c) { ctrl_send(c, "F", 1); }

/* The receiver's fence record of a rail: the sender's copy (written by the receiver) or the
 * receiver's staging, after the CTS FIFO. The sender's notice word follows the size records. */
static struct mpib_fence_rec *fence_rec(struct mpib_comm *c, int r) {
  return (struct mpib_fence_rec *)((char *)c->cts + MPIB_CTS_BYTES) + r;
}
static uint64_t *notice_word(struct mpib_comm *c, int r) { return (uint64_t *)((char *)c->sizes + MPIB_SIZES_BYTES) + r; }

/* One signalled RDMA write of a control structure on `via`; len bytes from local to the
 * peer's buffer at offset off. A full send queue (ENOMEM) is back-pressure, not a fault: the
 * write is posted again on a later progress call (ctrl_rdma_retry; bit `due`), and the control
 * socket carries its copy meanwhile. */
static ncclResult_t post_control(struct mpib_comm *c, int via, void *local, struct ibv_mr *mr, uint32_t len,
                                 uint64_t off, uint32_t due) {
  struct ibv_sge sge = {.addr = (uintptr_t)local, .length = len, .lkey = mr->lkey};
  struct ibv_send_wr wr = {.wr_id = wrid_special(c, via, MPIB_WR_CTRL), .sg_list = &sge, .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
  if (len <= c->max_inline) wr.send_flags |= IBV_SEND_INLINE;
  int qi = mpib_qp_index(via, 0, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]); /* on the rail's first lane: mr's */
  wr.wr.rdma.remote_addr = c->rem_addr + off;
  wr.wr.rdma.rkey = c->rem_rkey[c->qps[qi].lane];
  int rc = qp_post(c, qi, &wr, 1);
  if (rc == ENOMEM) {
    c->ctrl_rdma_due |= due;
    return ncclSuccess;
  }
  if (rc) return rail_fail(c, via, "completion-error", "posting a failover message failed");
  c->pending[via]++;
  return ncclSuccess;
}

enum { CTRL_NOTICE = 0, CTRL_RECORD = 1, CTRL_CONFIRM = 2 };
static uint32_t ctrl_due_bit(int kind, int r) { return 1u << (kind * MPIB_NRAILS + r); }

/* Sender -> receiver: a notice about rail r, carried by the other rail (or by r itself once
 * its probes proved it), and over the control socket, which does not queue behind the data
 * on that rail's QP (mpib_notice_order: the receiver takes the newer). */
/* The RDMA copy of the notice word staged for rail r, on the rail that can carry it (the other
 * one, or r itself once its probes proved it). */
static ncclResult_t post_notice_rdma(struct mpib_comm *c, int r) {
  uint64_t *stage = notice_word(c, r);
  uint32_t gen, cmd;
  (void)mpib_notice_decode(*stage, &gen, &cmd);
  int via = (cmd == MPIB_NOTICE_FAIL || rail_usable(c, 1 - r)) ? 1 - r : r;
  /* No working rail to carry it (a RECOVER while the other rail is out too, a FAIL with no
   * rail left): the control socket alone does (ride-through). */
  if (!rail_usable(c, via) && c->ctrl_fd >= 0) return ncclSuccess;
  return post_control(c, via, stage, c->stage_mr[via], sizeof *stage, MPIB_SIZES_BYTES + (uint64_t)r * sizeof *stage,
                      ctrl_due_bit(CTRL_NOTICE, r));
}

static ncclResult_t post_notice(struct mpib_comm *c, int r, uint32_t cmd) {
  uint64_t *stage = notice_word(c, r);
  *stage = mpib_notice_encode(c->rail[r].gen, cmd);
  uint8_t msg[10] = {'N', (uint8_t)r};
  for (int i = 0; i < 8; i++) msg[2 + i] = (uint8_t)(*stage >> (8 * i));
  ctrl_send(c, msg, sizeof msg);
  return post_notice_rdma(c, r);
}

/* Receiver -> sender: its fence record of rail r, carried by the other rail and, like the
 * notices, the control socket ('R' rail record: the sender takes whichever copy names the
 * generation it waits for); the socket alone when no rail works (ride-through). */
static ncclResult_t post_record_rdma(struct mpib_comm *c, int r) {
  int via = 1 - r;
  struct mpib_fence_rec *st = fence_rec(c, r);
  if (!rail_usable(c, via)) {
    if (c->ctrl_fd >= 0) return ncclSuccess;
    return rail_fail(c, via, "completion-error", "no rail left for the fence record");
  }
  return post_control(c, via, st, c->stage_mr[via], sizeof *st, MPIB_CTS_BYTES + (uint64_t)r * sizeof *st,
                      ctrl_due_bit(CTRL_RECORD, r));
}

static ncclResult_t post_record(struct mpib_comm *c, int r) {
  struct mpib_fence_rec *st = fence_rec(c, r);
  st->check = mpib_fence_check(st);
  uint8_t msg[2 + sizeof *st] = {'R', (uint8_t)r};
  memcpy(msg + 2, st, sizeof *st);
  ctrl_send(c, msg, sizeof msg);
  return post_record_rdma(c, r);
}

/* Sender -> receiver: its confirm record of rail r (mpib_policy.h), like the notices: RDMA on
 * the other rail and the control socket ('C'). */
static struct mpib_confirm_rec *confirm_rec(struct mpib_comm *c, int r) {
  return (struct mpib_confirm_rec *)((char *)c->sizes + MPIB_CONFIRM_OFFSET) + r;
}

static ncclResult_t post_confirm_rdma(struct mpib_comm *c, int r) {
  int via = 1 - r;
  struct mpib_confirm_rec *st = confirm_rec(c, r);
  if (!rail_usable(c, via)) return ncclSuccess; /* the control socket's copy */
  return post_control(c, via, st, c->stage_mr[via], sizeof *st, MPIB_CONFIRM_OFFSET + (uint64_t)r * sizeof *st,
                      ctrl_due_bit(CTRL_CONFIRM, r));
}

static ncclResult_t post_confirm(struct mpib_comm *c, int r) {
  struct mpib_confirm_rec *st = confirm_rec(c, r);
  uint8_t msg[2 + sizeof *st] = {'C', (uint8_t)r};
  memcpy(msg + 2, st, sizeof *st);
  ctrl_send(c, msg, sizeof msg);
  return post_confirm_rdma(c, r);
}

/* Posts again the control writes a full send queue refused, and what the control socket has
 * not taken yet. Runs on every progress call; with nothing due it costs two loads. */
static ncclResult_t ctrl_retry(struct mpib_comm *c) {
  if (__atomic_load_n(&c->ctrl_out_n, __ATOMIC_RELAXED)) ctrl_flush(c);
  uint32_t due = c->ctrl_rdma_due;
  c->ctrl_rdma_due = 0; /* post_control marks again what the send queue still refuses */
  for (int r = 0; r < MPIB_NRAILS && due; r++) {
    ncclResult_t res = ncclSuccess;
    if (due & ctrl_due_bit(CTRL_NOTICE, r)) res = post_notice_rdma(c, r);
    if (res == ncclSuccess && (due & ctrl_due_bit(CTRL_RECORD, r))) res = post_record_rdma(c, r);
    if (res == ncclSuccess && (due & ctrl_due_bit(CTRL_CONFIRM, r))) res = post_confirm_rdma(c, r);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

/* Receiver: every open slot's CTS again, on the rail that took the CTS over. */
static int repost_open_cts(struct mpib_comm *c, int rail) {
  int last = -1;
  c->cts_repost_due = 0;
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++)
    if (c->slot_reqs[slot][0]) last = slot;
  for (int slot = 0; slot <= last; slot++) {
    struct mpib_request *req = c->slot_reqs[slot][0];
    if (req == NULL) continue;
    int rc = post_cts(c, slot, rail, req->nreqs, slot == last);
    if (rc == ENOMEM) { /* all of them again once the queue drains (a CTS written twice is harmless) */
      c->cts_repost_due = 1;
      return 0;
    }
    if (rc) return rc;
  }
  return 0;
}

/* Ride-through: when no rail of the connection works (vanilla inter-island has only SOUT; both
 * rails faulted), requests stall instead of failing. The failed rail is fenced and settled as
 * in a failover, with the notices and the receiver's records over the control socket; the
 * rails are retried as usual, and the first one back carries the open slots' replays (and the
 * receiver's CTS). The connection fails on both ends only after MPIB_STALL_TIMEOUT_MS, or at
 * once when the peer is gone. net_ib, with its 20/7 RC budget (~34 s), rides out a stall
 * shorter than that on the same QPs and fails after it; MPIB detects in ~0.7 s (the fast
 * failover where a rail survives) and then waits up to the stall timeout. */
static int ride_through_possible(const struct mpib_comm *c) {
  return mpib_g.failover && mpib_g.stall_timeout_ms > 0 && c->ctrl_fd >= 0;
}

static ncclResult_t fence_rail(struct mpib_comm *c, int r, const char *reason);

static ncclResult_t ride_through(struct mpib_comm *c, int r, const char *reason, const char *detail) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  int retrying = rc->state == MPIB_RAIL_RECOVERING || rc->state == MPIB_RAIL_PROBING;
  if (retrying) rc->attempts++;
  if (!c->stall_since_ns) {
    c->stall_since_ns = mpib_now_ns();
    if (!c->stall_since_ns) c->stall_since_ns = 1;
  }
  if (!retrying || rc->attempts <= 3)
    MPIB_WARN("failover: rail=%s side=%s decided_ms=%llu reason=%s continued_on=none gen=%u (%s): no rail works; "
              "requests stall up to MPIB_STALL_TIMEOUT_MS=%llu for one to come back",
              rail_name(r), c->is_send ? "send" : "recv", (unsigned long long)wall_ms(), reason, rc->gen, detail,
              (unsigned long long)mpib_g.stall_timeout_ms);
  return fence_rail(c, r, reason);
}

/* A rail came back (UP): a stalled connection resumes. */
static void stall_end(struct mpib_comm *c, int r) {
  if (!c->stall_since_ns) return;
  MPIB_WARN("ride-through: side=%s resumed on %s after %llu ms", c->is_send ? "send" : "recv", rail_name(r),
            (unsigned long long)((mpib_now_ns() - c->stall_since_ns) / 1000000ull));
  c->stall_since_ns = 0;
}

/* Takes rail r out of service for this connection. Without another usable rail (or with
 * MPIB_FAILOVER=0) the connection rides through (above) or fails, and the peer is told. */
static ncclResult_t rail_fail(struct mpib_comm *c, int r, const char *reason, const char *detail) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  int s = 1 - r;
  const char *side = c->is_send ? "send" : "recv";
  if (!rail_usable(c, s) && ride_through_possible(c)) return ride_through(c, r, reason, detail);
  if (!mpib_g.failover || !rail_usable(c, s)) {
    if (!c->failure_reported)
      MPIB_WARN("failover: rail=%s side=%s decided_ms=%llu reason=%s continued_on=none gen=%u (%s): %s",
                rail_name(r), side, (unsigned long long)wall_ms(), reason, rc->gen, detail,
                mpib_g.failover ? "no other rail can carry this connection" : "MPIB_FAILOVER=0");
    c->failure_reported = 1;
    notify_peer_failed(c);
    return ncclRemoteError;
  }
  int retrying = rc->state == MPIB_RAIL_RECOVERING || rc->state == MPIB_RAIL_PROBING;
  if (retrying) rc->attempts++;
  if (!retrying || rc->attempts <= 3)
    MPIB_WARN("failover: rail=%s side=%s decided_ms=%llu reason=%s continued_on=%s gen=%u (%s)", rail_name(r), side,
              (unsigned long long)wall_ms(), reason, rail_name(s), rc->gen, detail);
  return fence_rail(c, r, reason);
}

/* Receiver: rail r is out of service: when it carried the CTS, every open slot's CTS is
 * written again on the other rail (writes still queued on r are lost with its QPs), or on the
 * first rail back when none works. */
static ncclResult_t recv_leave_cts_rail(struct mpib_comm *c, int r) {
  int s = 1 - r;
  if (c->cts_rail != r) return ncclSuccess;
  if (!rail_usable(c, s)) {
    c->cts_repost_due = 1;
    return ncclSuccess;
  }
  c->cts_rail = s;
  int e = repost_open_cts(c, s);
  if (e) return comm_failed(c, "reposting the CTS on the surviving rail failed: ", strerror(e));
  return ncclSuccess;
}

/* The failed rail leaves service: its QPs forced to the error state, the receiver's CTS moved
 * to a rail that works (or written again once one does), the receiver told (sender). */
static ncclResult_t fence_rail(struct mpib_comm *c, int r, const char *reason) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  int retrying = rc->state == MPIB_RAIL_RECOVERING || rc->state == MPIB_RAIL_PROBING;
  rc->state = MPIB_RAIL_FENCING;
  rc->since_ns = mpib_now_ns();
  rc->keepalive_out = 0;
  if (!retrying) publish_rail_state(c, r);
  if (!rail_fatal(c, r)) mpib_rail_to_error(c, r);
  ncclResult_t res = c->is_send ? ncclSuccess : recv_leave_cts_rail(c, r);
  if (res != ncclSuccess) return res;
  if (c->is_send && strcmp(reason, "peer-fence") != 0) return post_notice(c, r, MPIB_NOTICE_FAIL);
  return ncclSuccess;
}

static ncclResult_t handle_completion(struct mpib_comm *c, int rail, int lane, const struct ibv_wc *wc);

/* Everything rail r's CQs hold, handled now: every lane whose device lives (a dead device's
 * CQ is not touched; a striped rail's healthy lanes still deliver what they have). A lane
 * whose poll fails has nothing more to give: what it held is settled by the fence record and
 * the sender's confirm. */
static ncclResult_t drain_rail(struct mpib_comm *c, int r) {
  struct ibv_wc wcs[16];
  int n;
  if (!c->cq[r]) return ncclSuccess;
  for (int l = 0; l < mpib_lane_count(c, r); l++) {
    int lane = mpib_lane(r, l);
    if (__atomic_load_n(&c->nic[lane]->fatal, __ATOMIC_ACQUIRE)) continue;
    while ((n = ibv_poll_cq(c->cq[lane], 16, wcs)) > 0) {
      for (int i = 0; i < n; i++) {
        ncclResult_t res = handle_completion(c, r, lane, &wcs[i]);
        if (res != ncclSuccess) return res;
      }
    }
    if (n < 0) MPIB_INFO("%s rail: polling %s's completions failed while draining it", rail_name(r), c->nic[lane]->name);
  }
  return ncclSuccess;
}

/* A sender's slot completes once every byte range is confirmed: no original chain, replay
 * chain or replay waiting to be posted is left. */
static int slot_unconfirmed(const struct mpib_comm *c, int slot) {
  uint32_t live = c->slot_rails[slot] | c->slot_replay_wait[slot];
  for (int r = 0; r < MPIB_NRAILS; r++) live |= c->slot_replay_on[slot][r];
  return live != 0;
}

static void slot_try_complete(struct mpib_comm *c, int slot) {
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

/* When a DOWN rail is tried again: the back-off after rc->attempts failed attempts. */
static uint64_t next_retry_ns(const struct mpib_comm *c, const struct mpib_rail_ctl *rc, uint64_t now) {
  /* While no rail works (ride-through) nothing else can carry the traffic, and an attempt
   * costs a few probe writes: retry at the first back-off step, not the doubled ones, so the
   * stall ends within about one RC budget of the path's return. */
  uint64_t cap = c->stall_since_ns ? mpib_g.recovery_backoff_ms : mpib_g.recovery_backoff_max_ms;
  return now + mpib_recovery_backoff_ms(rc->attempts, mpib_g.recovery_backoff_ms, cap) * 1000000ull;
}

/* Sender: posts the replays decided by send_resolve, as far as the send queue has room. A
 * replay re-sends the lost byte ranges of the slot on a surviving rail, in one chain whose
 * immediate names them and the slot's full range mask; its final write carries the size
 * records. The receiver counts the ranges as confirmed when the immediate arrives and
 * completes the slot once all of them are (mpib_recv_ranges_arrived). */
static ncclResult_t post_replays(struct mpib_comm *c) {
  int s = rail_usable(c, MPIB_RAIL_SOUT) ? MPIB_RAIL_SOUT : MPIB_RAIL_SUP;
  if (!rail_usable(c, s) && c->stall_since_ns) return ncclSuccess; /* riding through: the first rail back */
  for (int slot = 0; slot < MPIB_MAX_REQUESTS && c->replays_waiting > 0; slot++) {
    uint32_t ranges = c->slot_replay_wait[slot];
    if (ranges == 0) continue;
    if (!rail_usable(c, s)) return rail_fail(c, s, "completion-error", "no rail left to replay on");
    if (c->slot_replay_on[slot][s]) continue; /* never two replay chains of a slot on one rail (cannot happen) */
    struct mpib_request **reqs = c->slot_reqs[slot];
    struct slot_plan p = {.mask = 1u << s, .leader = s, .size_in_imm = 0};
    for (int r = 0; r < c->slot_matched[slot]; r++) p.sout[r] = c->slot_sout[slot][r];
    p.imm = mpib_imm_encode_replay((uint32_t)slot, ranges, c->slot_full[slot], reqs[0]->seq);
    int rc = post_chain(c, slot, s, &p, ranges, 1);
    if (rc == ENOMEM) return ncclSuccess; /* the send queue is full: the rest on a later call */
    if (rc == MPIB_POST_PARTIAL) { /* carried by s now, in part: s's fence settles it */
      c->slot_replay_wait[slot] = 0;
      c->replays_waiting--;
      return rail_fail(c, s, "completion-error", "its send queue took part of a replay");
    }
    if (rc) return rail_fail(c, s, "completion-error", "posting a replay failed");
    for (int range = 0; range < MPIB_NRAILS; range++)
      if (ranges & (1u << range)) tele_post(c, slot, s, range, completion_now(c));
    c->slot_replay_wait[slot] = 0;
    c->replays_waiting--;
  }
  return ncclSuccess;
}

/* Sender: rail r failed; settle one slot's ranges that r carried (its original chain and a
 * replay chain on it) with the receiver's record: confirmed ones count as delivered by r,
 * the others wait for a replay. Returns 1 when something must be replayed. */
static int settle_slot(struct mpib_comm *c, int slot, int r, const struct mpib_fence_rec *rec) {
  uint32_t lost = (c->slot_rails[slot] & (1u << r)) | c->slot_replay_on[slot][r];
  uint64_t seq = c->slot_posted_seq1[slot] - 1;
  if (c->slot_rails[slot] & (1u << r)) {
    c->slot_rails[slot] &= ~(1u << r);
    if (mpib_profiling()) mpib_prof_send_rail_done(c, slot, r);
  }
  c->slot_replay_on[slot][r] = 0;
  uint32_t need = mpib_replay_ranges(rec->open_seq1[slot], rec->have[slot], rec->next_seq, seq, lost);
  for (int range = 0; range < MPIB_NRAILS; range++) {
    if (!(lost & (1u << range))) continue;
    if (need & (1u << range)) tele_leave(c, r, c->slot_rail_bytes[slot][range], completion_now(c)); /* lost on r */
    else tele_complete(c, slot, r, range); /* the receiver has them: delivered by r */
  }
  if (need) {
    if (c->slot_replay_wait[slot] == 0) c->replays_waiting++;
    c->slot_replay_wait[slot] |= (uint8_t)need;
    return 1;
  }
  slot_try_complete(c, slot);
  return 0;
}

/* Sender: stages the confirm record of rail r for the receiver's record `rec`: the ranges its
 * open receives lack whose carrier on r was acknowledged (mpib_confirm_ranges). A slot the
 * record shows open cannot have been reused here: its next CTS comes only after that receive
 * completes. Returns how many slots it names. */
static int confirm_build(struct mpib_comm *c, int r, const struct mpib_fence_rec *rec, struct mpib_confirm_rec *st) {
  int n = 0;
  memset(st, 0, sizeof *st);
  st->gen = rec->fence_gen;
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++) {
    uint64_t w = __atomic_load_n(&c->slot_ack[slot][r], __ATOMIC_ACQUIRE), seq1 = mpib_ack_seq1(w);
    uint32_t ranges = seq1 ? mpib_confirm_ranges(rec->open_seq1[slot], rec->have[slot], seq1 - 1, mpib_ack_ranges(w)) : 0;
    if (!ranges) continue;
    st->seq1[slot] = seq1;
    st->ranges[slot] = (uint8_t)ranges;
    st->full[slot] = (uint8_t)mpib_ack_full(w);
    st->imm_size[slot] = mpib_ack_imm_size(w);
    n++;
  }
  st->check = mpib_confirm_check(st);
  return n;
}

/* The control plane's answer to a FAIL for an idle receiver (mpib.h): a fence record with no
 * receive open and next_seq where the next one will be. A receive NCCL posts meanwhile is one
 * "posted after the report" (mpib_replay_ranges): whatever the failed rail carried of it is
 * replayed. The data path fences its end and answers too when it next runs; the sender takes
 * the first answer of the generation. */
void mpib_comm_answer_notice(struct mpib_comm *c, int rail, uint64_t word) {
  uint32_t gen, cmd;
  if (c->is_send || rail < 0 || rail >= MPIB_NRAILS || mpib_notice_decode(word, &gen, &cmd) != 0 || cmd != MPIB_NOTICE_FAIL)
    return;
  uint64_t idle = __atomic_load_n(&c->recv_idle_seq1, __ATOMIC_ACQUIRE);
  if (idle == 0) return;
  struct mpib_fence_rec rec;
  memset(&rec, 0, sizeof rec);
  rec.fence_gen = gen;
  rec.next_seq = idle - 1;
  rec.check = mpib_fence_check(&rec);
  uint8_t msg[2 + sizeof rec] = {'R', (uint8_t)rail};
  memcpy(msg + 2, &rec, sizeof rec);
  ctrl_send_wait(c, msg, sizeof msg);
}

/* The control plane's answer to a fence record (mpib.h): the confirm, over the control socket. */
void mpib_comm_answer_record(struct mpib_comm *c, int rail, const void *rec_bytes) {
  struct mpib_fence_rec rec;
  struct mpib_confirm_rec st;
  if (!c->is_send || rail < 0 || rail >= MPIB_NRAILS) return;
  memcpy(&rec, rec_bytes, sizeof rec);
  if (rec.fence_gen == 0 || rec.check != mpib_fence_check(&rec) || confirm_build(c, rail, &rec, &st) == 0) return;
  uint8_t msg[2 + sizeof st] = {'C', (uint8_t)rail};
  memcpy(msg + 2, &st, sizeof st);
  ctrl_send_wait(c, msg, sizeof msg);
}

/* Sender: the receiver's record of rail r says which byte ranges of its open slots it already
 * has; the rest of what r carried is replayed on the surviving rail (mpib_replay_ranges). */
static ncclResult_t send_resolve(struct mpib_comm *c, int r, const struct mpib_fence_rec *rec) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  int replays = 0, settled = 0;
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++) {
    if (!c->slot_posted_seq1[slot] || !((c->slot_rails[slot] & (1u << r)) | c->slot_replay_on[slot][r])) continue;
    if (settle_slot(c, slot, r, rec)) replays++;
    else settled++;
  }
  uint64_t now = mpib_now_ns();
  rc->state = rail_fatal(c, r) ? MPIB_RAIL_DEAD : MPIB_RAIL_DOWN;
  if (rc->state == MPIB_RAIL_DEAD) publish_rail_state(c, r);
  c->pending[r] = 0;
  rc->since_ns = now;
  rc->retry_at_ns = next_retry_ns(c, rc, now);
  int confirmed = confirm_build(c, r, rec, confirm_rec(c, r));
  MPIB_INFO("failover: rail=%s side=send gen=%u resolved: %d slot(s) replayed, %d already delivered, %d confirmed",
            rail_name(r), rc->gen, replays, settled, confirmed);
  ncclResult_t res = confirmed ? post_confirm(c, r) : ncclSuccess;
  return res == ncclSuccess ? post_replays(c) : res;
}

/* Which field of the receiver's record names the generation the sender waits for. */
enum record_field { REC_FENCE, REC_READY, REC_REFUSED };
static uint64_t record_gen(const volatile struct mpib_fence_rec *rec, enum record_field f) {
  return f == REC_FENCE ? rec->fence_gen : f == REC_READY ? rec->ready_gen : rec->refused_gen;
}

/* Copies the receiver's record of rail r (`in`: the RDMA-written copy or the control socket's),
 * which names the current generation in field f; 1 when the copy is complete (its checksum
 * holds). */
static int read_record_check(struct mpib_comm *c, int r, enum record_field f, volatile struct mpib_fence_rec *in,
                             struct mpib_fence_rec *out) {
  uint64_t want = c->rail[r].gen;
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  memcpy(out, (const void *)in, sizeof *out);
  return record_gen(out, f) == want && out->check == mpib_fence_check(out);
}

/* Reads the receiver's record of rail r when it is complete and names the rail's generation
 * in field f. The sender looks for a fence on every progress call: the common answer (no
 * record for this generation) is one load, in line. */
static inline int read_record(struct mpib_comm *c, int r, enum record_field f, struct mpib_fence_rec *out) {
  volatile struct mpib_fence_rec *in = fence_rec(c, r), *tcp = &c->tcp_rec[r];
  if (record_gen(in, f) == c->rail[r].gen && read_record_check(c, r, f, in, out)) return 1;
  if (record_gen(tcp, f) != c->rail[r].gen) return 0;
  return read_record_check(c, r, f, tcp, out);
}

/* Sender: an attempt to bring rail r back failed before its probes (this side's or the
 * receiver's rebuild, or no answer): the rail is DOWN and tried again after the back-off. */
static ncclResult_t attempt_failed(struct mpib_comm *c, int r, uint64_t now, const char *why, const char *detail) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  rc->state = MPIB_RAIL_DOWN;
  rc->attempts++;
  rc->retry_at_ns = next_retry_ns(c, rc, now);
  MPIB_INFO("%s rail: generation %u: %s%s; next attempt in %llu ms", rail_name(r), rc->gen, why, detail,
            (unsigned long long)((rc->retry_at_ns - now) / 1000000ull));
  return ncclSuccess;
}

/* Sender: rail r never comes back for this connection (a device under it died, here or at the
 * receiver): it stays out of service, with no more recovery attempts. */
static ncclResult_t rail_dead(struct mpib_comm *c, int r, const char *why) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  rc->state = MPIB_RAIL_DEAD;
  publish_rail_state(c, r);
  MPIB_WARN("failover: rail=%s side=%s gen=%u is dead for this connection: %s; no more recovery attempts", rail_name(r),
            c->is_send ? "send" : "recv", rc->gen, why);
  return ncclSuccess;
}

/* Sender: the rail's QPs were rebuilt (e == 0): ask the receiver to do the same. */
static ncclResult_t send_rebuilt(struct mpib_comm *c, int r, int e, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  if (e) return attempt_failed(c, r, now, "reconnecting its QPs failed: ", strerror(-e));
  rc->state = MPIB_RAIL_RECOVERING;
  rc->since_ns = now;
  return post_notice(c, r, MPIB_NOTICE_RECOVER);
}

/* Sender, rail DOWN: reset and reconnect its QPs as generation + 1, off this thread
 * (mpib_rail_rebuild_start); send_rail_tick takes it from there. */
static ncclResult_t send_recover(struct mpib_comm *c, int r, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  ncclResult_t res = drain_rail(c, r); /* stale completions of the failed generation */
  if (res != ncclSuccess) return res;
  sq_reset_rail(c, r);
  rc->gen++;
  rc->since_ns = now;
  if (mpib_rail_rebuild_start(c, r, mpib_gen_psn(rc->gen)) == 0) return ncclSuccess;
  return send_rebuilt(c, r, mpib_rail_reconnect(c, r, mpib_gen_psn(rc->gen)), now); /* no thread: here */
}

/* Sender: one zero-byte write per QP of the rebuilt rail; all must complete before the rail
 * carries data again. */
static ncclResult_t post_probes(struct mpib_comm *c, int r, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  rc->state = MPIB_RAIL_PROBING;
  rc->since_ns = now;
  rc->probes = 0;
  for (uint32_t i = 0; i < c->nqps[r]; i++) {
    struct ibv_send_wr wr = {.wr_id = wrid_special(c, r, MPIB_WR_PROBE), .num_sge = 0, .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED};
    int qi = mpib_qp_index(r, i, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]); /* every QP of the rail once */
    wr.wr.rdma.remote_addr = c->rem_addr;
    wr.wr.rdma.rkey = c->rem_rkey[c->qps[qi].lane];
    if (qp_post(c, qi, &wr, 1)) return rail_fail(c, r, "probe-failed", "posting a probe failed");
    rc->probes++;
    c->pending[r]++;
  }
  return ncclSuccess;
}

static ncclResult_t probe_done(struct mpib_comm *c, int r) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  if (rc->state != MPIB_RAIL_PROBING || --rc->probes > 0) return ncclSuccess;
  rc->state = MPIB_RAIL_UP;
  publish_rail_state(c, r);
  MPIB_WARN("recovery: rail=%s side=send restored_ms=%llu gen=%u (after %u failed attempt(s))", rail_name(r),
            (unsigned long long)wall_ms(), rc->gen, rc->attempts);
  rc->attempts = 0;
  stall_end(c, r);
  return post_notice(c, r, MPIB_NOTICE_UP);
}

/* Sender side of a rail that is not simply UP. */
static ncclResult_t send_rail_tick(struct mpib_comm *c, int r, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  struct mpib_fence_rec rec;
  uint64_t timeout = mpib_g.failover_timeout_ms * 1000000ull;
  switch (rc->state) {
  case MPIB_RAIL_FENCING:
    /* The receiver answers from its own calls into the plugin: one that has no receive open
     * (it completed them all; only acknowledgements were lost) answers when NCCL posts its
     * next one. A dead receiver closes the control socket (comm_health fails us then), so
     * waiting longer is only logged. */
    if (read_record(c, r, REC_FENCE, &rec)) {
      rc->slow_reported = 0;
      return send_resolve(c, r, &rec);
    }
    if (now - rc->since_ns > timeout && !rc->slow_reported) {
      rc->slow_reported = 1;
      MPIB_WARN("%s rail: the receiver has not answered its failover for %llu ms (it has no receive open?); "
                "requests it carried wait for the answer", rail_name(r), (unsigned long long)((now - rc->since_ns) / 1000000ull));
    }
    return ncclSuccess;
  case MPIB_RAIL_DOWN: {
    int e;
    if (rc->rebuild.running) return mpib_rail_rebuild_poll(c, r, &e) ? send_rebuilt(c, r, e, now) : ncclSuccess;
    uint64_t port_back = 0;
    for (int l = 0; l < mpib_lane_count(c, r); l++) { /* the latest change of any of its ports */
      uint64_t t = __atomic_load_n(&c->nic[mpib_lane(r, l)]->port_change_ns, __ATOMIC_RELAXED);
      if (t > port_back) port_back = t;
    }
    int due = now >= rc->retry_at_ns || port_back > rc->since_ns;
    /* Without a working other rail only when the control socket can carry the handshake. */
    if (due && !rail_down(c, r) && !rail_fatal(c, r) && (rail_usable(c, 1 - r) || c->ctrl_fd >= 0)) return send_recover(c, r, now);
    return ncclSuccess;
  }
  case MPIB_RAIL_RECOVERING:
    if (read_record(c, r, REC_READY, &rec)) return post_probes(c, r, now);
    if (read_record(c, r, REC_REFUSED, &rec)) {
      if (rec.refused_dead) return rail_dead(c, r, "the receiver's device under it died");
      return attempt_failed(c, r, now, "the receiver could not rebuild it", "");
    }
    if (now - rc->since_ns > timeout) return attempt_failed(c, r, now, "the receiver did not answer its RECOVER", "");
    return ncclSuccess;
  case MPIB_RAIL_PROBING:
    if (now - rc->since_ns > timeout) return rail_fail(c, r, "probe-failed", "the probes never completed");
    return ncclSuccess;
  default:
    return ncclSuccess;
  }
}

/* Receiver: rail r fenced a moment ago; once what was already in flight has landed, report
 * what it has to the sender. */
static ncclResult_t recv_fence_settle(struct mpib_comm *c, int r, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  /* With no receive open nothing in flight can matter: answer now, from the call that completed
   * the last one (NCCL may not call this comm again for a while). */
  if (now - rc->since_ns < MPIB_FENCE_SETTLE_NS && c->recvs_open > 0) return ncclSuccess;
  ncclResult_t res = drain_rail(c, r);
  if (res != ncclSuccess) return res;
  struct mpib_fence_rec *st = fence_rec(c, r);
  st->fence_gen = rc->gen;
  st->refused_gen = 0; /* set only in a refusal's record: the others check as without the field */
  st->refused_dead = 0;
  st->next_seq = c->fifo_head;
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++) {
    struct mpib_request *req = c->slot_reqs[slot][0];
    st->open_seq1[slot] = req ? req->seq + 1 : 0;
    st->have[slot] = req ? (uint8_t)req->have_mask : 0;
  }
  rc->state = rail_fatal(c, r) ? MPIB_RAIL_DEAD : MPIB_RAIL_DOWN;
  if (rc->state == MPIB_RAIL_DEAD) publish_rail_state(c, r);
  c->pending[r] = 0;
  return post_record(c, r);
}

/* Receiver: rail r's QPs were rebuilt (e == 0) as generation rc->gen: refill its receives and
 * tell the sender. A failure is told too: the sender retries after its back-off (without the
 * answer it would wait MPIB_FAILOVER_TIMEOUT_MS; seen in the lab when the loss that failed the
 * rail also lost the ARP reply this side's RTR waited for). */
/* Receiver: refuses the sender's attempt to bring rail r back as generation gen: it retries
 * after its back-off, or, when this side's device under the rail died, never again. */
static ncclResult_t recv_refuse(struct mpib_comm *c, int r, uint32_t gen, int dead, const char *why) {
  MPIB_INFO("%s rail: refusing its recovery as generation %u: %s", rail_name(r), gen, why);
  fence_rec(c, r)->refused_gen = gen;
  fence_rec(c, r)->refused_dead = (uint8_t)dead;
  return rail_usable(c, 1 - r) || c->ctrl_fd >= 0 ? post_record(c, r) : ncclSuccess; /* else: its timeout */
}

static ncclResult_t recv_rebuilt(struct mpib_comm *c, int r, int e, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  if (rail_fatal(c, r)) return recv_refuse(c, r, rc->gen, 1, "its device died");
  if (rc->state != MPIB_RAIL_DOWN) return ncclSuccess;
  if (e) return recv_refuse(c, r, rc->gen, 0, strerror(-e));
  if (c->srq[r] && srq_refill_rail(c, r)) return recv_refuse(c, r, rc->gen, 0, "posting its receives failed");
  rc->state = MPIB_RAIL_RECOVERING;
  rc->since_ns = now;
  fence_rec(c, r)->ready_gen = rc->gen;
  fence_rec(c, r)->refused_gen = 0;
  fence_rec(c, r)->refused_dead = 0;
  return post_record(c, r);
}

/* Receiver: the sender rebuilt rail r as generation gen; do the same, off this thread like the
 * sender (failover_tick polls the rebuild), and say so. */
static ncclResult_t recv_recover(struct mpib_comm *c, int r, uint32_t gen, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  if (rail_fatal(c, r)) return recv_refuse(c, r, gen, 1, "its device died");
  if (rc->state == MPIB_RAIL_UP) { /* the sender rebuilds a rail this side never saw fail (its end */
    rc->state = MPIB_RAIL_DOWN;   /* never came up at connect): what is queued on it dies with the reset */
    ncclResult_t res = recv_leave_cts_rail(c, r);
    if (res != ncclSuccess) return res;
  }
  rc->state = MPIB_RAIL_DOWN; /* completions of the old generation are dropped by the drain */
  ncclResult_t res = drain_rail(c, r);
  if (res != ncclSuccess) return res;
  c->pending[r] = 0; /* the reset discards what is still queued: counted, it would keep the rail */
  rc->keepalive_out = 0; /* busy and its idle keepalives off for good (as fence_rail clears them) */
  sq_reset_rail(c, r);
  rc->gen = gen;
  if (mpib_rail_rebuild_start(c, r, mpib_gen_psn(gen)) == 0) return ncclSuccess;
  return recv_rebuilt(c, r, mpib_rail_reconnect(c, r, mpib_gen_psn(gen)), now); /* no thread: here */
}

static ncclResult_t recv_notice(struct mpib_comm *c, int r, uint64_t word, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  uint32_t gen, cmd;
  if (mpib_notice_decode(word, &gen, &cmd) != 0) {
    MPIB_WARN("%s rail: ignoring a malformed failover notice 0x%llx from the peer", rail_name(r), (unsigned long long)word);
    return ncclSuccess;
  }
  int live = rc->state == MPIB_RAIL_UP || rc->state == MPIB_RAIL_RECOVERING;
  /* A FAIL of a newer generation than this side's: its RECOVER was superseded before it was
   * read (notices keep only the newest), so this side never rebuilt for it. The sender waits
   * for a record naming that generation: adopt it and answer. */
  if (cmd == MPIB_NOTICE_FAIL && gen > rc->gen) rc->gen = gen;
  if (cmd == MPIB_NOTICE_FAIL && gen == rc->gen && live) return rail_fail(c, r, "peer-notice", "the sender failed it");
  if (cmd == MPIB_NOTICE_FAIL && gen == rc->gen && (rc->state == MPIB_RAIL_DOWN || rc->state == MPIB_RAIL_DEAD)) {
    /* Out of service here already (never brought up at connect, a rebuild it refused, or its
     * device died) while the sender's was in service: the sender waits for a record. Nothing
     * can have arrived on it since its last record. */
    rc->state = MPIB_RAIL_FENCING;
    rc->since_ns = now - MPIB_FENCE_SETTLE_NS;
    return ncclSuccess;
  }
  if (cmd == MPIB_NOTICE_RECOVER && gen > rc->gen) return recv_recover(c, r, gen, now);
  if (cmd == MPIB_NOTICE_UP && gen == rc->gen && rc->state == MPIB_RAIL_RECOVERING) {
    rc->state = MPIB_RAIL_UP;
    publish_rail_state(c, r);
    /* The CTS stays on the rail that took it over: moving it back would let a CTS still queued
     * there (retransmitted after a stall) land after a newer CTS of the same FIFO slot sent on
     * this rail and overwrite it (the sender then waits forever), and a CTS still queued there
     * when that rail fails later would be flushed and never reposted (only the CTS rail's
     * failure reposts the open slots). Found by plugin/ctest/replay_model_test.c. A CTS write
     * is a few dozen bytes: which rail carries it costs nothing. */
    MPIB_INFO("%s rail: back in service (generation %u)", rail_name(r), gen);
    stall_end(c, r);
    if (c->cts_repost_due) { /* the CTS of every open slot, lost with the rails, on the first one back */
      c->cts_repost_due = 0;
      c->cts_rail = r;
      int e = repost_open_cts(c, r);
      if (e) return comm_failed(c, "reposting the CTS on the returning rail failed: ", strerror(e));
    }
  }
  return ncclSuccess;
}

static ncclResult_t recv_finish(struct mpib_comm *c, int rail, uint32_t slot, struct mpib_request *req, uint32_t imm_size);

/* Receiver: the sender's confirm record of rail r (the RDMA copy or the control socket's),
 * when it is complete and not the last one applied; 1 then. Applying one is idempotent: a
 * confirm names a receive by its sequence number, and ranges already arrived arrive again
 * harmlessly (both the data path and the control plane may send one). */
static int read_confirm(struct mpib_comm *c, int r, struct mpib_confirm_rec *out) {
  volatile struct mpib_confirm_rec *in[2] = {confirm_rec(c, r), &c->tcp_confirm[r]};
  for (int k = 0; k < 2; k++) {
    if (in[k]->check == c->confirm_seen[r] || in[k]->gen == 0) continue;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    memcpy(out, (const void *)in[k], sizeof *out);
    if (out->check == mpib_confirm_check(out) && out->check != c->confirm_seen[r]) return 1;
  }
  return 0;
}

/* Receiver: the ranges the sender's confirm names arrived (their carrier on the fenced rail r
 * was acknowledged, but this side never polled the completion): counted as a replay of them
 * would be. */
static ncclResult_t recv_confirm(struct mpib_comm *c, int r) {
  struct mpib_confirm_rec rec;
  if (!read_confirm(c, r, &rec)) return ncclSuccess;
  c->confirm_seen[r] = rec.check;
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++) {
    struct mpib_request *req = c->slot_reqs[slot][0];
    if (!rec.seq1[slot] || req == NULL || req->seq + 1 != rec.seq1[slot]) continue;
    int complete = mpib_recv_ranges_arrived(&req->expected_mask, &req->have_mask, rec.full[slot], rec.ranges[slot], 1);
    if (complete < 0) {
      MPIB_WARN("%s rail: the sender confirmed ranges %u of slot %d (full %u) that its receive cannot have (expects %u)",
                rail_name(r), rec.ranges[slot], slot, rec.full[slot], req->expected_mask);
      return ncclRemoteError;
    }
    req->wrote_rails |= 1u << r;
    MPIB_INFO("%s rail: slot %d: ranges %u confirmed by the sender (their completion was lost with the rail)", rail_name(r),
              slot, rec.ranges[slot]);
    if (complete) {
      ncclResult_t res = recv_finish(c, r, (uint32_t)slot, req, rec.imm_size[slot]);
      if (res != ncclSuccess) return res;
    }
  }
  return ncclSuccess;
}

/* Runs on every progress call. With every rail UP it costs a load or two per rail: the port
 * state, and the peer's record (sender) or notice and confirm (receiver) words. */
static ncclResult_t failover_tick(struct mpib_comm *c) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (!c->nqps[r]) continue;
    struct mpib_rail_ctl *rc = &c->rail[r];
    ncclResult_t res = ncclSuccess;
    int e;
    if (!c->is_send && rc->rebuild.running) {
      /* Notices wait in their words until the rebuild is done: a newer RECOVER is acted on then. */
      if (mpib_rail_rebuild_poll(c, r, &e)) res = recv_rebuilt(c, r, e, mpib_now_ns());
    } else if (!c->is_send) {
      res = recv_confirm(c, r);
      uint64_t word = __atomic_load_n(notice_word(c, r), __ATOMIC_ACQUIRE);
      uint64_t tcp = __atomic_load_n(&c->tcp_notice[r], __ATOMIC_ACQUIRE);
      if (mpib_notice_order(tcp) > mpib_notice_order(word)) word = tcp;
      if (res == ncclSuccess && word != rc->notice_seen && mpib_notice_order(word) > mpib_notice_order(rc->notice_seen)) {
        rc->notice_seen = word;
        res = recv_notice(c, r, word, mpib_now_ns());
      }
    } else if (rc->state == MPIB_RAIL_UP || rc->state == MPIB_RAIL_PROBING) {
      struct mpib_fence_rec rec;
      if (read_record(c, r, REC_FENCE, &rec) && (res = rail_fail(c, r, "peer-fence", "the receiver fenced it")) == ncclSuccess)
        res = send_resolve(c, r, &rec);
    }
    if (res == ncclSuccess && rc->state == MPIB_RAIL_UP && rail_down(c, r))
      res = rail_fail(c, r, "port-down", mpib_rail_fault_nic(c, r));
    if (res == ncclSuccess && rc->state != MPIB_RAIL_UP && rc->state != MPIB_RAIL_DEAD) {
      uint64_t now = mpib_now_ns();
      res = c->is_send ? send_rail_tick(c, r, now)
                       : rc->state == MPIB_RAIL_FENCING ? recv_fence_settle(c, r, now) : ncclSuccess;
    }
    if (res != ncclSuccess) return res;
  }
  if (__atomic_load_n(&c->ctrl_out_n, __ATOMIC_RELAXED) || c->ctrl_rdma_due) {
    ncclResult_t res = ctrl_retry(c);
    if (res != ncclSuccess) return res;
  }
  if (c->cts_repost_due && !c->is_send && rail_usable(c, c->cts_rail)) { /* a repost a full queue cut short */
    int e = repost_open_cts(c, c->cts_rail);
    if (e) return comm_failed(c, "reposting the CTS failed: ", strerror(e));
  }
  return c->replays_waiting > 0 ? post_replays(c) : ncclSuccess;
}

/* ---- Completions ---- */

static ncclResult_t rail_error(struct mpib_comm *c, int rail, const struct ibv_wc *wc) {
  int st = c->rail[rail].state;
  if (st == MPIB_RAIL_FENCING || st == MPIB_RAIL_DOWN || st == MPIB_RAIL_DEAD) return ncclSuccess; /* the rest of its queue */
  char detail[160];
  snprintf(detail, sizeof detail, "%s, status %d, vendor error %u, QP %u", ibv_wc_status_str(wc->status), wc->status,
           wc->vendor_err, wc->qp_num);
  return rail_fail(c, rail, st == MPIB_RAIL_PROBING ? "probe-failed" : "completion-error", detail);
}

/* The slot's ranges `ranges` were acknowledged on `rail` (their carrier completed). */
static void slot_acked(struct mpib_comm *c, int slot, int rail, uint32_t ranges) {
  uint64_t w = c->slot_ack[slot][rail];
  __atomic_store_n(&c->slot_ack[slot][rail], w | (uint64_t)(ranges & 3u) << 18, __ATOMIC_RELEASE);
}

static ncclResult_t on_send_completion(struct mpib_comm *c, int rail, uint64_t id) {
  uint64_t seq = id & MPIB_WRID_SEQ_MASK;
  int slot = (int)(seq % MPIB_MAX_REQUESTS);
  if (c->slot_posted_seq1[slot] != seq + 1) return ncclSuccess; /* already settled by a failover */
  if (id & MPIB_WRID_REPLAY) {
    uint32_t ranges = c->slot_replay_on[slot][rail];
    if (!ranges) return ncclSuccess;
    c->slot_replay_on[slot][rail] = 0;
    slot_acked(c, slot, rail, ranges);
    for (int range = 0; range < MPIB_NRAILS; range++) /* the lost ranges, carried by this rail */
      if (ranges & (1u << range)) tele_complete(c, slot, rail, range);
  } else {
    if (!(c->slot_rails[slot] & (1u << rail))) return ncclSuccess;
    if (mpib_profiling()) mpib_prof_send_rail_done(c, slot, rail);
    c->slot_rails[slot] &= ~(1u << rail);
    slot_acked(c, slot, rail, 1u << rail);
    tele_complete(c, slot, rail, rail);
  }
  slot_try_complete(c, slot);
  if (telemetry_due(c)) mpib_telemetry_flush(c);
  return ncclSuccess;
}

/* A receive's sizes, from the immediate or the size records, checked against its buffers. */
static ncclResult_t recv_finish(struct mpib_comm *c, int rail, uint32_t slot, struct mpib_request *req, uint32_t imm_size) {
  if (imm_size != MPIB_IMM_NO_SIZE && req->nreqs != 1) {
    MPIB_WARN("%s rail: size in the immediate for a grouped receive of %d", rail_name(rail), req->nreqs);
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
  c->flush_due |= req->wrote_rails;
  req->done = 1;
  c->slot_reqs[slot][0] = NULL;
  if (--c->recvs_open == 0) __atomic_store_n(&c->recv_idle_seq1, c->fifo_head + 1, __ATOMIC_RELEASE);
  c->progress_count++;
  return ncclSuccess;
}

static ncclResult_t on_recv_completion(struct mpib_comm *c, int rail, const struct ibv_wc *wc) {
  uint32_t slot, mask, seq8, imm_size;
  if (!(wc->wc_flags & IBV_WC_WITH_IMM) || mpib_imm_decode(wc->imm_data, &slot, &mask, &seq8, &imm_size) != 0) {
    MPIB_WARN("%s rail: malformed completion from the peer (imm 0x%x)", rail_name(rail), wc->imm_data);
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
    else if ((req->seq & 0xFF) != seq8) snprintf(open, sizeof open, "the slot's receive is seq %u", (unsigned)(req->seq & 0xFF));
    else snprintf(open, sizeof open, "its receive expects ranges %u and has %u%s", req->expected_mask, req->have_mask,
                  !replay && (req->have_mask & ranges) ? " (the transport delivered a write twice?)" : "");
    MPIB_WARN("%s rail (generation %u, %s): completion for slot %u (seq %u, mask %u%s, QP %u) matches no posted receive: %s",
              rail_name(rail), c->rail[rail].gen, rail_state_name(c->rail[rail].state), slot, seq8, mask,
              replay ? ", replay" : "", wc->qp_num, open);
    return ncclRemoteError;
  }
  req->wrote_rails |= 1u << rail;
  if (mpib_profiling()) mpib_prof_recv_rail_done(req, rail);
  if (!complete) return ncclSuccess;
  return recv_finish(c, rail, slot, req, imm_size);
}

/* Whether a rail can have completions to deliver: signalled sends outstanding, or (receiver)
 * receives posted that the peer's writes can complete. An idle rail costs no poll; neither
 * does a failed one (its CQ is drained when it is rebuilt) or a dead device. */
static int rail_busy(const struct mpib_comm *c, int rail) {
  int st = c->rail[rail].state;
  if (st == MPIB_RAIL_DOWN || st == MPIB_RAIL_DEAD || rail_fatal(c, rail)) return 0;
  return c->pending[rail] > 0 || (c->srq[rail] && c->recvs_open > 0) || st == MPIB_RAIL_FENCING;
}

/* One completion of lane `lane` of rail `rail`: a receive used up that lane's SRQ. */
static ncclResult_t handle_completion(struct mpib_comm *c, int rail, int lane, const struct ibv_wc *wc) {
  uint64_t id = wc->wr_id;
  if (id == MPIB_WRID_RECV) { /* an SRQ receive: they outlive QP generations */
    c->srq_posted[lane]--;
    if (wc->status != IBV_WC_SUCCESS) return rail_error(c, rail, wc);
    return on_recv_completion(c, rail, wc);
  }
  int st = c->rail[rail].state;
  if (!wrid_current(c, rail, id)) return ncclSuccess;
  sq_retire(c, rail, id);
  if (st == MPIB_RAIL_DOWN || st == MPIB_RAIL_DEAD) return ncclSuccess;
  if (wc->status != IBV_WC_SUCCESS) return rail_error(c, rail, wc);
  if (c->pending[rail]) c->pending[rail]--;
  int kind = wrid_kind(id);
  if (kind == MPIB_WR_PROBE) return probe_done(c, rail);
  if (kind == MPIB_WR_KEEPALIVE && c->rail[rail].keepalive_out > 0) c->rail[rail].keepalive_out--;
  if (kind == 0 && c->is_send) return on_send_completion(c, rail, id);
  return ncclSuccess; /* a signalled CTS or control write */
}

/* A comm NCCL keeps polling (a receiver with receives open, a sender waiting for a CTS or a
 * completion) that has made no progress for MPIB_KEEPALIVE_NS writes zero bytes on each rail
 * in service, once per period: on a live path the write completes and nothing happens; on a
 * dead one it errors after the RC budget and the rail fails over, or, with no rail left, the
 * connection fails. Without it a receiver whose sender's path died silently would wait
 * forever when the control socket shares the dead network. Checked every 256th poll. */
#define MPIB_KEEPALIVE_NS 1000000000ull
/* A comm busy on one rail also writes zero bytes, every MPIB_IDLE_RAIL_PROBE_NS, on a rail it
 * leaves idle (vanilla intra-island: SOUT carries nothing), so that a silent black hole there
 * is found within the RC budget, as one under traffic is, and not when a failover first needs
 * the rail. net_ib checks no idle port at all. Cost: one zero-byte write per idle rail per
 * 100 ms per busy comm, none on a comm that is idle altogether (MPIB_KEEPALIVE_NS there). */
#define MPIB_IDLE_RAIL_PROBE_NS 100000000ull

/* One zero-byte write on each lane of the rail (its first QPs: QP i sits on lane i mod the
 * lanes), so that a striped rail's idle cable is checked too. */
static ncclResult_t post_keepalive(struct mpib_comm *c, int r) {
  for (int i = 0; i < mpib_lane_count(c, r); i++) {
    struct ibv_send_wr wr = {.wr_id = wrid_special(c, r, MPIB_WR_KEEPALIVE), .num_sge = 0,
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
    int qi = mpib_qp_index(r, (uint64_t)i, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
    wr.wr.rdma.remote_addr = c->rem_addr;
    wr.wr.rdma.rkey = c->rem_rkey[c->qps[qi].lane];
    int rc = qp_post(c, qi, &wr, 1);
    if (rc == ENOMEM) continue; /* a full send queue: the rail is busy, its own traffic checks it */
    if (rc) return rail_fail(c, r, "completion-error", "posting a keepalive failed");
    c->rail[r].keepalive_out++;
    c->pending[r]++;
  }
  return ncclSuccess;
}

static int keepalive_possible(const struct mpib_comm *c, int r) {
  return c->nqps[r] && c->rail[r].state == MPIB_RAIL_UP && !c->rail[r].keepalive_out && !rail_fatal(c, r);
}

static ncclResult_t probe_idle_rails(struct mpib_comm *c, uint64_t now) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    int idle = keepalive_possible(c, r) && c->pending[r] == 0;
    if (mpib_idle_probe_due(&c->rail[r].idle_since_ns, idle, now, MPIB_IDLE_RAIL_PROBE_NS)) {
      ncclResult_t res = post_keepalive(c, r);
      if (res != ncclSuccess) return res;
    }
  }
  return ncclSuccess;
}

static ncclResult_t keepalive_tick(struct mpib_comm *c) {
  uint64_t now = mpib_now_ns();
  if (c->progress_count != c->progress_seen || c->idle_since_ns == 0) {
    c->progress_seen = c->progress_count;
    c->idle_since_ns = now;
    return probe_idle_rails(c, now);
  }
  /* Idle for 256 polls: what is left of the telemetry batch is published now, not at the next
   * message (the agent would see the last completions late and the bytes in flight stuck). */
  if (c->tele_slots || c->tele_done) mpib_telemetry_flush(c);
  if (now - c->idle_since_ns < MPIB_KEEPALIVE_NS || (!c->is_send && c->recvs_open == 0)) return ncclSuccess;
  c->idle_since_ns = now;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (!keepalive_possible(c, r)) continue;
    ncclResult_t res = post_keepalive(c, r);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

/* Handles what one lane's CQ yields, 16 at a time while it fills the batch; a failing poll
 * fails the rail. */
static ncclResult_t poll_lane(struct mpib_comm *c, int rail, int lane) {
  struct ibv_wc wcs[16];
  int n;
  do {
    n = ibv_poll_cq(c->cq[lane], 16, wcs);
    if (n < 0) {
      if (c->rail[rail].state != MPIB_RAIL_UP) return ncclSuccess;
      return rail_fail(c, rail, "completion-error", "ibv_poll_cq failed");
    }
    for (int i = 0; i < n; i++) {
      ncclResult_t res = handle_completion(c, rail, lane, &wcs[i]);
      if (res != ncclSuccess) return res;
    }
  } while (n == 16);
  return ncclSuccess;
}

/* Drains the completion queues of the rails that have work, each lane while it yields, then
 * lets the failover state machine move. */
static ncclResult_t progress(struct mpib_comm *c) {
  c->tele_now_ns = 0; /* completion_now reads the clock afresh for this call's completions */
  for (int rail = 0; rail < MPIB_NRAILS; rail++) {
    if (!c->cq[rail] || !rail_busy(c, rail)) continue;
    for (int i = 0; i < mpib_lane_count(c, rail); i++) {
      if (i > 0 && !rail_busy(c, rail)) break; /* an earlier lane's completion took the rail out */
      ncclResult_t res = poll_lane(c, rail, mpib_lane(rail, i));
      if (res != ncclSuccess) return res;
    }
    ncclResult_t res = srq_refill_or_fail(c, rail); /* after all its lanes' receives were consumed */
    if (res != ncclSuccess) return res;
  }
  if ((++c->idle_polls & 255) == 0) {
    ncclResult_t res = keepalive_tick(c);
    if (res != ncclSuccess) return res;
  }
  return failover_tick(c);
}

ncclResult_t mpib_test(void *request, int *done, int *sizes) {
  struct mpib_request *req = request;
  struct mpib_comm *c = req->comm;
  *done = 0;
  /* A flush still waiting (a lane that must read again) lets the comm's failover move too: NCCL
   * may be testing nothing else of this comm. */
  ncclResult_t res = req->type == MPIB_REQ_FLUSH ? mpib_flush_test(c, req) : progress(c);
  if (res == ncclSuccess && req->type == MPIB_REQ_FLUSH && !req->done && req->flush_redo) res = progress(c);
  if (res != ncclSuccess) return res;
  if (!req->done) return comm_health(c);
  *done = 1;
  if (sizes && req->type == MPIB_REQ_SEND) sizes[0] = (int)req->size;
  if (sizes && req->type == MPIB_REQ_RECV) memcpy(sizes, req->sizes, (size_t)req->nreqs * sizeof(int));
  req->type = MPIB_REQ_FREE;
  return ncclSuccess;
}
