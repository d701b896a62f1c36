/* ncclNetPlugin_v9 (NCCL 2.24..2.25): v10 without the profiler, the connect config and the
 * profiler handles. forceFlush is the device's (v12's): 1 on mlx5 Data Direct devices, where
 * net_ib also forces it; otherwise NCCL asks for a flush exactly when the GPU needs one
 * (pre-sm90; C2C only from 2.27, so never on sm90 here) and MPIB then performs a real loopback
 * RDMA_READ. NCCL 2.24..2.25 calls
 * the exported table. */
#include "mpib_api.h"
#include "mpib_flush.h"
#include "mpib_p2p.h"

ncclResult_t mpib_v9_init(ncclDebugLogger_t logger) { return mpib_v10_init(logger, NULL); }

ncclResult_t mpib_v9_connect(int dev, void *handle, void **sendComm, ncclNetDeviceHandle_t **sendDevComm) {
  return mpib_v10_connect(dev, NULL, handle, sendComm, sendDevComm);
}

static ncclResult_t isend_v9(void *sendComm, void *data, size_t size, int tag, void *mhandle, void **request) {
  return mpib_isend(sendComm, data, size, tag, mhandle, NULL, request);
}

static ncclResult_t irecv_v9(void *recvComm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                             void **request) {
  return mpib_irecv(recvComm, n, data, sizes, tags, mhandles, NULL, request);
}

__attribute__((visibility("default"))) const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = "MPIB",
    .init = mpib_v9_init,
    .devices = mpib_devices,
    .getProperties = mpib_v10_get_properties,
    .listen = mpib_v10_listen,
    .connect = mpib_v9_connect,
    .accept = mpib_accept,
    .regMr = mpib_reg_mr_v8,
    .regMrDmaBuf = mpib_reg_mr_dmabuf,
    .deregMr = mpib_dereg_mr_api,
    .isend = isend_v9,
    .irecv = irecv_v9,
    .iflush = mpib_iflush,
    .test = mpib_test,
    .closeSend = mpib_close_send,
    .closeRecv = mpib_close_recv,
    .closeListen = mpib_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
};
