/*
 * Failover: a rail leaves service and the connection goes on (docs/failover.md). Called by the
 * message path (mpib_p2p.c), and by the control plane's thread (lifecycle.go) for its answers
 * (mpib_comm_answer_*); offers what mpib_failover.h declares. Calls the slots' bookkeeping
 * (mpib_slots.h), rail rebuild (mpib_rebuild.h: QP reset and reconnect on a thread of their
 * own) and the agent segment.
 * Pure C, no Go calls; every timeout reads mpib_now_ns.
 *
 * A rail that fails (an error completion of any status, a port that went down, a dead device,
 * or the peer saying so) leaves service for the connection without an error to NCCL: both
 * ends fence it (its QPs forced to the error state), the receiver tells the sender which of
 * the open slots it already has (its fence record), the sender answers with the ranges its
 * acknowledgements show delivered (its confirm record) and replays the others whole on the
 * surviving rail, and the CTS moves there too. The sender then retries the rail with back-off:
 * QPs reset and reconnected, a probe write per QP, back in service. With no rail left the
 * connection rides through (stalls) up to MPIB_STALL_TIMEOUT_MS. Keepalives find a dead path
 * that carries nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "mpib_clock.h"
#include "mpib_failover.h"
#include "mpib_profiler.h"
#include "mpib_rebuild.h"
#include "mpib_slots.h"

static void notify_peer_failed(struct mpib_comm *c);
static ncclResult_t fence_rail(struct mpib_comm *c, int r, const char *reason);

/* Why a comm can make no more progress, checked only while a caller waits for it: a fatal
 * device under any of its rails, or a peer whose control socket closed longer ago than the
 * grace period (a peer that exits right after its last completion must not fail requests
 * whose completions are already on their way). The reason is logged once per comm. */
#define MPIB_PEER_GONE_GRACE_NS 1000000000ull
/* After fencing a rail the receiver waits this long before reporting what it has, so that a
 * write the NIC was processing at the fence has produced its completion (net_ib's probe waits
 * 10 ms too). */
#define MPIB_FENCE_SETTLE_NS 10000000ull

/* Whether rail r may carry this connection again: not DEAD, its devices alive (MPIB never
 * reopens a dead device, as net_ib). With no such rail a stall has nothing to wait for. */
static int rail_can_return(const struct mpib_comm *c, int r) {
  return c->nqps[r] && c->rail[r].state != MPIB_RAIL_DEAD && !mpib_rail_fatal(c, r);
}

static ncclResult_t comm_failed(struct mpib_comm *c, const char *why, const char *what) {
  if (!c->failure_reported) {
    c->failure_reported = 1;
    MPIB_WARN("%s comm: %s%s", c->is_send ? "send" : "recv", why, what);
  }
  return ncclRemoteError;
}

/* A ride-through that cannot end: warned once, the peer told, the comm failed. */
static ncclResult_t stall_failed(struct mpib_comm *c, const char *why) {
  if (!c->failure_reported) MPIB_WARN("ride-through: side=%s %s: failing it", c->is_send ? "send" : "recv", why);
  c->failure_reported = 1;
  notify_peer_failed(c);
  return ncclRemoteError;
}

ncclResult_t mpib_failover_health_check(struct mpib_comm *c) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (c->nqps[r] && mpib_rail_fatal(c, r) && c->rail[r].state != MPIB_RAIL_DEAD) {
      if (c->rail[r].state == MPIB_RAIL_DOWN) {
        c->rail[r].state = MPIB_RAIL_DEAD; /* already failed over: it just never comes back */
        mpib_publish_rail_state(c, r);
        continue;
      }
      if (c->rail[r].state == MPIB_RAIL_FENCING) continue;
      ncclResult_t res = mpib_failover_rail_fail(c, r, "device-fatal", mpib_rail_fault_nic(c, r));
      if (res != ncclSuccess) return ncclSystemError;
    }
  }
  uint64_t gone = __atomic_load_n(&c->peer_gone_ns, __ATOMIC_ACQUIRE);
  /* With no rail working nothing is on its way: a peer gone then fails the requests at once. */
  if (gone && (c->stall_since_ns || mpib_now_ns() - gone > MPIB_PEER_GONE_GRACE_NS))
    return comm_failed(c, "the peer closed the connection with requests still waiting",
                       " (its process exited or aborted)");
  if (c->stall_since_ns && !rail_can_return(c, MPIB_RAIL_SOUT) && !rail_can_return(c, MPIB_RAIL_SUP))
    return stall_failed(c, "every rail of this connection is over a dead device");
  if (c->stall_since_ns && mpib_now_ns() - c->stall_since_ns > mpib_g.stall_timeout_ms * 1000000ull) {
    char why[96];
    snprintf(why, sizeof why, "no rail of this connection came back within MPIB_STALL_TIMEOUT_MS=%llu",
             (unsigned long long)mpib_g.stall_timeout_ms);
    return stall_failed(c, why);
  }
  return ncclSuccess;
}

/* Sends what a short write left on the control socket; 0 once nothing is left. The socket is
 * non-blocking for the data path: a full one keeps the bytes for a later progress call. A comm
 * whose socket is gone (closing: mpib_comm_set_ctrl_fd) drops them: nothing will send them. */
static int ctrl_flush_locked(struct mpib_comm *c) {
  if (c->ctrl_fd < 0) c->ctrl_out_n = 0;
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
static int ctrl_queue_locked(struct mpib_comm *c, const void *msg, size_t len) {
  if (c->ctrl_out_n + len > sizeof c->ctrl_out) {
    MPIB_INFO("%s comm: the control socket has %u bytes unsent; a %zu-byte message is dropped",
              c->is_send ? "send" : "recv", c->ctrl_out_n, len);
    return -ENOBUFS;
  }
  memcpy(c->ctrl_out + c->ctrl_out_n, msg, len);
  c->ctrl_out_n += (uint32_t)len;
  (void)ctrl_flush_locked(c);
  return 0;
}

static void ctrl_send(struct mpib_comm *c, const void *msg, size_t len) {
  if (c->ctrl_fd < 0) return;
  pthread_mutex_lock(&c->ctrl_mu);
  (void)ctrl_queue_locked(c, msg, len); /* a message dropped whole is superseded (above) */
  pthread_mutex_unlock(&c->ctrl_mu);
}

/* The control plane's thread (its answers, below): sends until the socket took everything
 * queued, for up to about 2 s. It may wait; the data path's thread never does, and holds the
 * lock only for one non-blocking send, so neither waits long for the other. */
static void ctrl_wait_sent(struct mpib_comm *c) {
  for (int i = 0; i < 200; i++) {
    pthread_mutex_lock(&c->ctrl_mu);
    int left = ctrl_flush_locked(c) != 0, fd = c->ctrl_fd;
    pthread_mutex_unlock(&c->ctrl_mu);
    if (!left) return;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    (void)poll(&p, 1, 10);
  }
}

static void ctrl_send_wait(struct mpib_comm *c, const void *msg, size_t len) {
  ctrl_send(c, msg, len);
  ctrl_wait_sent(c);
}

int mpib_comm_ctrl_send(struct mpib_comm *c, const void *msg, size_t len) {
  if (c->ctrl_fd < 0) return -ENOTCONN;
  ctrl_wait_sent(c); /* room first: the queue drops a message it cannot take whole */
  pthread_mutex_lock(&c->ctrl_mu);
  int rc = c->ctrl_fd < 0 ? -ENOTCONN : ctrl_queue_locked(c, msg, len);
  pthread_mutex_unlock(&c->ctrl_mu);
  if (rc) return rc;
  ctrl_wait_sent(c);
  return __atomic_load_n(&c->ctrl_out_n, __ATOMIC_RELAXED) ? -EAGAIN : 0;
}

/* The peer's requests would otherwise wait for their own timeouts: one byte on the control
 * socket makes its watcher fail them at once (lifecycle.go). */
static void notify_peer_failed(struct mpib_comm *c) { ctrl_send(c, "F", 1); }

/* One signalled RDMA write of a control structure on `via`; len bytes from local to the
 * peer's buffer at offset off. A full send queue (ENOMEM) is back-pressure, not a fault: the
 * write is posted again on a later progress call (ctrl_rdma_retry; bit `due`), and the control
 * socket carries its copy meanwhile. */
static ncclResult_t post_control(struct mpib_comm *c, int via, void *local, struct ibv_mr *mr, uint32_t len,
                                 uint64_t off, uint32_t due) {
  struct ibv_sge sge = {.addr = (uintptr_t)local, .length = len, .lkey = mr->lkey};
  struct ibv_send_wr wr = {.wr_id = mpib_wrid_special(c, via, MPIB_WR_CTRL),
                           .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = IBV_WR_RDMA_WRITE,
                           .send_flags = IBV_SEND_SIGNALED};
  if (len <= c->max_inline) wr.send_flags |= IBV_SEND_INLINE;
  int qi = mpib_qp_index(via, 0, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]); /* on the rail's first lane: mr's */
  wr.wr.rdma.remote_addr = c->rem_addr + off;
  wr.wr.rdma.rkey = c->rem_rkey[c->qps[qi].lane];
  int rc = mpib_qp_post(c, qi, &wr, 1);
  if (rc == ENOMEM) {
    c->ctrl_rdma_due |= due;
    return ncclSuccess;
  }
  if (rc) return mpib_failover_rail_fail(c, via, "completion-error", "posting a failover message failed");
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
  uint64_t *stage = mpib_notice_area(c, r);
  uint32_t gen, cmd;
  (void)mpib_notice_decode(*stage, &gen, &cmd);
  int via = (cmd == MPIB_NOTICE_FAIL || mpib_rail_usable(c, 1 - r)) ? 1 - r : r;
  /* No working rail to carry it (a RECOVER while the other rail is out too, a FAIL with no
   * rail left): the control socket alone does (ride-through). */
  if (!mpib_rail_usable(c, via) && c->ctrl_fd >= 0) return ncclSuccess;
  return post_control(c, via, stage, c->stage_mr[via], sizeof *stage, MPIB_SIZES_BYTES + (uint64_t)r * sizeof *stage,
                      ctrl_due_bit(CTRL_NOTICE, r));
}

static ncclResult_t post_notice(struct mpib_comm *c, int r, uint32_t cmd) {
  uint64_t *stage = mpib_notice_area(c, r);
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
  struct mpib_fence_rec *st = mpib_fence_area(c, r);
  if (!mpib_rail_usable(c, via)) {
    if (c->ctrl_fd >= 0) return ncclSuccess;
    return mpib_failover_rail_fail(c, via, "completion-error", "no rail left for the fence record");
  }
  return post_control(c, via, st, c->stage_mr[via], sizeof *st, MPIB_CTS_BYTES + (uint64_t)r * sizeof *st,
                      ctrl_due_bit(CTRL_RECORD, r));
}

static ncclResult_t post_record(struct mpib_comm *c, int r) {
  struct mpib_fence_rec *st = mpib_fence_area(c, r);
  st->check = mpib_fence_check(st);
  uint8_t msg[2 + sizeof *st] = {'R', (uint8_t)r};
  memcpy(msg + 2, st, sizeof *st);
  ctrl_send(c, msg, sizeof msg);
  return post_record_rdma(c, r);
}

static ncclResult_t post_confirm_rdma(struct mpib_comm *c, int r) {
  int via = 1 - r;
  struct mpib_confirm_rec *st = mpib_confirm_area(c, r);
  if (!mpib_rail_usable(c, via)) return ncclSuccess; /* the control socket's copy */
  return post_control(c, via, st, c->stage_mr[via], sizeof *st, MPIB_CONFIRM_OFFSET + (uint64_t)r * sizeof *st,
                      ctrl_due_bit(CTRL_CONFIRM, r));
}

static ncclResult_t post_confirm(struct mpib_comm *c, int r) {
  struct mpib_confirm_rec *st = mpib_confirm_area(c, r);
  uint8_t msg[2 + sizeof *st] = {'C', (uint8_t)r};
  memcpy(msg + 2, st, sizeof *st);
  ctrl_send(c, msg, sizeof msg);
  return post_confirm_rdma(c, r);
}

/* Posts again the control writes a full send queue refused, and what the control socket has
 * not taken yet. Runs on every tick; with nothing due it costs two loads. */
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

/* Receiver: every open slot's CTS from slot `from` on again, on the rail that took the CTS
 * over. A full send queue stops it; the rest goes out from where it stopped once the queue
 * drains (c->cts_repost_from), since a queue smaller than the FIFO never takes all at once.
 * Every MPIB_CTS_SIGNAL_EVERY-th write and the last are signalled, so the queue drains. */
static int repost_open_cts(struct mpib_comm *c, int rail, int from) {
  int last = -1, n = 0;
  c->cts_repost_due = 0;
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++)
    if (c->slot_reqs[slot][0]) last = slot;
  for (int slot = from; slot <= last; slot++) {
    struct mpib_request *req = c->slot_reqs[slot][0];
    if (req == NULL) continue;
    int signalled = slot == last || ++n % MPIB_CTS_SIGNAL_EVERY == 0;
    int rc = mpib_post_cts(c, slot, rail, req->nreqs, signalled);
    if (rc == ENOMEM) {
      c->cts_repost_due = 1;
      c->cts_repost_from = slot;
      return 0;
    }
    if (rc) return rc;
  }
  c->cts_repost_from = 0;
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

/* No rail of the connection works from now: its stall (and the stall's deadline) starts. */
static void stall_begin(struct mpib_comm *c) {
  if (!c->stall_since_ns) {
    c->stall_since_ns = mpib_now_ns();
    if (!c->stall_since_ns) c->stall_since_ns = 1;
  }
}

static ncclResult_t ride_through(struct mpib_comm *c, int r, const char *reason, const char *detail) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  int retrying = rc->state == MPIB_RAIL_RECOVERING || rc->state == MPIB_RAIL_PROBING;
  if (retrying) rc->attempts++;
  stall_begin(c);
  if (!retrying || rc->attempts <= 3)
    MPIB_WARN("failover: rail=%s side=%s decided_ms=%llu reason=%s continued_on=none gen=%u (%s): no rail works; "
              "requests stall up to MPIB_STALL_TIMEOUT_MS=%llu for one to come back",
              mpib_rail_name(r), c->is_send ? "send" : "recv", (unsigned long long)mpib_wall_ms(), reason, rc->gen,
              detail, (unsigned long long)mpib_g.stall_timeout_ms);
  return fence_rail(c, r, reason);
}

/* A rail came back (UP): a stalled connection resumes. */
static void stall_end(struct mpib_comm *c, int r) {
  if (!c->stall_since_ns) return;
  MPIB_WARN("ride-through: side=%s resumed on %s after %llu ms", c->is_send ? "send" : "recv", mpib_rail_name(r),
            (unsigned long long)((mpib_now_ns() - c->stall_since_ns) / 1000000ull));
  c->stall_since_ns = 0;
}

/* Rail r failed and no other rail can carry the connection (or MPIB_FAILOVER=0): it fails, and
 * the peer is told. */
static ncclResult_t no_rail_left(struct mpib_comm *c, int r, const char *reason, const char *detail) {
  if (!c->failure_reported)
    MPIB_WARN("failover: rail=%s side=%s decided_ms=%llu reason=%s continued_on=none gen=%u (%s): %s",
              mpib_rail_name(r), c->is_send ? "send" : "recv", (unsigned long long)mpib_wall_ms(), reason,
              c->rail[r].gen, detail, mpib_g.failover ? "no other rail can carry this connection" : "MPIB_FAILOVER=0");
  c->failure_reported = 1;
  notify_peer_failed(c);
  return ncclRemoteError;
}

/* Rail r is out of service already (fenced and settled, DOWN or DEAD; its rebuild thread may be
 * moving its QPs): nothing is fenced again, which would modify those QPs beside the thread and
 * announce a generation the rebuild's RECOVER then repeats. Without a usable rail the
 * connection stalls, or fails where it cannot ride through; the rail whose fault left none is
 * still UP, and its own detection fails it. */
static ncclResult_t rail_already_out(struct mpib_comm *c, int r, const char *reason, const char *detail) {
  int s = 1 - r;
  if (mpib_rail_usable(c, s)) return ncclSuccess;
  if (!ride_through_possible(c) || !(rail_can_return(c, r) || rail_can_return(c, s)))
    return no_rail_left(c, r, reason, detail);
  if (!c->stall_since_ns)
    MPIB_WARN("failover: rail=%s side=%s decided_ms=%llu reason=%s continued_on=none gen=%u (%s): out of service "
              "already, and no rail works; requests stall up to MPIB_STALL_TIMEOUT_MS=%llu for one to come back",
              mpib_rail_name(r), c->is_send ? "send" : "recv", (unsigned long long)mpib_wall_ms(), reason,
              c->rail[r].gen, detail, (unsigned long long)mpib_g.stall_timeout_ms);
  stall_begin(c);
  return ncclSuccess;
}

/* Takes rail r out of service for this connection. Without another usable rail (or with
 * MPIB_FAILOVER=0) the connection rides through (above) or fails, and the peer is told. */
ncclResult_t mpib_failover_rail_fail(struct mpib_comm *c, int r, const char *reason, const char *detail) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  int s = 1 - r;
  const char *side = c->is_send ? "send" : "recv";
  if (rc->state == MPIB_RAIL_DOWN || rc->state == MPIB_RAIL_DEAD) return rail_already_out(c, r, reason, detail);
  if (!mpib_rail_usable(c, s) && ride_through_possible(c) && (rail_can_return(c, r) || rail_can_return(c, s)))
    return ride_through(c, r, reason, detail);
  if (!mpib_g.failover || !mpib_rail_usable(c, s)) return no_rail_left(c, r, reason, detail);
  int retrying = rc->state == MPIB_RAIL_RECOVERING || rc->state == MPIB_RAIL_PROBING;
  if (retrying) rc->attempts++;
  if (!retrying || rc->attempts <= 3)
    MPIB_WARN("failover: rail=%s side=%s decided_ms=%llu reason=%s continued_on=%s gen=%u (%s)", mpib_rail_name(r),
              side, (unsigned long long)mpib_wall_ms(), reason, mpib_rail_name(s), rc->gen, detail);
  return fence_rail(c, r, reason);
}

/* Receiver: rail r is out of service: when it carried the CTS, every open slot's CTS is
 * written again on the other rail (writes still queued on r are lost with its QPs), or on the
 * first rail back when none works. */
static ncclResult_t recv_leave_cts_rail(struct mpib_comm *c, int r) {
  int s = 1 - r;
  if (c->cts_rail != r) return ncclSuccess;
  if (!mpib_rail_usable(c, s)) {
    c->cts_repost_due = 1;
    c->cts_repost_from = 0;
    return ncclSuccess;
  }
  c->cts_rail = s;
  int e = repost_open_cts(c, s, 0);
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
  if (!retrying) mpib_publish_rail_state(c, r);
  mpib_rail_to_error(c, r); /* lane by lane: a dead lane's QPs are left, the live lanes' stop */
  ncclResult_t res = c->is_send ? ncclSuccess : recv_leave_cts_rail(c, r);
  if (res != ncclSuccess) return res;
  if (c->is_send && strcmp(reason, "peer-fence") != 0) return post_notice(c, r, MPIB_NOTICE_FAIL);
  return ncclSuccess;
}

/* Rail r out of service: its lanes' completions thrown away before its QPs are reset (the fence
 * settled what they carried; mpib_lane_discard). */
static void discard_rail(struct mpib_comm *c, int r) {
  for (int l = 0; l < mpib_lane_count(c, r); l++) mpib_lane_discard(c, r, mpib_lane(r, l));
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
  int s = mpib_rail_usable(c, MPIB_RAIL_SOUT) ? MPIB_RAIL_SOUT : MPIB_RAIL_SUP;
  if (!mpib_rail_usable(c, s) && c->stall_since_ns) return ncclSuccess; /* riding through: the first rail back */
  for (int slot = 0; slot < MPIB_MAX_REQUESTS && c->replays_waiting > 0; slot++) {
    uint32_t ranges = c->slot_replay_wait[slot];
    if (ranges == 0) continue;
    if (!mpib_rail_usable(c, s)) return mpib_failover_rail_fail(c, s, "completion-error", "no rail left to replay on");
    if (c->slot_replay_on[slot][s]) continue; /* never two replay chains of a slot on one rail (cannot happen) */
    struct mpib_request **reqs = c->slot_reqs[slot];
    struct mpib_slot_plan p = {.mask = 1u << s, .leader = s, .size_in_imm = 0};
    for (int r = 0; r < c->slot_matched[slot]; r++) p.sout[r] = c->slot_sout[slot][r];
    p.imm = mpib_imm_encode_replay((uint32_t)slot, ranges, c->slot_full[slot], reqs[0]->seq);
    int rc = mpib_post_chain(c, slot, s, &p, ranges, 1);
    if (rc == ENOMEM) return ncclSuccess; /* the send queue is full: the rest on a later call */
    if (rc == MPIB_POST_PARTIAL) {        /* carried by s now, in part: s's fence settles it */
      c->slot_replay_wait[slot] = 0;
      c->replays_waiting--;
      return mpib_failover_rail_fail(c, s, "completion-error", "its send queue took part of a replay");
    }
    if (rc) return mpib_failover_rail_fail(c, s, "completion-error", "posting a replay failed");
    for (int range = 0; range < MPIB_NRAILS; range++)
      if ((ranges & (1u << range)) && mpib_tele_on(c)) mpib_tele_post(c, slot, s, range, mpib_completion_now(c));
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
    if (!(lost & (1u << range)) || !mpib_tele_on(c)) continue;
    /* lost on r */
    if (need & (1u << range)) mpib_tele_leave(c, r, c->slot_rail_bytes[slot][range], mpib_completion_now(c));
    else mpib_tele_complete(c, slot, r, range, mpib_completion_now(c)); /* the receiver has them: delivered by r */
  }
  if (need) {
    if (c->slot_replay_wait[slot] == 0) c->replays_waiting++;
    c->slot_replay_wait[slot] |= (uint8_t)need;
    return 1;
  }
  mpib_slot_try_complete(c, slot);
  return 0;
}

/* Sender: stages the confirm record of rail r for the receiver's record `rec`: the ranges its
 * open receives, and those posted after the record, lack whose carrier on r was acknowledged
 * (mpib_confirm_ranges). A slot the record shows open cannot have been reused here: its next
 * CTS comes only after that receive completes. Returns how many slots it names. */
static int confirm_build(struct mpib_comm *c, int r, const struct mpib_fence_rec *rec, struct mpib_confirm_rec *st) {
  int n = 0;
  memset(st, 0, sizeof *st);
  st->gen = rec->fence_gen;
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++) {
    uint64_t w = __atomic_load_n(&c->slot_ack[slot][r], __ATOMIC_ACQUIRE),
             seq1 = mpib_ack_seq1_near(w, rec->next_seq + 1);
    uint32_t ranges =
        seq1 ? mpib_confirm_ranges(rec->open_seq1[slot], rec->have[slot], rec->next_seq, seq1 - 1, mpib_ack_ranges(w))
             : 0;
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

/* The control plane's answer to a FAIL for an idle receiver (mpib_failover.h): a fence record with no
 * receive open and next_seq where the next one will be. A receive NCCL posts meanwhile is one
 * "posted after the report" (mpib_replay_ranges): whatever the failed rail carried of it is
 * replayed. The data path fences its end and answers too when it next runs; the sender takes
 * the first answer of the generation. */
void mpib_comm_answer_notice(struct mpib_comm *c, int rail, uint64_t word) {
  uint32_t gen, cmd;
  if (c->is_send || rail < 0 || rail >= MPIB_NRAILS || mpib_notice_decode(word, &gen, &cmd) != 0 ||
      cmd != MPIB_NOTICE_FAIL)
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

/* The control plane's answer to a fence record (mpib_failover.h): the confirm, over the control
 * socket. Only while the rail is still in the record's generation: once the data path rebuilt it
 * (it answered the record before that), the rail's acknowledgements are of writes the record
 * never covered. The generation is read again after the confirm is built: a rebuild in between
 * may have carried new writes. Built and queued under the socket's lock: the receiver keeps the
 * last confirm the socket brings, and one the data path queues after this one was built after
 * it, from at least the same acknowledgements. */
void mpib_comm_answer_record(struct mpib_comm *c, int rail, const void *rec_bytes) {
  struct mpib_fence_rec rec;
  struct mpib_confirm_rec st;
  if (!c->is_send || rail < 0 || rail >= MPIB_NRAILS || c->ctrl_fd < 0) return;
  memcpy(&rec, rec_bytes, sizeof rec);
  if (rec.fence_gen == 0 || rec.check != mpib_fence_check(&rec)) return;
  if (rec.fence_gen != __atomic_load_n(&c->rail[rail].gen, __ATOMIC_ACQUIRE)) return;
  pthread_mutex_lock(&c->ctrl_mu);
  int queued =
      confirm_build(c, rail, &rec, &st) > 0 && rec.fence_gen == __atomic_load_n(&c->rail[rail].gen, __ATOMIC_ACQUIRE);
  if (queued) {
    uint8_t msg[2 + sizeof st] = {'C', (uint8_t)rail};
    memcpy(msg + 2, &st, sizeof st);
    (void)ctrl_queue_locked(c, msg, sizeof msg);
  }
  pthread_mutex_unlock(&c->ctrl_mu);
  if (queued) ctrl_wait_sent(c);
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
  rc->state = mpib_rail_fatal(c, r) ? MPIB_RAIL_DEAD : MPIB_RAIL_DOWN;
  if (rc->state == MPIB_RAIL_DEAD) mpib_publish_rail_state(c, r);
  c->pending[r] = 0;
  rc->since_ns = now;
  rc->retry_at_ns = next_retry_ns(c, rc, now);
  int confirmed = confirm_build(c, r, rec, mpib_confirm_area(c, r));
  MPIB_INFO("failover: rail=%s side=send gen=%u resolved: %d slot(s) replayed, %d already delivered, %d confirmed",
            mpib_rail_name(r), rc->gen, replays, settled, confirmed);
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
  volatile struct mpib_fence_rec *in = mpib_fence_area(c, r), *tcp = &c->tcp_rec[r];
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
  MPIB_INFO("%s rail: generation %u: %s%s; next attempt in %llu ms", mpib_rail_name(r), rc->gen, why, detail,
            (unsigned long long)((rc->retry_at_ns - now) / 1000000ull));
  return ncclSuccess;
}

/* Sender: rail r never comes back for this connection (a device under it died, here or at the
 * receiver): it stays out of service, with no more recovery attempts. */
static ncclResult_t rail_dead(struct mpib_comm *c, int r, const char *why) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  rc->state = MPIB_RAIL_DEAD;
  mpib_publish_rail_state(c, r);
  MPIB_WARN("failover: rail=%s side=%s gen=%u is dead for this connection: %s; no more recovery attempts",
            mpib_rail_name(r), c->is_send ? "send" : "recv", rc->gen, why);
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
  discard_rail(c, r); /* stale completions of the failed generation */
  mpib_sq_reset_rail(c, r);
  __atomic_store_n(&rc->gen, rc->gen + 1, __ATOMIC_RELEASE); /* mpib_comm_answer_record reads it */
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
    struct ibv_send_wr wr = {.wr_id = mpib_wrid_special(c, r, MPIB_WR_PROBE),
                             .num_sge = 0,
                             .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED};
    int qi = mpib_qp_index(r, i, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]); /* every QP of the rail once */
    wr.wr.rdma.remote_addr = c->rem_addr;
    wr.wr.rdma.rkey = c->rem_rkey[c->qps[qi].lane];
    if (mpib_qp_post(c, qi, &wr, 1)) return mpib_failover_rail_fail(c, r, "probe-failed", "posting a probe failed");
    rc->probes++;
    c->pending[r]++;
  }
  return ncclSuccess;
}

ncclResult_t mpib_failover_probe_done(struct mpib_comm *c, int r) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  if (rc->state != MPIB_RAIL_PROBING || --rc->probes > 0) return ncclSuccess;
  rc->state = MPIB_RAIL_UP;
  mpib_publish_rail_state(c, r);
  if (rc->joining) /* a standby rail's first time in service is no recovery */
    MPIB_INFO("standby: rail=%s side=send joined_ms=%llu gen=%u after %llu ms (after %u failed attempt(s))",
              mpib_rail_name(r), (unsigned long long)mpib_wall_ms(), rc->gen,
              (unsigned long long)((mpib_now_ns() - rc->joining) / 1000000ull), rc->attempts);
  else
    MPIB_WARN("recovery: rail=%s side=send restored_ms=%llu gen=%u (after %u failed attempt(s))", mpib_rail_name(r),
              (unsigned long long)mpib_wall_ms(), rc->gen, rc->attempts);
  rc->joining = 0;
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
                "requests it carried wait for the answer",
                mpib_rail_name(r), (unsigned long long)((now - rc->since_ns) / 1000000ull));
    }
    return ncclSuccess;
  case MPIB_RAIL_DOWN: {
    int e;
    if (rc->rebuild.running) return mpib_rail_rebuild_poll(c, r, &e) ? send_rebuilt(c, r, e, now) : ncclSuccess;
    if (rc->join_wait) { /* a standby rail: tried once it joined */
      if (!mpib_join_take(c, r)) return ncclSuccess;
      rc->joining = now;
    }
    uint64_t port_back = 0;
    for (int l = 0; l < mpib_lane_count(c, r); l++) { /* the latest change of any of its ports */
      uint64_t t = __atomic_load_n(&c->nic[mpib_lane(r, l)]->port_change_ns, __ATOMIC_RELAXED);
      if (t > port_back) port_back = t;
    }
    int due = now >= rc->retry_at_ns || port_back > rc->since_ns;
    /* Without a working other rail only when the control socket can carry the handshake. */
    if (due && !mpib_rail_port_down(c, r) && !mpib_rail_fatal(c, r) && (mpib_rail_usable(c, 1 - r) || c->ctrl_fd >= 0))
      return send_recover(c, r, now);
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
    if (now - rc->since_ns > timeout)
      return mpib_failover_rail_fail(c, r, "probe-failed", "the probes never completed");
    return ncclSuccess;
  default: return ncclSuccess;
  }
}

/* Receiver: rail r fenced a moment ago; once what was already in flight has landed, report
 * what it has to the sender. */
static ncclResult_t recv_fence_settle(struct mpib_comm *c, int r, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  /* With no receive open nothing in flight can matter: answer now, from the call that completed
   * the last one (NCCL may not call this comm again for a while). */
  if (now - rc->since_ns < MPIB_FENCE_SETTLE_NS && c->recvs_open > 0) return ncclSuccess;
  struct mpib_fence_rec *st = mpib_fence_area(c, r);
  st->fence_gen = rc->gen;
  st->refused_gen = 0; /* set only in a refusal's record: the others check as without the field */
  st->refused_dead = 0;
  st->next_seq = c->fifo_head;
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++) {
    struct mpib_request *req = c->slot_reqs[slot][0];
    st->open_seq1[slot] = req ? req->seq + 1 : 0;
    st->have[slot] = req ? (uint8_t)req->have_mask : 0;
  }
  rc->state = mpib_rail_fatal(c, r) ? MPIB_RAIL_DEAD : MPIB_RAIL_DOWN;
  if (rc->state == MPIB_RAIL_DEAD) mpib_publish_rail_state(c, r);
  c->pending[r] = 0;
  return post_record(c, r);
}

/* Receiver: refuses the sender's attempt to bring rail r back as generation gen: it retries
 * after its back-off, or, when this side's device under the rail died, never again. */
static ncclResult_t recv_refuse(struct mpib_comm *c, int r, uint32_t gen, int dead, const char *why) {
  MPIB_INFO("%s rail: refusing its recovery as generation %u: %s", mpib_rail_name(r), gen, why);
  mpib_fence_area(c, r)->refused_gen = gen;
  mpib_fence_area(c, r)->refused_dead = (uint8_t)dead;
  return mpib_rail_usable(c, 1 - r) || c->ctrl_fd >= 0 ? post_record(c, r) : ncclSuccess; /* else: its timeout */
}

/* Receiver: rail r's QPs were rebuilt (e == 0) as generation rc->gen: refill its receives and
 * tell the sender. A failure is told too: the sender retries after its back-off (without the
 * answer it would wait MPIB_FAILOVER_TIMEOUT_MS, as when the loss that failed the rail also
 * lost the ARP reply this side's RTR waited for). */
static ncclResult_t recv_rebuilt(struct mpib_comm *c, int r, int e, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  if (mpib_rail_fatal(c, r)) return recv_refuse(c, r, rc->gen, 1, "its device died");
  if (rc->state != MPIB_RAIL_DOWN) return ncclSuccess;
  if (e) return recv_refuse(c, r, rc->gen, 0, strerror(-e));
  if (c->srq[r] && mpib_srq_refill_rail(c, r)) return recv_refuse(c, r, rc->gen, 0, "posting its receives failed");
  rc->state = MPIB_RAIL_RECOVERING;
  rc->since_ns = now;
  mpib_fence_area(c, r)->ready_gen = rc->gen;
  mpib_fence_area(c, r)->refused_gen = 0;
  mpib_fence_area(c, r)->refused_dead = 0;
  return post_record(c, r);
}

/* Receiver: the open slots' CTS still to write. On the CTS rail once it works (a repost a full
 * queue cut short, or one held back while no rail worked); or on the other rail when that one
 * works first while the CTS rail is out of service (its QPs reset or in error: nothing it
 * queued can land after a newer CTS), which also ends the stall. */
static ncclResult_t recv_repost_due(struct mpib_comm *c) {
  int r = c->cts_rail;
  if (!mpib_rail_usable(c, r) && c->rail[r].state != MPIB_RAIL_UP && mpib_rail_usable(c, 1 - r)) {
    r = c->cts_rail = 1 - r;
    c->cts_repost_from = 0;
    stall_end(c, r);
  }
  if (!mpib_rail_usable(c, r)) return ncclSuccess;
  int e = repost_open_cts(c, r, c->cts_repost_from);
  if (e) return comm_failed(c, "reposting the CTS failed: ", strerror(e));
  return ncclSuccess;
}

/* Receiver: the sender rebuilt rail r as generation gen; do the same, off this thread like the
 * sender (mpib_failover_tick polls the rebuild), and say so. */
static ncclResult_t recv_recover(struct mpib_comm *c, int r, uint32_t gen, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  if (mpib_rail_fatal(c, r)) return recv_refuse(c, r, gen, 1, "its device died");
  if (!mpib_join_take(c, r)) return recv_refuse(c, r, gen, 0, "the sender's QPs of this standby rail have not arrived");
  if (rc->state == MPIB_RAIL_UP) { /* the sender rebuilds a rail this side never saw fail (its end */
    rc->state = MPIB_RAIL_DOWN;    /* never came up at connect): what is queued on it dies with the reset */
    if (!mpib_rail_usable(c, 1 - r)) stall_begin(c); /* as the sender's: its deadline, and its end when r is back */
    ncclResult_t res = recv_leave_cts_rail(c, r);
    if (res != ncclSuccess) return res;
  }
  rc->state = MPIB_RAIL_DOWN; /* completions of the old generation are thrown away */
  discard_rail(c, r);
  c->pending[r] = 0;     /* the reset discards what is still queued: counted, it would keep the rail */
  rc->keepalive_out = 0; /* busy and its idle keepalives off for good (as fence_rail clears them) */
  mpib_sq_reset_rail(c, r);
  rc->gen = gen;
  if (mpib_rail_rebuild_start(c, r, mpib_gen_psn(gen)) == 0) return ncclSuccess;
  return recv_rebuilt(c, r, mpib_rail_reconnect(c, r, mpib_gen_psn(gen)), now); /* no thread: here */
}

static ncclResult_t recv_notice(struct mpib_comm *c, int r, uint64_t word, uint64_t now) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  uint32_t gen, cmd;
  if (mpib_notice_decode(word, &gen, &cmd) != 0) {
    MPIB_WARN("%s rail: ignoring a malformed failover notice 0x%llx from the peer", mpib_rail_name(r),
              (unsigned long long)word);
    return ncclSuccess;
  }
  int live = rc->state == MPIB_RAIL_UP || rc->state == MPIB_RAIL_RECOVERING;
  /* A FAIL of a newer generation than this side's: its RECOVER was superseded before it was
   * read (notices keep only the newest), so this side never rebuilt for it. The sender waits
   * for a record naming that generation: adopt it and answer. */
  if (cmd == MPIB_NOTICE_FAIL && gen > rc->gen) rc->gen = gen;
  if (cmd == MPIB_NOTICE_FAIL && gen == rc->gen && live)
    return mpib_failover_rail_fail(c, r, "peer-notice", "the sender failed it");
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
    mpib_publish_rail_state(c, r);
    /* The CTS stays on the rail that took it over: moving it back would let a CTS still queued
     * there (retransmitted after a stall) land after a newer CTS of the same FIFO slot sent on
     * this rail and overwrite it (the sender then waits forever), and a CTS still queued there
     * when that rail fails later would be flushed and never reposted (only the CTS rail's
     * failure reposts the open slots). Found by plugin/ctest/replay_model_test.c. A CTS write
     * is a few dozen bytes: which rail carries it costs nothing. */
    MPIB_INFO("%s rail: back in service (generation %u)", mpib_rail_name(r), gen);
    stall_end(c, r);
    if (c->cts_repost_due) { /* the CTS of every open slot, lost with the rails, on the first one back */
      c->cts_repost_due = 0;
      c->cts_rail = r;
      int e = repost_open_cts(c, r, 0);
      if (e) return comm_failed(c, "reposting the CTS on the returning rail failed: ", strerror(e));
    }
  }
  return ncclSuccess;
}

/* Receiver: the sender's confirm record of rail r (the RDMA copy or the control socket's),
 * when it is complete and not the last one applied from that copy; 1 then, and *copy says
 * which. Applying one is idempotent: a confirm names a receive by its sequence number, and
 * ranges already arrived arrive again harmlessly (both the data path and the control plane may
 * send one). */
static int read_confirm(struct mpib_comm *c, int r, struct mpib_confirm_rec *out, int *copy) {
  volatile struct mpib_confirm_rec *in[2] = {mpib_confirm_area(c, r), &c->tcp_confirm[r]};
  for (int k = 0; k < 2; k++) {
    if (in[k]->check == c->confirm_seen[r][k] || in[k]->gen == 0) continue;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    memcpy(out, (const void *)in[k], sizeof *out);
    if (out->check == mpib_confirm_check(out) && out->check != c->confirm_seen[r][k]) {
      *copy = k;
      return 1;
    }
  }
  return 0;
}

/* Receiver: the ranges the sender's confirm names arrived (their carrier on the fenced rail r
 * was acknowledged, but this side never polled the completion): counted as a replay of them
 * would be. Only once this side's own fence of r has settled (its record written, r's
 * completions dropped from then on): a confirm can come first (the control plane answered the
 * sender's FAIL for an idle receiver), and a completion of r polled after it would bring the
 * same range a second time. */
static ncclResult_t recv_confirm(struct mpib_comm *c, int r) {
  struct mpib_confirm_rec rec;
  if (c->rail[r].state == MPIB_RAIL_UP || c->rail[r].state == MPIB_RAIL_FENCING) return ncclSuccess;
  int copy;
  if (!read_confirm(c, r, &rec, &copy)) return ncclSuccess;
  c->confirm_seen[r][copy] = rec.check;
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++) {
    struct mpib_request *req = c->slot_reqs[slot][0];
    if (!rec.seq1[slot] || req == NULL || req->seq + 1 != rec.seq1[slot]) continue;
    int complete = mpib_recv_ranges_arrived(&req->expected_mask, &req->have_mask, rec.full[slot], rec.ranges[slot], 1);
    if (complete < 0) {
      MPIB_WARN(
          "%s rail: the sender confirmed ranges %u of slot %d (full %u) that its receive cannot have (expects %u)",
          mpib_rail_name(r), rec.ranges[slot], slot, rec.full[slot], req->expected_mask);
      return ncclRemoteError;
    }
    int qi = mpib_chain_qp(c, r, req->seq); /* the confirmed ranges' carrier on r: its lane placed them */
    req->wrote_lanes |= 1u << (qi >= 0 ? c->qps[qi].lane : r);
    MPIB_INFO("%s rail: slot %d: ranges %u confirmed by the sender (their completion was lost with the rail)",
              mpib_rail_name(r), slot, rec.ranges[slot]);
    if (complete) {
      ncclResult_t res = mpib_recv_finish(c, r, (uint32_t)slot, req, rec.imm_size[slot]);
      if (res != ncclSuccess) return res;
    }
  }
  return ncclSuccess;
}

/* Runs on every progress call, every 16th on a quiet sender (mpib_failover_quiet, progress in
 * mpib_p2p.c). With every rail UP it checks a load or two per rail: the port state, and the
 * peer's record (sender) or notice and confirm (receiver) words. */
ncclResult_t mpib_failover_tick(struct mpib_comm *c) {
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
      uint64_t word = __atomic_load_n(mpib_notice_area(c, r), __ATOMIC_ACQUIRE);
      uint64_t tcp = __atomic_load_n(&c->tcp_notice[r], __ATOMIC_ACQUIRE);
      if (mpib_notice_order(tcp) > mpib_notice_order(word)) word = tcp;
      if (res == ncclSuccess && word != rc->notice_seen &&
          mpib_notice_order(word) > mpib_notice_order(rc->notice_seen)) {
        rc->notice_seen = word;
        res = recv_notice(c, r, word, mpib_now_ns());
      }
    } else if (rc->state == MPIB_RAIL_UP || rc->state == MPIB_RAIL_PROBING) {
      struct mpib_fence_rec rec;
      if (read_record(c, r, REC_FENCE, &rec) &&
          (res = mpib_failover_rail_fail(c, r, "peer-fence", "the receiver fenced it")) == ncclSuccess)
        res = send_resolve(c, r, &rec);
    }
    if (res == ncclSuccess && rc->state == MPIB_RAIL_UP && mpib_rail_port_down(c, r))
      res = mpib_failover_rail_fail(c, r, "port-down", mpib_rail_fault_nic(c, r));
    if (res == ncclSuccess && rc->state != MPIB_RAIL_UP && rc->state != MPIB_RAIL_DEAD) {
      uint64_t now = mpib_now_ns();
      res = c->is_send                       ? send_rail_tick(c, r, now)
            : rc->state == MPIB_RAIL_FENCING ? recv_fence_settle(c, r, now)
                                             : ncclSuccess;
    }
    if (res != ncclSuccess) return res;
  }
  if (__atomic_load_n(&c->ctrl_out_n, __ATOMIC_RELAXED) || c->ctrl_rdma_due) {
    ncclResult_t res = ctrl_retry(c);
    if (res != ncclSuccess) return res;
  }
  if (c->cts_repost_due && !c->is_send) {
    ncclResult_t res = recv_repost_due(c);
    if (res != ncclSuccess) return res;
  }
  return c->replays_waiting > 0 ? post_replays(c) : ncclSuccess;
}

/* ---- Completions ---- */

ncclResult_t mpib_failover_completion_error(struct mpib_comm *c, int rail, const struct ibv_wc *wc) {
  int st = c->rail[rail].state;
  /* the rest of its queue */
  if (st == MPIB_RAIL_FENCING || st == MPIB_RAIL_DOWN || st == MPIB_RAIL_DEAD) return ncclSuccess;
  char detail[160];
  snprintf(detail, sizeof detail, "%s, status %d, vendor error %u, QP %u", ibv_wc_status_str(wc->status), wc->status,
           wc->vendor_err, wc->qp_num);
  return mpib_failover_rail_fail(c, rail, st == MPIB_RAIL_PROBING ? "probe-failed" : "completion-error", detail);
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
    struct ibv_send_wr wr = {.wr_id = mpib_wrid_special(c, r, MPIB_WR_KEEPALIVE),
                             .num_sge = 0,
                             .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED};
    int qi = mpib_qp_index(r, (uint64_t)i, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP]);
    wr.wr.rdma.remote_addr = c->rem_addr;
    wr.wr.rdma.rkey = c->rem_rkey[c->qps[qi].lane];
    int rc = mpib_qp_post(c, qi, &wr, 1);
    if (rc == ENOMEM) continue; /* a full send queue: the rail is busy, its own traffic checks it */
    if (rc) return mpib_failover_rail_fail(c, r, "completion-error", "posting a keepalive failed");
    c->rail[r].keepalive_out++;
    c->pending[r]++;
  }
  return ncclSuccess;
}

static int keepalive_possible(const struct mpib_comm *c, int r) {
  return c->nqps[r] && c->rail[r].state == MPIB_RAIL_UP && !c->rail[r].keepalive_out && !mpib_rail_fatal(c, r);
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

ncclResult_t mpib_failover_keepalive_tick(struct mpib_comm *c) {
  uint64_t now = mpib_now_ns();
  if (c->progress_count != c->progress_seen || c->idle_since_ns == 0) {
    c->progress_seen = c->progress_count;
    c->idle_since_ns = now;
    return probe_idle_rails(c, now);
  }
  /* Idle for 256 polls: what is left of the telemetry batch is published now, not at the next
   * message (the agent would see the last completions late and the bytes in flight stuck). */
  if (mpib_tele_on(c) && (c->tele_slots || c->tele_done)) mpib_telemetry_flush(c);
  if (now - c->idle_since_ns < MPIB_KEEPALIVE_NS || (!c->is_send && c->recvs_open == 0)) return ncclSuccess;
  c->idle_since_ns = now;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (!keepalive_possible(c, r)) continue;
    ncclResult_t res = post_keepalive(c, r);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}
