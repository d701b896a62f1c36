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
