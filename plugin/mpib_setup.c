/* Verbs setup and teardown, driven by the Go control plane. Functions return 0 or -errno. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "mpib.h"
#include "mpib_shm.h"
#include "mpib_verbs.h"

struct mpib_global mpib_g = {.force_sup_bw = MPIB_NO_OVERRIDE};
static struct mpib_pending pending_tab[MPIB_PENDING_MAX];
static pthread_mutex_t pending_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t pending_free[MPIB_PENDING_MAX]; /* freed entries (index + 1), a stack */
static uint32_t pending_nfree, pending_used;    /* entries on the stack; entries ever handed out */

static uint64_t pending_word(uint32_t gen, int state) { return (uint64_t)gen << 32 | (uint32_t)state; }

/* An entry's first generation is random, so that a corrupt or forged handle cannot name a
 * live attempt (and take its comm) by guessing small numbers. */
static uint32_t pending_first_gen(uint32_t idx1) {
  uint32_t g = 0;
  if (getrandom(&g, sizeof g, GRND_NONBLOCK) != (ssize_t)sizeof g) {
    uint64_t x = mpib_now_ns() ^ ((uint64_t)idx1 << 32);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    g = (uint32_t)(x ^ (x >> 29));
  }
  return g;
}

uint32_t mpib_pending_acquire(uint32_t *gen) {
  uint32_t idx1 = 0;
  pthread_mutex_lock(&pending_mu);
  if (pending_nfree > 0)
    idx1 = pending_free[--pending_nfree];
  else if (pending_used < MPIB_PENDING_MAX)
    idx1 = ++pending_used;
  pthread_mutex_unlock(&pending_mu);
  if (idx1 == 0) return 0;
  struct mpib_pending *p = &pending_tab[idx1 - 1];
  uint32_t last = (uint32_t)(__atomic_load_n(&p->word, __ATOMIC_RELAXED) >> 32);
  *gen = last ? last + 1 : pending_first_gen(idx1);
  if (*gen == 0) *gen = 1; /* 0 never names an entry */
  p->comm = NULL;
  p->result = 0;
  __atomic_store_n(&p->word, pending_word(*gen, MPIB_PENDING_RUNNING), __ATOMIC_RELEASE);
  return idx1;
}

void mpib_pending_finish(uint32_t idx1, uint32_t gen, struct mpib_comm *comm, int result) {
  struct mpib_pending *p = &pending_tab[idx1 - 1];
  p->comm = comm;
  p->result = result;
  uint64_t want = pending_word(gen, MPIB_PENDING_RUNNING);
  __atomic_compare_exchange_n(&p->word, &want, pending_word(gen, MPIB_PENDING_DONE), 0, __ATOMIC_RELEASE,
                              __ATOMIC_RELAXED);
}

int mpib_pending_take(uint32_t idx1, uint32_t gen, struct mpib_comm **comm, int *result) {
  if (idx1 == 0 || idx1 > MPIB_PENDING_MAX) return 0;
  struct mpib_pending *p = &pending_tab[idx1 - 1];
  uint64_t want = pending_word(gen, MPIB_PENDING_DONE);
  if (!__atomic_compare_exchange_n(&p->word, &want, pending_word(gen, MPIB_PENDING_FREE), 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return 0;
  *comm = p->comm;
  *result = p->result;
  pthread_mutex_lock(&pending_mu);
  pending_free[pending_nfree++] = idx1;
  pthread_mutex_unlock(&pending_mu);
  return 1;
}

int mpib_pending_collected(uint32_t idx1, uint32_t gen) {
  if (idx1 == 0 || idx1 > MPIB_PENDING_MAX) return 0;
  uint64_t w = __atomic_load_n(&pending_tab[idx1 - 1].word, __ATOMIC_ACQUIRE);
  return w != pending_word(gen, MPIB_PENDING_RUNNING) && w != pending_word(gen, MPIB_PENDING_DONE);
}

int mpib_pending_poll(const void *handle, struct mpib_comm **comm, int *result) {
  uint32_t idx1, gen;
  memcpy(&idx1, (const uint8_t *)handle + MPIB_HANDLE_PENDING_OFFSET, 4);
  memcpy(&gen, (const uint8_t *)handle + MPIB_HANDLE_PENDING_OFFSET + 4, 4);
  if (idx1 == 0 || idx1 > MPIB_PENDING_MAX) return 0;
  uint64_t w = __atomic_load_n(&pending_tab[idx1 - 1].word, __ATOMIC_ACQUIRE);
  if (w == pending_word(gen, MPIB_PENDING_RUNNING)) return 1;
  return mpib_pending_take(idx1, gen, comm, result) ? 2 : 0;
}

static pthread_mutex_t creq_mu = PTHREAD_MUTEX_INITIALIZER;
static struct mpib_connect_req *creq_head, *creq_tail;
static int creq_fd = -1;

int mpib_connect_queue_open(void) {
  pthread_mutex_lock(&creq_mu);
  if (creq_fd < 0) creq_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  int fd = creq_fd;
  pthread_mutex_unlock(&creq_mu);
  return fd;
}

int mpib_connect_enqueue(uint64_t ctx, int dev, int traffic_class, void *handle) {
  if (__atomic_load_n(&creq_fd, __ATOMIC_RELAXED) < 0) return 0;
  struct mpib_connect_req *q = malloc(sizeof *q);
  if (!q) return 0;
  uint32_t gen = 0, idx1 = mpib_pending_acquire(&gen);
  if (idx1 == 0) {
    free(q);
    return 0;
  }
  *q = (struct mpib_connect_req){.ctx = ctx, .dev = dev, .traffic_class = traffic_class, .idx1 = idx1, .gen = gen};
  memcpy(q->handle, handle, sizeof q->handle);
  memcpy((uint8_t *)handle + MPIB_HANDLE_PENDING_OFFSET, &idx1, 4); /* the next connect() polls the entry */
  memcpy((uint8_t *)handle + MPIB_HANDLE_PENDING_OFFSET + 4, &gen, 4);
  pthread_mutex_lock(&creq_mu);
  if (creq_tail)
    creq_tail->next = q;
  else
    creq_head = q;
  creq_tail = q;
  uint64_t one = 1;
  ssize_t n = write(creq_fd, &one, sizeof one); /* wakes the dispatcher; EAGAIN: it is awake already */
  (void)n;
  pthread_mutex_unlock(&creq_mu);
  return 1;
}

int mpib_connect_dequeue(struct mpib_connect_req *out) {
  pthread_mutex_lock(&creq_mu);
  struct mpib_connect_req *q = creq_head;
  if (q) {
    creq_head = q->next;
    if (!creq_head) creq_tail = NULL;
  }
  pthread_mutex_unlock(&creq_mu);
  if (!q) return 0;
  *out = *q;
  out->next = NULL;
  free(q);
  return 1;
}

struct mpib_listen_comm *mpib_listen_comm_new(uint64_t id) {
  struct mpib_listen_comm *lc = calloc(1, sizeof *lc);
  if (!lc) return NULL;
  lc->id = id;
  pthread_mutex_init(&lc->mu, NULL);
  return lc;
}

void mpib_listen_comm_free(struct mpib_listen_comm *lc) {
  if (!lc) return;
  /* The control plane drained the queue when it closed the listener (its comms are Go's to
   * close): nothing is left here but the lock. */
  pthread_mutex_destroy(&lc->mu);
  free(lc);
}

int mpib_listen_push(struct mpib_listen_comm *lc, struct mpib_comm *comm, int result) {
  struct mpib_ready *r = malloc(sizeof *r);
  if (!r) return -ENOMEM;
  *r = (struct mpib_ready){.comm = comm, .result = result};
  pthread_mutex_lock(&lc->mu);
  if (lc->tail)
    lc->tail->next = r;
  else
    lc->head = r;
  lc->tail = r;
  __atomic_add_fetch(&lc->ready, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&lc->mu);
  return 0;
}

void mpib_listen_close(struct mpib_listen_comm *lc) { __atomic_store_n(&lc->closed, 1, __ATOMIC_RELEASE); }

int mpib_listen_pop(struct mpib_listen_comm *lc, struct mpib_comm **comm, int *result) {
  pthread_mutex_lock(&lc->mu);
  struct mpib_ready *r = lc->head;
  if (r) {
    lc->head = r->next;
    if (!lc->head) lc->tail = NULL;
    __atomic_sub_fetch(&lc->ready, 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&lc->mu);
  if (!r) return 0;
  *comm = r->comm;
  *result = r->result;
  free(r);
  return 1;
}

void mpib_set_shm(void *shm) { __atomic_store_n(&mpib_g.shm, shm, __ATOMIC_RELEASE); }

static const char *rail_name(int rail) { return rail == MPIB_RAIL_SOUT ? "SOUT" : "SUP"; }
static int nic_gid_entry(const struct mpib_nic *d, int index, uint8_t gid[16], int *type);

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

int mpib_nic_open(int nic, int rail, const char *name, int port, int pkey_index) {
  if (nic < 0 || nic >= MPIB_MAX_NICS) return -EINVAL;
  struct mpib_nic *d = &mpib_g.nic[nic];
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
  d->role = rail;
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
  struct ibv_device_attr da;
  if (ibv_query_device(d->ctx, &da) == 0) {
    d->max_qp = da.max_qp;
    d->max_cq = da.max_cq;
  }
  d->gid_tbl_len = pa.gid_tbl_len;
  if (pkey_index >= pa.pkey_tbl_len) { /* NCCL_IB_PKEY is an index into the port's table, as in net_ib */
    MPIB_WARN("%s HCA %s port %d: P_Key index %d beyond its table of %d (NCCL_IB_PKEY)", rail_name(rail), name,
              port, pkey_index, pa.pkey_tbl_len);
    rc = -ENOENT;
    goto fail;
  }
  d->pkey_index = (uint16_t)pkey_index;
  d->pd = ibv_alloc_pd(d->ctx);
  if (d->pd == NULL) {
    rc = -ENOMEM;
    MPIB_WARN("%s HCA %s: ibv_alloc_pd failed", rail_name(rail), name);
    goto fail;
  }
  if ((rc = mpib_events_start(nic)) != 0) {
    MPIB_WARN("%s HCA %s: cannot start its async-event thread: %s", rail_name(rail), name, strerror(-rc));
    goto fail;
  }
  MPIB_INFO("%s rail: %s port %d (%s) MTU %d speed %d Mbps P_Key index %d", rail_name(rail), name, port,
            d->link_layer == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand" : "RoCE", mtu_bytes(d->active_mtu),
            d->speed_mbps, pkey_index);
  if (nic >= mpib_g.nnics) mpib_g.nnics = nic + 1;
  goto out;
fail:
  if (d->pd) ibv_dealloc_pd(d->pd);
  ibv_close_device(d->ctx);
  d->ctx = NULL;
  d->pd = NULL;
out:
  if (list) ibv_free_device_list(list);
  return rc;
}

void mpib_nic_close_all(void) {
  mpib_g.nfdevs = 0;
  for (int n = 0; n < MPIB_MAX_NICS; n++) {
    struct mpib_nic *d = &mpib_g.nic[n];
    mpib_events_stop(n); /* before the context closes: the thread reads its events */
    if (d->pd) ibv_dealloc_pd(d->pd);
    if (d->ctx) ibv_close_device(d->ctx);
    memset(d, 0, sizeof *d);
  }
  mpib_g.nnics = 0;
}

/* A connection uses, per rail with QPs, its QPs plus a loopback flush QP, a CQ plus a flush
 * CQ (worst case: a receiver with flush). net_ib reports the device's QP limit; MPIB divides
 * it by what one connection takes on the tighter rail. */
int mpib_max_comms(int dev, const uint32_t nqps[MPIB_NRAILS]) {
  int best = 65536;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    struct mpib_nic *d = &mpib_g.nic[mpib_g.fdev[dev].nic[r]];
    if (nqps[r] == 0 || d->max_qp <= 0 || d->max_cq <= 0) continue;
    int by_qp = d->max_qp / (int)(nqps[r] + 1), by_cq = d->max_cq / 2;
    if (by_qp < best) best = by_qp;
    if (by_cq < best) best = by_cq;
  }
  return best > 0 ? best : 1;
}

/* mlx5 Data Direct devices need a flush NCCL would not ask for (net_ib sets forceFlush for
 * them). The probe is mlx5dv's, resolved at run time from the provider libibverbs already
 * loaded for the device, so MPIB links no mlx5 library; absent means not Data Direct. */
int mpib_data_direct(int nic) {
  struct ibv_context *ctx = mpib_g.nic[nic].ctx;
  if (ctx == NULL || strncmp(mpib_g.nic[nic].name, "mlx5", 4) != 0) return 0;
  void *lib = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == NULL) return 0;
  int (*probe)(struct ibv_context *, char *, size_t) =
      (int (*)(struct ibv_context *, char *, size_t))dlvsym(lib, "mlx5dv_get_data_direct_sysfs_path", "MLX5_1.25");
  char path[256];
  int dd = probe != NULL && probe(ctx, path, sizeof path) == 0;
  dlclose(lib);
  if (dd) MPIB_INFO("%s rail: %s is an mlx5 Data Direct device (%s): receives are always flushed",
                    rail_name(mpib_g.nic[nic].role), mpib_g.nic[nic].name, path);
  return dd;
}

/* DMA-BUF is supported when the provider does not reject ibv_reg_dmabuf_mr outright. */
int mpib_dmabuf_supported(void) {
  struct ibv_mr *mr = mpib_ibv_reg_dmabuf_mr(mpib_g.nic[0].pd, 0, 0, 0, -1, 0);
  if (mr) {
    ibv_dereg_mr(mr);
    return 1;
  }
  return errno != EOPNOTSUPP && errno != EPROTONOSUPPORT;
}

/* Inline data lets the NIC take small payloads (CTS elements) from the work request itself
 * instead of a second DMA read (NCCL_IB_USE_INLINE). Only the receiver's QPs send inline (its
 * CTS writes). Asking for inline room widens every send queue entry, whether it is used or not:
 * 64 bytes take an mlx5 WQE from one 64-byte block to two, and an rxe entry from 256 to 512
 * bytes. The sender's 296-entry queues are the largest rings of a connection, so its QPs ask
 * for none. */
#define MPIB_MAX_INLINE sizeof(struct mpib_cts) /* one CTS element, as net_ib */

/* max_inline (NULL: none) asks for that much inline room and returns what the device gave: the
 * provider writes the QP's real capabilities back into the attributes. */
static struct ibv_qp *create_rc_qp(const struct mpib_comm *c, int rail, struct ibv_cq *cq, struct ibv_srq *srq, int send_wr, uint32_t *max_inline) {
  struct ibv_qp_init_attr ia = {0};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.srq = srq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = send_wr;
  ia.cap.max_recv_wr = srq ? 0 : 4;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = max_inline ? *max_inline : 0;
  struct ibv_qp *qp = ibv_create_qp(c->nic[rail]->pd, &ia);
  if (qp == NULL) return NULL;
  if (max_inline) *max_inline = ia.cap.max_inline_data;
  struct ibv_qp_attr a = {0};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = c->nic[rail]->pkey_index;
  a.port_num = c->nic[rail]->port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    ibv_destroy_qp(qp);
    return NULL;
  }
  return qp;
}

/* INIT -> RTR -> RTS against a remote QP; tc is this QP's traffic class. */
static int qp_connect(struct mpib_comm *c, struct ibv_qp *qp, int rail, uint32_t rem_qpn,
                      const struct mpib_rail_info *rem, enum ibv_mtu mtu, uint8_t tc, uint32_t psn) {
  struct mpib_nic *d = c->nic[rail];
  if (rem->ece_valid && mpib_g.ece_enable) {
    struct ibv_ece ece = rem->ece; /* the device keeps the options both ends support */
    if (mpib_ibv_set_ece(qp, &ece) != 0 && errno != EOPNOTSUPP) MPIB_INFO("%s rail: ibv_set_ece failed", rail_name(rail));
  }
  struct ibv_qp_attr a = {0};
  if (mpib_build_ah(&a.ah_attr, d->link_layer, rem->link_layer, d->port, (uint8_t)c->gid_index[rail],
                    c->gid[rail].raw, rem->gid, rem->lid, tc, c->sl) != 0) {
    MPIB_WARN("%s rail: no address for the peer (link layer %d vs %d, LID %u)", rail_name(rail), d->link_layer,
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
  int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  uint64_t took_ms = (mpib_now_ns() - t0) / 1000000ull;
  if (took_ms >= 100) /* RoCE: the kernel resolves the peer's MAC inside this call */
    MPIB_INFO("%s rail: QP %u to RTR took %llu ms", rail_name(rail), qp->qp_num, (unsigned long long)took_ms);
  if (rc) return -rc;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = mpib_g.ib_timeout;
  a.retry_cnt = mpib_g.ib_retry_cnt;
  a.rnr_retry = 7;
  a.sq_psn = psn;
  a.max_rd_atomic = 1;
  rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  return -rc;
}

static struct ibv_mr *reg_local(const struct mpib_comm *c, int rail, void *addr, size_t len) {
  return ibv_reg_mr(c->nic[rail]->pd, addr, len,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
}

/* This rail's own address, as the peer would see it (for the loopback flush QP). */
static void local_rail_info(const struct mpib_comm *c, int rail, struct mpib_rail_info *ri) {
  memset(ri, 0, sizeof *ri);
  memcpy(ri->gid, c->gid[rail].raw, 16);
  ri->mtu = c->nic[rail]->active_mtu;
  ri->lid = c->nic[rail]->lid;
  ri->link_layer = (uint8_t)c->nic[rail]->link_layer;
}

/* Loopback QP used by iflush: an RDMA_READ through the NIC orders prior GPU writes. */
static int flush_setup(struct mpib_comm *c, int rail) {
  c->flush_cq[rail] = ibv_create_cq(c->nic[rail]->ctx, 64, NULL, NULL, 0);
  if (!c->flush_cq[rail]) return -ENOMEM;
  c->flush_qp[rail] = create_rc_qp(c, rail, c->flush_cq[rail], NULL, 64, NULL);
  if (!c->flush_qp[rail]) return -ENOMEM;
  c->flush_mr[rail] = reg_local(c, rail, c->flush_buf, MPIB_PAGE);
  if (!c->flush_mr[rail]) return -ENOMEM;
  struct mpib_rail_info self;
  local_rail_info(c, rail, &self);
  return qp_connect(c, c->flush_qp[rail], rail, c->flush_qp[rail]->qp_num, &self, c->nic[rail]->active_mtu, c->tc, 0);
}

/* A QP back to INIT through RESET (what it had queued is discarded): 0 or -errno. */
static int qp_reset_to_init(const struct mpib_comm *c, struct ibv_qp *qp, int rail) {
  struct mpib_nic *d = c->nic[rail];
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RESET};
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE)) return -errno ? -errno : -EIO;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = d->pkey_index;
  a.port_num = d->port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return -EIO;
  return 0;
}

/* The flush QP after a read failed on it (it is in the error state): reset and connected to
 * itself again. Called by iflush before it posts on that rail; a loopback needs no peer. net_ib
 * resets its flush QP in recovery; MPIB does it when the QP is next needed, on the thread that
 * owns it, so no rebuild thread races a flush. 0 or -errno. */
int mpib_flush_qp_reset(struct mpib_comm *c, int rail) {
  struct mpib_nic *d = c->nic[rail];
  struct ibv_qp *qp = c->flush_qp[rail];
  struct ibv_wc wc;
  if (qp == NULL) return -EINVAL;
  int rc = qp_reset_to_init(c, qp, rail);
  while (ibv_poll_cq(c->flush_cq[rail], 1, &wc) > 0) {} /* flushed reads of requests already failed or done */
  if (rc) return rc;
  struct mpib_rail_info self;
  local_rail_info(c, rail, &self);
  return qp_connect(c, qp, rail, qp->qp_num, &self, d->active_mtu, c->tc, 0);
}

static int rail_setup(struct mpib_comm *c, int rail) {
  struct mpib_nic *d = c->nic[rail];
  if (ibv_query_gid(d->ctx, d->port, c->gid_index[rail], &c->gid[rail]) != 0) return -EADDRNOTAVAIL;
  /* A failed QP completes every outstanding work request in error, signalled or not: the
   * sender's CQ holds a full send queue's worth besides the normal completions. */
  c->cq[rail] = ibv_create_cq(d->ctx, c->is_send ? MPIB_CQ_DEPTH_SENDER : MPIB_CQ_DEPTH, NULL, NULL, 0);
  if (!c->cq[rail]) return -ENOMEM;
  /* One key for both areas: a peer's write past the CTS area lands in the size records instead
   * of failing with a remote access error. Every remote offset the protocol uses is in bounds
   * (CTS slots and fence records, size records and notice words), and a peer that wrote
   * elsewhere could corrupt the CTS area itself just as well. */
  c->area_mr[rail] = reg_local(c, rail, c->cts, MPIB_NIC_AREA);
  if (!c->area_mr[rail]) return -ENOMEM;
  if (!c->is_send) {
    struct ibv_srq_init_attr sa = {0};
    sa.attr.max_wr = MPIB_SRQ_DEPTH;
    sa.attr.max_sge = 1;
    c->srq[rail] = ibv_create_srq(d->pd, &sa);
    if (!c->srq[rail]) return -ENOMEM;
    int rc = mpib_srq_refill(c, rail);
    if (rc) return rc;
  }
  int send_wr = c->is_send ? MPIB_SEND_WR_SENDER : MPIB_SEND_WR_RECEIVER;
  int inline_cts = mpib_g.use_inline && !c->is_send;
  int base = rail == MPIB_RAIL_SOUT ? 0 : (int)c->nqps[MPIB_RAIL_SOUT];
  for (uint32_t i = 0; i < c->nqps[rail]; i++) {
    uint32_t max_inline = inline_cts ? (uint32_t)MPIB_MAX_INLINE : 0;
    struct ibv_qp *qp = create_rc_qp(c, rail, c->cq[rail], c->srq[rail], send_wr, &max_inline);
    if (!qp) {
      MPIB_WARN("%s rail: ibv_create_qp failed: %s", rail_name(rail), strerror(errno));
      return errno ? -errno : -ENOMEM;
    }
    c->qps[base + i].qp = qp;
    c->qps[base + i].rail = rail;
    int first = base + i == 0; /* the comm's first QP: the CTS may go on either rail */
    if (inline_cts && (first || max_inline < c->max_inline)) c->max_inline = max_inline;
  }
  if (!c->is_send && mpib_g.flush_enabled) return flush_setup(c, rail);
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

struct mpib_comm *mpib_comm_create(const struct mpib_conn_params *p) {
  if (p->dev < 0 || p->dev >= mpib_g.nfdevs) {
    MPIB_WARN("connection on fused device %d: %d exist", p->dev, mpib_g.nfdevs);
    return NULL;
  }
  struct mpib_comm *c = page_alloc(sizeof *c);
  if (c == NULL) return NULL;
  c->fdev = p->dev;
  for (int r = 0; r < MPIB_NRAILS; r++) c->nic[r] = &mpib_g.nic[mpib_g.fdev[p->dev].nic[r]];
  c->nreqs_pool = p->is_send ? MPIB_REQ_POOL_SEND : MPIB_REQ_POOL_RECV;
  c->reqs = calloc((size_t)c->nreqs_pool, sizeof *c->reqs);
  c->cts = page_alloc(MPIB_NIC_AREA);
  c->sizes = c->cts ? (mpib_sizes_row *)((char *)c->cts + MPIB_SIZES_OFFSET) : NULL;
  c->flush_buf = page_alloc(MPIB_PAGE);
  c->is_send = p->is_send;
  c->mode = p->mode;
  c->path_class = p->path_class;
  c->sup_relay = mpib_g.sup_relay;
  c->cts_rail = mpib_cts_rail(p->mode, p->path_class);
  c->ctrl_fd = -1;
  for (int r = 0; r < MPIB_NRAILS; r++) c->rail[r] = (struct mpib_rail_ctl){.state = MPIB_RAIL_UP, .gen = 1};
  c->force_sup_bw = mpib_g.force_sup_bw;
  c->shm_slot = -1;
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
    int rc = rail_setup(c, r);
    if (rc) {
      MPIB_WARN("%s rail: connection setup failed: %s", rail_name(r), strerror(-rc));
      mpib_comm_destroy(c);
      return NULL;
    }
  }
  return c;
}

static void rail_ece(const struct mpib_comm *c, int rail, int base, struct mpib_rail_info *ri) {
  if (!mpib_g.ece_enable || c->nqps[rail] == 0) return;
  if (mpib_ibv_query_ece(c->qps[base].qp, &ri->ece) == 0) ri->ece_valid = 1;
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
    local_rail_info(c, r, &info->rail[r]);
    info->rail[r].rkey = c->area_mr[r]->rkey;
    rail_ece(c, r, base, &info->rail[r]);
    for (uint32_t i = 0; i < c->nqps[r]; i++) info->rail[r].qpn[i] = c->qps[base + i].qp->qp_num;
    base += (int)c->nqps[r];
  }
}

/* The class of a QP's packets: the sender's class, except on the receiver, whose QPs carry
 * only CTS writes (and acknowledgements), which NCCL_IB_FIFO_TC may put in another class (as
 * net_ib does for its accept-side QPs). */
static uint8_t qp_traffic_class(const struct mpib_comm *c) {
  if (!c->is_send && mpib_g.fifo_tc >= 0) return (uint8_t)mpib_g.fifo_tc;
  return c->tc;
}

/* One rail's QPs to the peer's: 0 or the first QP's -errno. */
static int rail_connect(struct mpib_comm *c, int r, int base, const struct mpib_conn_info *remote) {
  c->rem_rkey[r] = remote->rail[r].rkey;
  enum ibv_mtu mtu = c->nic[r]->active_mtu;
  if ((enum ibv_mtu)remote->rail[r].mtu < mtu) mtu = (enum ibv_mtu)remote->rail[r].mtu;
  c->rem_rail[r] = remote->rail[r];
  c->rail_mtu[r] = mtu;
  if (c->nic[r]->fatal) return -ENODEV;
  if (c->nic[r]->link_layer == IBV_LINK_LAYER_ETHERNET) mpib_neigh_warm(remote->rail[r].gid);
  for (uint32_t i = 0; i < c->nqps[r]; i++) {
    int rc = qp_connect(c, c->qps[base + i].qp, r, remote->rail[r].qpn[i], &remote->rail[r], mtu,
                        qp_traffic_class(c), mpib_gen_psn(c->rail[r].gen));
    if (rc) {
      MPIB_WARN("%s rail: QP %u to remote QP %u cannot reach RTS: %s", rail_name(r), c->qps[base + i].qp->qp_num,
                remote->rail[r].qpn[i], strerror(-rc));
      return rc;
    }
  }
  return 0;
}

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
  int base = 0, up = 0, down = -1, err = 0;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (c->nqps[r] == 0) continue;
    if (remote->nqps[r] != c->nqps[r]) return -EPROTO;
    int rc = rail_connect(c, r, base, remote);
    base += (int)c->nqps[r];
    if (rc == 0) {
      up++;
    } else {
      down = r;
      err = rc;
    }
  }
  if (down < 0) return 0;
  if (up == 0 || !mpib_g.failover) return err;
  struct mpib_rail_ctl *rc = &c->rail[down];
  rc->state = c->nic[down]->fatal ? MPIB_RAIL_DEAD : MPIB_RAIL_DOWN;
  rc->since_ns = mpib_now_ns();
  rc->retry_at_ns = rc->since_ns + mpib_g.recovery_backoff_ms * 1000000ull;
  if (c->cts_rail == down) c->cts_rail = 1 - down;
  MPIB_INFO("%s comm: connection started degraded: the %s rail could not come up (%s); everything rides %s until it "
            "joins", c->is_send ? "send" : "recv", rail_name(down), strerror(-err), rail_name(1 - down));
  return 0;
}

static int rail_base(const struct mpib_comm *c, int r) { return r == MPIB_RAIL_SOUT ? 0 : (int)c->nqps[MPIB_RAIL_SOUT]; }

/* Forces the rail's QPs into the error state: the NIC stops sending on them and drops what
 * arrives for them, and their outstanding work requests complete in error. */
int mpib_rail_to_error(struct mpib_comm *c, int r) {
  int first = 0;
  for (uint32_t i = 0; i < c->nqps[r]; i++) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    int rc = ibv_modify_qp(c->qps[rail_base(c, r) + i].qp, &a, IBV_QP_STATE);
    if (rc && !first) first = rc;
  }
  return -first;
}

/* Brings a failed rail's QPs back: RESET, INIT, then RTR/RTS against the same remote QPs
 * (the peer does the same with the same psn). */
/* After a port flap the kernel may have re-added the rail's GID at another index: find the
 * same address of the same type again (0), or -EADDRNOTAVAIL while it is not back yet. */
static int refresh_gid_index(struct mpib_comm *c, int r) {
  uint8_t gid[16];
  int type, want_type;
  if (nic_gid_entry(c->nic[r], c->gid_index[r], gid, &want_type) == 0 && memcmp(gid, c->gid[r].raw, 16) == 0) return 0;
  /* The original type is what the entry had at connect time; without it, take RoCE v2. */
  want_type = IBV_GID_TYPE_ROCE_V2;
  int n = c->nic[r]->gid_tbl_len;
  for (int i = 0; i < n; i++) {
    if (nic_gid_entry(c->nic[r], i, gid, &type) == 0 && type == want_type && memcmp(gid, c->gid[r].raw, 16) == 0) {
      MPIB_INFO("%s rail: its GID moved from index %d to %d", rail_name(r), c->gid_index[r], i);
      c->gid_index[r] = i;
      return 0;
    }
  }
  return -EADDRNOTAVAIL;
}

int mpib_rail_reconnect(struct mpib_comm *c, int r, uint32_t psn) {
  struct mpib_nic *d = c->nic[r];
  if (d->link_layer == IBV_LINK_LAYER_ETHERNET) {
    int rc = refresh_gid_index(c, r);
    if (rc) return rc;
    mpib_neigh_warm(c->rem_rail[r].gid); /* a link that went down flushed the entry */
  }
  for (uint32_t i = 0; i < c->nqps[r]; i++) {
    struct ibv_qp *qp = c->qps[rail_base(c, r) + i].qp;
    int rc = qp_reset_to_init(c, qp, r);
    if (rc) return rc;
    rc = qp_connect(c, qp, r, c->rem_rail[r].qpn[i], &c->rem_rail[r], c->rail_mtu[r], qp_traffic_class(c), psn);
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
 * seen in the lab right after a link came back), and the caller is NCCL's progress thread,
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

/* Waits for a rebuild still running before its QPs are destroyed (a close during recovery). */
static void rebuild_wait(struct mpib_comm *c, int r) {
  struct mpib_rebuild *b = &c->rail[r].rebuild;
  if (b->running) pthread_join(b->thread, NULL);
  b->running = 0;
}

void mpib_comm_set_ctrl_fd(struct mpib_comm *c, int fd) { c->ctrl_fd = fd; }

void mpib_comm_tcp_notice(struct mpib_comm *c, int rail, uint64_t word) {
  if (rail >= 0 && rail < MPIB_NRAILS) __atomic_store_n(&c->tcp_notice[rail], word, __ATOMIC_RELEASE);
}

void mpib_comm_tcp_record(struct mpib_comm *c, int rail, const void *rec) {
  if (rail < 0 || rail >= MPIB_NRAILS) return;
  memcpy(&c->tcp_rec[rail], rec, sizeof c->tcp_rec[rail]);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void rail_destroy(struct mpib_comm *c, int r) {
  if (c->flush_qp[r]) ibv_destroy_qp(c->flush_qp[r]);
  if (c->flush_mr[r]) ibv_dereg_mr(c->flush_mr[r]);
  if (c->flush_cq[r]) ibv_destroy_cq(c->flush_cq[r]);
  if (c->srq[r]) ibv_destroy_srq(c->srq[r]);
  if (c->area_mr[r]) ibv_dereg_mr(c->area_mr[r]);
  if (c->cq[r]) ibv_destroy_cq(c->cq[r]);
  c->flush_qp[r] = NULL, c->flush_mr[r] = NULL, c->flush_cq[r] = NULL, c->srq[r] = NULL;
  c->area_mr[r] = NULL, c->cq[r] = NULL;
  c->srq_posted[r] = 0;
}

static void rail_qps_destroy(struct mpib_comm *c, int r) {
  int base = rail_base(c, r);
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

int mpib_comm_set_path(struct mpib_comm *c, int path_class, uint32_t sup_qps, int sup_gid_index) {
  if (sup_qps > 0 && c->nqps[MPIB_RAIL_SUP] == 0) {
    c->nqps[MPIB_RAIL_SUP] = sup_qps;
    c->gid_index[MPIB_RAIL_SUP] = sup_gid_index;
    int rc = rail_setup(c, MPIB_RAIL_SUP);
    if (rc) {
      MPIB_WARN("SUP rail: connection setup failed: %s", strerror(-rc));
      mpib_comm_drop_rail(c, MPIB_RAIL_SUP);
      return rc;
    }
  }
  c->path_class = path_class;
  c->cts_rail = mpib_cts_rail(c->mode, path_class);
  return 0;
}

void mpib_comm_destroy(struct mpib_comm *c) {
  if (!c) return;
  if (c->shm_slot >= 0 && mpib_g.shm) {
    mpib_telemetry_flush(c);
    mpib_shm_release((mpib_shm *)mpib_g.shm, (uint32_t)c->shm_slot);
  }
  for (int r = 0; r < MPIB_NRAILS; r++) rebuild_wait(c, r);
  for (int r = 0; r < MPIB_NRAILS; r++) rail_qps_destroy(c, r);
  for (int r = 0; r < MPIB_NRAILS; r++) rail_destroy(c, r);
  free(c->reqs);
  page_free(c->cts, MPIB_NIC_AREA);
  page_free(c->flush_buf, MPIB_PAGE);
  page_free(c, sizeof *c);
}

void mpib_comm_peer_gone(struct mpib_comm *c) { __atomic_store_n(&c->peer_gone_ns, mpib_now_ns(), __ATOMIC_RELEASE); }

/* Backdated past the grace period: the peer said it failed, nothing more is on its way. */
void mpib_comm_peer_failed(struct mpib_comm *c) {
  uint64_t now = mpib_now_ns();
  __atomic_store_n(&c->peer_gone_ns, now > 2000000000ull ? now - 2000000000ull : 1, __ATOMIC_RELEASE);
}

uint64_t mpib_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int mpib_gid_table_len(int nic) { return mpib_g.nic[nic].gid_tbl_len; }

uint32_t mpib_gid_gen(int nic) { return __atomic_load_n(&mpib_g.nic[nic].gid_gen, __ATOMIC_ACQUIRE); }

int mpib_gid_entry(int nic, int index, uint8_t gid[16], int *type) { return nic_gid_entry(&mpib_g.nic[nic], index, gid, type); }

static int nic_gid_entry(const struct mpib_nic *d, int index, uint8_t gid[16], int *type) {
  struct ibv_gid_entry e;
  int rc = mpib_ibv_query_gid_ex(d->ctx, d->port, (uint32_t)index, &e, 0);
  if (rc == EOPNOTSUPP) { /* libibverbs before rdma-core 32: the type from sysfs */
    if (ibv_query_gid(d->ctx, d->port, index, &e.gid) != 0) return -1;
    int t = mpib_gid_type_sysfs(ibv_get_device_name(d->ctx->device), d->port, index);
    if (t < 0) return -1;
    e.gid_type = (uint32_t)t;
  } else if (rc != 0) {
    return -1;
  }
  memcpy(gid, e.gid.raw, 16);
  *type = (int)e.gid_type;
  return 0;
}

void mpib_gid_table_read(int nic, uint8_t *gids, int *types, int n) {
  struct mpib_nic *d = &mpib_g.nic[nic];
  for (int i = 0; i < n; i++) types[i] = -1;
  /* Entries of every port come back: room for two ports' worth (a larger device fails the
   * call and is read entry by entry below). */
  size_t max = (size_t)n * 2;
  struct ibv_gid_entry *e = calloc(max, sizeof *e);
  ssize_t got = e ? mpib_ibv_query_gid_table(d->ctx, e, max, 0) : -ENOMEM;
  for (ssize_t j = 0; j < got; j++) {
    if (e[j].port_num != d->port || e[j].gid_index >= (uint32_t)n) continue;
    memcpy(gids + 16 * (size_t)e[j].gid_index, e[j].gid.raw, 16);
    types[e[j].gid_index] = (int)e[j].gid_type;
  }
  free(e);
  if (got >= 0) return;
  for (int i = 0; i < n; i++) { /* an older library (or a failed call): entry by entry */
    int t;
    if (nic_gid_entry(d, i, gids + 16 * (size_t)i, &t) == 0) types[i] = t;
  }
}

int mpib_reg_mr(int dev, void *data, size_t size, int fd, uint64_t offset, struct mpib_mr **out) {
  if (dev < 0 || dev >= mpib_g.nfdevs) return -ENODEV;
  struct mpib_mr *mh = calloc(1, sizeof *mh);
  if (!mh) return -ENOMEM;
  mh->fdev = dev;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (mpib_g.relaxed_ordering) access |= IBV_ACCESS_RELAXED_ORDERING;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    struct mpib_nic *d = &mpib_g.nic[mpib_g.fdev[dev].nic[r]];
    /* A dead device never carries data again in this process: the buffer is registered on
     * the rails that work (the data path never posts on a dead rail). */
    if (!d->pd || __atomic_load_n(&d->fatal, __ATOMIC_ACQUIRE)) continue;
    if (fd >= 0) {
      mh->mr[r] = mpib_ibv_reg_dmabuf_mr(d->pd, offset, size, (uint64_t)(uintptr_t)data, fd, access);
    } else {
      mh->mr[r] = mpib_ibv_reg_mr_compat(d->pd, data, size, access);
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
