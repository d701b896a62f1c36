/*
 * The plugin behind one version-independent interface: dlopen + dlsym as NCCL's proxy does,
 * one small adapter per ABI difference, and the variadic logger NCCL would pass to init.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nettest.h"

/* ---- logger ---- */

static int nt_log_level = NCCL_LOG_WARN;
static pthread_mutex_t nt_log_mu = PTHREAD_MUTEX_INITIALIZER;

/* NCCL_DEBUG=NONE|VERSION|WARN|INFO|ABORT|TRACE, as NCCL parses it. Unset means WARN here
 * (NCCL itself prints nothing when unset; a test driver wants the warnings). */
void nt_log_setup(void) {
  const char *e = getenv("NCCL_DEBUG");
  if (e == NULL || *e == '\0') {
    return;
  }
  if (strcasecmp(e, "NONE") == 0) {
    nt_log_level = NCCL_LOG_NONE;
  } else if (strcasecmp(e, "VERSION") == 0) {
    nt_log_level = NCCL_LOG_VERSION;
  } else if (strcasecmp(e, "WARN") == 0) {
    nt_log_level = NCCL_LOG_WARN;
  } else if (strcasecmp(e, "INFO") == 0) {
    nt_log_level = NCCL_LOG_INFO;
  } else if (strcasecmp(e, "ABORT") == 0) {
    nt_log_level = NCCL_LOG_ABORT;
  } else if (strcasecmp(e, "TRACE") == 0) {
    nt_log_level = NCCL_LOG_TRACE;
  }
}

static const char *nt_level_name(ncclDebugLogLevel l) {
  switch (l) {
  case NCCL_LOG_VERSION: return "VERSION";
  case NCCL_LOG_WARN: return "WARN";
  case NCCL_LOG_INFO: return "INFO";
  case NCCL_LOG_ABORT: return "ABORT";
  case NCCL_LOG_TRACE: return "TRACE";
  default: return "NONE";
  }
}

/* Called from any thread of the plugin (Go threads included): one write per line. */
void nt_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  (void)flags;
  if (level == NCCL_LOG_NONE || fmt == NULL) {
    return;
  }
  int show;
  if (level == NCCL_LOG_VERSION) {
    show = nt_log_level >= NCCL_LOG_VERSION;
  } else if (level == NCCL_LOG_WARN || level == NCCL_LOG_ABORT) {
    show = nt_log_level >= NCCL_LOG_WARN;
  } else {
    show = nt_log_level >= (int)level;
  }
  if (!show) {
    return;
  }
  char msg[2048];
  int off;
  if (level == NCCL_LOG_TRACE) {
    off = snprintf(msg, sizeof(msg), "NCCL TRACE %s:%d ", file ? file : "?", line);
  } else {
    off = snprintf(msg, sizeof(msg), "NCCL %s ", nt_level_name(level));
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + off, sizeof(msg) - (size_t)off, fmt, ap);
  va_end(ap);
  size_t len = strlen(msg);
  while (len > 0 && msg[len - 1] == '\n') {
    len--;
  }
  if (len > sizeof(msg) - 2) {
    len = sizeof(msg) - 2;
  }
  msg[len++] = '\n';
  pthread_mutex_lock(&nt_log_mu);
  ssize_t w = write(STDERR_FILENO, msg, len);
  (void)w;
  pthread_mutex_unlock(&nt_log_mu);
}

/* ---- loading ---- */

static const char *nt_sym_names[] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                     "ncclNetPlugin_v8", "ncclNetPlugin_v9", "ncclNetPlugin_v10",
                                     "ncclNetPlugin_v11"};

#define NT_REQUIRE(tbl, field)                                                                     \
  do {                                                                                             \
    if ((tbl)->field == NULL) {                                                                    \
      snprintf(err, errlen, "%s: function table has no %s", sym, #field);                          \
      return -1;                                                                                   \
    }                                                                                              \
  } while (0)

#define NT_REQUIRE_COMMON(tbl)                                                                     \
  do {                                                                                             \
    NT_REQUIRE(tbl, init);                                                                         \
    NT_REQUIRE(tbl, devices);                                                                      \
    NT_REQUIRE(tbl, getProperties);                                                                \
    NT_REQUIRE(tbl, listen);                                                                       \
    NT_REQUIRE(tbl, connect);                                                                      \
    NT_REQUIRE(tbl, accept);                                                                       \
    NT_REQUIRE(tbl, regMr);                                                                        \
    NT_REQUIRE(tbl, deregMr);                                                                      \
    NT_REQUIRE(tbl, isend);                                                                        \
    NT_REQUIRE(tbl, irecv);                                                                        \
    NT_REQUIRE(tbl, test);                                                                         \
    NT_REQUIRE(tbl, closeSend);                                                                    \
    NT_REQUIRE(tbl, closeRecv);                                                                    \
    NT_REQUIRE(tbl, closeListen);                                                                  \
  } while (0)

/* dlopen(path, RTLD_NOW|RTLD_LOCAL) and dlsym the requested version's table. The library is
 * never dlclose'd: a Go c-shared runtime cannot be unloaded. */
int nt_net_load(struct nt_net *n, const char *path, int abi, char *err, size_t errlen) {
  memset(n, 0, sizeof(*n));
  if (abi < 8 || abi > 11) {
    snprintf(err, errlen, "unsupported ABI version %d (8..11)", abi);
    return -1;
  }
  void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL) {
    snprintf(err, errlen, "dlopen(%s) failed: %s", path, dlerror());
    return -1;
  }
  const char *sym = nt_sym_names[abi];
  void *t = dlsym(dl, sym);
  if (t == NULL) {
    snprintf(err, errlen, "dlsym(%s) in %s failed: %s", sym, path, dlerror());
    return -1;
  }
  n->abi = abi;
  switch (abi) {
  case 8: n->t.v8 = t; NT_REQUIRE_COMMON(n->t.v8); n->name = n->t.v8->name; break;
  case 9: n->t.v9 = t; NT_REQUIRE_COMMON(n->t.v9); n->name = n->t.v9->name; break;
  case 10: n->t.v10 = t; NT_REQUIRE_COMMON(n->t.v10); n->name = n->t.v10->name; break;
  default: n->t.v11 = t; NT_REQUIRE_COMMON(n->t.v11); n->name = n->t.v11->name; break;
  }
  if (n->name == NULL) {
    n->name = "(null)";
  }
  return 0;
}

/* Dispatch a call with the same arguments in every version. */
#define NT_CALL(n, fn, ...)                                                                        \
  ((n)->abi == 8    ? (n)->t.v8->fn(__VA_ARGS__)                                                   \
   : (n)->abi == 9  ? (n)->t.v9->fn(__VA_ARGS__)                                                   \
   : (n)->abi == 10 ? (n)->t.v10->fn(__VA_ARGS__)                                                  \
                    : (n)->t.v11->fn(__VA_ARGS__))

ncclResult_t nt_net_init(struct nt_net *n, uint64_t comm_id) {
  ncclNetCommConfig_t config = {.trafficClass = -1}; /* NCCL_NET_TRAFFIC_CLASS_UNDEF */
  switch (n->abi) {
  case 8: return n->t.v8->init(nt_logger);
  case 9: return n->t.v9->init(nt_logger);
  case 10: return n->t.v10->init(nt_logger, NULL);
  default: return n->t.v11->init(&n->ctx, comm_id, &config, nt_logger, NULL);
  }
}

ncclResult_t nt_net_devices(struct nt_net *n, int *ndev) { return NT_CALL(n, devices, ndev); }

static void nt_copy_str(char *dst, size_t len, const char *src) {
  snprintf(dst, len, "%s", src ? src : "(null)");
}

ncclResult_t nt_net_props(struct nt_net *n, int dev, struct nt_props *p) {
  memset(p, 0, sizeof(*p));
  ncclResult_t rc;
  if (n->abi == 8) {
    ncclNetProperties_v8_t v;
    memset(&v, 0, sizeof(v));
    rc = n->t.v8->getProperties(dev, &v);
    nt_copy_str(p->name, sizeof(p->name), v.name);
    nt_copy_str(p->pci_path, sizeof(p->pci_path), v.pciPath);
    p->guid = v.guid;
    p->ptr_support = v.ptrSupport;
    p->reg_is_global = v.regIsGlobal;
    p->speed = v.speed;
    p->port = v.port;
    p->latency = v.latency;
    p->max_comms = v.maxComms;
    p->max_recvs = v.maxRecvs;
    p->vndevs = -1;
    return rc;
  }
  ncclNetProperties_v11_t v;
  memset(&v, 0, sizeof(v));
  if (n->abi == 11) {
    rc = n->t.v11->getProperties(dev, &v);
  } else {
    /* v9 and v10 share the v11 layout minus the trailing maxMultiRequestSize. */
    rc = n->abi == 9 ? n->t.v9->getProperties(dev, (ncclNetProperties_v9_t *)&v)
                     : n->t.v10->getProperties(dev, (ncclNetProperties_v9_t *)&v);
    v.maxMultiRequestSize = -1;
  }
  nt_copy_str(p->name, sizeof(p->name), v.name);
  nt_copy_str(p->pci_path, sizeof(p->pci_path), v.pciPath);
  p->guid = v.guid;
  p->ptr_support = v.ptrSupport;
  p->reg_is_global = v.regIsGlobal;
  p->force_flush = v.forceFlush;
  p->speed = v.speed;
  p->port = v.port;
  p->latency = v.latency;
  p->max_comms = v.maxComms;
  p->max_recvs = v.maxRecvs;
  p->vndevs = v.vProps.ndevs;
  for (int i = 0; i < NCCL_NET_MAX_DEVS_PER_NIC; i++) {
    p->vdevs[i] = v.vProps.devs[i];
  }
  p->max_p2p_bytes = v.maxP2pBytes;
  p->max_coll_bytes = v.maxCollBytes;
  p->max_multi_request_size = v.maxMultiRequestSize;
  return rc;
}

/* One line of key=value fields; spaces inside values become '_' so the line splits on spaces. */
void nt_props_format(const struct nt_props *p, char *buf, size_t len) {
  char ptrs[64] = "";
  if (p->ptr_support & NCCL_PTR_HOST) {
    strcat(ptrs, "|HOST");
  }
  if (p->ptr_support & NCCL_PTR_CUDA) {
    strcat(ptrs, "|CUDA");
  }
  if (p->ptr_support & NCCL_PTR_DMABUF) {
    strcat(ptrs, "|DMABUF");
  }
  char vp[64] = "none";
  if (p->vndevs >= 0) {
    int o = snprintf(vp, sizeof(vp), "%d:[", p->vndevs);
    for (int i = 0; i < p->vndevs && i < NCCL_NET_MAX_DEVS_PER_NIC; i++) {
      o += snprintf(vp + o, sizeof(vp) - (size_t)o, "%s%d", i ? "," : "", p->vdevs[i]);
    }
    snprintf(vp + o, sizeof(vp) - (size_t)o, "]");
  }
  snprintf(buf, len,
           "name=%s pciPath=%s guid=0x%llx speed=%d port=%d ptrSupport=0x%x ptrs=%s regIsGlobal=%d "
           "forceFlush=%d latency=%.1f maxComms=%d maxRecvs=%d vProps=%s maxP2pBytes=%zu "
           "maxCollBytes=%zu maxMultiRequestSize=%d",
           p->name, p->pci_path, (unsigned long long)p->guid, p->speed, p->port, (unsigned)p->ptr_support,
           ptrs[0] ? ptrs + 1 : "none", p->reg_is_global, p->force_flush, (double)p->latency, p->max_comms,
           p->max_recvs, vp, p->max_p2p_bytes, p->max_coll_bytes, p->max_multi_request_size);
  for (char *c = buf; *c; c++) {
    if (*c == '\t' || *c == '\n') {
      *c = '_';
    }
  }
}

ncclResult_t nt_net_listen(struct nt_net *n, int dev, void *handle, void **lcomm) {
  switch (n->abi) {
  case 8: return n->t.v8->listen(dev, handle, lcomm);
  case 9: return n->t.v9->listen(dev, handle, lcomm);
  case 10: return n->t.v10->listen(dev, handle, lcomm);
  default: return n->t.v11->listen(n->ctx, dev, handle, lcomm);
  }
}

ncclResult_t nt_net_connect(struct nt_net *n, int dev, void *handle, void **scomm) {
  ncclNetDeviceHandle_t *dh = NULL;
  ncclNetCommConfig_t config = {.trafficClass = -1};
  switch (n->abi) {
  case 8: return n->t.v8->connect(dev, handle, scomm, &dh);
  case 9: return n->t.v9->connect(dev, handle, scomm, &dh);
  case 10: return n->t.v10->connect(dev, &config, handle, scomm, &dh);
  default: return n->t.v11->connect(n->ctx, dev, handle, scomm, &dh);
  }
}

ncclResult_t nt_net_accept(struct nt_net *n, void *lcomm, void **rcomm) {
  ncclNetDeviceHandle_t *dh = NULL;
  return NT_CALL(n, accept, lcomm, rcomm, &dh);
}

ncclResult_t nt_net_regmr(struct nt_net *n, void *comm, void *data, size_t size, void **mh) {
  return NT_CALL(n, regMr, comm, data, size, NCCL_PTR_HOST, mh);
}

ncclResult_t nt_net_deregmr(struct nt_net *n, void *comm, void *mh) { return NT_CALL(n, deregMr, comm, mh); }

ncclResult_t nt_net_isend(struct nt_net *n, void *scomm, void *data, size_t size, int tag, void *mh,
                          void **req) {
  switch (n->abi) {
  case 8: return n->t.v8->isend(scomm, data, (int)size, tag, mh, req);
  case 9: return n->t.v9->isend(scomm, data, size, tag, mh, req);
  case 10: return n->t.v10->isend(scomm, data, size, tag, mh, NULL, req);
  default: return n->t.v11->isend(scomm, data, size, tag, mh, NULL, req);
  }
}

ncclResult_t nt_net_irecv(struct nt_net *n, void *rcomm, int cnt, void **data, size_t *sizes, int *tags,
                          void **mhs, void **req) {
  void *phandles[NT_MAX_MULTI] = {0}; /* profiler handles: none */
  if (n->abi == 8) {
    int isz[NT_MAX_MULTI];
    for (int i = 0; i < cnt && i < NT_MAX_MULTI; i++) {
      isz[i] = (int)sizes[i];
    }
    return n->t.v8->irecv(rcomm, cnt, data, isz, tags, mhs, req);
  }
  if (n->abi == 9) {
    return n->t.v9->irecv(rcomm, cnt, data, sizes, tags, mhs, req);
  }
  if (n->abi == 10) {
    return n->t.v10->irecv(rcomm, cnt, data, sizes, tags, mhs, phandles, req);
  }
  return n->t.v11->irecv(rcomm, cnt, data, sizes, tags, mhs, phandles, req);
}

int nt_net_has_iflush(const struct nt_net *n) {
  switch (n->abi) {
  case 8: return n->t.v8->iflush != NULL;
  case 9: return n->t.v9->iflush != NULL;
  case 10: return n->t.v10->iflush != NULL;
  default: return n->t.v11->iflush != NULL;
  }
}

ncclResult_t nt_net_iflush(struct nt_net *n, void *rcomm, int cnt, void **data, int *sizes, void **mhs,
                           void **req) {
  return NT_CALL(n, iflush, rcomm, cnt, data, sizes, mhs, req);
}

ncclResult_t nt_net_test(struct nt_net *n, void *req, int *done, int *sizes) {
  return NT_CALL(n, test, req, done, sizes);
}

ncclResult_t nt_net_close_send(struct nt_net *n, void *c) { return NT_CALL(n, closeSend, c); }
ncclResult_t nt_net_close_recv(struct nt_net *n, void *c) { return NT_CALL(n, closeRecv, c); }
ncclResult_t nt_net_close_listen(struct nt_net *n, void *c) { return NT_CALL(n, closeListen, c); }

ncclResult_t nt_net_finalize(struct nt_net *n) {
  if (n->abi == 11 && n->t.v11->finalize != NULL) {
    return n->t.v11->finalize(n->ctx);
  }
  return ncclSuccess;
}
