/* Comm setup: a connection's verbs resources on its fused device's NICs (CQs, SRQs, QPs, the
 * CTS and size area, the flush loopback), bringing them up against the peer's, adding or
 * dropping a rail, and teardown. Called by the Go control plane (mpib_comm.h, whose
 * mpib_comm_close ends every comm here) and by rail rebuild and the flush (the QP helpers of
 * mpib_qp.h); calls only the NICs' functions, path progress and the verbs shims. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mpib.h"
#include "mpib_clock.h"
#include "mpib_comm.h"
#include "mpib_device.h"
#include "mpib_progress.h"
#include "mpib_qp.h"
#include "mpib_srq.h"
#include "mpib_verbs.h"

/* Inline data lets the NIC take small payloads (CTS elements) from the work request itself
 * instead of a second DMA read (NCCL_IB_USE_INLINE). Only the receiver's QPs send inline (its
 * CTS writes). Asking for inline room widens every send queue entry, whether it is used or not:
 * 64 bytes take an mlx5 WQE from one 64-byte block to two, and an rxe entry from 256 to 512
 * bytes. The sender's send queues are the largest rings of a connection, so its QPs ask
 * for none. */
#define MPIB_MAX_INLINE sizeof(struct mpib_cts) /* one CTS element, as net_ib */

/* max_inline (NULL: none) asks for that much inline room and returns what the device gave: the
 * provider writes the QP's real capabilities back into the attributes. */
static struct ibv_qp *create_rc_qp(const struct mpib_comm *c, int lane, struct ibv_cq *cq, struct ibv_srq *srq,
                                   int send_wr, uint32_t *max_inline, int access) {
  struct ibv_qp_init_attr ia = {0};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.srq = srq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = send_wr;
  /* Receives come from the SRQ; the sender's and the flush QPs take none (as net_ib's sender). */
  ia.cap.max_recv_wr = 0;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = max_inline ? *max_inline : 0;
  struct ibv_qp *qp = ibv_create_qp(c->nic[lane]->pd, &ia);
  if (qp == NULL) return NULL;
  if (max_inline) *max_inline = ia.cap.max_inline_data;
  struct ibv_qp_attr a = {0};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = c->nic[lane]->pkey_index;
  a.port_num = c->nic[lane]->port;
  a.qp_access_flags = (unsigned)access;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    ibv_destroy_qp(qp);
    return NULL;
  }
  return qp;
}

/* INIT -> RTR -> RTS against a remote QP; tc is this QP's traffic class. */
int mpib_qp_connect(struct mpib_comm *c, struct ibv_qp *qp, int lane, uint32_t rem_qpn,
                    const struct mpib_rail_info *rem, enum ibv_mtu mtu, uint8_t tc, uint32_t psn) {
  struct mpib_nic *d = c->nic[lane];
  int rail = mpib_lane_rail(lane);
  if (rem->ece_valid && mpib_g.ece_enable) {
    struct ibv_ece ece = rem->ece; /* the device keeps the options both ends support */
    if (mpib_ibv_set_ece(qp, &ece) != 0 && errno != EOPNOTSUPP)
      MPIB_INFO("%s rail: ibv_set_ece failed", mpib_rail_name(rail));
  }
  struct ibv_qp_attr a = {0};
  if (mpib_build_ah(&a.ah_attr, d->link_layer, rem->link_layer, d->port, (uint8_t)c->gid_index[lane], c->gid[lane].raw,
                    rem->gid, rem->lid, tc, c->sl) != 0) {
    MPIB_WARN("%s rail: no address for the peer (link layer %d vs %d, LID %u)", mpib_rail_name(rail), d->link_layer,
              rem->link_layer, rem->lid);
    return -EPROTO;
  }
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = mtu;
  a.dest_qp_num = rem_qpn;
  a.rq_psn = psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  uint64_t t0 = mpib_now_ns();
  int rc = ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  uint64_t took_ms = (mpib_now_ns() - t0) / 1000000ull;
  if (took_ms >= 100) /* RoCE: the kernel resolves the peer's MAC inside this call */
    MPIB_INFO("%s rail: QP %u to RTR took %llu ms", mpib_rail_name(rail), qp->qp_num, (unsigned long long)took_ms);
  if (rc) return -rc;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = mpib_g.ib_timeout;
  a.retry_cnt = mpib_g.ib_retry_cnt;
  a.rnr_retry = 7;
  a.sq_psn = psn;
  a.max_rd_atomic = 1;
  rc = ibv_modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC);
  return -rc;
}

/* The highest GID index an address handle can name (ibv_global_route.sgid_index is 8 bits;
 * the control plane's choice obeys the same bound, gid.MaxIndex). */
#define MPIB_GID_INDEX_MAX 255

/* Whether a GID table entry (gid, type) is the lane's: its address with the RoCE version the
 * lane was set up with. Both ends of a connection send the same version (v1 is an Ethernet
 * frame, v2 a UDP datagram), and a port holds each address once per version: the twin of the
 * other version would talk past the peer. A RoCE v1 entry may read as IBV_GID_TYPE_IB (older
 * libraries, sysfs "IB/RoCE v1"): one wire format. An unknown type (-1) takes v2, the
 * default choice. */
static int gid_entry_is_lanes(const uint8_t lane_gid[16], int lane_type, const uint8_t gid[16], int type) {
  int want_v2 = lane_type < 0 || lane_type == IBV_GID_TYPE_ROCE_V2;
  return memcmp(gid, lane_gid, 16) == 0 && (type == IBV_GID_TYPE_ROCE_V2) == want_v2;
}

/* After a port flap the kernel may have re-added a lane's GID at another index: find the same
 * address of the same RoCE version again (0), or -EADDRNOTAVAIL while it is not back yet (or
 * back only beyond the indexes an address handle can name). On the thread that owns the lane's
 * QPs for now (a rail's rebuild, or the comm's for its flush loopback). */
int mpib_lane_gid_refresh(struct mpib_comm *c, int l) {
  const uint8_t *want = c->gid[l].raw;
  int want_type = c->gid_type[l];
  uint8_t gid[16];
  int type;
  if (mpib_nic_gid_entry(c->nic[l], c->gid_index[l], gid, &type) == 0 && gid_entry_is_lanes(want, want_type, gid, type))
    return 0;
  int n = c->nic[l]->gid_tbl_len;
  if (n > MPIB_GID_INDEX_MAX + 1) n = MPIB_GID_INDEX_MAX + 1;
  for (int i = 0; i < n; i++) {
    if (mpib_nic_gid_entry(c->nic[l], i, gid, &type) == 0 && gid_entry_is_lanes(want, want_type, gid, type)) {
      MPIB_INFO("%s rail: its GID moved from index %d to %d", mpib_rail_name(mpib_lane_rail(l)), c->gid_index[l], i);
      c->gid_index[l] = i;
      return 0;
    }
  }
  return -EADDRNOTAVAIL;
}

/* Reads the lane's address at its GID index, and on RoCE the entry's type (the RoCE version its
 * packets use, which mpib_lane_gid_refresh keeps). 0 or -EADDRNOTAVAIL. */
static int lane_gid_read(struct mpib_comm *c, int lane) {
  struct mpib_nic *d = c->nic[lane];
  int type;
  if (d->link_layer == IBV_LINK_LAYER_ETHERNET &&
      mpib_nic_gid_entry(d, c->gid_index[lane], c->gid[lane].raw, &type) == 0) {
    c->gid_type[lane] = (int8_t)type;
    return 0;
  }
  c->gid_type[lane] = -1;
  return ibv_query_gid(d->ctx, d->port, c->gid_index[lane], &c->gid[lane]) != 0 ? -EADDRNOTAVAIL : 0;
}

/* Memory of this comm's own: access as given (remote access only where the peer must write). */
static struct ibv_mr *reg_local(const struct mpib_comm *c, int lane, void *addr, size_t len, int access) {
  return ibv_reg_mr(c->nic[lane]->pd, addr, len, access);
}

/* This lane's own address, as the peer would see it (for the loopback flush QP). */
void mpib_local_rail_info(const struct mpib_comm *c, int lane, struct mpib_rail_info *ri) {
  memset(ri, 0, sizeof *ri);
  memcpy(ri->gid, c->gid[lane].raw, 16);
  ri->mtu = c->nic[lane]->active_mtu;
  ri->lid = __atomic_load_n(&c->nic[lane]->lid, __ATOMIC_RELAXED); /* the event thread updates it */
  ri->link_layer = (uint8_t)c->nic[lane]->link_layer;
}

/* Whether a flush QP that could not connect to itself may wait for its first read: its port is
 * down (a SUP cable unplugged at boot), or, on InfiniBand, it has no LID yet (the subnet
 * manager never configured the port), so no address reaches it. A port that is up and
 * addressed fails the comm as before. */
static int flush_connect_can_wait(int port_down, int link_layer, uint16_t lid) {
  return port_down || (link_layer == IBV_LINK_LAYER_INFINIBAND && lid == 0);
}

/* Loopback QP used by iflush: an RDMA_READ through the NIC orders prior GPU writes. On a lane
 * whose port cannot take the connect now (flush_connect_can_wait) the QP stays in INIT, marked
 * broken: the lane's first flush read resets and connects it (mpib_flush.c), with the port's
 * LID then. The comm starts degraded on such a port instead of failing. */
static int flush_setup(struct mpib_comm *c, int lane) {
  struct mpib_nic *d = c->nic[lane];
  c->flush_cq[lane] = ibv_create_cq(d->ctx, 64, NULL, NULL, 0);
  if (!c->flush_cq[lane]) return -ENOMEM;
  c->flush_qp[lane] = create_rc_qp(c, lane, c->flush_cq[lane], NULL, 64, NULL, MPIB_FLUSH_QP_ACCESS);
  if (!c->flush_qp[lane]) return -ENOMEM;
  c->flush_mr[lane] = reg_local(c, lane, c->flush_buf, MPIB_PAGE, IBV_ACCESS_LOCAL_WRITE); /* the read lands here */
  if (!c->flush_mr[lane]) return -ENOMEM;
  struct mpib_rail_info self;
  mpib_local_rail_info(c, lane, &self);
  int rc = mpib_qp_connect(c, c->flush_qp[lane], lane, c->flush_qp[lane]->qp_num, &self, d->active_mtu, c->tc, 0);
  if (rc == 0 || !flush_connect_can_wait(__atomic_load_n(&d->port_down, __ATOMIC_RELAXED), d->link_layer, self.lid))
    return rc;
  MPIB_INFO("%s rail: %s port %d is down or has no LID: its flush QP connects at its first read",
            mpib_rail_name(mpib_lane_rail(lane)), d->name, d->port);
  c->flush_broken[lane] = 1;
  return 0;
}

/* A QP back to INIT through RESET (what it had queued is discarded): 0 or -errno. */
int mpib_qp_reset_to_init(const struct mpib_comm *c, struct ibv_qp *qp, int lane, int access) {
  struct mpib_nic *d = c->nic[lane];
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return -errno ? -errno : -EIO;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = d->pkey_index;
  a.port_num = d->port;
  a.qp_access_flags = (unsigned)access;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return -EIO;
  return 0;
}

/* One lane's CQ (for qps QPs), CTS/size area registrations, SRQ (receiver) and flush loopback. */
static int lane_setup(struct mpib_comm *c, int lane, uint32_t qps) {
  struct mpib_nic *d = c->nic[lane];
  int rc = lane_gid_read(c, lane);
  if (rc) return rc;
  /* A failed QP completes every outstanding work request in error, signalled or not: the
   * sender's CQ holds a full send queue's worth besides the normal completions. */
  uint32_t depth = c->is_send ? mpib_lane_cq_depth(MPIB_CQ_DEPTH_SENDER, MPIB_SEND_WR_SENDER, qps)
                              : mpib_lane_cq_depth(MPIB_CQ_DEPTH, MPIB_SEND_WR_RECEIVER, qps);
  c->cq[lane] = ibv_create_cq(d->ctx, (int)depth, NULL, NULL, 0);
  if (!c->cq[lane]) return -ENOMEM;
  /* The peer writes the sender's CTS area and the receiver's size area, nothing else (mpib.h:
   * stage_mr, inbox_mr); a write elsewhere fails with a remote access error. */
  uint8_t *area = (uint8_t *)c->cts;
  size_t cts_part[2] = {0, MPIB_CTS_AREA}, sizes_part[2] = {MPIB_SIZES_OFFSET, MPIB_SIZES_AREA};
  const size_t *stage = c->is_send ? sizes_part : cts_part, *inbox = c->is_send ? cts_part : sizes_part;
  c->stage_mr[lane] = reg_local(c, lane, area + stage[0], stage[1], IBV_ACCESS_LOCAL_WRITE);
  if (!c->stage_mr[lane]) return -ENOMEM;
  c->inbox_mr[lane] = reg_local(c, lane, area + inbox[0], inbox[1], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!c->inbox_mr[lane]) return -ENOMEM;
  if (!c->is_send) {
    struct ibv_srq_init_attr sa = {0};
    sa.attr.max_wr = MPIB_SRQ_DEPTH;
    sa.attr.max_sge = 1;
    c->srq[lane] = ibv_create_srq(d->pd, &sa);
    if (!c->srq[lane]) return -ENOMEM;
    rc = mpib_srq_refill(c, lane);
    if (rc) return rc;
  }
  if (!c->is_send && mpib_g.flush_enabled) return flush_setup(c, lane);
  return 0;
}

/* A rail's lanes and QPs: QP i on lane i mod the rail's lanes. */
static int rail_setup(struct mpib_comm *c, int rail) {
  int nlanes = mpib_lane_count(c, rail);
  for (int i = 0; i < nlanes; i++) {
    int rc = lane_setup(c, mpib_lane(rail, i), mpib_qps_on_lane(c->nqps[rail], (uint32_t)nlanes, (uint32_t)i));
    if (rc) return rc;
  }
  int send_wr = c->sq_depth;
  int inline_cts = mpib_g.use_inline && !c->is_send;
  int base = rail == MPIB_RAIL_SOUT ? 0 : (int)c->nqps[MPIB_RAIL_SOUT];
  for (uint32_t i = 0; i < c->nqps[rail]; i++) {
    int lane = mpib_lane(rail, (int)(i % (uint32_t)nlanes));
    uint32_t max_inline = inline_cts ? (uint32_t)MPIB_MAX_INLINE : 0;
    struct ibv_qp *qp = create_rc_qp(c, lane, c->cq[lane], c->srq[lane], send_wr, &max_inline, MPIB_DATA_QP_ACCESS);
    if (!qp) {
      MPIB_WARN("%s rail: ibv_create_qp failed: %s", mpib_rail_name(rail), strerror(errno));
      return errno ? -errno : -ENOMEM;
    }
    c->qps[base + i] = (struct mpib_qp){.qp = qp, .rail = rail, .lane = lane};
    int first = base + i == 0; /* the comm's first QP: the CTS may go on either rail */
    if (inline_cts && (first || max_inline < c->max_inline)) c->max_inline = max_inline;
  }
  return 0;
}

/* A zeroed allocation of whole pages, mapped for itself and unmapped by page_free: nothing
 * else shares its pages, and a closed connection gives them back to the system at once.
 * (Page-aligned heap chunks, registered as MRs and freed in whatever thread closes the comm,
 * fragment malloc's arenas: a process that opens and closes connections all day would keep
 * the high-water mark of every arena it touched.) */
static void *page_alloc(size_t size) {
  size = (size + MPIB_PAGE - 1) & ~(size_t)(MPIB_PAGE - 1);
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void page_free(void *p, size_t size) {
  if (p) munmap(p, (size + MPIB_PAGE - 1) & ~(size_t)(MPIB_PAGE - 1));
}

/* Host memory one comm allocates (the verbs provider's queues come on top). */
size_t mpib_comm_host_bytes(int is_send) {
  size_t pool = (size_t)(is_send ? MPIB_REQ_POOL_SEND : MPIB_REQ_POOL_RECV) * sizeof(struct mpib_request);
  return sizeof(struct mpib_comm) + pool + MPIB_PAGE + ((MPIB_NIC_AREA + MPIB_PAGE - 1) & ~(size_t)(MPIB_PAGE - 1));
}

/* Points the comm's SUP lanes at ports of its device (before any SUP resource exists): the
 * first at p->sup_port, lane 2+i at p->lane_port[i], each port once. */
static int use_sup_ports(struct mpib_comm *c, const struct mpib_conn_params *p) {
  const struct mpib_fdev *f = &mpib_g.fdev[c->fdev];
  int nlanes = p->sup_lanes > 1 ? p->sup_lanes : 1;
  if (nlanes > MPIB_MAX_STRIPE || (p->nqps[MPIB_RAIL_SUP] && p->nqps[MPIB_RAIL_SUP] < (uint32_t)nlanes)) {
    MPIB_WARN("SUP rail: %d lanes with %u QPs (at most %d lanes, a QP each)", nlanes, p->nqps[MPIB_RAIL_SUP],
              MPIB_MAX_STRIPE);
    return -EINVAL;
  }
  uint32_t used = 0;
  for (int i = 0; i < nlanes; i++) {
    int port = i == 0 ? p->sup_port : p->lane_port[i - 1];
    if (port < 0 || port >= f->nsup || (used & (1u << port))) {
      MPIB_WARN("SUP rail: port %d of fused device %d for lane %d: it has %d, each used once", port, c->fdev, i + 1,
                f->nsup);
      return -EINVAL;
    }
    used |= 1u << port;
    int l = mpib_lane(MPIB_RAIL_SUP, i);
    c->lane_port[l] = port;
    c->nic[l] = &mpib_g.nic[f->sup_nic[port]];
    if (i > 0) c->gid_index[l] = p->lane_gid_index[i - 1];
  }
  c->sup_port = p->sup_port;
  c->sup_lanes = nlanes;
  return 0;
}

/* Rail r is a standby that waits for its join: DOWN, never tried until it joins, and not the
 * CTS rail meanwhile. */
static void standby_wait(struct mpib_comm *c, int r) {
  c->rail[r].state = MPIB_RAIL_DOWN;
  c->rail[r].since_ns = mpib_now_ns();
  c->rail[r].join_wait = 1;
  if (c->cts_rail == r) c->cts_rail = 1 - r;
}

/* A standby rail whose QPs are built after the handshake (mpib_comm_build_deferred): for now
 * only its address, which the handshake carries. */
static int defer_rail(struct mpib_comm *c, int r) {
  if (mpib_lane_count(c, r) != 1) return -EINVAL; /* a standby rail has one lane */
  int rc = lane_gid_read(c, r);
  if (rc) return rc;
  standby_wait(c, r);
  return 0;
}

/* Comms created and not destroyed yet, whoever holds them (NCCL, a handshake, a listener's
 * spare, a goroutine freeing one): the devices and the agent segment stay open while any is. */
static int comms_alive;

int mpib_comms_alive(void) { return __atomic_load_n(&comms_alive, __ATOMIC_ACQUIRE); }

struct mpib_comm *mpib_comm_create(const struct mpib_conn_params *p) {
  if (p->dev < 0 || p->dev >= mpib_g.nfdevs) {
    MPIB_WARN("connection on fused device %d: %d exist", p->dev, mpib_g.nfdevs);
    return NULL;
  }
  struct mpib_comm *c = page_alloc(sizeof *c);
  if (c == NULL) return NULL;
  memset(c->gid_type, -1, sizeof c->gid_type); /* each lane's setup reads its own */
  c->fdev = p->dev;
  c->nic[MPIB_RAIL_SOUT] = &mpib_g.nic[mpib_g.fdev[p->dev].sout_nic];
  if (use_sup_ports(c, p)) {
    page_free(c, sizeof *c);
    return NULL;
  }
  __atomic_add_fetch(&comms_alive, 1, __ATOMIC_RELEASE); /* mpib_comm_destroy counts it out, on every path */
  c->nreqs_pool = p->is_send ? MPIB_REQ_POOL_SEND : MPIB_REQ_POOL_RECV;
  c->reqs = page_alloc((size_t)c->nreqs_pool * sizeof *c->reqs);
  c->cts = page_alloc(MPIB_NIC_AREA);
  c->sizes = c->cts ? (mpib_sizes_row *)((char *)c->cts + MPIB_SIZES_OFFSET) : NULL;
  c->flush_buf = page_alloc(MPIB_PAGE);
  c->is_send = p->is_send;
  c->mode = p->mode;
  c->path_class = p->path_class;
  c->sup_relay = mpib_g.sup_relay;
  c->cts_rail = mpib_cts_rail(p->mode, p->path_class, p->nqps[MPIB_RAIL_SUP]);
  c->ctrl_fd = -1;
  c->sq_depth = p->is_send ? MPIB_SEND_WR_SENDER : MPIB_SEND_WR_RECEIVER;
  c->recv_idle_seq1 = 1; /* no receive open, the first at seq 0 */
  pthread_mutex_init(&c->ctrl_mu, NULL);
  for (int r = 0; r < MPIB_NRAILS; r++) c->rail[r] = (struct mpib_rail_ctl){.state = MPIB_RAIL_UP, .gen = 1};
  c->force_sup_bw = mpib_g.force_sup_bw;
  c->shm_slot = -1;
  c->hint_due = 1;
  c->tc = (uint8_t)p->tc;
  c->sl = mpib_g.ib_sl;
  c->whole_msg_max = mpib_g.whole_msg_max;
  if (!c->reqs || !c->cts || !c->sizes || !c->flush_buf) {
    mpib_comm_destroy(c);
    return NULL;
  }
  for (int r = 0; r < MPIB_NRAILS; r++) {
    c->nqps[r] = p->nqps[r];
    c->gid_index[r] = p->gid_index[r];
  }
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (c->nqps[r] == 0) continue;
    int rc = (p->defer_rails & (1u << r)) ? defer_rail(c, r) : rail_setup(c, r);
    if (rc) {
      MPIB_WARN("%s rail: connection setup failed: %s", mpib_rail_name(r), strerror(-rc));
      mpib_comm_destroy(c);
      return NULL;
    }
  }
  return c;
}

/* What only rail r's built objects say (its QPs from c->qps[base]): the rkey of its inbox,
 * its ECE options and its QP numbers. */
static void rail_objects_info(const struct mpib_comm *c, int r, int base, uint32_t *rkey, struct ibv_ece *ece,
                              uint8_t *ece_valid, uint32_t qpn[MPIB_MAX_QPS_PER_RAIL]) {
  *rkey = c->inbox_mr[r]->rkey;
  if (mpib_g.ece_enable && mpib_ibv_query_ece(c->qps[base].qp, ece) == 0) *ece_valid = 1;
  for (uint32_t i = 0; i < c->nqps[r]; i++) qpn[i] = c->qps[base + i].qp->qp_num;
}

void mpib_comm_local_info(struct mpib_comm *c, struct mpib_conn_info *info) {
  memset(info, 0, sizeof *info);
  info->buf_addr = c->is_send ? (uint64_t)(uintptr_t)c->cts : (uint64_t)(uintptr_t)c->sizes;
  info->tc = c->tc;
  info->sl = c->sl;
  int base = 0;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    info->nqps[r] = c->nqps[r];
    if (c->nqps[r] == 0) continue;
    mpib_local_rail_info(c, r, &info->rail[r]);
    if (c->rail[r].join_wait && !c->qps[base].qp) { /* its rkey, ECE and QPs come with its join */
      info->deferred |= 1u << r;
      base += (int)c->nqps[r];
      continue;
    }
    struct mpib_rail_info *ri = &info->rail[r];
    rail_objects_info(c, r, base, &ri->rkey, &ri->ece, &ri->ece_valid, ri->qpn);
    base += (int)c->nqps[r];
  }
  info->sup_lanes = c->nqps[MPIB_RAIL_SUP] ? (uint32_t)c->sup_lanes : 0;
  for (int i = 1; i < (int)info->sup_lanes; i++) {
    int l = mpib_lane(MPIB_RAIL_SUP, i);
    struct mpib_rail_info self;
    mpib_local_rail_info(c, l, &self);
    struct mpib_lane_info *li = &info->lane[i - 1];
    memcpy(li->gid, self.gid, 16);
    li->mtu = self.mtu, li->lid = self.lid, li->link_layer = self.link_layer;
    li->rkey = c->inbox_mr[l]->rkey;
  }
}

/* The class of a QP's packets: the sender's class, except on the receiver, whose QPs carry
 * only CTS writes (and acknowledgements), which NCCL_IB_FIFO_TC may put in another class (as
 * net_ib does for its accept-side QPs). */
uint8_t mpib_qp_traffic_class(const struct mpib_comm *c) {
  if (!c->is_send && mpib_g.fifo_tc >= 0) return (uint8_t)mpib_g.fifo_tc;
  return c->tc;
}

/* The peer's facts for one lane of rail r: its rail's for the first lane, a striped lane's
 * own (address, MTU, rkey) for the others. */
static void remote_lane(struct mpib_comm *c, int r, int i, const struct mpib_conn_info *remote) {
  int l = mpib_lane(r, i);
  struct mpib_rail_info ri = remote->rail[r];
  if (i > 0) {
    const struct mpib_lane_info *li = &remote->lane[i - 1];
    memcpy(ri.gid, li->gid, 16);
    ri.mtu = li->mtu, ri.rkey = li->rkey, ri.lid = li->lid, ri.link_layer = li->link_layer;
    ri.ece_valid = 0;
  }
  enum ibv_mtu mtu = c->nic[l]->active_mtu;
  if ((enum ibv_mtu)ri.mtu < mtu) mtu = (enum ibv_mtu)ri.mtu;
  c->rem_rail[l] = ri;
  c->rem_rkey[l] = ri.rkey;
  c->rail_mtu[l] = mtu;
}

/* Rail r's QPs (from c->qps[base]) to the peer's, as kept in c->rem_rail: 0 or the first QP's
 * -errno. */
static int rail_qps_connect(struct mpib_comm *c, int r, int base) {
  for (uint32_t i = 0; i < c->nqps[r]; i++) {
    const struct mpib_qp *q = &c->qps[base + i];
    int rc = mpib_qp_connect(c, q->qp, q->lane, c->rem_rail[r].qpn[i], &c->rem_rail[q->lane], c->rail_mtu[q->lane],
                             mpib_qp_traffic_class(c), mpib_gen_psn(c->rail[r].gen));
    if (rc) {
      MPIB_WARN("%s rail: QP %u to remote QP %u cannot reach RTS: %s", mpib_rail_name(r), q->qp->qp_num,
                c->rem_rail[r].qpn[i], strerror(-rc));
      /* The rail starts DOWN: the QPs that reached RTR or RTS (another lane's, on a striped
       * rail) must not take the peer's writes on a rail out of service. */
      (void)mpib_rail_qps_to_error(c, r);
      return rc;
    }
  }
  return 0;
}

/* One rail's QPs to the peer's, each against its lane's address: 0, the first QP's -errno, or 1
 * for a standby rail that joins later (either end builds its QPs after the handshake). */
static int rail_connect(struct mpib_comm *c, int r, int base, const struct mpib_conn_info *remote) {
  for (int i = 0; i < mpib_lane_count(c, r); i++) {
    int l = mpib_lane(r, i);
    remote_lane(c, r, i, remote);
    if (c->nic[l]->link_layer == IBV_LINK_LAYER_ETHERNET) mpib_neigh_warm(c->rem_rail[l].gid);
  }
  c->path_ack_ns[r] = mpib_path_progress(c->nic[mpib_lane(r, 0)], c->rem_rail[mpib_lane(r, 0)].gid);
  if (c->rail[r].join_wait || (remote->deferred & (1u << r))) { /* a standby rail: up after its join */
    standby_wait(c, r);
    return 1;
  }
  if (mpib_rail_fatal(c, r)) return -ENODEV;
  return rail_qps_connect(c, r, base);
}

static void start_degraded(struct mpib_comm *c, int down, int err);

/* mpib_comm_connect's answer when no rail failed: 0 with a rail up, MPIB_CONNECT_JOIN_NOW when
 * every rail it has waits to join (a deferred SOUT beside a SUP both ends dropped for an
 * unaddressed pair): the comm must not reach NCCL with no rail to carry it. */
static int connect_result(int up, int waiting) { return up == 0 && waiting > 0 ? MPIB_CONNECT_JOIN_NOW : 0; }

/* Brings the comm's QPs up against the peer's. A rail that cannot come up (its port is down:
 * RoCE cannot resolve the peer's address; its device died) does not fail the connection when
 * the other rail came up and failover is on: the comm starts with the rail DOWN, carries
 * everything on the other, and the sender's recovery brings the rail in when it works
 * (docs/failover.md, degraded start). NCCL connects lazily, mid-job: a lost rail must not fail
 * every new connection. The peer finds the rail out of service by itself (its first write or
 * CTS there fails over). */
int mpib_comm_connect(struct mpib_comm *c, const struct mpib_conn_info *remote) {
  c->rem_addr = remote->buf_addr;
  if (!c->is_send) {
    c->tc = remote->tc; /* both ends use the sender's class and level */
    c->sl = remote->sl;
  }
  int base = 0, up = 0, waiting = 0, down = -1, err = 0;
  if (remote->sup_lanes != (c->nqps[MPIB_RAIL_SUP] ? (uint32_t)c->sup_lanes : 0)) return -EPROTO;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (c->nqps[r] == 0) continue;
    if (remote->nqps[r] != c->nqps[r]) return -EPROTO;
    int rc = rail_connect(c, r, base, remote);
    base += (int)c->nqps[r];
    if (rc == 0) {
      up++;
    } else if (rc == 1) {
      waiting++;
    } else {
      down = r;
      err = rc;
    }
  }
  if (down < 0) return connect_result(up, waiting);
  if ((up == 0 && waiting == 0) || !mpib_g.failover) return err;
  start_degraded(c, down, err);
  return up ? 0 : MPIB_CONNECT_JOIN_NOW;
}

/* Rail `down` could not come up at connect: the comm starts with it out of service. */
static void start_degraded(struct mpib_comm *c, int down, int err) {
  struct mpib_rail_ctl *rc = &c->rail[down];
  rc->state = mpib_rail_fatal(c, down) ? MPIB_RAIL_DEAD : MPIB_RAIL_DOWN;
  rc->since_ns = mpib_now_ns();
  rc->retry_at_ns = rc->since_ns + mpib_g.recovery_backoff_ms * 1000000ull;
  if (c->cts_rail == down) c->cts_rail = 1 - down;
  MPIB_INFO("%s comm: connection started degraded: the %s rail could not come up (%s); everything rides %s until it "
            "joins",
            c->is_send ? "send" : "recv", mpib_rail_name(down), strerror(-err), mpib_rail_name(1 - down));
}

int mpib_rail_base(const struct mpib_comm *c, int r) { return r == MPIB_RAIL_SOUT ? 0 : (int)c->nqps[MPIB_RAIL_SOUT]; }

/* Waits for a rebuild still running before its QPs are destroyed (a close during recovery). */
static void rebuild_wait(struct mpib_comm *c, int r) {
  struct mpib_rebuild *b = &c->rail[r].rebuild;
  if (b->running) pthread_join(b->thread, NULL);
  b->running = 0;
}

void mpib_comm_set_ctrl_fd(struct mpib_comm *c, int fd) {
  pthread_mutex_lock(&c->ctrl_mu); /* no send under the lock uses the old socket after this */
  c->ctrl_fd = fd;
  pthread_mutex_unlock(&c->ctrl_mu);
}

void mpib_comm_tcp_notice(struct mpib_comm *c, int rail, uint64_t word) {
  if (rail >= 0 && rail < MPIB_NRAILS) __atomic_store_n(&c->tcp_notice[rail], word, __ATOMIC_RELEASE);
}

void mpib_comm_tcp_record(struct mpib_comm *c, int rail, const void *rec) {
  if (rail < 0 || rail >= MPIB_NRAILS) return;
  memcpy(&c->tcp_rec[rail], rec, sizeof c->tcp_rec[rail]);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

void mpib_comm_tcp_confirm(struct mpib_comm *c, int rail, const void *rec) {
  if (rail < 0 || rail >= MPIB_NRAILS) return;
  memcpy(&c->tcp_confirm[rail], rec, sizeof c->tcp_confirm[rail]);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void lane_destroy(struct mpib_comm *c, int l) {
  if (c->flush_qp[l]) ibv_destroy_qp(c->flush_qp[l]);
  if (c->flush_mr[l]) ibv_dereg_mr(c->flush_mr[l]);
  if (c->flush_cq[l]) ibv_destroy_cq(c->flush_cq[l]);
  if (c->srq[l]) ibv_destroy_srq(c->srq[l]);
  if (c->stage_mr[l]) ibv_dereg_mr(c->stage_mr[l]);
  if (c->inbox_mr[l]) ibv_dereg_mr(c->inbox_mr[l]);
  if (c->cq[l]) ibv_destroy_cq(c->cq[l]);
  c->flush_qp[l] = NULL, c->flush_mr[l] = NULL, c->flush_cq[l] = NULL, c->srq[l] = NULL;
  c->stage_mr[l] = NULL, c->inbox_mr[l] = NULL, c->cq[l] = NULL;
  c->srq_posted[l] = 0;
}

static void rail_destroy(struct mpib_comm *c, int r) {
  for (int i = 0; i < mpib_lane_count(c, r); i++) lane_destroy(c, mpib_lane(r, i));
}

static void rail_qps_destroy(struct mpib_comm *c, int r) {
  int base = mpib_rail_base(c, r);
  for (uint32_t i = 0; i < c->nqps[r]; i++) {
    if (c->qps[base + i].qp) ibv_destroy_qp(c->qps[base + i].qp);
    c->qps[base + i].qp = NULL;
  }
}

void mpib_comm_drop_rail(struct mpib_comm *c, int rail) {
  rail_qps_destroy(c, rail);
  rail_destroy(c, rail);
  c->nqps[rail] = 0;
  if (c->cts_rail == rail) c->cts_rail = 1 - rail;
}

int mpib_comm_set_path(struct mpib_comm *c, const struct mpib_conn_params *p) {
  int path_class = p->path_class;
  if (p->nqps[MPIB_RAIL_SUP] > 0 && c->nqps[MPIB_RAIL_SUP] == 0) {
    int rc = use_sup_ports(c, p); /* a spare has no SUP resources yet: its ports are the pairs' */
    if (rc) return rc;
    c->nqps[MPIB_RAIL_SUP] = p->nqps[MPIB_RAIL_SUP];
    c->gid_index[MPIB_RAIL_SUP] = p->gid_index[MPIB_RAIL_SUP];
    rc = rail_setup(c, MPIB_RAIL_SUP);
    if (rc) {
      MPIB_WARN("SUP rail: connection setup failed: %s", strerror(-rc));
      mpib_comm_drop_rail(c, MPIB_RAIL_SUP);
      return rc;
    }
  }
  c->path_class = path_class;
  c->cts_rail = mpib_cts_rail(c->mode, path_class, c->nqps[MPIB_RAIL_SUP]);
  return 0;
}

int mpib_comm_build_deferred(struct mpib_comm *c, int r) {
  if (r < 0 || r >= MPIB_NRAILS || !c->is_send || !c->rail[r].join_wait || c->qps[mpib_rail_base(c, r)].qp)
    return -EINVAL;
  int rc = rail_setup(c, r);
  if (rc) {
    rail_qps_destroy(c, r);
    rail_destroy(c, r);
    return rc;
  }
  __atomic_store_n(&c->rail[r].join_built, 1, __ATOMIC_RELEASE);
  return 0;
}

void mpib_comm_join_info(const struct mpib_comm *c, int r, struct mpib_join_info *out) {
  memset(out, 0, sizeof *out);
  out->nqps = c->nqps[r];
  rail_objects_info(c, r, mpib_rail_base(c, r), &out->rkey, &out->ece, &out->ece_valid, out->qpn);
}

int mpib_comm_join_peer(struct mpib_comm *c, int r, const struct mpib_join_info *in) {
  if (r < 0 || r >= MPIB_NRAILS || c->nqps[r] == 0 || __atomic_load_n(&c->rail[r].join_arrived, __ATOMIC_ACQUIRE))
    return -EPROTO;
  if (!c->is_send) {
    if (in == NULL || in->nqps != c->nqps[r]) return -EPROTO;
    c->join_peer[r] = *in;
  }
  __atomic_store_n(&c->rail[r].join_arrived, 1, __ATOMIC_RELEASE);
  return 0;
}

int mpib_comm_join_now(struct mpib_comm *c, int r) {
  if (!mpib_join_take(c, r)) return -EPROTO;
  if (c->nic[r]->link_layer == IBV_LINK_LAYER_ETHERNET) mpib_neigh_warm(c->rem_rail[r].gid);
  if (mpib_rail_fatal(c, r)) return -ENODEV;
  int rc = rail_qps_connect(c, r, mpib_rail_base(c, r));
  if (rc) return rc;
  c->rail[r].state = MPIB_RAIL_UP;
  c->rail[r].since_ns = mpib_now_ns();
  /* CTS moves here off a rail that is not up, or dropped (no QPs: its state stays UP) */
  if (c->rail[c->cts_rail].state != MPIB_RAIL_UP || c->nqps[c->cts_rail] == 0) c->cts_rail = r;
  return 0;
}

/* Frees everything the comm holds but its agent slot (mpib_comm_close, in mpib_comm.h,
 * publishes the last telemetry and releases the slot first). */
void mpib_comm_destroy(struct mpib_comm *c) {
  if (!c) return;
  for (int r = 0; r < MPIB_NRAILS; r++) rebuild_wait(c, r);
  for (int r = 0; r < MPIB_NRAILS; r++) rail_qps_destroy(c, r);
  for (int r = 0; r < MPIB_NRAILS; r++) rail_destroy(c, r);
  page_free(c->reqs, (size_t)c->nreqs_pool * sizeof *c->reqs);
  page_free(c->cts, MPIB_NIC_AREA);
  page_free(c->flush_buf, MPIB_PAGE);
  pthread_mutex_destroy(&c->ctrl_mu);
  page_free(c, sizeof *c);
  __atomic_sub_fetch(&comms_alive, 1, __ATOMIC_RELEASE);
}

void mpib_comm_peer_gone(struct mpib_comm *c) { __atomic_store_n(&c->peer_gone_ns, mpib_now_ns(), __ATOMIC_RELEASE); }

/* Backdated past the grace period: the peer said it failed, nothing more is on its way. */
void mpib_comm_peer_failed(struct mpib_comm *c) {
  uint64_t now = mpib_now_ns();
  __atomic_store_n(&c->peer_gone_ns, now > 2000000000ull ? now - 2000000000ull : 1, __ATOMIC_RELEASE);
}
