/* Verbs setup and teardown, driven by the Go control plane. Functions return 0 or -errno. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpib.h"
#include "mpib_shm.h"

struct mpib_global mpib_g = {.force_sup_bw = MPIB_NO_OVERRIDE};

void mpib_set_shm(void *shm) { __atomic_store_n(&mpib_g.shm, shm, __ATOMIC_RELEASE); }

static const char *rail_name(int rail) { return rail == MPIB_RAIL_SOUT ? "SOUT" : "SUP"; }

static int mtu_bytes(enum ibv_mtu m) { return 128 << (m - 1); }

/* Mbps from the port's active speed and width encodings (as net_ib reads them). */
static int port_speed_mbps(const struct ibv_port_attr *pa) {
  int lane;
  switch (pa->active_speed) {
  case 1: lane = 2500; break;
  case 2: lane = 5000; break;
  case 4: case 8: lane = 10000; break;
  case 16: lane = 14000; break;
  case 32: lane = 25000; break;
  case 64: lane = 50000; break;
  case 128: lane = 100000; break;
  default: lane = 10000; break;
  }
  int width;
  switch (pa->active_width) {
  case 1: width = 1; break;
  case 2: width = 4; break;
  case 4: width = 8; break;
  case 8: width = 12; break;
  case 16: width = 2; break;
  default: width = 1; break;
  }
  return lane * width;
}

/* The RoCE v2 IPv4-mapped GID, like net_ib's auto-selection; -1 when none exists. */
static int find_rocev2_ipv4_gid(struct ibv_context *ctx, uint8_t port, int table_len) {
  for (int i = 0; i < table_len; i++) {
    struct ibv_gid_entry e;
    if (ibv_query_gid_ex(ctx, port, i, &e, 0) != 0) continue; /* empty or hidden entry */
    if (e.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
    const uint8_t *g = e.gid.raw;
    int v4mapped = 1;
    for (int k = 0; k < 10; k++) v4mapped &= g[k] == 0;
    v4mapped &= g[10] == 0xff && g[11] == 0xff;
    if (v4mapped) return i;
  }
  return -1;
}

int mpib_dev_open(int rail, const char *name, int port, int gid_index) {
  struct mpib_dev *d = &mpib_g.dev[rail];
  int n = 0, rc = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  if (list == NULL) n = 0; /* no RDMA subsystem at all: NULL + ENOSYS, same as zero devices */
  struct ibv_device *found = NULL;
  for (int i = 0; i < n; i++) {
    if (strcmp(ibv_get_device_name(list[i]), name) == 0) found = list[i];
  }
  if (found == NULL) {
    MPIB_WARN("%s HCA '%s' not found (%d RDMA devices visible)", rail_name(rail), name, n);
    rc = -ENODEV;
    goto out;
  }
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->ctx = ibv_open_device(found);
  if (d->ctx == NULL) {
    rc = errno ? -errno : -EIO;
    MPIB_WARN("%s HCA %s: ibv_open_device failed: %s", rail_name(rail), name, strerror(-rc));
    goto out;
  }
  struct ibv_port_attr pa;
  d->port = (uint8_t)port;
  if ((rc = ibv_query_port(d->ctx, d->port, &pa)) != 0) {
    MPIB_WARN("%s HCA %s: port %d cannot be queried: %s", rail_name(rail), name, port, strerror(rc));
    rc = -rc;
    goto fail;
  }
  if (pa.state != IBV_PORT_ACTIVE) {
    MPIB_WARN("%s HCA %s port %d is not active (state %d)", rail_name(rail), name, port, pa.state);
    rc = -ENETDOWN;
    goto fail;
  }
  d->link_layer = pa.link_layer;
  d->active_mtu = pa.active_mtu;
  d->lid = pa.lid;
  d->speed_mbps = port_speed_mbps(&pa);
  d->gid_index = gid_index >= 0 ? gid_index : find_rocev2_ipv4_gid(d->ctx, d->port, pa.gid_tbl_len);
  if (d->link_layer == IBV_LINK_LAYER_INFINIBAND && d->gid_index < 0) d->gid_index = 0;
  if (d->gid_index < 0) {
    MPIB_WARN("%s HCA %s port %d has no RoCE v2 IPv4 GID (set MPIB_GID_INDEX)", rail_name(rail), name, port);
    rc = -EADDRNOTAVAIL;
    goto fail;
  }
  if ((rc = ibv_query_gid(d->ctx, d->port, d->gid_index, &d->gid)) != 0) {
    MPIB_WARN("%s HCA %s: GID index %d unreadable", rail_name(rail), name, d->gid_index);
    rc = -EINVAL;
    goto fail;
  }
  d->pd = ibv_alloc_pd(d->ctx);
  if (d->pd == NULL) {
    rc = -ENOMEM;
    MPIB_WARN("%s HCA %s: ibv_alloc_pd failed", rail_name(rail), name);
    goto fail;
  }
  MPIB_INFO("%s rail: %s port %d GID index %d MTU %d speed %d Mbps", rail_name(rail), name, port,
            d->gid_index, mtu_bytes(d->active_mtu), d->speed_mbps);
  mpib_g.ndevs_open++;
  goto out;
fail:
  ibv_close_device(d->ctx);
  d->ctx = NULL;
out:
  if (list) ibv_free_device_list(list);
  return rc;
}

void mpib_dev_close_all(void) {
  for (int r = 0; r < MPIB_NRAILS; r++) {
    struct mpib_dev *d = &mpib_g.dev[r];
    if (d->pd) ibv_dealloc_pd(d->pd);
    if (d->ctx) ibv_close_device(d->ctx);
    memset(d, 0, sizeof *d);
  }
  mpib_g.ndevs_open = 0;
}

/* DMA-BUF is supported when the provider does not reject ibv_reg_dmabuf_mr outright. */
int mpib_dmabuf_supported(void) {
  struct ibv_mr *mr = ibv_reg_dmabuf_mr(mpib_g.dev[0].pd, 0, 0, 0, -1, 0);
  if (mr) {
    ibv_dereg_mr(mr);
    return 1;
  }
  return errno != EOPNOTSUPP && errno != EPROTONOSUPPORT;
}

static struct ibv_qp *create_rc_qp(int rail, struct ibv_cq *cq, struct ibv_srq *srq, int send_wr) {
  struct ibv_qp_init_attr ia = {0};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.srq = srq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = send_wr;
  ia.cap.max_recv_wr = srq ? 0 : 4;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  struct ibv_qp *qp = ibv_create_qp(mpib_g.dev[rail].pd, &ia);
  if (qp == NULL) return NULL;
  struct ibv_qp_attr a = {0};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = mpib_g.dev[rail].port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    ibv_destroy_qp(qp);
    return NULL;
  }
  return qp;
}

/* INIT -> RTR -> RTS against a remote QP. */
static int qp_connect(struct ibv_qp *qp, int rail, uint32_t rem_qpn, const uint8_t *rem_gid,
                      enum ibv_mtu mtu) {
  struct mpib_dev *d = &mpib_g.dev[rail];
  struct ibv_qp_attr a = {0};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = mtu;
  a.dest_qp_num = rem_qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  memcpy(a.ah_attr.grh.dgid.raw, rem_gid, 16);
  a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
  a.ah_attr.grh.hop_limit = 255;
  a.ah_attr.grh.traffic_class = mpib_g.ib_tc;
  a.ah_attr.sl = mpib_g.ib_sl;
  a.ah_attr.port_num = d->port;
  int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc) return -rc;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = mpib_g.ib_timeout;
  a.retry_cnt = mpib_g.ib_retry_cnt;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  return -rc;
}

static struct ibv_mr *reg_local(int rail, void *addr, size_t len) {
  return ibv_reg_mr(mpib_g.dev[rail].pd, addr, len,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
}

/* Loopback QP used by iflush: an RDMA_READ through the NIC orders prior GPU writes. */
static int flush_setup(struct mpib_comm *c, int rail) {
  c->flush_cq[rail] = ibv_create_cq(mpib_g.dev[rail].ctx, 64, NULL, NULL, 0);
  if (!c->flush_cq[rail]) return -ENOMEM;
  c->flush_qp[rail] = create_rc_qp(rail, c->flush_cq[rail], NULL, 64);
  if (!c->flush_qp[rail]) return -ENOMEM;
  c->flush_mr[rail] = reg_local(rail, c->flush_buf, sizeof c->flush_buf);
  if (!c->flush_mr[rail]) return -ENOMEM;
  struct mpib_dev *d = &mpib_g.dev[rail];
  return qp_connect(c->flush_qp[rail], rail, c->flush_qp[rail]->qp_num, d->gid.raw, d->active_mtu);
}

static int rail_setup(struct mpib_comm *c, int rail) {
  struct mpib_dev *d = &mpib_g.dev[rail];
  c->cq[rail] = ibv_create_cq(d->ctx, MPIB_CQ_DEPTH, NULL, NULL, 0);
  if (!c->cq[rail]) return -ENOMEM;
  c->cts_mr[rail] = reg_local(rail, c->cts, sizeof c->cts);
  c->sizes_mr[rail] = reg_local(rail, c->sizes, sizeof c->sizes);
  if (!c->cts_mr[rail] || !c->sizes_mr[rail]) return -ENOMEM;
  if (!c->is_send) {
    struct ibv_srq_init_attr sa = {0};
    sa.attr.max_wr = MPIB_SRQ_DEPTH;
    sa.attr.max_sge = 1;
    c->srq[rail] = ibv_create_srq(d->pd, &sa);
    if (!c->srq[rail]) return -ENOMEM;
    int rc = mpib_srq_refill(c, rail);
    if (rc) return rc;
  }
  /* A send QP holds, per slot, up to MPIB_MAX_RECVS writes plus the final write-with-imm. */
  int send_wr = MPIB_MAX_REQUESTS * (MPIB_MAX_RECVS + 1) + 8;
  int base = rail == MPIB_RAIL_SOUT ? 0 : (int)c->nqps[MPIB_RAIL_SOUT];
  for (uint32_t i = 0; i < c->nqps[rail]; i++) {
    struct ibv_qp *qp = create_rc_qp(rail, c->cq[rail], c->srq[rail], send_wr);
    if (!qp) {
      MPIB_WARN("%s rail: ibv_create_qp failed: %s", rail_name(rail), strerror(errno));
      return errno ? -errno : -ENOMEM;
    }
    c->qps[base + i].qp = qp;
    c->qps[base + i].rail = rail;
  }
  if (!c->is_send && mpib_g.flush_enabled) return flush_setup(c, rail);
  return 0;
}

struct mpib_comm *mpib_comm_create(int is_send, int mode, int path_class, const uint32_t nqps[MPIB_NRAILS]) {
  struct mpib_comm *c = NULL;
  if (posix_memalign((void **)&c, 4096, sizeof *c) != 0) return NULL;
  memset(c, 0, sizeof *c);
  c->is_send = is_send;
  c->mode = mode;
  c->path_class = path_class;
  c->sup_relay = mpib_g.sup_relay;
  c->cts_rail = mpib_cts_rail(mode, path_class);
  c->force_sup_bw = mpib_g.force_sup_bw;
  c->shm_slot = -1;
  for (int r = 0; r < MPIB_NRAILS; r++) c->nqps[r] = nqps[r];
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (c->nqps[r] == 0) continue;
    int rc = rail_setup(c, r);
    if (rc) {
      MPIB_WARN("%s rail: connection setup failed: %s", rail_name(r), strerror(-rc));
      mpib_comm_destroy(c);
      return NULL;
    }
  }
  return c;
}

void mpib_comm_local_info(struct mpib_comm *c, struct mpib_conn_info *info) {
  memset(info, 0, sizeof *info);
  info->buf_addr = c->is_send ? (uint64_t)(uintptr_t)c->cts : (uint64_t)(uintptr_t)c->sizes;
  int base = 0;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    info->nqps[r] = c->nqps[r];
    if (c->nqps[r] == 0) continue;
    memcpy(info->rail[r].gid, mpib_g.dev[r].gid.raw, 16);
    info->rail[r].mtu = mpib_g.dev[r].active_mtu;
    info->rail[r].rkey = c->is_send ? c->cts_mr[r]->rkey : c->sizes_mr[r]->rkey;
    for (uint32_t i = 0; i < c->nqps[r]; i++) info->rail[r].qpn[i] = c->qps[base + i].qp->qp_num;
    base += (int)c->nqps[r];
  }
}

int mpib_comm_connect(struct mpib_comm *c, const struct mpib_conn_info *remote) {
  c->rem_addr = remote->buf_addr;
  int base = 0;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (c->nqps[r] == 0) continue;
    if (remote->nqps[r] != c->nqps[r]) return -EPROTO;
    c->rem_rkey[r] = remote->rail[r].rkey;
    enum ibv_mtu mtu = mpib_g.dev[r].active_mtu;
    if ((enum ibv_mtu)remote->rail[r].mtu < mtu) mtu = (enum ibv_mtu)remote->rail[r].mtu;
    for (uint32_t i = 0; i < c->nqps[r]; i++) {
      int rc = qp_connect(c->qps[base + i].qp, r, remote->rail[r].qpn[i], remote->rail[r].gid, mtu);
      if (rc) {
        MPIB_WARN("%s rail: QP %u to remote QP %u cannot reach RTS: %s", rail_name(r),
                  c->qps[base + i].qp->qp_num, remote->rail[r].qpn[i], strerror(-rc));
        return rc;
      }
    }
    base += (int)c->nqps[r];
  }
  return 0;
}

void mpib_comm_destroy(struct mpib_comm *c) {
  if (!c) return;
  if (c->shm_slot >= 0 && mpib_g.shm) mpib_shm_release((mpib_shm *)mpib_g.shm, (uint32_t)c->shm_slot);
  for (int i = 0; i < MPIB_MAX_QPS; i++) {
    if (c->qps[i].qp) ibv_destroy_qp(c->qps[i].qp);
  }
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (c->flush_qp[r]) ibv_destroy_qp(c->flush_qp[r]);
    if (c->flush_mr[r]) ibv_dereg_mr(c->flush_mr[r]);
    if (c->flush_cq[r]) ibv_destroy_cq(c->flush_cq[r]);
    if (c->srq[r]) ibv_destroy_srq(c->srq[r]);
    if (c->cts_mr[r]) ibv_dereg_mr(c->cts_mr[r]);
    if (c->sizes_mr[r]) ibv_dereg_mr(c->sizes_mr[r]);
    if (c->cq[r]) ibv_destroy_cq(c->cq[r]);
  }
  free(c);
}

int mpib_reg_mr(void *data, size_t size, int fd, uint64_t offset, struct mpib_mr **out) {
  struct mpib_mr *mh = calloc(1, sizeof *mh);
  if (!mh) return -ENOMEM;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (mpib_g.relaxed_ordering) access |= IBV_ACCESS_RELAXED_ORDERING;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    struct mpib_dev *d = &mpib_g.dev[r];
    if (!d->pd) continue;
    if (fd >= 0) {
      mh->mr[r] = ibv_reg_dmabuf_mr(d->pd, offset, size, (uint64_t)(uintptr_t)data, fd, access);
    } else {
      mh->mr[r] = ibv_reg_mr_iova2(d->pd, data, size, (uint64_t)(uintptr_t)data, (unsigned)access);
    }
    if (!mh->mr[r]) {
      int rc = errno ? -errno : -ENOMEM;
      MPIB_WARN("%s rail: memory registration of %zu bytes at %p failed: %s", rail_name(r), size, data,
                strerror(-rc));
      mpib_dereg_mr(mh);
      return rc;
    }
  }
  *out = mh;
  return 0;
}

int mpib_dereg_mr(struct mpib_mr *mh) {
  int rc = 0;
  if (!mh) return 0;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (mh->mr[r] && ibv_dereg_mr(mh->mr[r])) rc = -EIO;
  }
  free(mh);
  return rc;
}
