//go:build ignore
// link: ../abi_v12.c

/* The v11/v12 per-communicator context as NCCL 2.29 and 2.30 use it (abi_v12.c): NCCL hands
 * the net plugin's context to its own InfiniBand RMA/GIN code, which reads it as an
 * ncclNetCommConfig_t and (2.30, ncclIbSetTrafficClass) writes the RMA's traffic class into
 * it. The shim's entry points run against recording stubs of the control plane. Checks:
 *   - the context reads as init's config (the class NCCL passed, or UNDEF without a config);
 *   - after NCCL writes a class there, listen and connect still name the context the control
 *     plane gave init, and connect asks for the class written (net_ib's connect reads it);
 *   - finalize names that context too. */
#include <stdio.h>
#include <string.h>

#include "../mpib_api.h"
#include "../mpib_flush.h"
#include "../mpib_p2p.h"

#include "check.h"

enum { CTX_ID = 0x1234567890ull };
static uint64_t listened, connected, finalized;
static int connect_class = 999, init_class = 999;

/* ---- the control plane, recorded ---- */

ncclResult_t mpib_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof, int traffic_class, uint64_t *ctx) {
  (void)logger, (void)prof;
  init_class = traffic_class;
  *ctx = CTX_ID;
  return ncclSuccess;
}
ncclResult_t mpib_finalize(uint64_t ctx) { return finalized = ctx, ncclSuccess; }
ncclResult_t mpib_listen(uint64_t ctx, int dev, void *handle, void **listenComm) {
  (void)dev, (void)handle;
  listened = ctx;
  *listenComm = NULL;
  return ncclSuccess;
}
ncclResult_t mpib_connect(uint64_t ctx, int dev, int traffic_class, void *handle, void **sendComm,
                          ncclNetDeviceHandle_t **sendDevComm) {
  (void)dev, (void)handle, (void)sendDevComm;
  connected = ctx;
  connect_class = traffic_class;
  *sendComm = NULL;
  return ncclSuccess;
}

/* ---- the rest of the table: never called here ---- */

ncclResult_t mpib_devices(int *ndev) { return *ndev = 0, ncclSuccess; }
ncclResult_t mpib_get_properties(int dev, struct mpib_props *p) { return (void)dev, (void)p, ncclInternalError; }
ncclResult_t mpib_accept(void *l, void **r, ncclNetDeviceHandle_t **d) {
  return (void)l, (void)r, (void)d, ncclInternalError;
}
ncclResult_t mpib_reg_mr_v8(void *c, void *d, size_t s, int t, void **m) {
  return (void)c, (void)d, (void)s, (void)t, (void)m, ncclInternalError;
}
ncclResult_t mpib_reg_mr_dmabuf(void *c, void *d, size_t s, int t, uint64_t o, int fd, void **m) {
  return (void)c, (void)d, (void)s, (void)t, (void)o, (void)fd, (void)m, ncclInternalError;
}
ncclResult_t mpib_dereg_mr_api(void *c, void *m) { return (void)c, (void)m, ncclInternalError; }
ncclResult_t mpib_close_send(void *c) { return (void)c, ncclInternalError; }
ncclResult_t mpib_close_recv(void *c) { return (void)c, ncclInternalError; }
ncclResult_t mpib_close_listen(void *c) { return (void)c, ncclInternalError; }
ncclResult_t mpib_isend(void *c, void *d, size_t s, int t, void *m, void *p, void **r) {
  return (void)c, (void)d, (void)s, (void)t, (void)m, (void)p, (void)r, ncclInternalError;
}
ncclResult_t mpib_irecv(void *c, int n, void **d, size_t *s, int *t, void **m, void **p, void **r) {
  return (void)c, (void)n, (void)d, (void)s, (void)t, (void)m, (void)p, (void)r, ncclInternalError;
}
ncclResult_t mpib_test(void *r, int *d, int *s) { return (void)r, (void)d, (void)s, ncclInternalError; }
ncclResult_t mpib_iflush(void *c, int n, void **d, int *s, void **m, void **r) {
  return (void)c, (void)n, (void)d, (void)s, (void)m, (void)r, ncclInternalError;
}

int main(void) {
  ncclNetCommConfig_t config = {.trafficClass = 106};
  void *ctx = NULL, *comm = (void *)1;
  char handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
  CHECK(mpib_v12_init(&ctx, 77, &config, NULL, NULL) == ncclSuccess && ctx != NULL, "init");
  CHECK(init_class == 106 && ((ncclNetCommConfig_t *)ctx)->trafficClass == 106,
        "the context reads as init's config: class %d to the control plane, %d in the context", init_class,
        ((ncclNetCommConfig_t *)ctx)->trafficClass);

  ((ncclNetCommConfig_t *)ctx)->trafficClass = 3; /* NCCL 2.30's IB RMA: ncclIbSetTrafficClass(ctx, 3) */
  CHECK(mpib_v12_listen(ctx, 0, handle, &comm) == ncclSuccess && listened == CTX_ID,
        "listen after NCCL wrote the class names context %#llx, want %#llx", (unsigned long long)listened,
        (unsigned long long)CTX_ID);
  CHECK(mpib_v12_connect(ctx, 0, handle, &comm, NULL) == ncclSuccess && connected == CTX_ID && connect_class == 3,
        "connect after NCCL wrote the class: context %#llx (want %#llx), class %d (want 3)",
        (unsigned long long)connected, (unsigned long long)CTX_ID, connect_class);
  CHECK(mpib_v12_finalize(ctx) == ncclSuccess && finalized == CTX_ID, "finalize names context %#llx",
        (unsigned long long)finalized);

  ctx = NULL;
  CHECK(mpib_v12_init(&ctx, 78, NULL, NULL, NULL) == ncclSuccess && init_class == MPIB_TC_UNDEF &&
            ((ncclNetCommConfig_t *)ctx)->trafficClass == MPIB_TC_UNDEF,
        "no config: the class is UNDEF (%d, %d)", init_class, ctx ? ((ncclNetCommConfig_t *)ctx)->trafficClass : 0);
  mpib_v12_finalize(ctx);
  if (failures == 0) printf("abi-ctx: config_first=true class_written_by_nccl_used=true\n");
  return failures ? 1 : 0;
}
