/*
 * The no-progress watch: finds a dead path by the acknowledgements that stop coming back and
 * fails its rail over (mpib_failover_rail_fail). Called by the message path (mpib_p2p.c's
 * progress, every 16th call, after the completion queues were polled); reads and writes the
 * shared path words (mpib_progress.h) through the comm's pointers. Pure C, no Go calls; time is mpib_now_ns.
 *
 * A dead path is found by what stops coming back, not by the RC transport's give-up: a rail
 * with signalled writes outstanding (data, CTS, keepalives, probes) fails over once neither
 * this comm nor any other comm of the process on the same path (local NIC, peer GID) has had
 * an acknowledgement for MPIB_DETECT_MS. Under congestion acknowledgements come late but keep
 * coming on the path, so nothing fails; the RC budget (MPIB_IB_TIMEOUT, net_ib's 4.3 s a try)
 * is long enough that a deep queue draws no retransmissions, and is the backstop for a path
 * the watch cannot judge. The limit widens to four times the longest recent wait for an
 * acknowledgement on the rail (a slow path that delivers), decaying by an eighth per
 * acknowledgement; each verdict widens the rail's next one fourfold too, so a path slower than
 * the limit (a message that takes longer than it to cross) costs a failover or two, never a
 * failover every 600 ms that replays the same messages forever.
 */
#include <stdarg.h>
#include <stdio.h>

#include "mpib_clock.h"
#include "mpib_failover.h"
#include "mpib_watch.h"

#define MPIB_WATCH_WIDEN 4u
/* Time the watch did not see does not count: ticks further apart than this (NCCL stopped
 * testing the comm, or the process or its host was not scheduled, which stalls the local NIC
 * driver's acknowledgements too under soft-RoCE) start every rail's wait afresh. NCCL's proxy
 * tests a comm with work in flight thousands of times a second; a comm tested less often than
 * this is left to the RC budget. */
#define MPIB_WATCH_GAP_NS (100ull * 1000000ull)

static void watch_progress(struct mpib_rail_ctl *rc, uint64_t *path, int waited, uint64_t now) {
  if (waited && rc->progress_ns && now > rc->progress_ns) {
    uint64_t wait = now - rc->progress_ns, decayed = rc->slow_ns - rc->slow_ns / 8;
    rc->slow_ns = wait > decayed ? wait : decayed;
  }
  rc->acks_seen = rc->acks;
  rc->progress_ns = now;
  if (path) __atomic_store_n(path, now, __ATOMIC_RELAXED);
}

ncclResult_t mpib_watch_tick(struct mpib_comm *c) {
  if (!mpib_g.detect_ms) return ncclSuccess;
  uint64_t now = mpib_now_ns();
  int unwatched = c->watch_tick_ns && now - c->watch_tick_ns > MPIB_WATCH_GAP_NS;
  c->watch_tick_ns = now;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    struct mpib_rail_ctl *rc = &c->rail[r];
    if (!c->nqps[r]) continue;
    int busy =
        (rc->state == MPIB_RAIL_UP || rc->state == MPIB_RAIL_PROBING) && c->pending[r] > 0 && !mpib_rail_fatal(c, r);
    if (rc->acks != rc->acks_seen) {
      watch_progress(rc, c->path_ack_ns[r], busy && rc->watch_busy, now);
      rc->watch_busy = busy;
      continue;
    }
    if (!busy || !rc->watch_busy || unwatched) { /* a wait starts when a tick first sees the work */
      rc->watch_busy = busy;
      rc->progress_ns = now;
      continue;
    }
    uint64_t last = rc->progress_ns;
    uint64_t path = c->path_ack_ns[r] ? __atomic_load_n(c->path_ack_ns[r], __ATOMIC_RELAXED) : 0;
    if (path > last) last = path;
    /* Another comm on the path (another NCCL communicator's proxy thread) may have stored an
     * acknowledgement after this tick read the clock: progress just now, not a wait. */
    if (last >= now) continue;
    uint64_t limit = mpib_g.detect_ms * 1000000ull, widened = MPIB_WATCH_WIDEN * rc->slow_ns;
    if (widened > limit) limit = widened;
    if (now - last <= limit) continue;
    char detail[160];
    snprintf(detail, sizeof detail, "no acknowledgement on its path for %llu ms with %u signalled writes outstanding",
             (unsigned long long)((now - last) / 1000000ull), c->pending[r]);
    rc->progress_ns = now;
    rc->slow_ns = limit; /* the next verdict on this rail waits four times longer (a path too slow for the limit) */
    ncclResult_t res =
        mpib_failover_rail_fail(c, r, rc->state == MPIB_RAIL_PROBING ? "probe-failed" : "no-progress", detail);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

/* ---- The stuck report ----
 * A comm NCCL keeps calling that completes nothing for MPIB_STUCK_REPORT_NS says once, with a
 * warning, what it is waiting for: the next request and its CTS, the slots in flight, each
 * rail's state and queues. A peer that is busy elsewhere (a rank still computing) legitimately
 * leaves a comm waiting that long; a hang leaves the line that explains it. net_ib logs
 * nothing while it waits. */
#define MPIB_STUCK_REPORT_NS (10ull * 1000000000ull)

struct text {
  char *buf;
  size_t cap, len;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...) {
  if (t->len >= t->cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
  va_end(ap);
  if (n > 0) t->len = t->len + (size_t)n < t->cap ? t->len + (size_t)n : t->cap;
}

static void put_rails(struct text *t, const struct mpib_comm *c) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (!c->nqps[r]) continue;
    uint32_t used = 0; /* every QP of the rail once */
    for (uint32_t i = 0; i < c->nqps[r]; i++)
      used += c->sq_used[mpib_qp_index(r, i, c->nqps[MPIB_RAIL_SOUT], c->nqps[MPIB_RAIL_SUP])];
    const struct mpib_rail_ctl *rc = &c->rail[r];
    put(t, "; %s %s gen %u: %u signalled pending, send queues %u/%u used, %d keepalive(s), %llu acks",
        mpib_rail_name(r), mpib_rail_state_name(rc->state), rc->gen, c->pending[r], used, c->nqps[r] * c->sq_depth,
        rc->keepalive_out, (unsigned long long)rc->acks);
  }
  put(t, "; control: %u bytes unsent, RDMA copies due 0x%x%s%s", c->ctrl_out_n, c->ctrl_rdma_due,
      c->stall_since_ns ? ", riding through (no rail works)" : "",
      __atomic_load_n(&c->peer_gone_ns, __ATOMIC_ACQUIRE) ? ", the peer closed the connection" : "");
}

static void put_send(struct text *t, const struct mpib_comm *c) {
  int slot = (int)(c->fifo_head % MPIB_MAX_REQUESTS);
  uint64_t landed = ((volatile struct mpib_cts *)c->cts[slot])[0].seq;
  put(t, "next request seq %llu (slot %d): its CTS %s, %d of its requests matched", (unsigned long long)c->fifo_head,
      slot, landed == c->fifo_head + 1 ? "landed" : "has not landed", c->slot_matched[slot]);
  put(t, "; in flight:");
  for (int s = 0; s < MPIB_MAX_REQUESTS; s++) {
    if (!c->slot_posted_seq1[s]) continue;
    put(t, " seq %llu (originals 0x%x, replays on SOUT/SUP 0x%x/0x%x, waiting 0x%x)",
        (unsigned long long)(c->slot_posted_seq1[s] - 1), c->slot_rails[s], c->slot_replay_on[s][MPIB_RAIL_SOUT],
        c->slot_replay_on[s][MPIB_RAIL_SUP], c->slot_replay_wait[s]);
  }
  put(t, "; %d slot(s) wait for a replay", c->replays_waiting);
}

static void put_recv(struct text *t, const struct mpib_comm *c) {
  put(t, "next receive seq %llu, %d open:", (unsigned long long)c->fifo_head, c->recvs_open);
  for (int s = 0; s < MPIB_MAX_REQUESTS; s++) {
    const struct mpib_request *req = c->slot_reqs[s][0];
    if (req)
      put(t, " seq %llu (ranges 0x%x of 0x%x)", (unsigned long long)req->seq, req->have_mask, req->expected_mask);
  }
  put(t, "; CTS on %s%s", mpib_rail_name(c->cts_rail), c->cts_repost_due ? " (a repost is due)" : "");
}

void mpib_watch_stuck_tick(struct mpib_comm *c) {
  uint64_t now = mpib_now_ns();
  if (c->progress_count != c->stuck_seen || c->stuck_since_ns == 0) {
    c->stuck_seen = c->progress_count;
    c->stuck_since_ns = now;
    c->stuck_reported = 0;
    return;
  }
  if (c->stuck_reported || now - c->stuck_since_ns < MPIB_STUCK_REPORT_NS) return;
  c->stuck_reported = 1;
  char buf[2048];
  struct text t = {.buf = buf, .cap = sizeof buf};
  if (c->is_send) put_send(&t, c);
  else put_recv(&t, c);
  put_rails(&t, c);
  MPIB_WARN("%s comm: nothing completed for %llu s while NCCL kept calling it (logged once per wait): %s",
            c->is_send ? "send" : "recv", (unsigned long long)((now - c->stuck_since_ns) / 1000000000ull), buf);
}
