/* ncclNetPlugin_v10 (NCCL 2.26..2.27): the v12 data path (phandles included) with a
 * process-wide context: init once per process, the traffic class per connect, v9's
 * properties layout. Its control calls are the ones v9 and v8 reuse. NCCL 2.26..2.27 calls
 * the exported table. */
#include "mpib_api.h"
#include "mpib_flush.h"
#include "mpib_log.h"
#include "mpib_p2p.h"
#include "mpib_profiler.h"

/* NCCL 2.26 resets its plugin state after the last communicator and calls init again: the
 * process keeps its one context (there is no finalize to end the first). */
ncclResult_t mpib_v10_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof) {
  if (mpib_process_ctx != 0) {
    mpib_log_set(logger);
    mpib_prof_set(prof);
    return ncclSuccess;
  }
  return mpib_init(logger, prof, MPIB_TC_UNDEF, &mpib_process_ctx);
}

ncclResult_t mpib_v10_listen(int dev, void *handle, void **listenComm) {
  return mpib_listen(mpib_process_ctx, dev, handle, listenComm);
}

ncclResult_t mpib_v10_connect(int dev, ncclNetCommConfig_t *config, void *handle, void **sendComm,
                              ncclNetDeviceHandle_t **sendDevComm) {
  int tc = config ? config->trafficClass : MPIB_TC_UNDEF;
  return mpib_connect(mpib_process_ctx, dev, tc, handle, sendComm, sendDevComm);
}

/* v9 and v10 share this layout: v11's without maxMultiRequestSize. */
ncclResult_t mpib_v10_get_properties(int dev, ncclNetProperties_v9_t *props) {
  ncclNetProperties_v12_t p;
  ncclResult_t res = mpib_v12_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  *props = (ncclNetProperties_v9_t){0};
  MPIB_COPY_PROPS_V9(props, &p);
  return ncclSuccess;
}

__attribute__((visibility("default"))) const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = "MPIB",
    .init = mpib_v10_init,
    .devices = mpib_devices,
    .getProperties = mpib_v10_get_properties,
    .listen = mpib_v10_listen,
    .connect = mpib_v10_connect,
    .accept = mpib_accept,
    .regMr = mpib_reg_mr_v8,
    .regMrDmaBuf = mpib_reg_mr_dmabuf,
    .deregMr = mpib_dereg_mr_api,
    .isend = mpib_isend,
    .irecv = mpib_irecv,
    .iflush = mpib_iflush,
    .test = mpib_test,
    .closeSend = mpib_close_send,
    .closeRecv = mpib_close_recv,
    .closeListen = mpib_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
};
