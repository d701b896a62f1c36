// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_shm_*.c shm_agent.c shm_decode.c
// (relative to plugin/ctest, as every ctest program's: hotpath_test.go builds it from there)

/* The send path's cost per call, on fake verbs, for callgrind (plugin/ctest/hotpath_test.go): a vanilla
 * intra-island send comm (one QP and one lane per rail; a 4 KiB message goes whole to SUP)
 * sends MESSAGES messages the way NCCL's proxy calls the plugin, and each kind of call goes
 * through a wrapper of its own, so that callgrind's inclusive cost per call of a wrapper is
 * what that kind of call costs:
 *   - isend_no_cts: the slot's CTS has not landed yet (NCCL calls again);
 *   - isend_posting: it has: the message is posted;
 *   - test_pending: its completion has not arrived;
 *   - test_completing: the completion is polled and the request handed back.
 * The fake provider (fake_post_send, fake_poll_cq) stands in for the NIC's; the Go side
 * reports its share apart. The data path's clock is fake and advances 1 us per read, so every
 * run counts the same instructions. With the argument "advanced" the comm runs in advanced
 * mode with an agent's segment: a fresh heartbeat and a slot hint of 1024 (all on SUP, as
 * vanilla puts it), so that every request reads its hint and every slot keeps the agent's
 * telemetry. Exits 1 when a call does not do what its kind says. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpib.h"
#include "mpib_p2p.h"
#include "mpib_profiler.h"
#include "mpib_shm.h"
#include "mpib_slots.h"
#include "../shm_agent.h"

#define MESSAGES 2000
#define SIZE 4096

/* ---- what mpib_p2p.c and failover need from the rest of the plugin ---- */

struct mpib_global mpib_g;
ncclProfilerCallback_t mpib_prof_fn;
static uint64_t fake_now = 1000000000ull;

uint64_t mpib_now_ns(void) { return fake_now += 1000; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "log %d %s:%d: ", (int)level, file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
#include "../p2p_stubs.h"

/* ---- fake verbs: a signalled write completes when the test says it arrived ---- */

static struct ibv_context ctx;
static struct ibv_qp qp[MPIB_NRAILS];
static struct ibv_cq cq[MPIB_NRAILS];
static struct ibv_mr mr;
static uint64_t sent[MPIB_NRAILS][64], arrived[MPIB_NRAILS][64]; /* wr_ids */
static int nsent[MPIB_NRAILS], narrived[MPIB_NRAILS];

static int fake_post_send(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  int rail = (int)(q - qp);
  (void)bad;
  for (; wr != NULL; wr = wr->next)
    if ((wr->send_flags & IBV_SEND_SIGNALED) && nsent[rail] < 64) sent[rail][nsent[rail]++] = wr->wr_id;
  return 0;
}

static int fake_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc) {
  int rail = (int)(c - cq), k = 0;
  for (; k < n && k < narrived[rail]; k++)
    wc[k] = (struct ibv_wc){.wr_id = arrived[rail][k], .opcode = IBV_WC_RDMA_WRITE, .status = IBV_WC_SUCCESS};
  narrived[rail] -= k;
  memmove(arrived[rail], arrived[rail] + k, (size_t)narrived[rail] * sizeof arrived[0][0]);
  return k;
}

/* Every write posted so far completes: its completion is in the CQ for the next poll. */
static void deliver(void) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    for (int i = 0; i < nsent[r]; i++) arrived[r][narrived[r]++] = sent[r][i];
    nsent[r] = 0;
  }
}

static struct mpib_comm *vanilla_send_comm(void) {
  struct mpib_comm *c = fake_send_comm(&ctx, fake_post_send, fake_poll_cq, qp, cq, &mr);
  c->whole_msg_max = 65536; /* MPIB_WHOLE_MSG_MAX's default */
  return c;
}

/* Advanced mode on `c`: an agent's segment in a fresh directory (removed again at exit by the
 * caller) with the comm registered, its hint set to 1024 and the heartbeat fresh for the
 * run. 0, or 1 with a message. */
static int advanced_mode(struct mpib_comm *c, char *dir, char *path, size_t pathlen) {
  char err[256];
  mpib_shm *shm = NULL;
  uint32_t id = 0, slot = 0, gen = 0;
  snprintf(path, pathlen, "%s/hints", dir);
  mpib_conn_desc d = {.peer_sout_ip = 0x0A000207, .is_send = 1, .nqps_sout = 1, .nqps_sup = 1, .conn_id = 1};
  if (mpib_shm_create(path, 4, 0, err, sizeof err) != 0 || mpib_shm_open(path, &shm, err, sizeof err) != 0) {
    fprintf(stderr, "agent segment: %s\n", err);
    return 1;
  }
  if (mpib_shm_register(shm, &d, &id) != 0 || mpib_shm_conn_slot(shm, id, &slot, &gen) != 0 ||
      mpib_shm_set_slot_hint(shm, slot, gen, 1, MPIB_SUP_BW_MAX) < 0) {
    fprintf(stderr, "agent segment: registering the comm or setting its hint failed\n");
    return 1;
  }
  mpib_shm_heartbeat(shm, mpib_shm_now_ns());
  mpib_g.shm = shm;
  mpib_g.agent_stale_ns = 3600 * 1000000000ull; /* callgrind's slowdown never makes it stale */
  c->mode = MPIB_MODE_ADVANCED;
  c->shm_slot = (int)id;
  return 0;
}

/* The receiver's CTS for the next slot: one receive of SIZE bytes, tag 7. */
static void cts_lands(struct mpib_comm *c) {
  struct mpib_cts *e = &c->cts[c->fifo_head % MPIB_MAX_REQUESTS][0];
  *e =
      (struct mpib_cts){.addr = 0x10000, .size = SIZE, .rkey = {11, 12}, .tag = 7, .nreqs = 1, .seq = c->fifo_head + 1};
  e->check = mpib_cts_check(e);
}

/* ---- the four kinds of call, one wrapper each (callgrind counts per function) ---- */

static __attribute__((noinline)) void *isend_no_cts(struct mpib_comm *c, struct mpib_mr *mh, void *buf) {
  void *req = (void *)1;
  if (mpib_isend(c, buf, SIZE, 7, mh, NULL, &req) != ncclSuccess || req != NULL) return (void *)1;
  return NULL;
}
static __attribute__((noinline)) void *isend_posting(struct mpib_comm *c, struct mpib_mr *mh, void *buf) {
  void *req = NULL;
  if (mpib_isend(c, buf, SIZE, 7, mh, NULL, &req) != ncclSuccess) return NULL;
  return req;
}
static __attribute__((noinline)) int test_pending(void *req) {
  int done = -1;
  return mpib_test(req, &done, NULL) == ncclSuccess && done == 0;
}
static __attribute__((noinline)) int test_completing(void *req) {
  int done = 0, size = -1;
  return mpib_test(req, &done, &size) == ncclSuccess && done == 1 && size == SIZE;
}

/* MESSAGES messages, each through one call of every kind: 0, or 1 with a message. */
static int run(struct mpib_comm *c) {
  struct mpib_mr mh = {.mr = {&mr, &mr}, .fdev = 0};
  static char buf[SIZE];
  for (int i = 0; i < MESSAGES; i++) {
    if (isend_no_cts(c, &mh, buf) != NULL) {
      fprintf(stderr, "message %d: isend without a CTS did not wait\n", i);
      return 1;
    }
    cts_lands(c);
    void *req = isend_posting(c, &mh, buf);
    if (req == NULL || nsent[MPIB_RAIL_SUP] != 1 || nsent[MPIB_RAIL_SOUT] != 0) {
      fprintf(stderr, "message %d: isend with its CTS posted %d writes on SUP and %d on SOUT (want 1 and 0)\n", i,
              nsent[MPIB_RAIL_SUP], nsent[MPIB_RAIL_SOUT]);
      return 1;
    }
    if (!test_pending(req)) {
      fprintf(stderr, "message %d: test before the completion did not say pending\n", i);
      return 1;
    }
    deliver();
    if (!test_completing(req)) {
      fprintf(stderr, "message %d: test after the completion did not hand the request back\n", i);
      return 1;
    }
  }
  return 0;
}

int main(int argc, char **argv) {
  struct mpib_comm *c = vanilla_send_comm();
  int advanced = argc > 1 && strcmp(argv[1], "advanced") == 0;
  char dir[] = "/tmp/mpib-hotpathXXXXXX", path[256];
  if (advanced && (mkdtemp(dir) == NULL || advanced_mode(c, dir, path, sizeof path) != 0)) return 1;
  int rc = run(c);
  if (advanced) {
    unlink(path);
    rmdir(dir);
  }
  if (rc == 0) printf("messages=%d size=%d mode=%s\n", MESSAGES, SIZE, advanced ? "advanced" : "vanilla");
  return rc;
}
