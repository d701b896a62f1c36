/* The device table (mpib_g, the process's NICs and fused devices) and the NICs in it: opening
 * and closing them (with the async-event thread watching them), their limits, properties and port state,
 * their GID tables, and memory registrations on a fused device's NICs. Called by the Go control
 * plane, by comm setup and by rail rebuild; offers what mpib_device.h declares; calls only the
 * event thread (mpib_events.h) and the verbs shims (mpib_verbs.h). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpib.h"
#include "mpib_device.h"
#include "mpib_events.h"
#include "mpib_props.h"
#include "mpib_verbs.h"

struct mpib_global mpib_g = {.force_sup_bw = MPIB_NO_OVERRIDE};

void mpib_set_shm(void *shm) { __atomic_store_n(&mpib_g.shm, shm, __ATOMIC_RELEASE); }

static int mtu_bytes(enum ibv_mtu m) { return 128 << (m - 1); }

/* Mbps from the port's active speed and width encodings (as net_ib reads them). */
static int port_speed_mbps(const struct ibv_port_attr *pa) {
  int lane;
  switch (pa->active_speed) {
  case 1: lane = 2500; break;
  case 2: lane = 5000; break;
  case 4:
  case 8: lane = 10000; break;
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

/* The port's rate from sysfs (/sys/class/infiniband/NAME/ports/PORT/rate), 0 when unread. */
static int sysfs_rate_mbps(const char *name, int port) {
  char path[256], text[64] = {0};
  snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/rate", name, port);
  FILE *f = fopen(path, "re");
  if (f == NULL) return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  return mpib_rate_text_mbps(text);
}

/* Reads an open NIC's port into d: state (a down port fails unless may_be_down), link layer,
 * MTU, LID, speed, the device's limits, the GID table's length and the P_Key index. 0 or
 * -errno. */
static int port_setup(struct mpib_nic *d, int rail, int port, int pkey_index, int may_be_down) {
  const char *name = d->name;
  int rc;
  struct ibv_port_attr pa;
  d->port = (uint8_t)port;
  if ((rc = ibv_query_port(d->ctx, d->port, &pa)) != 0) {
    MPIB_WARN("%s HCA %s: port %d cannot be queried: %s", mpib_rail_name(rail), name, port, strerror(rc));
    return -rc;
  }
  if (pa.state != IBV_PORT_ACTIVE && !may_be_down) {
    MPIB_WARN("%s HCA %s port %d is not active (state %d)", mpib_rail_name(rail), name, port, pa.state);
    return -ENETDOWN;
  }
  d->link_layer = pa.link_layer;
  d->active_mtu = pa.active_mtu >= IBV_MTU_256 && pa.active_mtu <= IBV_MTU_4096 ? pa.active_mtu : IBV_MTU_1024;
  d->lid = pa.lid;
  d->speed_mbps = port_speed_mbps(&pa);
  if (pa.active_speed == 128) { /* NDR, where the kernel caps the field: an XDR port reads so */
    int rate = sysfs_rate_mbps(name, port);
    if (rate > d->speed_mbps) d->speed_mbps = rate;
  }
  if (pa.state != IBV_PORT_ACTIVE) {
    /* An unplugged SUP cable must not take the node's devices away (only SUP ports get here):
     * the port is opened down and treated as one that went down later. A mesh device leaves it
     * out of SUP pairs (sup.go); a device's only SUP port gets its connections' SUP QPs, whose
     * traffic goes to SOUT until the port comes up. Its speed is unknown until then (a down
     * port's figures are not the link's). */
    MPIB_WARN("%s HCA %s port %d is not active (state %d): opened; its traffic moves to SOUT until the port comes up",
              mpib_rail_name(rail), name, port, pa.state);
    d->port_down = 1;
    d->speed_mbps = 0;
  }
  struct ibv_device_attr da;
  if (ibv_query_device(d->ctx, &da) == 0) {
    d->max_qp = da.max_qp;
    d->max_cq = da.max_cq;
  }
  d->gid_tbl_len = pa.gid_tbl_len;
  if (pkey_index >= pa.pkey_tbl_len) { /* NCCL_IB_PKEY is an index into the port's table, as in net_ib */
    MPIB_WARN("%s HCA %s port %d: P_Key index %d beyond its table of %d (NCCL_IB_PKEY)", mpib_rail_name(rail), name,
              port, pkey_index, pa.pkey_tbl_len);
    return -ENOENT;
  }
  d->pkey_index = (uint16_t)pkey_index;
  return 0;
}

int mpib_nic_open(int nic, int rail, const char *name, int port, int pkey_index, int may_be_down) {
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
    MPIB_WARN("%s HCA '%s' not found (%d RDMA devices visible)", mpib_rail_name(rail), name, n);
    rc = -ENODEV;
    goto out;
  }
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  d->role = rail;
  d->ctx = ibv_open_device(found);
  if (d->ctx == NULL) {
    rc = errno ? -errno : -EIO;
    MPIB_WARN("%s HCA %s: ibv_open_device failed: %s", mpib_rail_name(rail), name, strerror(-rc));
    goto out;
  }
  if ((rc = port_setup(d, rail, port, pkey_index, may_be_down)) != 0) goto fail;
  d->pd = ibv_alloc_pd(d->ctx);
  if (d->pd == NULL) {
    rc = -ENOMEM;
    MPIB_WARN("%s HCA %s: ibv_alloc_pd failed", mpib_rail_name(rail), name);
    goto fail;
  }
  if ((rc = mpib_events_start(nic)) != 0) {
    MPIB_WARN("%s HCA %s: cannot watch its async events: %s", mpib_rail_name(rail), name, strerror(-rc));
    goto fail;
  }
  MPIB_INFO("%s rail: %s port %d (%s) MTU %d speed %d Mbps P_Key index %d", mpib_rail_name(rail), name, port,
            d->link_layer == IBV_LINK_LAYER_INFINIBAND ? "InfiniBand" : "RoCE", mtu_bytes(d->active_mtu), d->speed_mbps,
            pkey_index);
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

static void mr_cache_forget(void);

void mpib_nic_close_all(void) {
  mpib_g.nfdevs = 0;
  mr_cache_forget();
  mpib_events_stop(); /* before the contexts close: the thread reads their events */
  for (int n = 0; n < MPIB_MAX_NICS; n++) {
    struct mpib_nic *d = &mpib_g.nic[n];
    if (d->pd) ibv_dealloc_pd(d->pd);
    if (d->ctx) ibv_close_device(d->ctx);
    memset(d, 0, sizeof *d);
  }
  mpib_g.nnics = 0;
}

/* A connection uses, per rail with QPs, its QPs plus a loopback flush QP, a CQ plus a flush
 * CQ (worst case: a receiver with flush). net_ib reports the device's QP limit; MPIB divides
 * it by what one connection takes on the tightest NIC (every SUP port may be the one: all of
 * a mesh's connections may go to one neighbour). */
int mpib_max_comms(int dev, const uint32_t nqps[MPIB_NRAILS]) {
  const struct mpib_fdev *f = &mpib_g.fdev[dev];
  int best = 65536;
  for (int i = -1; i < f->nsup; i++) {
    int r = i < 0 ? MPIB_RAIL_SOUT : MPIB_RAIL_SUP;
    struct mpib_nic *d = &mpib_g.nic[i < 0 ? f->sout_nic : f->sup_nic[i]];
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
  if (dd)
    MPIB_INFO("%s rail: %s is an mlx5 Data Direct device (%s): receives are always flushed",
              mpib_rail_name(mpib_g.nic[nic].role), mpib_g.nic[nic].name, path);
  return dd;
}

/* A NIC takes DMA-BUF registrations when its provider does not reject ibv_reg_dmabuf_mr
 * outright: a probe with no file (fd -1) fails with EBADF where the provider has it, and with
 * EOPNOTSUPP or EPROTONOSUPPORT where it has not (net_ib's test, ncclIbDmaBufSupport). The
 * answer is the NIC's provider's: two NICs of one fused device may differ (rxe, siw, an older
 * irdma beside an mlx5). */
int mpib_nic_dmabuf_supported(int nic) {
  struct ibv_pd *pd = mpib_g.nic[nic].pd;
  if (pd == NULL) return 0;
  errno = 0;
  struct ibv_mr *mr = mpib_ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
  if (mr) {
    ibv_dereg_mr(mr);
    return 1;
  }
  return errno != EOPNOTSUPP && errno != EPROTONOSUPPORT;
}

int mpib_gid_table_len(int nic) { return mpib_g.nic[nic].gid_tbl_len; }

uint32_t mpib_gid_gen(int nic) { return __atomic_load_n(&mpib_g.nic[nic].gid_gen, __ATOMIC_ACQUIRE); }

int mpib_sup_port_down(int nic) { return __atomic_load_n(&mpib_g.nic[nic].port_down, __ATOMIC_ACQUIRE); }

int mpib_nic_dead(int nic) { return __atomic_load_n(&mpib_g.nic[nic].fatal, __ATOMIC_ACQUIRE); }

int mpib_gid_entry(int nic, int index, uint8_t gid[16], int *type) {
  return mpib_nic_gid_entry(&mpib_g.nic[nic], index, gid, type);
}

int mpib_nic_gid_entry(const struct mpib_nic *d, int index, uint8_t gid[16], int *type) {
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
  /* One call returns the valid entries of every port; a device with more than fit (a rare
   * case: mpib_gid_table_room) fails it and is read entry by entry below. */
  size_t max = mpib_gid_table_room(n);
  struct ibv_gid_entry *e = calloc(max, sizeof *e);
  ssize_t got = e ? mpib_ibv_query_gid_table(d->ctx, e, max, 0) : -ENOMEM;
  for (ssize_t j = 0; j < got; j++) {
    if (e[j].port_num != d->port || e[j].gid_index >= (uint32_t)n) continue;
    memcpy(gids + 16 * (size_t)e[j].gid_index, e[j].gid.raw, 16);
    types[e[j].gid_index] = (int)e[j].gid_type;
  }
  free(e);
  if (got >= 0) return;
  MPIB_INFO("%s: the GID table in one call failed (%s): reading its %d entries one by one",
            ibv_get_device_name(d->ctx->device), strerror((int)-got), n);
  for (int i = 0; i < n; i++) { /* an older library (or a failed call): entry by entry */
    int t;
    if (mpib_nic_gid_entry(d, i, gids + 16 * (size_t)i, &t) == 0) types[i] = t;
  }
}

/* The registration cache, per fused device, as net_ib's (ncclIbMrCache): NCCL registers a user
 * buffer per operation (2.20..2.23, on its proxy thread: the flag regIsGlobal tells it
 * registration is cheap) and per peer connection (2.24+), and each regMr of a range inside a
 * registration held already takes that one (a reference) instead of pinning the pages again on
 * every NIC of the device. A host or CUDA buffer is registered over its whole pages; a DMA-BUF
 * one as asked (its offset names the buffer), served again only for a range inside it. One
 * lock for every device: registration is not on the message path. */
static struct mpib_mr *mr_cache[MPIB_MAX_DEVS];
static pthread_mutex_t mr_cache_mu = PTHREAD_MUTEX_INITIALIZER;

static struct mpib_mr *mr_cache_find(int dev, uintptr_t data, size_t size, int dmabuf) {
  for (struct mpib_mr *mh = mr_cache[dev]; mh; mh = mh->next)
    if (mh->dmabuf == dmabuf && mpib_mr_serves(mh->start, mh->len, data, size)) return mh;
  return NULL;
}

/* A new registration of [start, start + len) on every working NIC of the device. */
static int mr_register(int dev, void *start, size_t len, int fd, uint64_t offset, struct mpib_mr *mh) {
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (mpib_g.relaxed_ordering) access |= IBV_ACCESS_RELAXED_ORDERING;
  const struct mpib_fdev *f = &mpib_g.fdev[dev];
  for (int slot = 0; slot < 1 + f->nsup; slot++) { /* SOUT, then every SUP port (mpib_comm_mr) */
    struct mpib_nic *d = &mpib_g.nic[slot == 0 ? f->sout_nic : f->sup_nic[slot - 1]];
    /* A dead device never carries data again in this process: the buffer is registered on
     * the rails that work (the data path never posts on a dead rail). */
    if (!d->pd || __atomic_load_n(&d->fatal, __ATOMIC_ACQUIRE)) continue;
    if (fd >= 0) {
      mh->mr[slot] = mpib_ibv_reg_dmabuf_mr(d->pd, offset, len, (uint64_t)(uintptr_t)start, fd, access);
    } else {
      mh->mr[slot] = mpib_ibv_reg_mr_compat(d->pd, start, len, access);
    }
    if (!mh->mr[slot]) {
      int rc = errno ? -errno : -ENOMEM;
      MPIB_WARN("%s rail (%s): memory registration of %zu bytes at %p failed: %s", mpib_rail_name(d->role), d->name,
                len, start, strerror(-rc));
      return rc;
    }
  }
  return 0;
}

static int mr_free(struct mpib_mr *mh) {
  int rc = 0;
  for (int slot = 0; slot < MPIB_MR_SLOTS; slot++) {
    if (mh->mr[slot] && ibv_dereg_mr(mh->mr[slot])) rc = -EIO;
  }
  free(mh);
  return rc;
}

int mpib_reg_mr(int dev, void *data, size_t size, int fd, uint64_t offset, struct mpib_mr **out) {
  int dmabuf = fd >= 0;
  uintptr_t start = (uintptr_t)data;
  size_t len = size;
  if (!dmabuf) mpib_mr_span((uintptr_t)data, size, MPIB_PAGE, &start, &len);
  pthread_mutex_lock(&mr_cache_mu);
  if (dev < 0 || dev >= mpib_g.nfdevs) { /* checked under the lock: mpib_nic_close_all forgets the cache */
    pthread_mutex_unlock(&mr_cache_mu);
    return -ENODEV;
  }
  struct mpib_mr *mh = mr_cache_find(dev, (uintptr_t)data, size, dmabuf);
  if (mh) {
    mh->refs++;
    pthread_mutex_unlock(&mr_cache_mu);
    *out = mh;
    return 0;
  }
  int rc = -ENOMEM;
  mh = calloc(1, sizeof *mh);
  if (mh) {
    *mh = (struct mpib_mr){.fdev = dev, .start = start, .len = len, .dmabuf = dmabuf, .refs = 1, .in_cache = 1};
    rc = mr_register(dev, (void *)start, len, fd, offset, mh);
  }
  if (rc == 0) {
    mh->next = mr_cache[dev];
    mr_cache[dev] = mh;
    *out = mh;
  } else if (mh) {
    mr_free(mh);
  }
  pthread_mutex_unlock(&mr_cache_mu);
  return rc;
}

int mpib_dereg_mr(struct mpib_mr *mh) {
  if (!mh) return 0;
  pthread_mutex_lock(&mr_cache_mu);
  int last = --mh->refs == 0;
  if (last && mh->in_cache) {
    struct mpib_mr **p = &mr_cache[mh->fdev];
    while (*p != mh) p = &(*p)->next;
    *p = mh->next;
  }
  pthread_mutex_unlock(&mr_cache_mu);
  return last ? mr_free(mh) : 0;
}

/* The devices close: registrations still held are their holders' alone from now on (a
 * deregMr frees them), and none serves a registration made after the devices open again. */
static void mr_cache_forget(void) {
  pthread_mutex_lock(&mr_cache_mu);
  for (int dev = 0; dev < MPIB_MAX_DEVS; dev++) {
    for (struct mpib_mr *mh = mr_cache[dev]; mh; mh = mh->next) mh->in_cache = 0;
    mr_cache[dev] = NULL;
  }
  pthread_mutex_unlock(&mr_cache_mu);
}
