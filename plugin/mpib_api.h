/*
 * The one internal API that the ABI tables adapt to. abi_v12.c implements the newest table
 * on it; every older table (abi_v8.c .. abi_v11.c) is a thin shim that reuses the v12 entry
 * points where the signature is unchanged and converts only what differs. The control calls
 * are implemented in Go (plugin's .go files, exported through cgo); the data path in C
 * (mpib_p2p.h, mpib_flush.h).
 */
#ifndef MPIB_API_H
#define MPIB_API_H

#include "mpib.h"

/* Version-independent device properties. */
struct mpib_props {
  char *name;
  char *pci_path;
  uint64_t guid;
  int ptr_support;
  int force_flush; /* mlx5 Data Direct: NCCL must flush every receive (v9+ forceFlush) */
  int speed;
  int port;
  int max_comms;
  int max_recvs;
  int rail_id, plane_id; /* v12 railId / planeId */
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
};

/* Contexts: v11+ init once per communicator, each init returning a context that listen and
 * connect name and finalize ends (cancelling its handshakes). v8..v10 init once per process:
 * their calls share mpib_process_ctx. traffic_class is NCCL's per-communicator class, or
 * MPIB_TC_UNDEF. Every table leaves getDeviceMr and irecvConsumed NULL, as net_ib's: they
 * serve device offload, which MPIB does not do, and NCCL calls them only when set. */
#define MPIB_TC_UNDEF NCCL_NET_TRAFFIC_CLASS_UNDEF
extern uint64_t mpib_process_ctx;
ncclResult_t mpib_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof, int traffic_class, uint64_t *ctx);
ncclResult_t mpib_finalize(uint64_t ctx);
ncclResult_t mpib_devices(int *ndev);
ncclResult_t mpib_get_properties(int dev, struct mpib_props *p);
ncclResult_t mpib_listen(uint64_t ctx, int dev, void *handle, void **listenComm);
/* traffic_class: v10's per-connect class, or MPIB_TC_UNDEF to use the context's. */
ncclResult_t mpib_connect(uint64_t ctx, int dev, int traffic_class, void *handle, void **sendComm,
                          ncclNetDeviceHandle_t **sendDevComm);
ncclResult_t mpib_accept(void *listenComm, void **recvComm, ncclNetDeviceHandle_t **recvDevComm);
ncclResult_t mpib_reg_mr_v8(void *comm, void *data, size_t size, int type, void **mhandle);
ncclResult_t mpib_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd, void **mhandle);
ncclResult_t mpib_dereg_mr_api(void *comm, void *mhandle);
ncclResult_t mpib_close_send(void *sendComm);
ncclResult_t mpib_close_recv(void *recvComm);
ncclResult_t mpib_close_listen(void *listenComm);

/* abi_v12.c: the native table's entry points that older tables reuse or convert from. */
ncclResult_t mpib_v12_init(void **ctx, uint64_t commId, ncclNetCommConfig_t *config, ncclDebugLogger_t logger,
                           ncclProfilerCallback_t prof);
ncclResult_t mpib_v12_finalize(void *ctx);
ncclResult_t mpib_v12_get_properties(int dev, ncclNetProperties_v12_t *props);
ncclResult_t mpib_v12_listen(void *ctx, int dev, void *handle, void **listenComm);
ncclResult_t mpib_v12_connect(void *ctx, int dev, void *handle, void **sendComm, ncclNetDeviceHandle_t **sendDevComm);
ncclResult_t mpib_v12_set_net_attr(void *ctx, ncclNetAttr_v11_t *attr);

/* abi_v10.c: the process-wide (pre-v11) control calls that v9 and v8 reuse. */
ncclResult_t mpib_v10_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof);
ncclResult_t mpib_v10_listen(int dev, void *handle, void **listenComm);
ncclResult_t mpib_v10_connect(int dev, ncclNetCommConfig_t *config, void *handle, void **sendComm,
                              ncclNetDeviceHandle_t **sendDevComm);
ncclResult_t mpib_v10_get_properties(int dev, ncclNetProperties_v9_t *props);

/* abi_v9.c: the calls without profiler or connect config that v8 reuses. */
ncclResult_t mpib_v9_init(ncclDebugLogger_t logger);
ncclResult_t mpib_v9_connect(int dev, void *handle, void **sendComm, ncclNetDeviceHandle_t **sendDevComm);

/* abi_v8.c: isend and irecv with int sizes, which v7 reuses. */
ncclResult_t mpib_v8_isend(void *sendComm, void *data, int size, int tag, void *mhandle, void **request);
ncclResult_t mpib_v8_irecv(void *recvComm, int n, void **data, int *sizes, int *tags, void **mhandles, void **request);

/* The fields every properties version from v7 on shares by name (a macro because each
 * version is its own struct type). */
#define MPIB_COPY_PROPS_V7(dst, src)                                                         \
  do {                                                                                       \
    (dst)->name = (src)->name, (dst)->pciPath = (src)->pciPath, (dst)->guid = (src)->guid;   \
    (dst)->ptrSupport = (src)->ptrSupport;                                                   \
    (dst)->speed = (src)->speed, (dst)->port = (src)->port, (dst)->latency = (src)->latency; \
    (dst)->maxComms = (src)->maxComms, (dst)->maxRecvs = (src)->maxRecvs;                    \
    (dst)->netDeviceType = (src)->netDeviceType;                                             \
    (dst)->netDeviceVersion = (src)->netDeviceVersion;                                       \
  } while (0)

/* v8 on add regIsGlobal. */
#define MPIB_COPY_PROPS_V8(dst, src)         \
  do {                                       \
    MPIB_COPY_PROPS_V7(dst, src);            \
    (dst)->regIsGlobal = (src)->regIsGlobal; \
  } while (0)

/* v9..v11 add forceFlush, a 4-entry vProps and the size limits. */
#define MPIB_COPY_PROPS_V9(dst, src)                                                    \
  do {                                                                                  \
    MPIB_COPY_PROPS_V8(dst, src);                                                       \
    (dst)->forceFlush = (src)->forceFlush;                                              \
    mpib_copy_vprops(&(dst)->vProps, &(src)->vProps);                                   \
    (dst)->maxP2pBytes = (src)->maxP2pBytes, (dst)->maxCollBytes = (src)->maxCollBytes; \
  } while (0)

/* MPIB lists one device (its own), so the v12 list always fits the older 4 entries. */
static inline void mpib_copy_vprops(ncclNetVDeviceProps_v9_t *dst, const ncclNetVDeviceProps_v12_t *src) {
  dst->ndevs = src->ndevs < NCCL_NET_MAX_DEVS_PER_NIC ? src->ndevs : NCCL_NET_MAX_DEVS_PER_NIC;
  for (int i = 0; i < dst->ndevs; i++) dst->devs[i] = src->devs[i];
}

#endif
