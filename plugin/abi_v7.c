/* ncclNetPlugin_v7 (NCCL 2.19): v8 with the v7 properties (no regIsGlobal) and an int size in
 * regMr. NCCL 2.19 calls the exported table. */
#include "mpib_api.h"
#include "mpib_flush.h"
#include "mpib_p2p.h"

static ncclResult_t get_properties_v7(int dev, ncclNetProperties_v7_t *props) {
  ncclNetProperties_v12_t p;
  ncclResult_t res = mpib_v12_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  *props = (ncclNetProperties_v7_t){0};
  MPIB_COPY_PROPS_V7(props, &p);
  return ncclSuccess;
}

static ncclResult_t reg_mr_v7(void *comm, void *data, int size, int type, void **mhandle) {
  if (size < 0) return ncclInvalidArgument;
  return mpib_reg_mr_v8(comm, data, (size_t)size, type, mhandle);
}

__attribute__((visibility("default"))) const ncclNet_v7_t ncclNetPlugin_v7 = {
    .name = "MPIB",
    .init = mpib_v9_init,
    .devices = mpib_devices,
    .getProperties = get_properties_v7,
    .listen = mpib_v10_listen,
    .connect = mpib_v9_connect,
    .accept = mpib_accept,
    .regMr = reg_mr_v7,
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
