/* ncclNetPlugin_v10 (NCCL 2.26..2.27): profiler callback in init, comm config in connect,
 * profiler handles in isend/irecv (ignored: MPIB emits no profiler events). */
#include "mpib_api.h"

ncclResult_t listen_v8(int dev, void *handle, void **listenComm);
ncclResult_t get_properties_v9(int dev, ncclNetProperties_v9_t *props);

static ncclResult_t init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
  return mpib_init(logger, prof, MPIB_TC_UNDEF, &mpib_process_ctx);
}

static ncclResult_t connect_v10(int dev, ncclNetCommConfig_t *config, void *handle, void **sendComm,
                                ncclNetDeviceHandle_t **sendDevComm) {
  int tc = config ? config->trafficClass : MPIB_TC_UNDEF;
  return mpib_connect(mpib_process_ctx, dev, tc, handle, sendComm, sendDevComm);
}

ncclResult_t isend_v10(void *sendComm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                       void **request) {
  (void)phandle;
  return mpib_isend(sendComm, data, size, tag, mhandle, request);
}

ncclResult_t irecv_v10(void *recvComm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                       void **phandles, void **request) {
  (void)phandles;
  return mpib_irecv(recvComm, n, data, sizes, tags, mhandles, request);
}

__attribute__((visibility("default"))) const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = "MPIB",
    .init = init_v10,
    .devices = mpib_devices,
    .getProperties = get_properties_v9,
    .listen = listen_v8,
    .connect = connect_v10,
    .accept = mpib_accept,
    .regMr = mpib_reg_mr_v8,
    .regMrDmaBuf = mpib_reg_mr_dmabuf,
    .deregMr = mpib_dereg_mr_api,
    .isend = isend_v10,
    .irecv = irecv_v10,
    .iflush = mpib_iflush,
    .test = mpib_test,
    .closeSend = mpib_close_send,
    .closeRecv = mpib_close_recv,
    .closeListen = mpib_close_listen,
    .getDeviceMr = mpib_get_device_mr,
    .irecvConsumed = mpib_irecv_consumed,
    .makeVDevice = NULL,
};
