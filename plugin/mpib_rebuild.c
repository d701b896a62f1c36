/* Rail rebuild: a failed rail's QPs forced to the error state, then reset and reconnected to
 * the peer's same QPs (on a thread of their own). Called by failover (mpib_failover.c); offers
 * what mpib_rebuild.h declares; calls comm setup's QP helpers (the lanes' GID refresh among
 * them) and the verbs shims' neighbour warm-up. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "mpib.h"
#include "mpib_qp.h"
#include "mpib_rebuild.h"
#include "mpib_verbs.h"

/* Forces the rail's QPs into the error state, each on a lane whose device lives
 * (mpib_rail_qps_to_error). */
int mpib_rail_to_error(struct mpib_comm *c, int r) { return mpib_rail_qps_to_error(c, r); }

/* Brings a failed rail's QPs back: RESET, INIT, then RTR/RTS against the same remote QPs
 * (the peer does the same with the same psn). */
int mpib_rail_reconnect(struct mpib_comm *c, int r, uint32_t psn) {
  for (int i = 0; i < mpib_lane_count(c, r); i++) {
    int l = mpib_lane(r, i);
    if (c->nic[l]->link_layer != IBV_LINK_LAYER_ETHERNET) continue;
    int rc = mpib_lane_gid_refresh(c, l);
    if (rc) return rc;
    mpib_neigh_warm(c->rem_rail[l].gid); /* a link that went down flushed the entry */
  }
  for (uint32_t i = 0; i < c->nqps[r]; i++) {
    const struct mpib_qp *q = &c->qps[mpib_rail_base(c, r) + i];
    int rc = mpib_qp_reset_to_init(c, q->qp, q->lane, MPIB_DATA_QP_ACCESS);
    if (rc) return rc;
    rc = mpib_qp_connect(c, q->qp, q->lane, c->rem_rail[r].qpn[i], &c->rem_rail[q->lane], c->rail_mtu[q->lane],
                         mpib_qp_traffic_class(c), psn);
    if (rc) return rc;
  }
  return 0;
}

static void *rebuild_main(void *arg) {
  struct mpib_rebuild *b = arg;
  b->err = mpib_rail_reconnect(b->comm, b->rail, b->psn);
  __atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Rebuilds rail r's QPs (mpib_rail_reconnect) on a thread of its own. On RoCE the RTR
 * transition waits inside the kernel for the peer's MAC, up to the neighbour timeout (1 s,
 * right after a link came back), and the caller is NCCL's progress thread,
 * which meanwhile drives every other transfer of the process, this connection's surviving
 * rail included. net_ib rebuilds in the progress thread. The data path leaves the rail alone
 * until mpib_rail_rebuild_poll says it is done: the rail is DOWN, so nothing is posted on its
 * QPs and its CQ is not polled. 0, or -errno when no thread could be started. */
int mpib_rail_rebuild_start(struct mpib_comm *c, int r, uint32_t psn) {
  struct mpib_rebuild *b = &c->rail[r].rebuild;
  *b = (struct mpib_rebuild){.comm = c, .rail = r, .psn = psn};
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old); /* inherited: process signals keep going to NCCL's threads */
  int e = pthread_create(&b->thread, NULL, rebuild_main, b);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (e) return -e;
  b->running = 1;
  return 0;
}

/* 1 once the rebuild started on rail r has finished (its thread joined, its result in *err),
 * 0 while it still runs. */
int mpib_rail_rebuild_poll(struct mpib_comm *c, int r, int *err) {
  struct mpib_rebuild *b = &c->rail[r].rebuild;
  if (b->running && !__atomic_load_n(&b->done, __ATOMIC_ACQUIRE)) return 0;
  if (b->running) pthread_join(b->thread, NULL);
  b->running = 0;
  *err = b->err;
  return 1;
}
