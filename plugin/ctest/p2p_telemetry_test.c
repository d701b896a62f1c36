//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_shm_*.c shm_agent.c shm_decode.c

/* The send path's agent telemetry (mpib_p2p.c, docs/shm-format.md 4.3) on fake verbs: the
 * data path runs unchanged against a queue pair whose post_send records the signalled writes
 * and a completion queue that returns them, on a fake clock. Checks what the segment shows:
 *   - nothing per message: a batch is published after 16 slots (or 1 MiB), or at close;
 *   - per rail posted and completed bytes and requests, busy time = completion - post time,
 *     bytes in flight, the split applied after the topology guard, the wall-clock stamp;
 *   - the clock reads: one per posted slot, one per progress call that completes sends;
 *   - a failover (docs/failover.md): a slot the receiver already has counts as completed on
 *     the failed rail, a replayed one as posted and completed on the rail that carried it;
 *   - the recovery after it (not telemetry; the same harness): a receiver that could not
 *     rebuild says so and the sender retries after its back-off, not its failover timeout;
 *   - test() on a request an earlier call completed returns it without polling (the same
 *     harness), one still open polls.
 * No RDMA device is needed (ibv_post_send and ibv_poll_cq call through the context's ops). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../mpib.h"
#include "../mpib_p2p.h"
#include "../mpib_profiler.h"
#include "../mpib_slots.h"
#include "shm_agent.h"
#include "shm_decode.h"

#include "check.h"

/* ---- what mpib_p2p.c needs from the rest of the plugin ---- */

struct mpib_global mpib_g;
ncclProfilerCallback_t mpib_prof_fn;
static uint64_t fake_now = 1000000000ull;
static int clock_reads;

uint64_t mpib_now_ns(void) {
  clock_reads++;
  return fake_now;
}
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line, (void)fmt;
}
#include "p2p_stubs.h"

/* ---- fake verbs: one QP and one CQ per rail ---- */

static struct ibv_context ctx;
static struct ibv_qp qp[MPIB_NRAILS];
static struct ibv_cq cq[MPIB_NRAILS];
static struct ibv_mr mr;
static uint64_t done_q[MPIB_NRAILS][256]; /* wr_ids of signalled writes not yet polled */
static int done_n[MPIB_NRAILS];
static int broken_rail = -1; /* its completions carry an error status */
static int polls;            /* fake_poll_cq calls */

static int fake_post_send(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  int rail = (int)(q - qp);
  (void)bad;
  for (; wr != NULL; wr = wr->next)
    if (wr->send_flags & IBV_SEND_SIGNALED) done_q[rail][done_n[rail]++] = wr->wr_id;
  return 0;
}

static int fake_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc) {
  int rail = (int)(c - cq), k = 0;
  polls++;
  for (; k < n && k < done_n[rail]; k++)
    wc[k] = (struct ibv_wc){.wr_id = done_q[rail][k],
                            .opcode = IBV_WC_RDMA_WRITE,
                            .status = rail == broken_rail ? IBV_WC_RETRY_EXC_ERR : IBV_WC_SUCCESS};
  memmove(done_q[rail], done_q[rail] + k, (size_t)(done_n[rail] - k) * sizeof done_q[0][0]);
  done_n[rail] -= k;
  return k;
}

/* ---- a send comm bound to a slot of a real segment ---- */

static struct mpib_comm *send_comm(uint32_t shm_id) {
  struct mpib_comm *c = fake_send_comm(&ctx, fake_post_send, fake_poll_cq, qp, cq, &mr);
  c->force_sup_bw = 512; /* half on each rail */
  c->whole_msg_max = 0;  /* every slot is split */
  c->shm_slot = (int)shm_id;
  return c;
}

/* The receiver's CTS for the next slot (one receive of `size` bytes, tag 7). */
static void cts_for_next(struct mpib_comm *c, uint64_t size) {
  struct mpib_cts *e = &c->cts[c->fifo_head % MPIB_MAX_REQUESTS][0];
  *e = (struct mpib_cts){.addr = 0x10000, .size = size, .tag = 7, .nreqs = 1, .seq = c->fifo_head + 1};
  e->check = mpib_cts_check(e);
}

static struct mpib_request *send_one(struct mpib_comm *c, struct mpib_mr *mh, void *buf, size_t size) {
  void *req = NULL;
  cts_for_next(c, size);
  CHECK(mpib_isend(c, buf, size, 7, mh, NULL, &req) == ncclSuccess && req != NULL, "isend");
  return req;
}

/* A memory handle registered on another fused device carries that device's keys: isend
 * refuses it with a message instead of posting writes the NIC would fail (or, with a shared
 * NIC, send from the wrong registration). */
static void test_foreign_handle(struct mpib_comm *c, void *buf) {
  struct mpib_mr other = {.mr = {&mr, &mr}, .fdev = 1};
  void *req = NULL;
  uint64_t head = c->fifo_head;
  cts_for_next(c, 4096);
  CHECK(mpib_isend(c, buf, 4096, 7, &other, NULL, &req) == ncclInvalidArgument && req == NULL,
        "isend with device 1's handle on a device 0 connection");
  CHECK(c->fifo_head == head, "nothing posted");
}

static void wait_all(struct mpib_request **reqs, int n) {
  for (int i = 0; i < n; i++) {
    int done = 0;
    CHECK(mpib_test(reqs[i], &done, NULL) == ncclSuccess && done, "request %d not done", i);
  }
}

static uint64_t seg_u64(mpib_shm *shm, uint32_t id, int field) {
  uint32_t slot, gen;
  mpib_shm_slot_info s;
  if (mpib_shm_conn_slot(shm, id, &slot, &gen) != 0 || mpib_shm_decode_slot(shm, slot, &s) != 0) return UINT64_MAX;
  uint64_t v[] = {s.sout_bytes,         s.sout_requests,         s.sup_bytes,    s.sup_requests,
                  s.completed_bytes[0], s.completed_requests[0], s.busy_ns[0],   s.inflight_bytes[0],
                  s.completed_bytes[1], s.completed_requests[1], s.busy_ns[1],   s.inflight_bytes[1],
                  s.applied_sup_bw,     s.active_ns[0],          s.active_ns[1], s.flush_wall_ns};
  return v[field];
}
enum {
  SOUT_B,
  SOUT_Q,
  SUP_B,
  SUP_Q,
  SOUT_DONE,
  SOUT_DONE_Q,
  SOUT_BUSY,
  SOUT_FLY,
  SUP_DONE,
  SUP_DONE_Q,
  SUP_BUSY,
  SUP_FLY,
  APPLIED,
  SOUT_ACTIVE,
  SUP_ACTIVE,
  WALL
};

/* Four 64 KiB messages: nothing published until the batch closes; then posted = completed,
 * busy = 4 x 7 us per rail while each rail was active 7 us (the four overlap), nothing in
 * flight, split 512. Five clock reads: four posts and the
 * progress call that completed them. */
static void test_batch(mpib_shm *shm, uint32_t id, struct mpib_comm *c, struct mpib_mr *mh, void *buf) {
  const uint64_t size = 65536, sout = mpib_split_sout_bytes(size, 512), sup = size - sout;
  struct mpib_request *reqs[4];
  for (int i = 0; i < 4; i++) reqs[i] = send_one(c, mh, buf, size);
  CHECK(seg_u64(shm, id, SOUT_B) == 0 && seg_u64(shm, id, WALL) == 0, "published per message");
  CHECK(mpib_tele_inflight(c, 0) == 4 * sout && mpib_tele_inflight(c, 1) == 4 * sup, "in flight");
  fake_now += 7000;
  wait_all(reqs, 4);
  CHECK(clock_reads == 5, "clock reads: %d, want 4 posts + 1 progress call", clock_reads);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  mpib_telemetry_flush(c); /* as at close */
  uint64_t wall = seg_u64(shm, id, WALL);
  CHECK(wall > 0 && wall / 1000000000ull + 5 >= (uint64_t)ts.tv_sec, "flush_wall_ns %llu", (unsigned long long)wall);
  CHECK(seg_u64(shm, id, SOUT_B) == 4 * sout && seg_u64(shm, id, SOUT_Q) == 4 && seg_u64(shm, id, SUP_B) == 4 * sup &&
            seg_u64(shm, id, SUP_Q) == 4,
        "posted: %llu/%llu", (unsigned long long)seg_u64(shm, id, SOUT_B),
        (unsigned long long)seg_u64(shm, id, SOUT_Q));
  CHECK(seg_u64(shm, id, SOUT_DONE) == 4 * sout && seg_u64(shm, id, SOUT_DONE_Q) == 4 &&
            seg_u64(shm, id, SOUT_BUSY) == 4 * 7000 && seg_u64(shm, id, SOUT_FLY) == 0,
        "sout completed %llu, busy %llu", (unsigned long long)seg_u64(shm, id, SOUT_DONE),
        (unsigned long long)seg_u64(shm, id, SOUT_BUSY));
  CHECK(seg_u64(shm, id, SUP_DONE) == 4 * sup && seg_u64(shm, id, SUP_DONE_Q) == 4 &&
            seg_u64(shm, id, SUP_BUSY) == 4 * 7000 && seg_u64(shm, id, SUP_FLY) == 0 &&
            seg_u64(shm, id, APPLIED) == 512,
        "sup completion telemetry or applied split");
  CHECK(seg_u64(shm, id, SOUT_ACTIVE) == 7000 && seg_u64(shm, id, SUP_ACTIVE) == 7000, "active: %llu/%llu, want 7000",
        (unsigned long long)seg_u64(shm, id, SOUT_ACTIVE), (unsigned long long)seg_u64(shm, id, SUP_ACTIVE));
}

/* Sixteen more slots: published at the 16th post, with 16 in flight; completing them publishes
 * again (16 completions). A rail busy across a flush publishes its active time up to the
 * flush, and the rest at the next one. An inter-island peer without a relay: the guard puts everything on
 * SOUT and applied_sup_bw says 0 although the override asks 512. */
static void test_thresholds(mpib_shm *shm, uint32_t id, struct mpib_comm *c, struct mpib_mr *mh, void *buf) {
  const uint64_t size = 65536, sout = mpib_split_sout_bytes(size, 512);
  struct mpib_request *reqs[16];
  for (int i = 0; i < 15; i++) reqs[i] = send_one(c, mh, buf, size);
  CHECK(seg_u64(shm, id, SOUT_Q) == 4, "published before the 16th slot");
  reqs[15] = send_one(c, mh, buf, size);
  CHECK(seg_u64(shm, id, SOUT_Q) == 20 && seg_u64(shm, id, SOUT_FLY) == 16 * sout, "16th slot: %llu requests",
        (unsigned long long)seg_u64(shm, id, SOUT_Q));
  fake_now += 1000;
  mpib_telemetry_flush(c); /* mid-flight: 1 us of active time so far */
  CHECK(seg_u64(shm, id, SOUT_ACTIVE) == 7000 + 1000 && seg_u64(shm, id, SUP_ACTIVE) == 7000 + 1000,
        "active at a flush in flight: %llu", (unsigned long long)seg_u64(shm, id, SOUT_ACTIVE));
  fake_now += 2000;
  wait_all(reqs, 16);
  CHECK(seg_u64(shm, id, SOUT_DONE_Q) == 20 && seg_u64(shm, id, SOUT_FLY) == 0 &&
            seg_u64(shm, id, SUP_BUSY) == 4 * 7000 + 16 * 3000,
        "16 completions: %llu completed, busy %llu", (unsigned long long)seg_u64(shm, id, SOUT_DONE_Q),
        (unsigned long long)seg_u64(shm, id, SUP_BUSY));
  CHECK(seg_u64(shm, id, SOUT_ACTIVE) == 7000 + 3000 && seg_u64(shm, id, SUP_ACTIVE) == 7000 + 3000,
        "active after the 16: %llu", (unsigned long long)seg_u64(shm, id, SOUT_ACTIVE));
  c->path_class = MPIB_PATH_INTER_ISLAND;
  reqs[0] = send_one(c, mh, buf, size);
  wait_all(reqs, 1);
  mpib_telemetry_flush(c);
  CHECK(seg_u64(shm, id, APPLIED) == 0 && seg_u64(shm, id, SOUT_B) == 20 * sout + size && seg_u64(shm, id, SUP_Q) == 20,
        "guarded slot: applied %llu", (unsigned long long)seg_u64(shm, id, APPLIED));
}

/* Slots A and B split; SUP fails (error completions). The receiver's fence record says it has
 * A's SUP part (settled: completed on SUP) and not B's (replayed whole on SOUT: posted and
 * completed there). Nothing stays in flight. Times: posted at T, SOUT parts complete at T+5 us,
 * the record is read at T+7 us, the replay completes at T+8 us: SOUT was active 5 + 1 us, SUP
 * 7 us (until the record settled A and lost B). */
static void test_failover(mpib_shm *shm, uint32_t id, struct mpib_comm *c, struct mpib_mr *mh, void *buf) {
  const uint64_t size = 65536, sout = mpib_split_sout_bytes(size, 512), sup = size - sout;
  c->path_class = MPIB_PATH_INTRA_ISLAND;
  mpib_g.failover = 1;
  mpib_g.recovery_backoff_ms = mpib_g.recovery_backoff_max_ms = 1000000; /* no recovery here */
  mpib_g.failover_timeout_ms = 1000000;
  uint64_t base[WALL + 1];
  for (int f = 0; f <= WALL; f++) base[f] = seg_u64(shm, id, f);
  uint64_t seq_a = c->fifo_head;
  struct mpib_request *a = send_one(c, mh, buf, size), *b = send_one(c, mh, buf, size);
  broken_rail = MPIB_RAIL_SUP;
  fake_now += 5000;
  int done = 0;
  CHECK(mpib_test(a, &done, NULL) == ncclSuccess && !done && c->rail[MPIB_RAIL_SUP].state == MPIB_RAIL_FENCING,
        "SUP fails: state %d", c->rail[MPIB_RAIL_SUP].state);
  broken_rail = -1;
  struct mpib_fence_rec *rec = (struct mpib_fence_rec *)((char *)c->cts + MPIB_CTS_BYTES) + MPIB_RAIL_SUP;
  rec->fence_gen = c->rail[MPIB_RAIL_SUP].gen;
  rec->next_seq = seq_a + 2;
  rec->open_seq1[seq_a % MPIB_MAX_REQUESTS] = seq_a + 1;
  rec->have[seq_a % MPIB_MAX_REQUESTS] = 1u << MPIB_RAIL_SUP; /* A's SUP part arrived */
  rec->open_seq1[(seq_a + 1) % MPIB_MAX_REQUESTS] = seq_a + 2;
  rec->check = mpib_fence_check(rec);
  fake_now += 2000;
  CHECK(mpib_test(a, &done, NULL) == ncclSuccess && done, "A settled by the fence record");
  fake_now += 1000;
  wait_all(&b, 1);
  mpib_telemetry_flush(c);
  uint64_t want[][2] = {{SOUT_B, 2 * sout + sup},
                        {SOUT_Q, 3},
                        {SUP_B, 2 * sup},
                        {SUP_Q, 2},
                        {SOUT_DONE, 2 * sout + sup},
                        {SOUT_DONE_Q, 3},
                        {SOUT_BUSY, 5000 + 5000 + 8000},
                        {SUP_DONE, sup},
                        {SUP_DONE_Q, 1},
                        {SUP_BUSY, 7000},
                        {SOUT_ACTIVE, 6000},
                        {SUP_ACTIVE, 7000}};
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
    uint64_t got = seg_u64(shm, id, (int)want[k][0]) - base[want[k][0]];
    CHECK(got == want[k][1], "failover: field %d grew by %llu, want %llu", (int)want[k][0], (unsigned long long)got,
          (unsigned long long)want[k][1]);
  }
  CHECK(seg_u64(shm, id, SOUT_FLY) == 0 && seg_u64(shm, id, SUP_FLY) == 0, "failover: bytes left in flight");
}

/* After test_failover (SUP DOWN): a recovery the receiver refuses (its RTR failed) is a failed
 * attempt at once, so the next one comes after the back-off; a stale or torn refusal changes
 * nothing; the next attempt that the receiver answers ready probes and brings SUP back. The
 * failover timeout is out of reach here, so only the refusal can end the first attempt. */
static void test_recovery_refused(struct mpib_comm *c, struct mpib_mr *mh, void *buf) {
  struct mpib_rail_ctl *rc = &c->rail[MPIB_RAIL_SUP];
  struct mpib_fence_rec *rec = (struct mpib_fence_rec *)((char *)c->cts + MPIB_CTS_BYTES) + MPIB_RAIL_SUP;
  mpib_g.recovery_backoff_ms = 250;
  mpib_g.recovery_backoff_max_ms = 2000;
  mpib_g.failover_timeout_ms = 1000000;
  rc->retry_at_ns = fake_now;
  uint32_t gen = rc->gen;
  struct mpib_request *r = send_one(c, mh, buf, 4096);
  /* r stays open until the end (its completion held back), so each test() drives the comm as
   * NCCL's calls on an open request do; a request test() has returned done is NCCL's no more. */
  uint64_t held = done_q[MPIB_RAIL_SOUT][0];
  CHECK(done_n[MPIB_RAIL_SOUT] == 1 && done_n[MPIB_RAIL_SUP] == 0, "r's one completion (on SOUT)");
  done_n[MPIB_RAIL_SOUT] = 0;
  int done = 0;
  CHECK(mpib_test(r, &done, NULL) == ncclSuccess && rc->state == MPIB_RAIL_RECOVERING && rc->gen == gen + 1,
        "recovery started: state %d gen %u", rc->state, rc->gen);
  rec->refused_gen = gen; /* an older generation's refusal */
  rec->check = mpib_fence_check(rec);
  fake_now += 1000000;
  CHECK(mpib_test(r, &done, NULL) == ncclSuccess && rc->state == MPIB_RAIL_RECOVERING, "a stale refusal was taken");
  rec->refused_gen = gen + 1; /* torn: the checksum is the old one's */
  CHECK(mpib_test(r, &done, NULL) == ncclSuccess && rc->state == MPIB_RAIL_RECOVERING, "a torn refusal was taken");
  rec->check = mpib_fence_check(rec);
  CHECK(mpib_test(r, &done, NULL) == ncclSuccess && rc->state == MPIB_RAIL_DOWN && rc->attempts == 1 &&
            rc->retry_at_ns == fake_now + 500000000ull,
        "refused: state %d attempts %u retry in %lld ns", rc->state, rc->attempts,
        (long long)(rc->retry_at_ns - fake_now));
  fake_now = rc->retry_at_ns;
  CHECK(mpib_test(r, &done, NULL) == ncclSuccess && rc->state == MPIB_RAIL_RECOVERING && rc->gen == gen + 2,
        "retried after the back-off: state %d gen %u", rc->state, rc->gen);
  rec->ready_gen = gen + 2;
  rec->check = mpib_fence_check(rec);
  CHECK(mpib_test(r, &done, NULL) == ncclSuccess && rc->state == MPIB_RAIL_PROBING, "ready: state %d", rc->state);
  CHECK(mpib_test(r, &done, NULL) == ncclSuccess && rc->state == MPIB_RAIL_UP && rc->attempts == 0,
        "probed: state %d attempts %u", rc->state, rc->attempts);
  CHECK(!done, "r completed without its completion");
  done_q[MPIB_RAIL_SOUT][done_n[MPIB_RAIL_SOUT]++] = held;
  wait_all(&r, 1);
}

/* Five slots in flight, the last one's completions not in yet: the first test() polls and
 * finishes the first four, so the next three return done without a poll although the comm has
 * sends outstanding (as net_ib's test returns a request whose events are in); the open one
 * polls on every call. */
static void test_done_without_poll(struct mpib_comm *c, struct mpib_mr *mh, void *buf) {
  struct mpib_request *reqs[4];
  for (int i = 0; i < 4; i++) reqs[i] = send_one(c, mh, buf, 4096);
  struct mpib_request *open = send_one(c, mh, buf, 4096);
  uint64_t held[MPIB_NRAILS];
  for (int r = 0; r < MPIB_NRAILS; r++) {
    CHECK(done_n[r] == 5, "rail %d: %d completions queued, want one per slot", r, done_n[r]);
    held[r] = done_q[r][--done_n[r]];
  }
  int before = polls, done = 0;
  CHECK(mpib_test(reqs[0], &done, NULL) == ncclSuccess && done, "first request");
  CHECK(polls > before, "the first test did not poll");
  before = polls;
  wait_all(reqs + 1, 3);
  CHECK(polls == before, "%d polls for requests already complete", polls - before);
  CHECK(mpib_test(open, &done, NULL) == ncclSuccess && !done, "open request reported done");
  CHECK(polls > before, "an open request's test did not poll");
  for (int r = 0; r < MPIB_NRAILS; r++) done_q[r][done_n[r]++] = held[r];
  wait_all(&open, 1);
}

int main(void) {
  char dir[] = "/tmp/mpib-p2p-teleXXXXXX", path[256], err[512];
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  snprintf(path, sizeof path, "%s/hints", dir);
  mpib_shm *shm = NULL;
  CHECK(mpib_shm_create(path, 4, 0, err, sizeof err) == 0 && mpib_shm_open(path, &shm, err, sizeof err) == 0, "%s",
        err);
  uint32_t id = 0;
  mpib_conn_desc d = {.peer_sout_ip = 0x0A000207, .is_send = 1, .nqps_sout = 1, .nqps_sup = 1, .conn_id = 1};
  CHECK(shm != NULL && mpib_shm_register(shm, &d, &id) == 0, "register");
  mpib_g.shm = shm;
  struct mpib_comm *c = send_comm(id);
  struct mpib_mr mh = {.mr = {&mr, &mr}};
  void *buf = calloc(1, 65536);
  if (failures == 0) {
    test_batch(shm, id, c, &mh, buf);
    test_thresholds(shm, id, c, &mh, buf);
    test_failover(shm, id, c, &mh, buf);
    test_recovery_refused(c, &mh, buf);
    test_foreign_handle(c, buf);
    test_done_without_poll(c, &mh, buf);
  }
  mpib_shm_close(shm);
  unlink(path);
  rmdir(dir);
  free(buf);
  free(c->reqs);
  free(c->cts);
  free(c->sizes);
  free(c);
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
