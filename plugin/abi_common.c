/* Calls shared by every ABI table (abi_v8.c .. abi_v12.c), declared in mpib_api.h: thin C
 * entry points into the Go control plane (its exports, _cgo_export.h), and connect() and
 * accept(), which take finished handshakes from the handoff (mpib_handoff.h) without calling
 * into Go. */
#include <string.h>

#include "_cgo_export.h"
#include "mpib_api.h"
#include "mpib_handoff.h"
#include "mpib_profiler.h"
#include "mpib_props.h"

uint64_t mpib_process_ctx;

ncclResult_t mpib_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof, int traffic_class, uint64_t *ctx) {
  mpib_log_set(logger);
  mpib_prof_set(prof);
  return (ncclResult_t)mpibGoInit(traffic_class, ctx);
}

ncclResult_t mpib_finalize(uint64_t ctx) { return (ncclResult_t)mpibGoFinalize(ctx); }

ncclResult_t mpib_devices(int *ndev) {
  *ndev = mpib_g.nfdevs;
  MPIB_INFO("devices: %d fused device%s (%d NICs open)", *ndev, *ndev == 1 ? "" : "s", mpib_g.nnics);
  return ncclSuccess;
}

/* How many fused devices name NIC nic as a SUP port. */
static int sup_sharers(int nic) {
  int n = 0;
  for (int d = 0; d < mpib_g.nfdevs; d++)
    for (int i = 0; i < mpib_g.fdev[d].nsup; i++) n += mpib_g.fdev[d].sup_nic[i] == nic;
  return n;
}

/* The SUP speed of a fused device: a connection uses one of its SUP ports, so the slowest
 * whose speed is known (<= 0: none is), each port's speed its share among the devices naming
 * it. */
static int sup_speed_mbps(const struct mpib_fdev *f) {
  int slowest = 0;
  for (int i = 0; i < f->nsup; i++) {
    int s = mpib_sup_share_mbps(mpib_g.nic[f->sup_nic[i]].speed_mbps, sup_sharers(f->sup_nic[i]));
    if (s > 0 && (slowest == 0 || s < slowest)) slowest = s;
  }
  return slowest;
}

/* Each fused device is one NCCL device of its own (vProps: itself): MPIB makes no virtual
 * devices out of them (makeVDevice stays NULL), and its members are not NCCL devices. */
ncclResult_t mpib_get_properties(int dev, struct mpib_props *p) {
  if (dev < 0 || dev >= mpib_g.nfdevs) {
    MPIB_WARN("getProperties for device %d: MPIB has %d fused device%s", dev, mpib_g.nfdevs,
              mpib_g.nfdevs == 1 ? "" : "s");
    return ncclInvalidArgument;
  }
  const struct mpib_fdev *f = &mpib_g.fdev[dev];
  const struct mpib_nic *sout = &mpib_g.nic[f->sout_nic];
  memset(p, 0, sizeof *p);
  p->name = (char *)f->prop_name;
  p->pci_path = f->prop_has_pci_path ? (char *)f->prop_pci_path : NULL;
  p->guid = f->prop_guid;
  p->ptr_support = f->prop_ptr_support;
  p->force_flush = f->prop_force_flush;
  /* what the slowest kind of connection of this mode gets (mpib_props.h) */
  p->speed =
      mpib_fused_speed_mbps(mpib_g.mode == MPIB_MODE_ADVANCED, mpib_g.sup_relay, sout->speed_mbps, sup_speed_mbps(f));
  p->port = sout->port;
  p->max_comms = f->prop_max_comms;
  p->max_recvs = MPIB_MAX_RECVS;
  p->rail_id = f->rail_id;
  p->plane_id = f->plane_id;
  p->ndevs = 1;
  p->devs[0] = dev;
  return ncclSuccess;
}

ncclResult_t mpib_listen(uint64_t ctx, int dev, void *handle, void **listenComm) {
  return (ncclResult_t)mpibGoListen(ctx, dev, handle, listenComm);
}

/* A listen handle as the peer made it: no attempt id and no pending entry written into it by
 * an earlier connect() (mpib.h, MPIB_HANDLE_*_OFFSET). */
static int mpib_handle_fresh(const void *handle) {
  static const uint8_t zero[MPIB_HANDLE_PENDING_OFFSET + 8 - MPIB_HANDLE_ATTEMPT_OFFSET];
  return memcmp((const uint8_t *)handle + MPIB_HANDLE_ATTEMPT_OFFSET, zero, sizeof zero) == 0;
}

ncclResult_t mpib_connect(uint64_t ctx, int dev, int traffic_class, void *handle, void **sendComm,
                          ncclNetDeviceHandle_t **sendDevComm) {
  if (sendDevComm) *sendDevComm = NULL; /* no device offload */
  struct mpib_comm *comm = NULL;
  int result = ncclSuccess;
  switch (mpib_pending_poll(handle, &comm, &result)) { /* no call into Go: see mpib.h */
  case 1:
    *sendComm = NULL; /* the handshake is still running */
    return ncclSuccess;
  case 2: /* it ended: its comm, or the error the control plane logged when it failed */
    *sendComm = comm;
    return (ncclResult_t)result;
  default: /* a new attempt: queued for the control plane, which starts its handshake */
    *sendComm = NULL;
    if (dev >= 0 && dev < mpib_g.nfdevs && mpib_handle_fresh(handle) &&
        mpib_connect_enqueue(ctx, dev, traffic_class, handle))
      return ncclSuccess;
    return (ncclResult_t)mpibGoConnect(ctx, dev, traffic_class, handle, sendComm); /* or refused there */
  }
}

/* Never calls into Go, nor waits for it: the control plane queues finished handshakes on the
 * listen comm without a lock (mpib_handoff.c). */
ncclResult_t mpib_accept(void *listenComm, void **recvComm, ncclNetDeviceHandle_t **recvDevComm) {
  struct mpib_listen_comm *lc = listenComm;
  struct mpib_comm *comm = NULL;
  int result = ncclSuccess;
  if (recvDevComm) *recvDevComm = NULL;
  *recvComm = NULL;
  if (lc == NULL) {
    MPIB_WARN("accept on a NULL listen comm");
    return ncclInvalidArgument;
  }
  if (__atomic_load_n(&lc->ready, __ATOMIC_ACQUIRE) == 0 || !mpib_listen_try_pop(lc, &comm, &result)) {
    if (!__atomic_load_n(&lc->closed, __ATOMIC_ACQUIRE)) return ncclSuccess; /* nothing finished yet */
    MPIB_WARN("accept on a closed or finalized listen comm");
    return ncclInvalidArgument;
  }
  *recvComm = comm;
  return (ncclResult_t)result;
}

ncclResult_t mpib_reg_mr_v8(void *comm, void *data, size_t size, int type, void **mhandle) {
  return (ncclResult_t)mpibGoRegMr(comm, data, size, type, -1, 0, mhandle);
}

ncclResult_t mpib_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                void **mhandle) {
  return (ncclResult_t)mpibGoRegMr(comm, data, size, type, fd, offset, mhandle);
}

ncclResult_t mpib_dereg_mr_api(void *comm, void *mhandle) { return (ncclResult_t)mpibGoDeregMr(comm, mhandle); }
ncclResult_t mpib_close_send(void *sendComm) { return (ncclResult_t)mpibGoCloseComm(sendComm); }
ncclResult_t mpib_close_recv(void *recvComm) { return (ncclResult_t)mpibGoCloseComm(recvComm); }
ncclResult_t mpib_close_listen(void *listenComm) { return (ncclResult_t)mpibGoCloseListen(listenComm); }
