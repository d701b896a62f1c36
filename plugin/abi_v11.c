/* ncclNetPlugin_v11 (NCCL 2.28..2.29): the v12 table with v11's properties, whose vProps has
 * 4 entries and which ends at maxMultiRequestSize (no railId/planeId). NCCL 2.28..2.29 calls
 * the exported table. */
#include "mpib_api.h"
#include "mpib_flush.h"
#include "mpib_p2p.h"

static ncclResult_t get_properties_v11(int dev, ncclNetProperties_v11_t *props) {
  ncclNetProperties_v12_t p;
  ncclResult_t res = mpib_v12_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  *props = (ncclNetProperties_v11_t){0};
  MPIB_COPY_PROPS_V9(props, &p);
  props->maxMultiRequestSize = p.maxMultiRequestSize;
  return ncclSuccess;
}

__attribute__((visibility("default"))) const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = "MPIB",
    .init = mpib_v12_init,
    .devices = mpib_devices,
    .getProperties = get_properties_v11,
    .listen = mpib_v12_listen,
    .connect = mpib_v12_connect,
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
    .finalize = mpib_v12_finalize,
    .setNetAttr = mpib_v12_set_net_attr,
};
