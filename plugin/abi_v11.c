/* ncclNetPlugin_v11 (NCCL 2.28..2.29): init once per communicator with a context, listen and
 * connect take it, finalize(ctx), setNetAttr, maxMultiRequestSize. Devices are opened on the
 * first init and closed on the last finalize (the Go side keeps the reference count). */
#include <stdlib.h>

#include "mpib_api.h"

ncclResult_t get_properties_v9(int dev, ncclNetProperties_v9_t *props);
ncclResult_t isend_v10(void *sendComm, void *data, size_t size, int tag, void *mhandle, void *phandle,
                       void **request);
ncclResult_t irecv_v10(void *recvComm, int n, void **data, size_t *sizes, int *tags, void **mhandles,
                       void **phandles, void **request);

/* The per-communicator context: the control plane's context id and the communicator id. */
struct mpib_ctx {
  uint64_t id;
  uint64_t comm_id;
};

static ncclResult_t init_v11(void **ctx, uint64_t commId, ncclNetCommConfig_t *config, ncclDebugLogger_t logger,
                             ncclProfilerCallback_t prof) {
  struct mpib_ctx *c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  ncclResult_t res = mpib_init(logger, prof, config ? config->trafficClass : MPIB_TC_UNDEF, &c->id);
  if (res != ncclSuccess) {
    free(c);
    return res;
  }
  c->comm_id = commId;
  *ctx = c;
  return ncclSuccess;
}

static ncclResult_t finalize_v11(void *ctx) {
  struct mpib_ctx *c = ctx;
  ncclResult_t res = mpib_finalize(c ? c->id : 0);
  free(c);
  return res;
}

static ncclResult_t get_properties_v11(int dev, ncclNetProperties_v11_t *props) {
  ncclNetProperties_v9_t p9;
  ncclResult_t res = get_properties_v9(dev, &p9);
  if (res != ncclSuccess) return res;
  /* v11 appends one field to the v9 layout. */
  *(ncclNetProperties_v9_t *)props = p9;
  props->maxMultiRequestSize = MPIB_MAX_RECVS;
  return ncclSuccess;
}

static ncclResult_t listen_v11(void *ctx, int dev, void *handle, void **listenComm) {
  return mpib_listen(((struct mpib_ctx *)ctx)->id, dev, handle, listenComm);
}

static ncclResult_t connect_v11(void *ctx, int dev, void *handle, void **sendComm,
                                ncclNetDeviceHandle_t **sendDevComm) {
  return mpib_connect(((struct mpib_ctx *)ctx)->id, dev, MPIB_TC_UNDEF, handle, sendComm, sendDevComm);
}

static ncclResult_t set_net_attr_v11(void *ctx, ncclNetAttr_v11_t *attr) {
  (void)ctx, (void)attr; /* hints about concurrency; MPIB's policy comes from MPIB_MODE and the agent */
  return ncclSuccess;
}

__attribute__((visibility("default"))) const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = "MPIB",
    .init = init_v11,
    .devices = mpib_devices,
    .getProperties = get_properties_v11,
    .listen = listen_v11,
    .connect = connect_v11,
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
    .finalize = finalize_v11,
    .setNetAttr = set_net_attr_v11,
};
