//go:build ignore
// link: ../mpib_comm.c

/* Comm setup (mpib_comm.c unchanged) on FAKE verbs: two NICs (SOUT and one SUP port) whose GID
 * tables, port state, LID and QP transitions the test sets.
 *   - flush loopback: a receiver with flush on is built on a SUP port that is down at init
 *     (an InfiniBand port never given a LID, a RoCE port whose loopback cannot connect): that
 *     lane's flush QP stays in INIT, marked broken (its first read connects it), and the comm
 *     exists; a port that is up and addressed and cannot connect still fails the comm;
 *   - GID refresh: after a port flap moves a RoCE lane's GID, the lane finds its address again
 *     with the RoCE version it was set up with (v1 as well as v2: a v1-only port, a v1 twin
 *     beside the v2 one, v1 read as type IB by older libraries), never beyond index 255. */
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

static struct mpib_comm *recv_comm(void) {
  struct mpib_conn_params p = {.dev = 0, .is_send = 0, .nqps = {1, 1}, .sup_lanes = 1};
  return mpib_comm_create(&p);
}

/* ---- Flush loopback on a port down at init ---- */
static void flush_case(const char *name, int link_layer, int sup_down, uint16_t sup_lid, int sup_rtr_err,
                       int want_comm) {
  devices(link_layer);
  mpib_g.nic[1].port_down = sup_down;
  mpib_g.nic[1].lid = sup_lid;
  rtr_fails[1] = sup_rtr_err;
  struct mpib_comm *c = recv_comm();
  CHECK((c != NULL) == want_comm, "flush, %s: comm %s, want %s", name, c ? "built" : "failed",
        want_comm ? "built" : "failed");
  if (c == NULL || !want_comm) {
    mpib_comm_destroy(c);
    return;
  }
  int sup = MPIB_RAIL_SUP;
  CHECK(c->flush_qp[0]->state == IBV_QPS_RTS && !c->flush_broken[0], "flush, %s: SOUT's flush QP state %d broken %d",
        name, c->flush_qp[0]->state, c->flush_broken[0]);
  CHECK(c->flush_qp[sup] != NULL && c->flush_qp[sup]->state == IBV_QPS_INIT && c->flush_broken[sup],
        "flush, %s: SUP's flush QP %p state %d broken %d, want kept in INIT and broken (its first read connects it)",
        name, (void *)c->flush_qp[sup], c->flush_qp[sup] ? (int)c->flush_qp[sup]->state : -1, c->flush_broken[sup]);
  mpib_comm_destroy(c);
}

static void flush_tests(void) {
  const int IB = IBV_LINK_LAYER_INFINIBAND, ROCE = IBV_LINK_LAYER_ETHERNET;
  flush_case("InfiniBand SUP port down, LID 0", IB, 1, 0, 0, 1);
  flush_case("InfiniBand SUP port reported up, still LID 0", IB, 0, 0, 0, 1);
  flush_case("RoCE SUP port down, loopback RTR refused", ROCE, 1, 0, ENETUNREACH, 1);
  flush_case("InfiniBand SUP port up with a LID, RTR refused", IB, 0, 11, EINVAL, 0);
  flush_case("RoCE SUP port up, loopback RTR refused", ROCE, 0, 0, ENETUNREACH, 0);
  /* all ports up: both flush QPs connected */
  devices(IB);
  struct mpib_comm *c = recv_comm();
  CHECK(c && c->flush_qp[1]->state == IBV_QPS_RTS && !c->flush_broken[1], "flush, every port up: SUP's flush QP");
  mpib_comm_destroy(c);
}

/* ---- GID refresh after a port flap (RoCE, SOUT's lane 0) ---- */
struct gid_slot {
  int index, addr, type; /* addr: the last byte of 10.0.0.addr (IPv4-mapped) */
};
static void gid_set(int nic, const struct gid_slot *slots) {
  for (int i = 1; i < TBL; i++) gid_types[nic][i] = -1;
  for (const struct gid_slot *s = slots; s->index > 0; s++) {
    uint8_t g[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, (uint8_t)s->addr};
    memcpy(gids[nic][s->index], g, 16);
    gid_types[nic][s->index] = s->type;
  }
}

static void refresh_tests(void) {
  const int V1 = IBV_GID_TYPE_ROCE_V1, V2 = IBV_GID_TYPE_ROCE_V2, IBT = IBV_GID_TYPE_IB;
  struct {
    const char *name;
    struct gid_slot before[4];
    int index; /* the lane's index at setup */
    struct gid_slot after[4];
    int want_rc, want_index;
  } tests[] = {
      {"v2 lane, its GID moved", {{2, 5, V1}, {3, 5, V2}}, 3, {{4, 5, V1}, {5, 5, V2}}, 0, 5},
      {"v1 lane (ROCE_VERSION_NUM=1), v2 twin first", {{2, 5, V1}, {3, 5, V2}}, 2, {{4, 5, V2}, {5, 5, V1}}, 0, 5},
      {"v1-only port", {{2, 5, V1}}, 2, {{6, 5, V1}}, 0, 6},
      {"v1 lane, the twins swapped at its index", {{2, 5, V1}, {3, 5, V2}}, 2, {{2, 5, V2}, {3, 5, V1}}, 0, 3},
      {"v1 read as type IB (older library)", {{2, 5, IBT}, {3, 5, V2}}, 2, {{4, 5, V2}, {7, 5, IBT}}, 0, 7},
      {"nothing moved", {{2, 5, V1}, {3, 5, V2}}, 2, {{2, 5, V1}, {3, 5, V2}}, 0, 2},
      {"v1 lane, only the v2 twin back", {{2, 5, V1}, {3, 5, V2}}, 2, {{4, 5, V2}}, -EADDRNOTAVAIL, 2},
      {"back only beyond index 255", {{2, 5, V2}}, 2, {{300, 5, V2}}, -EADDRNOTAVAIL, 2},
      {"another address at its index", {{2, 5, V2}}, 2, {{2, 6, V2}, {9, 5, V2}}, 0, 9},
  };
  for (size_t t = 0; t < sizeof tests / sizeof tests[0]; t++) {
    devices(IBV_LINK_LAYER_ETHERNET);
    mpib_g.flush_enabled = 0;
    gid_set(0, tests[t].before);
    struct mpib_conn_params p = {.dev = 0, .is_send = 1, .nqps = {1, 0}, .gid_index = {tests[t].index, 0}};
    struct mpib_comm *c = mpib_comm_create(&p);
    CHECK(c != NULL, "refresh, %s: no comm", tests[t].name);
    if (c == NULL) continue;
    gid_set(0, tests[t].after);
    int rc = mpib_lane_gid_refresh(c, 0);
    CHECK(rc == tests[t].want_rc && c->gid_index[0] == tests[t].want_index,
          "refresh, %s: rc %d index %d, want rc %d index %d", tests[t].name, rc, c->gid_index[0], tests[t].want_rc,
          tests[t].want_index);
    mpib_comm_destroy(c);
  }
}

int main(void) {
  flush_tests();
  refresh_tests();
  if (failures == 0) printf("comm_setup: ok\n");
  return failures != 0;
}
