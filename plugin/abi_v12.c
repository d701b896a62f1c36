/* ncclNetPlugin_v12 (NCCL 2.30.3+), MPIB's native table: every older table is a shim over
 * these entry points (mpib_api.h). v12 = v11's members with an 8-entry vProps and
 * railId/planeId. NCCL 2.30.3+ calls the exported table. */
#include <stddef.h>
#include <stdlib.h>

#include "mpib_api.h"
#include "mpib_flush.h"
#include "mpib_p2p.h"

/* The per-communicator context: the communicator's net config, the control plane's context id
 * and the communicator id. The config comes first, and is the context as far as NCCL knows:
 * NCCL 2.29 and 2.30 hand the net plugin's context to their own InfiniBand RMA/GIN code, which
 * reads it as an ncclNetCommConfig_t and (2.30) writes the RMA's traffic class into it
 * (ncclIbSetTrafficClass), as net_ib's context is exactly that config. Anything else first
 * would be read as the class and overwritten. */
struct mpib_ctx {
  ncclNetCommConfig_t config;
  uint64_t id;
  uint64_t comm_id;
};
_Static_assert(offsetof(struct mpib_ctx, config) == 0, "NCCL's IB RMA/GIN reads the context as its net config");

ncclResult_t mpib_v12_init(void **ctx, uint64_t commId, ncclNetCommConfig_t *config, ncclDebugLogger_t logger,
                           ncclProfilerCallback_t prof) {
  struct mpib_ctx *c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  c->config.trafficClass = config ? config->trafficClass : MPIB_TC_UNDEF;
  ncclResult_t res = mpib_init(logger, prof, c->config.trafficClass, &c->id);
  if (res != ncclSuccess) {
    free(c);
    return res;
  }
  c->comm_id = commId;
  *ctx = c;
  return ncclSuccess;
}

ncclResult_t mpib_v12_finalize(void *ctx) {
  struct mpib_ctx *c = ctx;
  ncclResult_t res = mpib_finalize(c ? c->id : 0);
  free(c);
  return res;
}

/* railId and planeId: the device's (MPIB_HCA_SOUT's name:port:rail:plane, else its position and
 * no plane: docs/deploying.md). */
ncclResult_t mpib_v12_get_properties(int dev, ncclNetProperties_v12_t *props) {
  struct mpib_props p;
  ncclResult_t res = mpib_get_properties(dev, &p);
  if (res != ncclSuccess) return res;
  *props = (ncclNetProperties_v12_t){.name = p.name,
                                     .pciPath = p.pci_path,
                                     .guid = p.guid,
                                     .ptrSupport = p.ptr_support,
                                     .regIsGlobal = 1,
                                     .forceFlush = p.force_flush,
                                     .speed = p.speed,
                                     .port = p.port,
                                     .latency = 0,
                                     .maxComms = p.max_comms,
                                     .maxRecvs = p.max_recvs,
                                     .netDeviceType = NCCL_NET_DEVICE_HOST,
                                     .maxP2pBytes = INT32_MAX,
                                     .maxCollBytes = INT32_MAX,
                                     .maxMultiRequestSize = 1, /* as net_ib: MPIB has no multi-requests */
                                     .railId = (int16_t)p.rail_id,
                                     .planeId = (int16_t)p.plane_id};
  props->vProps.ndevs = p.ndevs;
  for (int i = 0; i < p.ndevs; i++) props->vProps.devs[i] = p.devs[i];
  return ncclSuccess;
}

ncclResult_t mpib_v12_listen(void *ctx, int dev, void *handle, void **listenComm) {
  return mpib_listen(((struct mpib_ctx *)ctx)->id, dev, handle, listenComm);
}

/* The traffic class is the context's config as it is now (v12 connect has no config of its
 * own): init's, or what NCCL's IB RMA wrote there since, as net_ib's connect reads it. */
ncclResult_t mpib_v12_connect(void *ctx, int dev, void *handle, void **sendComm, ncclNetDeviceHandle_t **sendDevComm) {
  struct mpib_ctx *c = ctx;
  return mpib_connect(c->id, dev, c->config.trafficClass, handle, sendComm, sendDevComm);
}

ncclResult_t mpib_v12_set_net_attr(void *ctx, ncclNetAttr_v11_t *attr) {
  (void)ctx, (void)attr; /* hints about concurrency; MPIB's policy comes from MPIB_MODE and the agent */
  return ncclSuccess;
}

/* makeVDevice is NULL: MPIB fuses its two rails itself and reports one device. */
__attribute__((visibility("default"))) const ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = "MPIB",
    .init = mpib_v12_init,
    .devices = mpib_devices,
    .getProperties = mpib_v12_get_properties,
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
