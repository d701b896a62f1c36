/* ncclNetPlugin_v8 (NCCL 2.19..2.22): int sizes in isend/irecv, no vProps. */
#include "mpib_api.h"

ncclResult_t init_v8(ncclDebugLogger_t logger) {
  return mpib_init(logger, NULL, MPIB_TC_UNDEF, &mpib_process_ctx);
}

static ncclResult_t get_properties_v8(int dev, ncclNetProperties_v8_t *props) {
  struct mpib_props p;
  ncclResult_t res = mpib_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  *props = (ncclNetProperties_v8_t){.name = p.name, .pciPath = p.pci_path, .guid = p.guid,
                                    .ptrSupport = p.ptr_support, .regIsGlobal = 1, .speed = p.speed,
                                    .port = p.port, .latency = 0, .maxComms = p.max_comms,
                                    .maxRecvs = p.max_recvs, .netDeviceType = NCCL_NET_DEVICE_HOST};
  return ncclSuccess;
}

ncclResult_t listen_v8(int dev, void *handle, void **listenComm) {
  return mpib_listen(mpib_process_ctx, dev, handle, listenComm);
}

ncclResult_t connect_v8(int dev, void *handle, void **sendComm, ncclNetDeviceHandle_t **sendDevComm) {
  return mpib_connect(mpib_process_ctx, dev, MPIB_TC_UNDEF, handle, sendComm, sendDevComm);
}

static ncclResult_t isend_v8(void *sendComm, void *data, int size, int tag, void *mhandle, void **request) {
  if (size < 0) return ncclInvalidArgument;
  return mpib_isend(sendComm, data, (size_t)size, tag, mhandle, request);
}

static ncclResult_t irecv_v8(void *recvComm, int n, void **data, int *sizes, int *tags, void **mhandles,
                             void **request) {
  size_t sz[MPIB_MAX_RECVS];
  if (n < 1 || n > MPIB_MAX_RECVS) return ncclInvalidArgument;
  for (int i = 0; i < n; i++) sz[i] = sizes[i] < 0 ? 0 : (size_t)sizes[i];
  return mpib_irecv(recvComm, n, data, sz, tags, mhandles, request);
}

__attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "MPIB",
    .init = init_v8,
    .devices = mpib_devices,
    .getProperties = get_properties_v8,
    .listen = listen_v8,
    .connect = connect_v8,
    .accept = mpib_accept,
    .regMr = mpib_reg_mr_v8,
    .regMrDmaBuf = mpib_reg_mr_dmabuf,
    .deregMr = mpib_dereg_mr_api,
    .isend = isend_v8,
    .irecv = irecv_v8,
    .iflush = mpib_iflush,
    .test = mpib_test,
    .closeSend = mpib_close_send,
    .closeRecv = mpib_close_recv,
    .closeListen = mpib_close_listen,
    .getDeviceMr = mpib_get_device_mr,
    .irecvConsumed = mpib_irecv_consumed,
};
