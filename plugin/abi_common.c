/* Calls shared by every ABI table (abi_v8.c .. abi_v12.c), declared in mpib_api.h: thin C
 * entry points into the Go control plane (its exports, _cgo_export.h), and connect() and
 * accept(), which take finished handshakes from the handoff (mpib_handoff.h) without calling
 * into Go. */
#include <string.h>
#include <unistd.h>

#include "_cgo_export.h"
#include "mpib_api.h"
#include "mpib_handoff.h"
#include "mpib_profiler.h"
#include "mpib_props.h"

uint64_t mpib_process_ctx;

/* The process that loaded the library. A child forked from it (PyTorch's fork start method,
 * os.fork) inherits the plugin without the threads that serve it: the Go runtime's and the
 * control plane's stay in the parent, so a call that waits on them never returns, and its
 * verbs objects share the parent's device files, so a close would destroy the parent's QPs.
 * Every control call refuses in such a child. The data calls (isend, irecv, iflush, test) do
 * not check: they need a comm, which a child has only by using its parent's, which neither
 * NCCL nor net_ib supports (registered pages are not even mapped in the child after
 * ibv_fork_init). */
static pid_t mpib_loaded_pid;
__attribute__((constructor)) static void mpib_note_loaded_pid(void) { mpib_loaded_pid = getpid(); }

/* Nonzero, with a warning naming call, in a child forked after the library loaded. */
static int mpib_refused_in_fork_child(const char *call) {
  pid_t pid = getpid();
  if (pid == mpib_loaded_pid) return 0;
  static int explained;
  if (__atomic_exchange_n(&explained, 1, __ATOMIC_RELAXED) == 0)
    MPIB_WARN("%s refused: process %d was forked from process %d after MPIB loaded there, and MPIB cannot run "
              "in a forked child (its control plane's threads stayed in the parent; its QPs are the parent's). "
              "Create this process's communicators in a process started by exec (Python: the multiprocessing "
              "start method 'spawn' or 'forkserver'), or load the plugin only after the fork",
              call, (int)pid, (int)mpib_loaded_pid);
  else MPIB_WARN("%s refused: process %d is a fork child of MPIB's process %d", call, (int)pid, (int)mpib_loaded_pid);
  return 1;
}
#define MPIB_REFUSE_IN_FORK_CHILD(call)                           \
  do {                                                            \
    if (mpib_refused_in_fork_child(call)) return ncclSystemError; \
  } while (0)

ncclResult_t mpib_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof, int traffic_class, uint64_t *ctx) {
  mpib_log_set(logger);
  MPIB_REFUSE_IN_FORK_CHILD("init");
  mpib_prof_set(prof);
  return (ncclResult_t)mpibGoInit(traffic_class, ctx);
}

ncclResult_t mpib_finalize(uint64_t ctx) {
  MPIB_REFUSE_IN_FORK_CHILD("finalize");
  return (ncclResult_t)mpibGoFinalize(ctx);
}

ncclResult_t mpib_devices(int *ndev) {
  MPIB_REFUSE_IN_FORK_CHILD("devices");
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

/* The SUP speed device dev reports: its own, else the node's slowest (mpib_props.h). */
static int sup_speed_reported_mbps(int dev) {
  int node[MPIB_MAX_DEVS] = {0};
  for (int d = 0; d < mpib_g.nfdevs; d++) node[d] = sup_speed_mbps(&mpib_g.fdev[d]);
  return mpib_sup_speed_or_node_mbps(node[dev], node, mpib_g.nfdevs);
}

/* Each fused device is one NCCL device of its own (vProps: itself): MPIB makes no virtual
 * devices out of them (makeVDevice stays NULL), and its members are not NCCL devices. */
ncclResult_t mpib_get_properties(int dev, struct mpib_props *p) {
  MPIB_REFUSE_IN_FORK_CHILD("getProperties");
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
  p->speed = mpib_fused_speed_mbps(mpib_g.mode == MPIB_MODE_ADVANCED, mpib_g.sup_relay, sout->speed_mbps,
                                   sup_speed_reported_mbps(dev));
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
  MPIB_REFUSE_IN_FORK_CHILD("listen");
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
  MPIB_REFUSE_IN_FORK_CHILD("connect");
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
  MPIB_REFUSE_IN_FORK_CHILD("accept");
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
  MPIB_REFUSE_IN_FORK_CHILD("regMr");
  return (ncclResult_t)mpibGoRegMr(comm, data, size, type, -1, 0, mhandle);
}

ncclResult_t mpib_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                void **mhandle) {
  MPIB_REFUSE_IN_FORK_CHILD("regMrDmaBuf");
  return (ncclResult_t)mpibGoRegMr(comm, data, size, type, fd, offset, mhandle);
}

ncclResult_t mpib_dereg_mr_api(void *comm, void *mhandle) {
  MPIB_REFUSE_IN_FORK_CHILD("deregMr");
  return (ncclResult_t)mpibGoDeregMr(comm, mhandle);
}

ncclResult_t mpib_close_send(void *sendComm) {
  MPIB_REFUSE_IN_FORK_CHILD("closeSend");
  return (ncclResult_t)mpibGoCloseComm(sendComm);
}

ncclResult_t mpib_close_recv(void *recvComm) {
  MPIB_REFUSE_IN_FORK_CHILD("closeRecv");
  return (ncclResult_t)mpibGoCloseComm(recvComm);
}

ncclResult_t mpib_close_listen(void *listenComm) {
  MPIB_REFUSE_IN_FORK_CHILD("closeListen");
  return (ncclResult_t)mpibGoCloseListen(listenComm);
}
