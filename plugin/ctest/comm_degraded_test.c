//go:build ignore
// link: ../mpib_comm.c

/* A degraded start on FAKE verbs (comm_stubs.h's fakes, mpib_comm.c unchanged): a rail whose
 * first QP reaches RTS and whose second cannot reach RTR (on a striped rail, the other port's
 * peer address does not resolve) starts DOWN, and the QP that came up must be in the error
 * state: a QP in RTS on a rail out of service would take the peer's writes, whose completions
 * the receiver drops, with nothing to fence them. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_comm.h"
#include "../mpib_qp.h"

#include "check.h"

#include "comm_stubs.h"

static struct mpib_comm *comm(int is_send) {
  struct mpib_conn_params p = {.dev = 0, .is_send = is_send, .nqps = {1, 2}, .sup_lanes = 1};
  return mpib_comm_create(&p);
}

int main(void) {
  for (int is_send = 0; is_send < 2; is_send++) {
    devices(IBV_LINK_LAYER_ETHERNET);
    mpib_g.failover = 1;
    struct mpib_comm *c = comm(is_send), *peer = comm(!is_send);
    CHECK(c && peer, "comms built");
    if (!c || !peer) return 1;
    struct mpib_conn_info info;
    mpib_comm_local_info(peer, &info);
    int base = mpib_rail_base(c, MPIB_RAIL_SUP);
    rtr_fails_qpn = c->qps[base + 1].qp->qp_num; /* SUP's second QP cannot reach RTR */
    int rc = mpib_comm_connect(c, &info);
    enum ibv_qp_state first = c->qps[base].qp->state;
    CHECK(rc == 0 && c->rail[MPIB_RAIL_SUP].state == MPIB_RAIL_DOWN && c->rail[MPIB_RAIL_SOUT].state == MPIB_RAIL_UP,
          "%s: the connection starts degraded with SUP DOWN (rc %d, SUP state %d)", is_send ? "sender" : "receiver", rc,
          c->rail[MPIB_RAIL_SUP].state);
    CHECK(first == IBV_QPS_ERR,
          "%s: SUP's first QP reached RTS before its second failed: on a DOWN rail it must be in IBV_QPS_ERR, is in "
          "state %d",
          is_send ? "sender" : "receiver", (int)first);
    CHECK(c->qps[0].qp->state == IBV_QPS_RTS, "SOUT's QP is in service");
    printf("comm-degraded: side=%s sup_state=%s first_sup_qp_state=%d\n", is_send ? "send" : "recv",
           mpib_rail_state_name(c->rail[MPIB_RAIL_SUP].state), (int)first);
    mpib_comm_destroy(c);
    mpib_comm_destroy(peer);
  }
  return failures ? 1 : 0;
}
