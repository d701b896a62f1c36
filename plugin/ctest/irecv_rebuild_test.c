//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_shm_*.c shm_agent.c shm_decode.c

/* A receive posted while the CTS rail's QPs are being rebuilt, on fake verbs. A receiver is
 * idle when the sender finds its rail failed: the receiver's control plane answers the
 * sender's FAIL, the sender rebuilds and its RECOVER replaces the FAIL in the notice word, so
 * the receiver's data path, which never saw the FAIL, rebuilds a rail it holds UP. Its
 * rebuild runs on a thread of its own; the provider refuses a post on a QP below RTS (rxe
 * does; another may take it while the thread modifies the QP). Checks, for a one-rail
 * receiver (vanilla inter-island):
 *   - the receive posted during the rebuild is taken (a request, no error) and its CTS is
 *     held back, not posted on the QP being rebuilt;
 *   - the connection stalls (no rail works) from the rebuild on, so the stall's deadline
 *     applies to the receiver too;
 *   - when the rail is back, both open receives' CTS go out on it and the stall ends.
 * And for a two-rail receiver whose other rail was out of service at the RECOVER and works
 * again before the rebuilt one: both CTS go out on the other rail, and the stall ends. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../mpib.h"
#include "../mpib_failover.h"
#include "../mpib_p2p.h"
#include "../mpib_profiler.h"
#include "../mpib_slots.h"

#include "check.h"

struct mpib_global mpib_g;
ncclProfilerCallback_t mpib_prof_fn;
uint64_t mpib_now_ns(void) { return 5000000000ull; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line, (void)fmt;
}
#include "p2p_stubs.h"

static struct ibv_context ctx;
static struct ibv_qp qp[MPIB_NRAILS];
static struct ibv_cq cq[MPIB_NRAILS];
static struct ibv_mr mr;
static struct mpib_comm *comm;
static int posts[MPIB_NRAILS], posts_while_rebuilding;

static int fake_post_send(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  int rail = (int)(q - qp);
  if (comm->rail[rail].rebuild.running) { /* the QP is between RESET and RTS */
    posts_while_rebuilding++;
    *bad = wr;
    return EINVAL;
  }
  posts[rail]++;
  return 0;
}
static int fake_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc) { return (void)c, (void)n, (void)wc, 0; }

static void *post_receive(struct mpib_comm *c, char *buf, ncclResult_t *res) {
  static struct mpib_mr mh;
  mh.mr[0] = mh.mr[1] = &mr;
  void *data[1] = {buf}, *mhs[1] = {&mh}, *req = NULL;
  size_t sizes[1] = {4096};
  int tags[1] = {7};
  *res = mpib_irecv(c, 1, data, sizes, tags, mhs, NULL, &req);
  return req;
}

/* The receiver is idle; the sender's RECOVER of SOUT's generation 2 arrives, and test() of an
 * open receive reads it. */
static void recover_sout(struct mpib_comm *c, void *open) {
  int done = 0;
  __atomic_store_n(&c->tcp_notice[MPIB_RAIL_SOUT], mpib_notice_encode(2, MPIB_NOTICE_RECOVER), __ATOMIC_RELEASE);
  ncclResult_t res = mpib_test(open, &done, NULL);
  CHECK(res == ncclSuccess && !done && c->rail[MPIB_RAIL_SOUT].rebuild.running,
        "the sender's RECOVER starts the receiver's rebuild: res %d done %d running %d", res, done,
        c->rail[MPIB_RAIL_SOUT].rebuild.running);
  CHECK(c->stall_since_ns != 0, "no rail works while the only one left is rebuilt, yet the connection does not stall");
}

static void one_rail(void) {
  static char buf[2][4096];
  ncclResult_t res;
  int done = 0;
  memset(posts, 0, sizeof posts);
  stub_rebuild = STUB_REBUILD_RUNS;
  struct mpib_comm *c = comm = fake_recv_comm(&ctx, fake_post_send, fake_poll_cq, &qp[0], &cq[0], &mr);
  void *first = post_receive(c, buf[0], &res);
  CHECK(res == ncclSuccess && first != NULL && posts[0] == 1, "the first receive: res %d, request %p, %d CTS posted",
        res, first, posts[0]);
  recover_sout(c, first);
  void *second = post_receive(c, buf[1], &res);
  CHECK(res == ncclSuccess && second != NULL, "a receive posted during the rebuild: res %d, request %p", res, second);
  CHECK(posts_while_rebuilding == 0, "%d CTS posted on the QP being rebuilt", posts_while_rebuilding);

  stub_rebuild = STUB_REBUILD_DONE;
  res = mpib_test(first, &done, NULL);
  CHECK(res == ncclSuccess && c->rail[MPIB_RAIL_SOUT].state == MPIB_RAIL_RECOVERING,
        "the rebuild finished: res %d, rail %s", res, mpib_rail_state_name(c->rail[MPIB_RAIL_SOUT].state));
  int before = posts[0];
  __atomic_store_n(&c->tcp_notice[MPIB_RAIL_SOUT], mpib_notice_encode(2, MPIB_NOTICE_UP), __ATOMIC_RELEASE);
  res = mpib_test(first, &done, NULL);
  CHECK(res == ncclSuccess && c->rail[MPIB_RAIL_SOUT].state == MPIB_RAIL_UP, "the sender's UP: res %d, rail %s", res,
        mpib_rail_state_name(c->rail[MPIB_RAIL_SOUT].state));
  CHECK(posts[0] - before == 2, "back in service: %d CTS posted, want both open receives' (2)", posts[0] - before);
  CHECK(c->stall_since_ns == 0, "the stall did not end when the rail came back");
  CHECK(posts_while_rebuilding == 0, "%d CTS posted on the QP being rebuilt", posts_while_rebuilding);
  fake_comm_free(c);
}

static void other_rail_first(void) {
  static char buf[2][4096];
  ncclResult_t res;
  memset(posts, 0, sizeof posts);
  stub_rebuild = STUB_REBUILD_RUNS;
  struct mpib_comm *c = comm = fake_recv_comm(&ctx, fake_post_send, fake_poll_cq, &qp[0], &cq[0], &mr);
  qp[1].context = cq[1].context = &ctx;
  c->nqps[MPIB_RAIL_SUP] = 1;
  c->qps[1] = (struct mpib_qp){.qp = &qp[1], .rail = MPIB_RAIL_SUP, .lane = 1};
  c->cq[1] = &cq[1];
  c->stage_mr[1] = &mr;
  c->rail[MPIB_RAIL_SUP].state = MPIB_RAIL_DOWN; /* out of service: its recovery is under way */
  void *first = post_receive(c, buf[0], &res);
  CHECK(res == ncclSuccess && first != NULL && posts[0] == 1, "two rails, the first receive: %d CTS on SOUT", posts[0]);
  recover_sout(c, first);
  void *second = post_receive(c, buf[1], &res);
  CHECK(res == ncclSuccess && second != NULL && posts_while_rebuilding == 0,
        "two rails, a receive during the rebuild: res %d, request %p, %d posted on the QP being rebuilt", res, second,
        posts_while_rebuilding);
  c->rail[MPIB_RAIL_SUP].state = MPIB_RAIL_UP; /* SUP works again before SOUT's rebuild is over */
  CHECK(mpib_failover_tick(c) == ncclSuccess, "tick");
  CHECK(c->cts_rail == MPIB_RAIL_SUP && posts[1] == 2,
        "SUP works first: the CTS rail is %s with %d CTS posted there, want SUP with both open receives' (2)",
        mpib_rail_name(c->cts_rail), posts[1]);
  CHECK(c->stall_since_ns == 0, "the stall did not end when SUP worked again");
}

int main(void) {
  fake_failover_defaults();
  one_rail();
  other_rail_first();
  if (failures == 0) printf("irecv_rebuild: ok\n");
  return failures != 0;
}
