/*
 * net.c: the plugin behind one version-independent interface (layer 2, nettest.h).
 */
#ifndef MPIB_NT_NET_H
#define MPIB_NT_NET_H

#include <stddef.h>
#include <stdint.h>

#include "nccl_abi.h"

struct nt_props {
  char name[128];
  char pci_path[256];
  uint64_t guid;
  int ptr_support, reg_is_global, force_flush, speed, port;
  float latency;
  int max_comms, max_recvs;
  int vndevs, vdevs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
  size_t max_p2p_bytes, max_coll_bytes;
  int max_multi_request_size;
  int has_rail_plane, rail_id, plane_id; /* v12 */
};

#define NT_ABI_MIN 7
#define NT_ABI_MAX 12
#define NT_ABI_DEFAULT 11 /* what NCCL 2.28..2.29 load */

struct nt_net {
  int abi;
  const char *name;
  union {
    const ncclNet_v7_t *v7;
    const ncclNet_v8_t *v8;
    const ncclNet_v9_t *v9;
    const ncclNet_v10_t *v10;
    const ncclNet_v11_t *v11;
    const ncclNet_v12_t *v12;
  } t;
  void *ctx;         /* v11+ per-communicator context */
  int traffic_class; /* ncclNetCommConfig_t.trafficClass for init (v11+) / connect (v10); -1 = undefined */
  int profiler;      /* --profiler: pass init a checking profiler callback (v10+) */
  int finalized;     /* nt_net_finalize was called: NCCL finalizes once, so the driver must not again */
};

void nt_log_setup(void);
void nt_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Connection phases: the plugin's INFO line that ends each comm's setup ("... setup ms: k=v
 * k=v ...", plugin/phases.go) as the logger saw it, whatever NCCL_DEBUG shows: per key, the
 * lines that had it, their sum and their maximum, in milliseconds, keys in first-seen order. */
#define NT_PHASE_KEYS 24
struct nt_phase_key {
  char name[24];
  int n;
  double sum_ms, max_ms;
};
struct nt_phases {
  int lines;
  int nkeys;
  struct nt_phase_key key[NT_PHASE_KEYS];
};
/* Hands over what the logger gathered since the last call, and starts afresh. */
void nt_phases_take(struct nt_phases *out);
int nt_net_load(struct nt_net *n, const char *path, int abi, char *err, size_t errlen);
ncclResult_t nt_net_init(struct nt_net *n, uint64_t comm_id);
ncclResult_t nt_net_devices(struct nt_net *n, int *ndev);
ncclResult_t nt_net_props(struct nt_net *n, int dev, struct nt_props *p);
void nt_props_format(const struct nt_props *p, char *buf, size_t len);
ncclResult_t nt_net_listen(struct nt_net *n, int dev, void *handle, void **lcomm);
ncclResult_t nt_net_connect(struct nt_net *n, int dev, void *handle, void **scomm);
ncclResult_t nt_net_accept(struct nt_net *n, void *lcomm, void **rcomm);
ncclResult_t nt_net_regmr(struct nt_net *n, void *comm, void *data, size_t size, void **mh);
ncclResult_t nt_net_deregmr(struct nt_net *n, void *comm, void *mh);
ncclResult_t nt_net_isend(struct nt_net *n, void *scomm, void *data, size_t size, int tag, void *mh, void **req);
ncclResult_t nt_net_irecv(struct nt_net *n, void *rcomm, int cnt, void **data, size_t *sizes, int *tags, void **mhs,
                          void **req);
int nt_net_has_iflush(const struct nt_net *n);
ncclResult_t nt_net_iflush(struct nt_net *n, void *rcomm, int cnt, void **data, int *sizes, void **mhs, void **req);
ncclResult_t nt_net_test(struct nt_net *n, void *req, int *done, int *sizes);
ncclResult_t nt_net_close_send(struct nt_net *n, void *c);
ncclResult_t nt_net_close_recv(struct nt_net *n, void *c);
ncclResult_t nt_net_close_listen(struct nt_net *n, void *c);
ncclResult_t nt_net_finalize(struct nt_net *n);

#endif
