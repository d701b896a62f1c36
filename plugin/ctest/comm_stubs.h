/* FAKE verbs for the C tests that link comm setup (mpib_comm.c) alone: two NICs of fused
 * device 0 (NIC 0 SOUT, NIC 1 its one SUP port) whose GID tables, port state, LID and QP
 * transitions the test sets, and what mpib_comm.c needs from the rest of the plugin. Defines
 * them: include it in one file of the program, after the system headers. */
#ifndef MPIB_CTEST_COMM_STUBS_H
#define MPIB_CTEST_COMM_STUBS_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_comm.h"
#include "../mpib_qp.h"

struct mpib_global mpib_g;
uint64_t mpib_now_ns(void) { return 5000000000ull; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line, (void)fmt;
}
uint64_t *mpib_path_progress(const void *nic, const uint8_t gid[16]) { return (void)nic, (void)gid, NULL; }
int mpib_neigh_warm(const uint8_t gid[16]) { return (void)gid, 0; }
int mpib_ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece) { return (void)qp, (void)ece, EOPNOTSUPP; }
int mpib_ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece) { return (void)qp, (void)ece, EOPNOTSUPP; }

/* ---- Fake NICs: NIC n's context is ctx[n]; its GID table is gids[n] (type -1: empty). ---- */
#define NNICS 2
#define TBL 320
static struct ibv_context ctx[NNICS];
static struct ibv_pd pd[NNICS];
static uint8_t gids[NNICS][TBL][16];
static int gid_types[NNICS][TBL];
static int rtr_fails[NNICS];   /* errno a QP's RTR transition fails with on this NIC (0: it works) */
static uint32_t rtr_fails_qpn; /* and the one QP (its number) whose RTR fails with EHOSTUNREACH (0: none) */

static int nic_of(const struct ibv_context *c) { return (int)(c - ctx); }

int mpib_nic_gid_entry(const struct mpib_nic *d, int index, uint8_t gid[16], int *type) {
  int n = nic_of(d->ctx);
  if (index < 0 || index >= TBL || gid_types[n][index] < 0) return -1;
  memcpy(gid, gids[n][index], 16);
  *type = gid_types[n][index];
  return 0;
}
int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid) {
  (void)port;
  if (index < 0 || index >= TBL) return EINVAL;
  memcpy(gid->raw, gids[nic_of(c)][index], 16);
  return 0;
}

static int fake_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  return (void)srq, (void)wr, *bad = NULL, 0;
}
struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *cq_context, struct ibv_comp_channel *channel,
                             int comp_vector) {
  (void)cqe, (void)cq_context, (void)channel, (void)comp_vector;
  struct ibv_cq *cq = calloc(1, sizeof *cq);
  cq->context = c;
  return cq;
}
int ibv_destroy_cq(struct ibv_cq *cq) { return free(cq), 0; }
struct ibv_srq *ibv_create_srq(struct ibv_pd *p, struct ibv_srq_init_attr *attr) {
  (void)attr;
  struct ibv_srq *srq = calloc(1, sizeof *srq);
  srq->context = p->context;
  return srq;
}
int ibv_destroy_srq(struct ibv_srq *srq) { return free(srq), 0; }
static uint32_t next_qpn = 100;
struct ibv_qp *ibv_create_qp(struct ibv_pd *p, struct ibv_qp_init_attr *attr) {
  struct ibv_qp *qp = calloc(1, sizeof *qp);
  qp->context = p->context;
  qp->pd = p;
  qp->send_cq = attr->send_cq;
  qp->qp_num = next_qpn++;
  qp->state = IBV_QPS_RESET;
  return qp;
}
int ibv_destroy_qp(struct ibv_qp *qp) { return free(qp), 0; }
int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
  if (!(mask & IBV_QP_STATE)) return 0;
  if (attr->qp_state == IBV_QPS_RTR && rtr_fails[nic_of(qp->context)]) return rtr_fails[nic_of(qp->context)];
  if (attr->qp_state == IBV_QPS_RTR && rtr_fails_qpn && qp->qp_num == rtr_fails_qpn) return EHOSTUNREACH;
  qp->state = attr->qp_state;
  return 0;
}
static struct ibv_mr *fake_mr(struct ibv_pd *p) {
  struct ibv_mr *mr = calloc(1, sizeof *mr);
  mr->context = p->context;
  return mr;
}
#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *p, void *addr, size_t len, int access) {
  return (void)addr, (void)len, (void)access, fake_mr(p);
}
struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *p, void *addr, size_t len, uint64_t iova, unsigned int access) {
  return (void)addr, (void)len, (void)iova, (void)access, fake_mr(p);
}
int ibv_dereg_mr(struct ibv_mr *mr) { return free(mr), 0; }

/* ---- The device: NIC 0 is SOUT, NIC 1 the SUP port, fused device 0. ---- */
static void devices(int link_layer) {
  memset(&mpib_g, 0, sizeof mpib_g);
  memset(rtr_fails, 0, sizeof rtr_fails);
  rtr_fails_qpn = 0;
  for (int n = 0; n < NNICS; n++) {
    ctx[n].ops.post_srq_recv = fake_post_srq_recv;
    pd[n].context = &ctx[n];
    for (int i = 0; i < TBL; i++) gid_types[n][i] = -1;
    struct mpib_nic *d = &mpib_g.nic[n];
    snprintf(d->name, sizeof d->name, "fake%d", n);
    d->role = n, d->ctx = &ctx[n], d->pd = &pd[n], d->port = 1, d->gid_tbl_len = TBL;
    d->active_mtu = IBV_MTU_4096, d->link_layer = link_layer, d->lid = (uint16_t)(10 + n);
    /* index 0: the port's GID (InfiniBand: subnet prefix and GUID; RoCE: an IPv4-mapped address) */
    uint8_t g[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, (uint8_t)(1 + n)};
    if (link_layer == IBV_LINK_LAYER_ETHERNET) g[0] = 0, g[1] = 0, g[10] = 0xff, g[11] = 0xff, g[12] = 10;
    memcpy(gids[n][0], g, 16);
    gid_types[n][0] = link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB;
  }
  mpib_g.nnics = NNICS;
  mpib_g.fdev[0] = (struct mpib_fdev){.sout_nic = 0, .nsup = 1, .sup_nic = {1}};
  mpib_g.nfdevs = 1;
  mpib_g.flush_enabled = 1;
}

#endif
