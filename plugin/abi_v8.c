/* ncclNetPlugin_v8 (NCCL 2.20..2.23): v9 with int sizes in isend/irecv and the v8
 * properties (no forceFlush, vProps or size limits). NCCL 2.20..2.23 calls the exported
 * table. */
#include "mpib_api.h"
#include "mpib_flush.h"
#include "mpib_p2p.h"

static ncclResult_t get_properties_v8(int dev, ncclNetProperties_v8_t *props) {
  ncclNetProperties_v12_t p;
  ncclResult_t res = mpib_v12_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  *props = (ncclNetProperties_v8_t){0};
  MPIB_COPY_PROPS_V8(props, &p);
  return ncclSuccess;
}

ncclResult_t mpib_v8_isend(void *sendComm, void *data, int size, int tag, void *mhandle, void **request) {
  if (size < 0) return ncclInvalidArgument;
  return mpib_isend(sendComm, data, (size_t)size, tag, mhandle, NULL, request);
}

ncclResult_t mpib_v8_irecv(void *recvComm, int n, void **data, int *sizes, int *tags, void **mhandles, void **request) {
  size_t sz[MPIB_MAX_RECVS];
  if (n < 1 || n > MPIB_MAX_RECVS) return ncclInvalidArgument;
  for (int i = 0; i < n; i++) sz[i] = sizes[i] < 0 ? 0 : (size_t)sizes[i];
  return mpib_irecv(recvComm, n, data, sz, tags, mhandles, NULL, request);
}

__attribute__((visibility("default"))) const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "MPIB",
    .init = mpib_v9_init,
    .devices = mpib_devices,
    .getProperties = get_properties_v8,
    .listen = mpib_v10_listen,
    .connect = mpib_v9_connect,
    .accept = mpib_accept,
    .regMr = mpib_reg_mr_v8,
    .regMrDmaBuf = mpib_reg_mr_dmabuf,
    .deregMr = mpib_dereg_mr_api,
    .isend = mpib_v8_isend,
    .irecv = mpib_v8_irecv,
    .iflush = mpib_iflush,
    .test = mpib_test,
    .closeSend = mpib_close_send,
    .closeRecv = mpib_close_recv,
    .closeListen = mpib_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
};
