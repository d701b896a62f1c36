/* ncclNetPlugin_v9 (NCCL 2.23..2.25): size_t sizes, vProps, forceFlush, makeVDevice. */
#include "mpib_api.h"

ncclResult_t init_v8(ncclDebugLogger_t logger);
ncclResult_t listen_v8(int dev, void *handle, void **listenComm);
ncclResult_t connect_v8(int dev, void *handle, void **sendComm, ncclNetDeviceHandle_t **sendDevComm);

/* forceFlush stays 0: NCCL asks for a flush exactly when the GPU needs one (pre-sm90, C2C)
 * and MPIB then performs a real loopback RDMA_READ. */
ncclResult_t get_properties_v9(int dev, ncclNetProperties_v9_t *props) {
  struct mpib_props p;
  ncclResult_t res = mpib_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  *props = (ncclNetProperties_v9_t){.name = p.name, .pciPath = p.pci_path, .guid = p.guid,
                                    .ptrSupport = p.ptr_support, .regIsGlobal = 1, .forceFlush = 0,
                                    .speed = p.speed, .port = p.port, .latency = 0,
                                    .maxComms = p.max_comms, .maxRecvs = p.max_recvs,
                                    .netDeviceType = NCCL_NET_DEVICE_HOST,
                                    .maxP2pBytes = INT32_MAX, .maxCollBytes = INT32_MAX};
  props->vProps.ndevs = p.ndevs;
  for (int i = 0; i < p.ndevs; i++) props->vProps.devs[i] = p.devs[i];
  return ncclSuccess;
}

ncclResult_t irecv_v9(void *recvComm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                      void **request) {
  return mpib_irecv(recvComm, n, data, sizes, tags, mhandles, request);
}

/* makeVDevice is NULL: MPIB fuses its two rails itself and reports one device. */
__attribute__((visibility("default"))) const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = "MPIB",
    .init = init_v8,
    .devices = mpib_devices,
    .getProperties = get_properties_v9,
    .listen = listen_v8,
    .connect = connect_v8,
    .accept = mpib_accept,
    .regMr = mpib_reg_mr_v8,
    .regMrDmaBuf = mpib_reg_mr_dmabuf,
    .deregMr = mpib_dereg_mr_api,
    .isend = mpib_isend,
    .irecv = irecv_v9,
    .iflush = mpib_iflush,
    .test = mpib_test,
    .closeSend = mpib_close_send,
    .closeRecv = mpib_close_recv,
    .closeListen = mpib_close_listen,
    .getDeviceMr = mpib_get_device_mr,
    .irecvConsumed = mpib_irecv_consumed,
    .makeVDevice = NULL,
};
