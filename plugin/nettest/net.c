/*
 * The plugin behind one version-independent interface: dlopen + dlsym as NCCL's proxy does,
 * one small adapter per ABI difference, the variadic logger NCCL would pass to init, and a
 * checking stand-in for NCCL's profiler callback (--profiler).
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nettest.h"
#include "nt_net.h"
#include "nt_util.h"

/* ---- logger ---- */

static int nt_log_level = NCCL_LOG_WARN;
static int nt_log_time;
static pthread_mutex_t nt_log_mu = PTHREAD_MUTEX_INITIALIZER;

/* NCCL_DEBUG=NONE|VERSION|WARN|INFO|ABORT|TRACE, as NCCL parses it. Unset means WARN here
 * (NCCL itself prints nothing when unset; a test driver wants the warnings). */
void nt_log_setup(void) {
  const char *t = getenv("MPIB_NETTEST_LOG_MS");
  nt_log_time = t != NULL && strcmp(t, "1") == 0;
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

/* ---- connection phases (nt_phases_take) ---- */

#define NT_PHASE_MARK "setup ms: "

static pthread_mutex_t nt_phases_mu = PTHREAD_MUTEX_INITIALIZER;
static struct nt_phases nt_phases_acc;

/* Adds one "k=v k=v ..." list (what follows NT_PHASE_MARK) to acc. */
static void nt_phases_add(struct nt_phases *acc, const char *list) {
  acc->lines++;
  for (const char *p = list;;) {
    p += strspn(p, " \n");
    if (*p == '\0') {
      break;
    }
    const char *eq = strchr(p, '='), *end = p + strcspn(p, " \n");
    if (eq == NULL || eq > end || eq == p || (size_t)(eq - p) >= sizeof(acc->key[0].name)) {
      p = end;
      continue;
    }
    char *num_end;
    double v = strtod(eq + 1, &num_end);
    if (num_end != end) {
      p = end;
      continue;
    }
    int k = 0;
    while (k < acc->nkeys &&
           (strncmp(acc->key[k].name, p, (size_t)(eq - p)) != 0 || acc->key[k].name[eq - p] != '\0')) {
      k++;
    }
    if (k == acc->nkeys && acc->nkeys < NT_PHASE_KEYS) {
      memcpy(acc->key[k].name, p, (size_t)(eq - p));
      acc->key[k].name[eq - p] = '\0';
      acc->nkeys++;
    }
    if (k < acc->nkeys) {
      struct nt_phase_key *e = &acc->key[k];
      e->n++;
      e->sum_ms += v;
      e->max_ms = e->n == 1 || v > e->max_ms ? v : e->max_ms;
    }
    p = end;
  }
}

/* The logger's view of one INFO message: a comm's setup line is gathered. */
static void nt_phases_note(const char *fmt, va_list ap) {
  char msg[2048];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  const char *m = strstr(msg, NT_PHASE_MARK);
  if (m == NULL) {
    return;
  }
  pthread_mutex_lock(&nt_phases_mu);
  nt_phases_add(&nt_phases_acc, m + strlen(NT_PHASE_MARK));
  pthread_mutex_unlock(&nt_phases_mu);
}

void nt_phases_take(struct nt_phases *out) {
  pthread_mutex_lock(&nt_phases_mu);
  *out = nt_phases_acc;
  memset(&nt_phases_acc, 0, sizeof(nt_phases_acc));
  pthread_mutex_unlock(&nt_phases_mu);
}

/* Called from any thread of the plugin (Go threads included): one write per line. */
void nt_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  (void)flags;
  if (level == NCCL_LOG_NONE || fmt == NULL) {
    return;
  }
  if (level == NCCL_LOG_INFO) {
    va_list ap;
    va_start(ap, fmt);
    nt_phases_note(fmt, ap);
    va_end(ap);
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
  if (nt_log_time && len < sizeof(msg) - 40) { /* MPIB_NETTEST_LOG_MS=1: a timeline to read */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    len += (size_t)snprintf(msg + len, sizeof(msg) - len, " [ms=%lld]",
                            (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
  }
  msg[len++] = '\n';
  pthread_mutex_lock(&nt_log_mu);
  ssize_t w = write(STDERR_FILENO, msg, len);
  (void)w;
  pthread_mutex_unlock(&nt_log_mu);
}

/* ---- profiler: stands in for NCCL's profiler callback and checks the plugin's events ----
 * Every Start must name a handle nettest passed to isend/irecv and carry net_ib's QP
 * descriptor (what NCCL's profilers decode); it gets a fresh event handle. Every Stop must
 * return an open handle, once. The plugin calls from whichever thread drives the comm. */

#define NT_PROF_EVENTS 4096 /* open at once: window x multi x rails x 2 directions, with room */
#define NT_PROF_DEVS 2

static pthread_mutex_t nt_prof_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char nt_prof_open[NT_PROF_EVENTS]; /* event handle i is &nt_prof_open[i] */
static char nt_prof_phandles[1 + NT_MAX_MULTI];    /* [0]: every isend, [1 + i]: irecv entry i */
static struct {
  uint64_t starts, stops, bad;
  uint64_t dev_starts[NT_PROF_DEVS];
  uint64_t send_bytes; /* lengths of the events started for isends */
  int cursor;
} nt_prof;

#define nt_prof_send_phandle ((void *)&nt_prof_phandles[0])
static void *nt_prof_recv_phandle(int i) { return &nt_prof_phandles[1 + i]; }

static void nt_prof_bad(const char *what, long long v) {
  if (nt_prof.bad++ < 5) {
    nt_err("profiler: %s (%lld)", what, v);
  }
}

static void nt_prof_start(void **eh, void *ph, int64_t plugin_id, const ncclProfilerNetIbDescr_v1_t *d) {
  if (eh == NULL) {
    nt_prof_bad("Start without an event handle pointer", 0);
    return;
  }
  *eh = NULL;
  long long pidx = (char *)ph - nt_prof_phandles;
  if (pidx < 0 || pidx > NT_MAX_MULTI) {
    nt_prof_bad("Start with a pHandle nettest never passed", pidx);
    return;
  }
  if (plugin_id != (int64_t)(NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER) || d == NULL ||
      d->type != ncclProfileQp || d->qp.device < 0) {
    nt_prof_bad("Start without an IB v1 QP descriptor, pluginId", (long long)plugin_id);
    return;
  }
  for (int k = 0; k < NT_PROF_EVENTS; k++) {
    int i = (nt_prof.cursor + k) % NT_PROF_EVENTS;
    if (!nt_prof_open[i]) {
      nt_prof_open[i] = 1;
      nt_prof.cursor = i + 1;
      nt_prof.starts++;
      if (d->qp.device < NT_PROF_DEVS) {
        nt_prof.dev_starts[d->qp.device]++;
      }
      if (pidx == 0) {
        nt_prof.send_bytes += d->qp.length;
      }
      *eh = &nt_prof_open[i];
      return;
    }
  }
  nt_prof_bad("more events open than nettest tracks", NT_PROF_EVENTS);
}

static void nt_prof_stop(void **eh) {
  long long i = (eh == NULL || *eh == NULL) ? -1 : (unsigned char *)*eh - nt_prof_open;
  if (i < 0 || i >= NT_PROF_EVENTS || !nt_prof_open[i]) {
    nt_prof_bad("Stop of a handle that is not open, index", i);
    return;
  }
  nt_prof_open[i] = 0;
  nt_prof.stops++;
}

static ncclResult_t nt_prof_callback(void **eHandle, int type, void *pHandle, int64_t pluginId, void *extData) {
  pthread_mutex_lock(&nt_prof_mu);
  if (type == ncclProfilerNetEventStart) {
    nt_prof_start(eHandle, pHandle, pluginId, extData);
  } else if (type == ncclProfilerNetEventStop) {
    nt_prof_stop(eHandle);
  } else {
    nt_prof_bad("event type other than Start/Stop", type); /* MPIB sends no updates */
  }
  pthread_mutex_unlock(&nt_prof_mu);
  return ncclSuccess;
}

/* One result line; 0 when every started event was stopped and none was malformed. */
static int nt_prof_report(void) {
  pthread_mutex_lock(&nt_prof_mu);
  uint64_t open = nt_prof.starts - nt_prof.stops;
  nt_out("nettest-profiler: starts=%llu stops=%llu open=%llu bad=%llu dev0_starts=%llu dev1_starts=%llu "
         "send_bytes=%llu",
         (unsigned long long)nt_prof.starts, (unsigned long long)nt_prof.stops, (unsigned long long)open,
         (unsigned long long)nt_prof.bad, (unsigned long long)nt_prof.dev_starts[0],
         (unsigned long long)nt_prof.dev_starts[1], (unsigned long long)nt_prof.send_bytes);
  int ok = open == 0 && nt_prof.bad == 0;
  pthread_mutex_unlock(&nt_prof_mu);
  return ok ? 0 : -1;
}

/* ---- loading ---- */

static const char *nt_sym_names[] = {NULL,
                                     NULL,
                                     NULL,
                                     NULL,
                                     NULL,
                                     NULL,
                                     NULL,
                                     "ncclNetPlugin_v7",
                                     "ncclNetPlugin_v8",
                                     "ncclNetPlugin_v9",
                                     "ncclNetPlugin_v10",
                                     "ncclNetPlugin_v11",
                                     "ncclNetPlugin_v12"};

#define NT_REQUIRE(tbl, field)                                            \
  do {                                                                    \
    if ((tbl)->field == NULL) {                                           \
      snprintf(err, errlen, "%s: function table has no %s", sym, #field); \
      return -1;                                                          \
    }                                                                     \
  } while (0)

#define NT_REQUIRE_COMMON(tbl)      \
  do {                              \
    NT_REQUIRE(tbl, init);          \
    NT_REQUIRE(tbl, devices);       \
    NT_REQUIRE(tbl, getProperties); \
    NT_REQUIRE(tbl, listen);        \
    NT_REQUIRE(tbl, connect);       \
    NT_REQUIRE(tbl, accept);        \
    NT_REQUIRE(tbl, regMr);         \
    NT_REQUIRE(tbl, deregMr);       \
    NT_REQUIRE(tbl, isend);         \
    NT_REQUIRE(tbl, irecv);         \
    NT_REQUIRE(tbl, test);          \
    NT_REQUIRE(tbl, closeSend);     \
    NT_REQUIRE(tbl, closeRecv);     \
    NT_REQUIRE(tbl, closeListen);   \
  } while (0)

/* dlopen(path, RTLD_NOW|RTLD_LOCAL) and dlsym the requested version's table. The library is
 * never dlclose'd: a Go c-shared runtime cannot be unloaded. */
int nt_net_load(struct nt_net *n, const char *path, int abi, char *err, size_t errlen) {
  memset(n, 0, sizeof(*n));
  if (abi < NT_ABI_MIN || abi > NT_ABI_MAX) {
    snprintf(err, errlen, "unsupported ABI version %d (%d..%d)", abi, NT_ABI_MIN, NT_ABI_MAX);
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
  case 7:
    n->t.v7 = t;
    NT_REQUIRE_COMMON(n->t.v7);
    n->name = n->t.v7->name;
    break;
  case 8:
    n->t.v8 = t;
    NT_REQUIRE_COMMON(n->t.v8);
    n->name = n->t.v8->name;
    break;
  case 9:
    n->t.v9 = t;
    NT_REQUIRE_COMMON(n->t.v9);
    n->name = n->t.v9->name;
    break;
  case 10:
    n->t.v10 = t;
    NT_REQUIRE_COMMON(n->t.v10);
    n->name = n->t.v10->name;
    break;
  case 11:
    n->t.v11 = t;
    NT_REQUIRE_COMMON(n->t.v11);
    n->name = n->t.v11->name;
    break;
  default:
    n->t.v12 = t;
    NT_REQUIRE_COMMON(n->t.v12);
    n->name = n->t.v12->name;
    break;
  }
  if (n->name == NULL) {
    n->name = "(null)";
  }
  return 0;
}

/* Dispatch a call with the same arguments in every version. */
#define NT_CALL(n, fn, ...)                       \
  ((n)->abi == 7    ? (n)->t.v7->fn(__VA_ARGS__)  \
   : (n)->abi == 8  ? (n)->t.v8->fn(__VA_ARGS__)  \
   : (n)->abi == 9  ? (n)->t.v9->fn(__VA_ARGS__)  \
   : (n)->abi == 10 ? (n)->t.v10->fn(__VA_ARGS__) \
   : (n)->abi == 11 ? (n)->t.v11->fn(__VA_ARGS__) \
                    : (n)->t.v12->fn(__VA_ARGS__))

ncclResult_t nt_net_init(struct nt_net *n, uint64_t comm_id) {
  ncclNetCommConfig_t config = {.trafficClass = n->traffic_class};
  ncclProfilerCallback_t prof = n->profiler ? nt_prof_callback : NULL;
  switch (n->abi) {
  case 7: return n->t.v7->init(nt_logger);
  case 8: return n->t.v8->init(nt_logger);
  case 9: return n->t.v9->init(nt_logger);
  case 10: return n->t.v10->init(nt_logger, prof);
  case 11: return n->t.v11->init(&n->ctx, comm_id, &config, nt_logger, prof);
  default: return n->t.v12->init(&n->ctx, comm_id, &config, nt_logger, prof);
  }
}

ncclResult_t nt_net_devices(struct nt_net *n, int *ndev) { return NT_CALL(n, devices, ndev); }

static void nt_copy_str(char *dst, size_t len, const char *src) { snprintf(dst, len, "%s", src ? src : "(null)"); }

/* The fields every properties version shares by name (each version is its own type). */
#define NT_PROPS_V7(p, v)                                                        \
  do {                                                                           \
    nt_copy_str((p)->name, sizeof((p)->name), (v)->name);                        \
    nt_copy_str((p)->pci_path, sizeof((p)->pci_path), (v)->pciPath);             \
    (p)->guid = (v)->guid, (p)->ptr_support = (v)->ptrSupport;                   \
    (p)->speed = (v)->speed, (p)->port = (v)->port, (p)->latency = (v)->latency; \
    (p)->max_comms = (v)->maxComms, (p)->max_recvs = (v)->maxRecvs;              \
  } while (0)

/* v8 adds regIsGlobal. */
#define NT_PROPS_V8(p, v)                  \
  do {                                     \
    NT_PROPS_V7(p, v);                     \
    (p)->reg_is_global = (v)->regIsGlobal; \
  } while (0)

/* v9 adds forceFlush, vProps (4 entries until v11, 8 in v12) and the size limits. */
#define NT_PROPS_V9(p, v)                                                                              \
  do {                                                                                                 \
    NT_PROPS_V8(p, v);                                                                                 \
    (p)->force_flush = (v)->forceFlush;                                                                \
    (p)->vndevs = (v)->vProps.ndevs;                                                                   \
    int cap_ = (int)(sizeof((v)->vProps.devs) / sizeof((v)->vProps.devs[0]));                          \
    for (int i_ = 0; i_ < cap_ && i_ < (v)->vProps.ndevs; i_++) (p)->vdevs[i_] = (v)->vProps.devs[i_]; \
    (p)->max_p2p_bytes = (v)->maxP2pBytes, (p)->max_coll_bytes = (v)->maxCollBytes;                    \
  } while (0)

ncclResult_t nt_net_props(struct nt_net *n, int dev, struct nt_props *p) {
  memset(p, 0, sizeof(*p));
  p->vndevs = -1;                 /* v8: no vProps */
  p->max_multi_request_size = -1; /* before v11 */
  ncclResult_t rc;
  if (n->abi == 7) {
    ncclNetProperties_v7_t v = {0};
    rc = n->t.v7->getProperties(dev, &v);
    NT_PROPS_V7(p, &v);
  } else if (n->abi == 8) {
    ncclNetProperties_v8_t v = {0};
    rc = n->t.v8->getProperties(dev, &v);
    NT_PROPS_V8(p, &v);
  } else if (n->abi == 9 || n->abi == 10) {
    ncclNetProperties_v9_t v = {0};
    rc = n->abi == 9 ? n->t.v9->getProperties(dev, &v) : n->t.v10->getProperties(dev, &v);
    NT_PROPS_V9(p, &v);
  } else if (n->abi == 11) {
    ncclNetProperties_v11_t v = {0};
    rc = n->t.v11->getProperties(dev, &v);
    NT_PROPS_V9(p, &v);
    p->max_multi_request_size = v.maxMultiRequestSize;
  } else {
    /* Poison the v12-only tail: a plugin that filled only a v11 layout shows here. */
    ncclNetProperties_v12_t v = {0};
    v.railId = v.planeId = 0x5A5A;
    rc = n->t.v12->getProperties(dev, &v);
    NT_PROPS_V9(p, &v);
    p->max_multi_request_size = v.maxMultiRequestSize;
    p->has_rail_plane = 1;
    p->rail_id = v.railId;
    p->plane_id = v.planeId;
  }
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
    for (int i = 0; i < p->vndevs && i < NCCL_NET_MAX_DEVS_PER_NIC_V12; i++) {
      o += snprintf(vp + o, sizeof(vp) - (size_t)o, "%s%d", i ? "," : "", p->vdevs[i]);
    }
    snprintf(vp + o, sizeof(vp) - (size_t)o, "]");
  }
  char ids[64] = ""; /* v12 only */
  if (p->has_rail_plane) {
    snprintf(ids, sizeof(ids), " railId=%d planeId=%d", p->rail_id, p->plane_id);
  }
  snprintf(buf, len,
           "name=%s pciPath=%s guid=0x%llx speed=%d port=%d ptrSupport=0x%x ptrs=%s regIsGlobal=%d "
           "forceFlush=%d latency=%.1f maxComms=%d maxRecvs=%d vProps=%s maxP2pBytes=%zu "
           "maxCollBytes=%zu maxMultiRequestSize=%d%s",
           p->name, p->pci_path, (unsigned long long)p->guid, p->speed, p->port, (unsigned)p->ptr_support,
           ptrs[0] ? ptrs + 1 : "none", p->reg_is_global, p->force_flush, (double)p->latency, p->max_comms,
           p->max_recvs, vp, p->max_p2p_bytes, p->max_coll_bytes, p->max_multi_request_size, ids);
  for (char *c = buf; *c; c++) {
    if (*c == '\t' || *c == '\n') {
      *c = '_';
    }
  }
}

ncclResult_t nt_net_listen(struct nt_net *n, int dev, void *handle, void **lcomm) {
  switch (n->abi) {
  case 7: return n->t.v7->listen(dev, handle, lcomm);
  case 8: return n->t.v8->listen(dev, handle, lcomm);
  case 9: return n->t.v9->listen(dev, handle, lcomm);
  case 10: return n->t.v10->listen(dev, handle, lcomm);
  case 11: return n->t.v11->listen(n->ctx, dev, handle, lcomm);
  default: return n->t.v12->listen(n->ctx, dev, handle, lcomm);
  }
}

ncclResult_t nt_net_connect(struct nt_net *n, int dev, void *handle, void **scomm) {
  ncclNetDeviceHandle_t *dh = NULL;
  ncclNetCommConfig_t config = {.trafficClass = n->traffic_class}; /* v10: per connect */
  switch (n->abi) {
  case 7: return n->t.v7->connect(dev, handle, scomm, &dh);
  case 8: return n->t.v8->connect(dev, handle, scomm, &dh);
  case 9: return n->t.v9->connect(dev, handle, scomm, &dh);
  case 10: return n->t.v10->connect(dev, &config, handle, scomm, &dh);
  case 11: return n->t.v11->connect(n->ctx, dev, handle, scomm, &dh);
  default: return n->t.v12->connect(n->ctx, dev, handle, scomm, &dh);
  }
}

ncclResult_t nt_net_accept(struct nt_net *n, void *lcomm, void **rcomm) {
  ncclNetDeviceHandle_t *dh = NULL;
  return NT_CALL(n, accept, lcomm, rcomm, &dh);
}

ncclResult_t nt_net_regmr(struct nt_net *n, void *comm, void *data, size_t size, void **mh) {
  if (n->abi == 7) { /* an int size, as NCCL 2.19 passes it */
    if (size > INT_MAX) return ncclInvalidArgument;
    return n->t.v7->regMr(comm, data, (int)size, NCCL_PTR_HOST, mh);
  }
  return NT_CALL(n, regMr, comm, data, size, NCCL_PTR_HOST, mh);
}

ncclResult_t nt_net_deregmr(struct nt_net *n, void *comm, void *mh) { return NT_CALL(n, deregMr, comm, mh); }

ncclResult_t nt_net_isend(struct nt_net *n, void *scomm, void *data, size_t size, int tag, void *mh, void **req) {
  switch (n->abi) {
  case 7: return n->t.v7->isend(scomm, data, (int)size, tag, mh, req);
  case 8: return n->t.v8->isend(scomm, data, (int)size, tag, mh, req);
  case 9: return n->t.v9->isend(scomm, data, size, tag, mh, req);
  case 10: return n->t.v10->isend(scomm, data, size, tag, mh, nt_prof_send_phandle, req);
  case 11: return n->t.v11->isend(scomm, data, size, tag, mh, nt_prof_send_phandle, req);
  default: return n->t.v12->isend(scomm, data, size, tag, mh, nt_prof_send_phandle, req);
  }
}

ncclResult_t nt_net_irecv(struct nt_net *n, void *rcomm, int cnt, void **data, size_t *sizes, int *tags, void **mhs,
                          void **req) {
  void *phandles[NT_MAX_MULTI];
  for (int i = 0; i < NT_MAX_MULTI; i++) {
    phandles[i] = nt_prof_recv_phandle(i);
  }
  if (n->abi <= 8) {
    int isz[NT_MAX_MULTI];
    for (int i = 0; i < cnt && i < NT_MAX_MULTI; i++) {
      isz[i] = (int)sizes[i];
    }
    return n->abi == 7 ? n->t.v7->irecv(rcomm, cnt, data, isz, tags, mhs, req)
                       : n->t.v8->irecv(rcomm, cnt, data, isz, tags, mhs, req);
  }
  if (n->abi == 9) {
    return n->t.v9->irecv(rcomm, cnt, data, sizes, tags, mhs, req);
  }
  if (n->abi == 10) {
    return n->t.v10->irecv(rcomm, cnt, data, sizes, tags, mhs, phandles, req);
  }
  if (n->abi == 11) {
    return n->t.v11->irecv(rcomm, cnt, data, sizes, tags, mhs, phandles, req);
  }
  return n->t.v12->irecv(rcomm, cnt, data, sizes, tags, mhs, phandles, req);
}

int nt_net_has_iflush(const struct nt_net *n) {
  switch (n->abi) {
  case 7: return n->t.v7->iflush != NULL;
  case 8: return n->t.v8->iflush != NULL;
  case 9: return n->t.v9->iflush != NULL;
  case 10: return n->t.v10->iflush != NULL;
  case 11: return n->t.v11->iflush != NULL;
  default: return n->t.v12->iflush != NULL;
  }
}

ncclResult_t nt_net_iflush(struct nt_net *n, void *rcomm, int cnt, void **data, int *sizes, void **mhs, void **req) {
  return NT_CALL(n, iflush, rcomm, cnt, data, sizes, mhs, req);
}

ncclResult_t nt_net_test(struct nt_net *n, void *req, int *done, int *sizes) {
  return NT_CALL(n, test, req, done, sizes);
}

ncclResult_t nt_net_close_send(struct nt_net *n, void *c) { return NT_CALL(n, closeSend, c); }
ncclResult_t nt_net_close_recv(struct nt_net *n, void *c) { return NT_CALL(n, closeRecv, c); }
ncclResult_t nt_net_close_listen(struct nt_net *n, void *c) { return NT_CALL(n, closeListen, c); }

/* With --profiler, a run whose events are not all stopped (or were malformed) fails here. */
ncclResult_t nt_net_finalize(struct nt_net *n) {
  ncclResult_t rc = ncclSuccess;
  n->finalized = 1;
  if (n->abi == 11 && n->t.v11->finalize != NULL) {
    rc = n->t.v11->finalize(n->ctx);
  } else if (n->abi >= 12 && n->t.v12->finalize != NULL) {
    rc = n->t.v12->finalize(n->ctx);
  }
  if (n->profiler && nt_prof_report() != 0 && rc == ncclSuccess) {
    rc = ncclInternalError;
  }
  return rc;
}
