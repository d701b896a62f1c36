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

ncclResult_t mpib_init(ncclDebugLogger_t logger);
ncclResult_t mpib_finalize(void);
ncclResult_t mpib_devices(int *ndev);
ncclResult_t mpib_get_properties(int dev, struct mpib_props *p);
ncclResult_t mpib_listen(int dev, void *handle, void **listenComm);
ncclResult_t mpib_connect(int dev, void *handle, void **sendComm, ncclNetDeviceHandle_t **sendDevComm);
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
