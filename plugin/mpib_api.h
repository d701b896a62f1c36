/*
 * The one internal API that every ABI table (abi_v8.c .. abi_v11.c) adapts to. The control
 * calls are implemented in Go (plugin's .go files, exported through cgo); the data path in C.
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
  int speed;
  int port;
  int max_comms;
  int max_recvs;
  int ndevs;
  int devs[NCCL_NET_MAX_DEVS_PER_NIC];
};

/* Contexts: v11+ init once per communicator, each init returning a context that listen and
 * connect name and finalize ends (cancelling its handshakes). v8..v10 init once per process:
 * their calls share mpib_process_ctx. traffic_class is NCCL's per-communicator class, or
 * MPIB_TC_UNDEF. */
#define MPIB_TC_UNDEF (-1)
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
ncclResult_t mpib_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                                void **mhandle);
ncclResult_t mpib_dereg_mr_api(void *comm, void *mhandle);
ncclResult_t mpib_close_send(void *sendComm);
ncclResult_t mpib_close_recv(void *recvComm);
ncclResult_t mpib_close_listen(void *listenComm);
ncclResult_t mpib_get_device_mr(void *comm, void *mhandle, void **dptr_mhandle);

#endif
