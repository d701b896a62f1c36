//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_flush.c ../mpib_shm_*.c ../mpib_profiler.c

/* iflush on FAKE verbs (mpib_flush.c and mpib_p2p.c unchanged): which rails a flush reads on,
 * what a dead device does to it, and what a failed read does. The lab cannot raise IBV_EVENT_DEVICE_FATAL (rxe
 * cannot disassociate a context), so the fatal cases are proven here:
 *   - a receive's bytes written by SUP only: the flush reads on SUP only;
 *   - SUP's device dies while that read is outstanding: test() fails with an error, it does
 *     not return done=0 forever (the dead device's CQ is never polled again);
 *   - SUP dead but idle (the bytes came by SOUT): the flush reads on SOUT and completes;
 *   - SUP dead before iflush, with SUP's bytes to order: iflush fails at once;
 *   - a read that fails on a live device never completes the flush and never fails the rail:
 *     the flush QP is reset with its own access (REMOTE_READ, what a loopback read needs) and
 *     the read posted again; a reset also posts again another flush's read that the QP had;
 *   - a lane that cannot read again within MPIB_STALL_TIMEOUT_MS fails the flush, whether its
 *     QP cannot be reset or resets and fails every read;
 *   - a receive NCCL does not flush leaves nothing for the next flush to read (a rail that
 *     died since does not fail it);
 *   - a missing or foreign memory handle is an error;
 *   - a flush outlives a peer that finished and closed;
 *   - on a comm of a device's third SUP port, SUP's read names the buffer's MR on that port
 *     (a device-wide memory handle holds one MR per port: mpib_comm_mr). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_flush.h"
#include "../mpib_p2p.h"
#include "../mpib_slots.h"

#include "check.h"

struct mpib_global mpib_g;
uint64_t mpib_now_ns(void);
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line, (void)fmt;
}
const char *ibv_wc_status_str(enum ibv_wc_status status) { return status == IBV_WC_SUCCESS ? "ok" : "error"; }
void mpib_comm_destroy(struct mpib_comm *c) { (void)c; } /* mpib_comm_close's last step (comm setup) */
int mpib_rail_to_error(struct mpib_comm *c, int rail) { return (void)c, (void)rail, 0; }
int mpib_rail_reconnect(struct mpib_comm *c, int rail, uint32_t psn) { return (void)c, (void)rail, (void)psn, 0; }
int mpib_rail_rebuild_start(struct mpib_comm *c, int rail, uint32_t psn) {
  return (void)c, (void)rail, (void)psn, -EAGAIN;
}
int mpib_rail_rebuild_poll(struct mpib_comm *c, int rail, int *err) { return (void)c, (void)rail, *err = -EAGAIN, 1; }
static int resets[MPIB_NRAILS], reset_access[MPIB_NRAILS], reset_fails;
static uint64_t now_ns = 1000000000ull;
int mpib_qp_reset_to_init(const struct mpib_comm *c, struct ibv_qp *qp, int lane, int access) {
  (void)c, (void)qp;
  resets[lane]++;
  reset_access[lane] = access;
  return reset_fails ? -EIO : 0;
}
static int connect_gid_index[MPIB_NRAILS]; /* the GID index of each lane's last connect */
int mpib_qp_connect(struct mpib_comm *c, struct ibv_qp *qp, int lane, uint32_t rem_qpn,
                    const struct mpib_rail_info *rem, enum ibv_mtu mtu, uint8_t tc, uint32_t psn) {
  connect_gid_index[lane] = c->gid_index[lane];
  return (void)qp, (void)rem_qpn, (void)rem, (void)mtu, (void)tc, (void)psn, 0;
}
static int gid_found_at = -1; /* where the lane's GID is in the table now (-1: where it was) */
int mpib_lane_gid_refresh(struct mpib_comm *c, int lane) {
  if (gid_found_at >= 0) c->gid_index[lane] = gid_found_at;
  return 0;
}
void mpib_local_rail_info(const struct mpib_comm *c, int lane, struct mpib_rail_info *ri) {
  (void)c, (void)lane, memset(ri, 0, sizeof *ri);
}

/* Fake flush QPs: a posted read waits in `reads` until the test completes it. */
static struct ibv_context ctx;
static struct ibv_qp fqp[MPIB_NRAILS];
static struct ibv_cq fcq[MPIB_NRAILS];
static struct ibv_mr mr = {.lkey = 1, .rkey = 2};
static uint64_t reads[MPIB_NRAILS][8];
static uint32_t read_rkey[MPIB_NRAILS];
static int nreads[MPIB_NRAILS], ncqe[MPIB_NRAILS];
static struct ibv_wc cqe[MPIB_NRAILS][8];
uint64_t mpib_now_ns(void) { return now_ns; }

static int fake_post_send(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  (void)bad;
  int r = (int)(q - fqp);
  reads[r][nreads[r]++] = wr->wr_id;
  read_rkey[r] = wr->wr.rdma.rkey;
  return 0;
}
static int fake_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc) {
  int r = (int)(c - fcq), k = 0;
  for (; k < n && ncqe[r] > 0; k++) wc[k] = cqe[r][--ncqe[r]];
  return k;
}
/* The NIC finishes rail r's outstanding reads with `status`. */
static void complete_reads(int r, enum ibv_wc_status status) {
  for (int i = 0; i < nreads[r]; i++) cqe[r][ncqe[r]++] = (struct ibv_wc){.wr_id = reads[r][i], .status = status};
  nreads[r] = 0;
}

static struct mpib_comm *recv_comm(void) {
  struct mpib_comm *c = calloc(1, sizeof *c);
  for (int n = 0; n < MPIB_NRAILS; n++) c->nic[n] = &mpib_g.nic[n]; /* fused device 0: NICs 0 and 1 */
  c->sup_lanes = 1;                                                 /* one lane per rail: lane r is rail r's */
  c->nreqs_pool = MPIB_REQ_POOL_RECV;
  c->reqs = calloc((size_t)c->nreqs_pool, sizeof *c->reqs);
  c->flush_buf = calloc(1, MPIB_PAGE);
  c->cts = calloc(1, MPIB_NIC_AREA); /* the failover state the flush's wait drives (nothing happens there) */
  c->sizes = (mpib_sizes_row *)((char *)c->cts + MPIB_SIZES_OFFSET);
  c->ctrl_fd = -1;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    fqp[r].context = fcq[r].context = &ctx;
    c->flush_qp[r] = &fqp[r];
    c->flush_cq[r] = &fcq[r];
    c->flush_mr[r] = &mr;
    c->nqps[r] = 1;
    c->rail[r] = (struct mpib_rail_ctl){.state = MPIB_RAIL_UP, .gen = 1};
  }
  return c;
}

static void reset(void) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    mpib_g.nic[r].fatal = 0;
    nreads[r] = ncqe[r] = resets[r] = 0;
  }
}

/* One flush of a 4 KiB receive whose bytes rails `due` wrote: its ncclResult_t, the request in
 * *req. The buffer's memory handle has an MR on SOUT and on each of 3 SUP ports, each with an
 * rkey of its own (10 + slot). */
static ncclResult_t flush(struct mpib_comm *c, uint32_t due, void **req) {
  static char buf[4096];
  static struct ibv_mr port_mr[MPIB_MR_SLOTS];
  static struct mpib_mr mh; /* NCCL's handle outlives the flush */
  for (int slot = 0; slot < 4; slot++) {
    port_mr[slot] = (struct ibv_mr){.lkey = 1, .rkey = 10 + (uint32_t)slot};
    mh.mr[slot] = &port_mr[slot];
  }
  void *data = buf, *mhp = &mh;
  int size = (int)sizeof buf;
  c->flush_due = due;
  return mpib_iflush(c, 1, &data, &size, &mhp, req);
}

/* What test() says of a flush request: 1 done, 0 still open, -1 an error. */
static int tested(void *req) {
  int done = 0;
  if (mpib_test(req, &done, NULL) != ncclSuccess) return -1;
  return done;
}

/* A flush that failed: NCCL aborts the comm after an error; the next case starts afresh. */
static void abandon(struct mpib_comm *c, void *req) {
  ((struct mpib_request *)req)->type = MPIB_REQ_FREE;
  c->flushes_open = 0;
}

static void free_comm(struct mpib_comm *c) {
  free(c->flush_buf);
  free(c->cts);
  free(c->reqs);
  free(c);
}

/* Two receives complete, then NCCL flushes each (NCCL_NET_SHARED_COMMS: two connections'
 * receives on one comm, flushed in no common order). The first iflush reads; the second finds
 * nothing due since, but its bytes are ordered only once that read completes, so it waits for
 * a read too, not "nothing to flush" at once. With no flush open and nothing due, nothing is
 * read; an open flush's rails join the rails due, but only those where it still reads. */
static void open_flush_orders_later_receives(void) {
  enum { O = 1u << MPIB_RAIL_SOUT, U = 1u << MPIB_RAIL_SUP };
  struct mpib_comm *c = recv_comm();
  void *first = NULL, *second = NULL, *third = (void *)1;
  reset();
  CHECK(flush(c, U, &first) == ncclSuccess && first != NULL && nreads[MPIB_RAIL_SUP] == 1, "the first flush reads");
  CHECK(flush(c, 0, &second) == ncclSuccess && second != NULL && nreads[MPIB_RAIL_SUP] == 2,
        "the second receive's flush, the first still reading: want a read of its own, got request %p and %d reads",
        second, nreads[MPIB_RAIL_SUP]);
  CHECK(second != NULL && tested(second) == 0, "done before any read completed");
  complete_reads(MPIB_RAIL_SUP, IBV_WC_SUCCESS);
  CHECK(tested(first) == 1, "the first flush completes");
  CHECK(second != NULL && tested(second) == 1, "the second flush completes");
  CHECK(flush(c, 0, &third) == ncclSuccess && third == NULL && nreads[MPIB_RAIL_SUP] == 0,
        "no flush open, nothing due: nothing to read (request %p, %d reads)", third, nreads[MPIB_RAIL_SUP]);
  CHECK(flush(c, U, &first) == ncclSuccess && flush(c, O, &second) == ncclSuccess && nreads[MPIB_RAIL_SOUT] == 1 &&
            nreads[MPIB_RAIL_SUP] == 2,
        "SOUT due while SUP's flush reads: reads on both (SOUT %d, SUP %d)", nreads[MPIB_RAIL_SOUT],
        nreads[MPIB_RAIL_SUP]);
  complete_reads(MPIB_RAIL_SOUT, IBV_WC_SUCCESS);
  complete_reads(MPIB_RAIL_SUP, IBV_WC_SUCCESS);
  CHECK(tested(first) == 1, "both flushes complete");
  CHECK(tested(second) == 1, "both flushes complete");

  /* A rail whose reads of an open flush all completed is not read again: its device dying
   * afterwards does not fail a flush of bytes only the other rail wrote. */
  reset();
  CHECK(flush(c, O | U, &first) == ncclSuccess && nreads[MPIB_RAIL_SOUT] == 1 && nreads[MPIB_RAIL_SUP] == 1,
        "a flush on both rails");
  complete_reads(MPIB_RAIL_SUP, IBV_WC_SUCCESS);
  CHECK(tested(first) == 0, "SOUT's read is still out");
  mpib_g.nic[MPIB_RAIL_SUP].fatal = 1;
  second = NULL;
  CHECK(flush(c, O, &second) == ncclSuccess && second != NULL && nreads[MPIB_RAIL_SOUT] == 2,
        "SUP died after its read completed: SOUT's bytes flush on SOUT (request %p, SOUT reads %d)", second,
        nreads[MPIB_RAIL_SOUT]);
  complete_reads(MPIB_RAIL_SOUT, IBV_WC_SUCCESS);
  CHECK(tested(first) == 1, "the first flush completes on SOUT");
  CHECK(second != NULL && tested(second) == 1, "the second flush completes");
  mpib_g.nic[MPIB_RAIL_SUP].fatal = 0;
  printf("flush: open-flush-covers-later-iflush=%s\n", failures ? "false" : "true");
  free_comm(c);
}

/* A flush read fails after a port flap that moved the RoCE GID of its lane in the table: the
 * loopback QP is connected again at the GID's new index, whether or not the data rail was
 * rebuilt first (the index is the lane's, shared with its data QPs). While the data rail's
 * rebuild runs (its thread moves that index), the flush QP waits for it. */
static void flush_after_gid_move(void) {
  enum { U = 1u << MPIB_RAIL_SUP };
  struct mpib_comm *c = recv_comm();
  void *req = NULL;
  reset();
  mpib_g.nic[MPIB_RAIL_SUP].link_layer = IBV_LINK_LAYER_ETHERNET;
  c->gid_index[MPIB_RAIL_SUP] = 1;
  CHECK(flush(c, U, &req) == ncclSuccess && req != NULL && nreads[MPIB_RAIL_SUP] == 1, "a flush on SUP");
  gid_found_at = 3;
  c->rail[MPIB_RAIL_SUP].rebuild.running = 1;
  complete_reads(MPIB_RAIL_SUP, IBV_WC_RETRY_EXC_ERR);
  CHECK(tested(req) == 0 && resets[MPIB_RAIL_SUP] == 0 && nreads[MPIB_RAIL_SUP] == 0,
        "the data rail is being rebuilt: the flush QP waits (resets %d, reads %d)", resets[MPIB_RAIL_SUP],
        nreads[MPIB_RAIL_SUP]);
  c->rail[MPIB_RAIL_SUP].rebuild.running = 0;
  CHECK(tested(req) == 0 && resets[MPIB_RAIL_SUP] == 1 && nreads[MPIB_RAIL_SUP] == 1,
        "the rebuild over: the flush QP is reset and reads again (resets %d, reads %d)", resets[MPIB_RAIL_SUP],
        nreads[MPIB_RAIL_SUP]);
  CHECK(connect_gid_index[MPIB_RAIL_SUP] == 3, "the flush QP connected at GID index %d, want the GID's new index 3",
        connect_gid_index[MPIB_RAIL_SUP]);
  complete_reads(MPIB_RAIL_SUP, IBV_WC_SUCCESS);
  CHECK(tested(req) == 1, "the flush completes");
  printf("flush: gid-moved connect_index=%d\n", connect_gid_index[MPIB_RAIL_SUP]);
  gid_found_at = -1;
  mpib_g.nic[MPIB_RAIL_SUP].link_layer = 0;
  free_comm(c);
}

/* A lane whose QP resets and connects but whose every read fails again (a port that stays
 * down, a read the NIC refuses): the flush fails with a message within MPIB_STALL_TIMEOUT_MS of
 * the first failure, it does not reset and read again for ever. */
static void reads_that_keep_failing(void) {
  enum { U = 1u << MPIB_RAIL_SUP };
  struct mpib_comm *c = recv_comm();
  void *req = NULL;
  reset();
  mpib_g.stall_timeout_ms = 5000;
  CHECK(flush(c, U, &req) == ncclSuccess && nreads[MPIB_RAIL_SUP] == 1, "a flush on SUP");
  uint64_t start = now_ns;
  int outcome = 0, cycles = 0;
  for (; cycles < 200 && outcome == 0; cycles++, now_ns += 100000000ull) {
    complete_reads(MPIB_RAIL_SUP, IBV_WC_RETRY_EXC_ERR); /* each read fails; each reset works */
    outcome = tested(req);
  }
  double waited_s = (double)(now_ns - start) / 1e9;
  CHECK(
      outcome == -1 && waited_s <= 5.0 + 0.5,
      "reads failing on a QP that resets fine: want an error within the 5 s stall timeout, got outcome %d after %.1f s "
      "(%d resets)",
      outcome, waited_s, resets[MPIB_RAIL_SUP]);
  printf("flush: reads-keep-failing outcome=%s waited_s=%.1f resets=%d\n", outcome == -1 ? "error" : "open", waited_s,
         resets[MPIB_RAIL_SUP]);
  abandon(c, req);
  free_comm(c);
}

/* A receive test() returns done (its lanes in *wrote: a rail's one lane is bit rail). */
static void receive_done(struct mpib_comm *c, int slot, uint32_t wrote) {
  struct mpib_request *r = mpib_req_alloc(c, MPIB_REQ_RECV);
  r->nreqs = 1;
  r->posted[0] = 4096;
  r->wrote_lanes = wrote;
  c->slot_reqs[slot][0] = r;
  c->recvs_open++;
  CHECK(mpib_recv_finish(c, MPIB_RAIL_SUP, (uint32_t)slot, r, 4096) == ncclSuccess, "the receive completes");
  CHECK(tested(r) == 1, "test() returns the receive");
}

/* NCCL flushes only the receives it must (Simple protocol, GPU memory, bytes): an LL receive
 * that SUP wrote is tested and never flushed. SUP's device then dies (failover moves the
 * traffic to SOUT), and the next receive, all on SOUT, is flushed: its flush reads on SOUT and
 * completes; the dead rail's old receive is not its to order. */
static void unflushed_receive_then_rail_dies(void) {
  enum { O = 1u << MPIB_RAIL_SOUT, U = 1u << MPIB_RAIL_SUP };
  static char buf[4096];
  static struct ibv_mr port_mr[MPIB_MR_SLOTS];
  static struct mpib_mr mh;
  for (int slot = 0; slot < 4; slot++) mh.mr[slot] = &port_mr[slot];
  struct mpib_comm *c = recv_comm();
  reset();
  receive_done(c, 0, U); /* LL: NCCL calls no iflush */
  mpib_g.nic[MPIB_RAIL_SUP].fatal = 1;
  receive_done(c, 1, O);
  void *data = buf, *mhp = &mh, *req = NULL;
  int size = (int)sizeof buf;
  ncclResult_t res = mpib_iflush(c, 1, &data, &size, &mhp, &req);
  CHECK(res == ncclSuccess && req != NULL && nreads[MPIB_RAIL_SOUT] == 1 && nreads[MPIB_RAIL_SUP] == 0,
        "the flush of a receive SOUT wrote, after an unflushed receive of SUP's dead device: want a read on SOUT, got "
        "res %d, request %p, reads SOUT %d SUP %d",
        res, req, nreads[MPIB_RAIL_SOUT], nreads[MPIB_RAIL_SUP]);
  if (req != NULL) {
    complete_reads(MPIB_RAIL_SOUT, IBV_WC_SUCCESS);
    CHECK(tested(req) == 1, "the flush completes on SOUT");
  }
  printf("flush: unflushed-receive-then-rail-dead outcome=%s\n", res == ncclSuccess ? "completed" : "error");
  mpib_g.nic[MPIB_RAIL_SUP].fatal = 0;
  free_comm(c);
}

/* The peer finished and closed (the job's last receive) while a flush of that receive still
 * reads: the flush completes when its read does, it is not failed for the peer. */
static void flush_outlives_the_peer(void) {
  enum { U = 1u << MPIB_RAIL_SUP };
  struct mpib_comm *c = recv_comm();
  void *req = NULL;
  reset();
  CHECK(flush(c, U, &req) == ncclSuccess && req != NULL, "a flush on SUP");
  c->peer_gone_ns = now_ns;
  now_ns += 2000000000ull;
  int before = tested(req);
  complete_reads(MPIB_RAIL_SUP, IBV_WC_SUCCESS);
  int after = tested(req);
  CHECK(before == 0 && after == 1, "a flush with the peer gone 2 s: want open then done, got %d then %d", before,
        after);
  printf("flush: peer-gone outcome=%s\n", after == 1 ? "completed" : "error");
  free_comm(c);
}

/* iflush checks the handle NCCL gives it: none, or one of another fused device, is an error
 * with a message, never a crash or a flush that reads nothing. */
static void flush_handle_checked(void) {
  enum { U = 1u << MPIB_RAIL_SUP };
  static char buf[4096];
  static struct ibv_mr port_mr[MPIB_MR_SLOTS];
  static struct mpib_mr other = {.fdev = 1}, unregistered;
  for (int slot = 0; slot < 4; slot++) other.mr[slot] = &port_mr[slot];
  unregistered.mr[0] = &port_mr[0]; /* SOUT only: no MR on the SUP port that wrote */
  struct mpib_comm *c = recv_comm();
  void *data = buf, *req = (void *)1, *none = NULL, *foreign = &other, *partial = &unregistered;
  int size = (int)sizeof buf;
  reset();
  c->flush_due = U;
  CHECK(mpib_iflush(c, 1, &data, &size, &none, &req) == ncclInvalidArgument && req == NULL,
        "iflush without a memory handle: an error");
  CHECK(mpib_iflush(c, 1, &data, &size, &foreign, &req) == ncclInvalidArgument && req == NULL,
        "iflush with another device's handle: an error");
  CHECK(mpib_iflush(c, 1, &data, &size, &partial, &req) == ncclInvalidArgument && req == NULL &&
            nreads[MPIB_RAIL_SUP] == 0,
        "iflush of a buffer with no MR on the lane that wrote: an error");
  free_comm(c);
}

int main(void) {
  ctx.ops.post_send = fake_post_send;
  ctx.ops.poll_cq = fake_poll_cq;
  mpib_g.flush_enabled = 1;
  struct mpib_comm *c = recv_comm();
  enum { O = 1u << MPIB_RAIL_SOUT, U = 1u << MPIB_RAIL_SUP };
  void *req = NULL;
  int done = 0;

  reset();
  CHECK(flush(c, U, &req) == ncclSuccess && req != NULL, "flush of SUP's bytes");
  CHECK(nreads[MPIB_RAIL_SUP] == 1 && nreads[MPIB_RAIL_SOUT] == 0, "reads on the rail that wrote only: SOUT %d SUP %d",
        nreads[MPIB_RAIL_SOUT], nreads[MPIB_RAIL_SUP]);
  mpib_g.nic[MPIB_RAIL_SUP].fatal = 1; /* the device dies with the read outstanding */
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 1000000 && res == ncclSuccess && !done; i++) res = mpib_test(req, &done, NULL);
  CHECK(res != ncclSuccess && !done, "fatal during flush on the rail that wrote: want an error, got res=%d done=%d",
        res, done);
  printf("flush: fatal-during-flush rail=SUP wrote=SUP outcome=%s hang=false\n",
         res != ncclSuccess ? "error" : "completed");
  abandon(c, req);

  reset();
  c->failure_reported = 0;
  mpib_g.nic[MPIB_RAIL_SUP].fatal = 1; /* dead but idle: SOUT wrote the bytes */
  CHECK(flush(c, O, &req) == ncclSuccess && req != NULL && nreads[MPIB_RAIL_SOUT] == 1 && nreads[MPIB_RAIL_SUP] == 0,
        "idle dead SUP: read on SOUT only");
  complete_reads(MPIB_RAIL_SOUT, IBV_WC_SUCCESS);
  CHECK(tested(req) == 1, "idle dead SUP: the flush completes on SOUT");
  printf("flush: fatal-during-flush rail=SUP wrote=SOUT outcome=completed hang=false\n");

  reset();
  mpib_g.nic[MPIB_RAIL_SUP].fatal = 1;
  req = NULL;
  CHECK(flush(c, O | U, &req) != ncclSuccess && req == NULL,
        "SUP dead before iflush with its bytes to order: an error");

  reset();
  CHECK(flush(c, O | U, &req) == ncclSuccess && nreads[0] == 1 && nreads[1] == 1, "both rails wrote: a read on each");
  complete_reads(MPIB_RAIL_SOUT, IBV_WC_SUCCESS);
  void *other = NULL;
  CHECK(flush(c, U, &other) == ncclSuccess && nreads[MPIB_RAIL_SUP] == 2 && nreads[MPIB_RAIL_SOUT] == 1,
        "a second flush's read queued behind it, and one on SOUT, a rail of the flush still open");
  /* the first read fails on a live device, the second is flushed */
  complete_reads(MPIB_RAIL_SUP, IBV_WC_RETRY_EXC_ERR);
  CHECK(tested(req) == 0, "a failed read never completes the flush");
  CHECK(resets[MPIB_RAIL_SUP] == 1 && reset_access[MPIB_RAIL_SUP] == IBV_ACCESS_REMOTE_READ,
        "the flush QP is reset once, granting REMOTE_READ (resets %d, access %#x)", resets[MPIB_RAIL_SUP],
        reset_access[MPIB_RAIL_SUP]);
  CHECK(nreads[MPIB_RAIL_SUP] == 1, "the failed read is posted again on the reset QP (%d reads)",
        nreads[MPIB_RAIL_SUP]);
  CHECK(c->rail[MPIB_RAIL_SUP].state == MPIB_RAIL_UP, "a flush error never fails the rail (state %d)",
        c->rail[MPIB_RAIL_SUP].state);
  done = 0;
  CHECK(mpib_test(other, &done, NULL) == ncclSuccess && !done && nreads[MPIB_RAIL_SUP] == 2,
        "the other flush's read, lost with the QP's error, is posted again too (%d reads)", nreads[MPIB_RAIL_SUP]);
  complete_reads(MPIB_RAIL_SUP, IBV_WC_SUCCESS);
  complete_reads(MPIB_RAIL_SOUT, IBV_WC_SUCCESS);
  CHECK(tested(req) == 1, "the reset QP orders the first flush");
  CHECK(tested(other) == 1, "and the second");
  printf("flush: failed-read reposted=true resets=%d access=REMOTE_READ counted_done_with_failed_read=false\n",
         resets[MPIB_RAIL_SUP]);

  reset(); /* a lane that cannot read again: the flush fails after the failover timeout, never completes */
  mpib_g.stall_timeout_ms = 5000;
  CHECK(flush(c, U, &req) == ncclSuccess && nreads[MPIB_RAIL_SUP] == 1, "a flush on SUP");
  complete_reads(MPIB_RAIL_SUP, IBV_WC_RETRY_EXC_ERR);
  reset_fails = 1; /* the port is down: the QP cannot come back */
  done = 0;
  res = ncclSuccess;
  for (int i = 0; i < 100 && res == ncclSuccess && !done; i++, now_ns += 100000000ull)
    res = mpib_test(req, &done, NULL);
  CHECK(res == ncclSystemError && !done,
        "a lane that cannot read for the stall timeout fails the flush (res %d done %d)", res, done);
  abandon(c, req);
  reset_fails = 0;
  c->failure_reported = 0;

  req = (void *)1;
  CHECK(flush(c, 0, &req) == ncclSuccess && req == NULL, "nothing written since the last flush: nothing to read");

  reset();
  CHECK(flush(c, O | U, &req) == ncclSuccess && read_rkey[MPIB_RAIL_SOUT] == 10 && read_rkey[MPIB_RAIL_SUP] == 11,
        "SUP port 0: the reads name the MRs of SOUT (10) and SUP port 0 (11): %u %u", read_rkey[MPIB_RAIL_SOUT],
        read_rkey[MPIB_RAIL_SUP]);
  complete_reads(MPIB_RAIL_SOUT, IBV_WC_SUCCESS);
  complete_reads(MPIB_RAIL_SUP, IBV_WC_SUCCESS);
  CHECK(tested(req) == 1, "port 0's flush completes");
  c->sup_port = c->lane_port[MPIB_RAIL_SUP] = 2;
  reset();
  CHECK(flush(c, O | U, &req) == ncclSuccess && read_rkey[MPIB_RAIL_SOUT] == 10 && read_rkey[MPIB_RAIL_SUP] == 13,
        "SUP port 2: the reads name the MRs of SOUT (10) and SUP port 2 (13): %u %u", read_rkey[MPIB_RAIL_SOUT],
        read_rkey[MPIB_RAIL_SUP]);
  printf("flush: sup_port=2 sout_rkey=%u sup_rkey=%u\n", read_rkey[MPIB_RAIL_SOUT], read_rkey[MPIB_RAIL_SUP]);
  free_comm(c);
  open_flush_orders_later_receives();
  flush_after_gid_move();
  reads_that_keep_failing();
  unflushed_receive_then_rail_dies();
  flush_handle_checked();
  flush_outlives_the_peer();
  return failures ? 1 : 0;
}
