//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_shm_*.c

/* A rail already out of service (DOWN, its rebuild thread moving its QPs) is failed again: a
 * sender's replays wait for room on SOUT while SUP rebuilds, and SOUT's device dies before the
 * health check takes it out, so the replay path finds no usable rail and fails SUP. Nothing may
 * be fenced again (its QPs forced to the error state beside the rebuild thread, and a FAIL of
 * the generation the rebuild's RECOVER will announce): SUP stays DOWN with its rebuild, and the
 * connection stalls for a rail to come back. On FAKE verbs. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_failover.h"
#include "../mpib_p2p.h"

#include "check.h"

struct mpib_global mpib_g;
ncclProfilerCallback_t mpib_prof_fn;
static uint64_t fake_now = 1000000000ull;
uint64_t mpib_now_ns(void) { return fake_now += 1000; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line, (void)fmt;
}
#include "p2p_stubs.h"

static struct ibv_context ctx;
static struct ibv_qp qp[MPIB_NRAILS];
static struct ibv_cq cq[MPIB_NRAILS];
static struct ibv_mr mr = {.lkey = 1, .rkey = 2};

int main(void) {
  fake_failover_defaults();
  stub_rebuild = STUB_REBUILD_RUNS;
  struct mpib_comm *c = fake_send_comm(&ctx, fake_post_taken, fake_poll_empty, qp, cq, &mr);
  c->ctrl_fd = open("/dev/null", O_WRONLY);
  c->rail[MPIB_RAIL_SUP].state = MPIB_RAIL_DOWN;
  c->rail[MPIB_RAIL_SUP].gen = 2;
  c->rail[MPIB_RAIL_SUP].rebuild.running = 1;
  mpib_g.nic[MPIB_RAIL_SOUT].fatal = 1; /* SOUT's device died; SOUT is still UP until the health check */
  ncclResult_t res = mpib_failover_rail_fail(c, MPIB_RAIL_SUP, "completion-error", "no rail left to replay on");
  CHECK(res == ncclSuccess && c->rail[MPIB_RAIL_SUP].state == MPIB_RAIL_DOWN &&
            c->rail[MPIB_RAIL_SUP].rebuild.running && c->rail[MPIB_RAIL_SUP].gen == 2 && c->stall_since_ns != 0,
        "failing a DOWN rail whose rebuild runs: want it left DOWN at generation 2 and the connection stalled, got "
        "res %d, state %d, rebuild running %d, generation %u, stall %llu",
        res, c->rail[MPIB_RAIL_SUP].state, c->rail[MPIB_RAIL_SUP].rebuild.running, c->rail[MPIB_RAIL_SUP].gen,
        (unsigned long long)c->stall_since_ns);
  printf("failover-out: rail=SUP state=%d stalled=%d\n", c->rail[MPIB_RAIL_SUP].state, c->stall_since_ns != 0);

  /* Without a ride-through (failover on, no control socket) the same call fails the
   * connection, still without fencing the rail. */
  struct mpib_comm *d = fake_send_comm(&ctx, fake_post_taken, fake_poll_empty, qp, cq, &mr);
  d->rail[MPIB_RAIL_SUP].state = MPIB_RAIL_DOWN;
  res = mpib_failover_rail_fail(d, MPIB_RAIL_SUP, "completion-error", "no rail left to replay on");
  CHECK(res == ncclRemoteError && d->rail[MPIB_RAIL_SUP].state == MPIB_RAIL_DOWN,
        "no ride-through: want ncclRemoteError with SUP left DOWN, got res %d, state %d", res,
        d->rail[MPIB_RAIL_SUP].state);
  close(c->ctrl_fd);
  c->ctrl_fd = -1;
  fake_comm_free(c);
  fake_comm_free(d);
  return failures ? 1 : 0;
}
