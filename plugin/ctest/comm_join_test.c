//go:build ignore
// link: ../mpib_comm.c

/* A connection's rails at connect on FAKE verbs (comm_stubs.h's fakes): a vanilla
 * intra-island sender defers its standby SOUT rail; when both ends then drop SUP (an
 * unaddressed pair whose addresses share no subnet, checkSupMetadata), no rail comes up and
 * one waits: mpib_comm_connect says MPIB_CONNECT_JOIN_NOW on both ends (the handshake joins
 * the standby before NCCL has the comm), and the join makes SOUT the CTS rail on both. */
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
  struct mpib_conn_params p = {.dev = 0, .is_send = is_send, .nqps = {1, 1}, .sup_lanes = 1, .defer_rails = is_send};
  return mpib_comm_create(&p);
}

/* Both ends' connect, with SUP dropped on both first when drop_sup (as checkSupMetadata does);
 * then, when both said MPIB_CONNECT_JOIN_NOW, the in-handshake join (joinStandbyNow). */
static void connect_case(const char *name, int drop_sup, int want_rc) {
  devices(IBV_LINK_LAYER_ETHERNET);
  mpib_g.failover = 1;
  struct mpib_comm *s = comm(1), *r = comm(0);
  CHECK(s && r, "%s: comms built", name);
  if (!s || !r) return;
  struct mpib_conn_info si, ri;
  mpib_comm_local_info(s, &si);
  mpib_comm_local_info(r, &ri);
  if (drop_sup) {
    mpib_comm_drop_rail(s, MPIB_RAIL_SUP);
    mpib_comm_drop_rail(r, MPIB_RAIL_SUP);
    si.nqps[MPIB_RAIL_SUP] = ri.nqps[MPIB_RAIL_SUP] = 0;
    si.sup_lanes = ri.sup_lanes = 0;
  }
  int src = mpib_comm_connect(s, &ri), rrc = mpib_comm_connect(r, &si);
  CHECK(src == want_rc && rrc == want_rc, "%s: connect: sender %d, receiver %d, want %d on both", name, src, rrc,
        want_rc);
  if (src == MPIB_CONNECT_JOIN_NOW && rrc == MPIB_CONNECT_JOIN_NOW) {
    struct mpib_join_info j;
    CHECK(mpib_comm_build_deferred(s, MPIB_RAIL_SOUT) == 0, "%s: sender builds its standby", name);
    mpib_comm_join_info(s, MPIB_RAIL_SOUT, &j);
    CHECK(mpib_comm_join_peer(r, MPIB_RAIL_SOUT, &j) == 0 && mpib_comm_join_now(r, MPIB_RAIL_SOUT) == 0,
          "%s: receiver joins", name);
    CHECK(mpib_comm_join_peer(s, MPIB_RAIL_SOUT, NULL) == 0 && mpib_comm_join_now(s, MPIB_RAIL_SOUT) == 0,
          "%s: sender joins", name);
  }
  struct mpib_comm *both[2] = {s, r};
  for (int i = 0; i < 2; i++) {
    struct mpib_comm *c = both[i];
    int cts = c->cts_rail;
    CHECK(c->nqps[cts] > 0 && c->rail[cts].state == MPIB_RAIL_UP && c->qps[mpib_rail_base(c, cts)].qp &&
              c->qps[mpib_rail_base(c, cts)].qp->state == IBV_QPS_RTS,
          "%s: %s's CTS rail %d (%u QPs, state %d) is not up: the comm would reach NCCL with no live rail", name,
          i == 0 ? "sender" : "receiver", cts, c->nqps[cts], c->rail[cts].state);
  }
  mpib_comm_destroy(s);
  mpib_comm_destroy(r);
}

int main(void) {
  connect_case("SUP up, standby deferred", 0, 0);
  connect_case("unaddressed SUP dropped on both ends, standby deferred", 1, MPIB_CONNECT_JOIN_NOW);
  if (failures == 0) printf("comm_join: ok\n");
  return failures != 0;
}
