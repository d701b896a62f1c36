/*
 * fakenet: a test-only NCCL net plugin over TCP, used to exercise mpib-nettest where no RDMA
 * device exists. It mimics the semantics the driver relies on, not MPIB's protocol:
 *   - handle: bytes [0,8) magic, [8,12) IPv4 (network order), [12,14) TCP port (big-endian);
 *   - receiver-driven: irecv sends a clear-to-send record {n, tags}; isend returns NULL until
 *     the CTS of its slot arrived; the data of a slot goes out when all n isends are present;
 *   - connect rejects a handle without the magic; accept drops a peer without the magic.
 * Fault injection for driver tests (environment):
 *   FAKENET_FAIL_INIT=1      init logs a WARN and fails
 *   FAKENET_CORRUPT_MSG=N    flip one byte of the N-th message received (0-based)
 *   FAKENET_OVERRUN_MSG=N    write 16 bytes past the end of the N-th message received
 *   FAKENET_BAD_SIZE_MSG=N   report size+1 for the N-th message received
 *   FAKENET_HANG_FINALIZE=1  finalize never returns (the driver's watchdog must end it)
 *   FAKENET_CONNECT_SLEEP_MS=N  connect sleeps N ms first: a call that blocks (--call-stats)
 * Devices (environment): FAKENET_NDEV=N (1..8, default 1) devices, fake0..fake<N-1>, all on
 * the same loopback TCP (mpib-nettest --devs tests); the device index changes nothing else.
 * Build: gcc -shared -fPIC -Iplugin -o build/libnccl-net-fake.so plugin/nettest/fake/fakenet.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nccl_abi.h"

#define FK_MAGIC 0x4b414e4554545346ULL
#define FK_SLOTS 32
#define FK_MAXN 8

static ncclDebugLogger_t fk_log;
#define FK_WARN(...) fk_log(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__, "NET/FAKE " __VA_ARGS__)
#define FK_INFO(...) fk_log(NCCL_LOG_INFO, NCCL_NET, __FILE__, __LINE__, "NET/FAKE " __VA_ARGS__)

static long fk_corrupt = -1, fk_overrun = -1, fk_badsize = -1, fk_connect_sleep_ms = -1;

struct fk_req {
  int used, is_send, done, n;
  int sizes[FK_MAXN];
  struct fk_comm *c;
};

struct fk_cts {
  int n;
  int tags[FK_MAXN];
  int posted; /* isends seen */
  void *data[FK_MAXN];
  int sizes[FK_MAXN];
  struct fk_req *reqs[FK_MAXN];
};

struct fk_comm {
  int fd;
  /* sender: CTS records received, in slot order */
  struct fk_cts cts[FK_SLOTS];
  uint64_t cts_recv, cts_sent_data;
  uint8_t rbuf[sizeof(int32_t) * (1 + FK_MAXN)];
  size_t rbuf_len;
  /* receiver: posted slots in order, and the read state of the head one */
  struct {
    int n;
    void *data[FK_MAXN];
    size_t cap[FK_MAXN];
    struct fk_req *req;
  } post[FK_SLOTS];
  uint64_t posted, completed;
  int hdr_have;
  int32_t hdr[1 + FK_MAXN];
  int piece;
  size_t piece_off;
  long msg_index;
  struct fk_req reqs[FK_SLOTS * FK_MAXN];
};

struct fk_listen {
  int fd;
};

static long fk_env(const char *n) {
  const char *e = getenv(n);
  return e ? atol(e) : -1;
}

static ncclResult_t fk_init(ncclDebugLogger_t logger) {
  fk_log = logger;
  if (getenv("FAKENET_FAIL_INIT")) {
    FK_WARN("init failed on purpose (FAKENET_FAIL_INIT)");
    return ncclSystemError;
  }
  fk_corrupt = fk_env("FAKENET_CORRUPT_MSG");
  fk_overrun = fk_env("FAKENET_OVERRUN_MSG");
  fk_badsize = fk_env("FAKENET_BAD_SIZE_MSG");
  fk_connect_sleep_ms = fk_env("FAKENET_CONNECT_SLEEP_MS");
  FK_INFO("init ok");
  return ncclSuccess;
}

#define FK_MAXDEV 8

static ncclResult_t fk_devices(int *n) {
  long e = fk_env("FAKENET_NDEV");
  *n = e >= 1 && e <= FK_MAXDEV ? (int)e : 1;
  return ncclSuccess;
}

static ncclResult_t fk_props(int dev, ncclNetProperties_v11_t *p) {
  static char *names[FK_MAXDEV] = {"fake0", "fake1", "fake2", "fake3", "fake4", "fake5", "fake6", "fake7"};
  memset(p, 0, sizeof(*p));
  if (dev < 0 || dev >= FK_MAXDEV) {
    return ncclInvalidArgument;
  }
  p->name = names[dev];
  p->pciPath = "/sys/devices/fake";
  p->ptrSupport = NCCL_PTR_HOST;
  p->regIsGlobal = 1;
  p->speed = 10000;
  p->latency = 1;
  p->maxComms = 65536;
  p->maxRecvs = FK_MAXN;
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = dev;
  p->maxP2pBytes = (size_t)1 << 31;
  p->maxCollBytes = (size_t)1 << 31;
  p->maxMultiRequestSize = 1;
  return ncclSuccess;
}

static int fk_full(int fd, void *buf, size_t len, int is_send) {
  uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = is_send ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
      struct pollfd pf = {.fd = fd, .events = is_send ? POLLOUT : POLLIN};
      poll(&pf, 1, 100);
      continue;
    }
    if (n <= 0) {
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static ncclResult_t fk_listen(int dev, void *handle, void **lcomm) {
  (void)dev;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const char *ip = getenv("FAKENET_IP");
  if (ip) {
    inet_pton(AF_INET, ip, &sa.sin_addr);
  }
  socklen_t sl = sizeof(sa);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
    FK_WARN("listen: %s", strerror(errno));
    return ncclSystemError;
  }
  uint8_t *h = handle;
  memset(h, 0, NCCL_NET_HANDLE_MAXSIZE);
  uint64_t m = FK_MAGIC;
  memcpy(h, &m, 8);
  memcpy(h + 8, &sa.sin_addr.s_addr, 4);
  memcpy(h + 12, &sa.sin_port, 2);
  struct fk_listen *l = calloc(1, sizeof(*l));
  l->fd = fd;
  *lcomm = l;
  return ncclSuccess;
}

static struct fk_comm *fk_comm_new(int fd) {
  struct fk_comm *c = calloc(1, sizeof(*c));
  c->fd = fd;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return c;
}

static ncclResult_t fk_connect(void *ctx, int dev, void *handle, void **scomm, ncclNetDeviceHandle_t **dh) {
  (void)ctx;
  (void)dev;
  (void)dh;
  uint64_t m;
  memcpy(&m, handle, 8);
  if (m != FK_MAGIC) {
    FK_WARN("connect: handle has a bad magic 0x%llx", (unsigned long long)m);
    return ncclInvalidArgument;
  }
  if (fk_connect_sleep_ms > 0) {
    usleep((useconds_t)fk_connect_sleep_ms * 1000);
  }
  struct sockaddr_in sa = {.sin_family = AF_INET};
  memcpy(&sa.sin_addr.s_addr, (uint8_t *)handle + 8, 4);
  memcpy(&sa.sin_port, (uint8_t *)handle + 12, 2);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    FK_WARN("connect: %s", strerror(errno));
    return ncclSystemError;
  }
  m = FK_MAGIC;
  if (fk_full(fd, &m, 8, 1) != 0) {
    return ncclSystemError;
  }
  *scomm = fk_comm_new(fd);
  return ncclSuccess;
}

static ncclResult_t fk_accept(void *lcomm, void **rcomm, ncclNetDeviceHandle_t **dh) {
  (void)dh;
  struct fk_listen *l = lcomm;
  *rcomm = NULL;
  int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0) {
    return (errno == EAGAIN || errno == EWOULDBLOCK) ? ncclSuccess : ncclSystemError;
  }
  uint64_t m = 0;
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  if (poll(&pf, 1, 5000) <= 0 || recv(fd, &m, 8, MSG_WAITALL) != 8 || m != FK_MAGIC) {
    /* Like MPIB: a client that never proves it is a peer is dropped, accept keeps waiting. */
    FK_WARN("accept: dropped a TCP client that is not a peer (magic 0x%llx)", (unsigned long long)m);
    close(fd);
    return ncclSuccess;
  }
  *rcomm = fk_comm_new(fd);
  return ncclSuccess;
}

static ncclResult_t fk_regmr(void *comm, void *data, size_t size, int type, void **mh) {
  (void)comm;
  (void)data;
  (void)size;
  (void)type;
  *mh = (void *)0x1;
  return ncclSuccess;
}

static ncclResult_t fk_deregmr(void *comm, void *mh) {
  (void)comm;
  return mh == (void *)0x1 ? ncclSuccess : ncclInvalidArgument;
}

static struct fk_req *fk_req_get(struct fk_comm *c) {
  for (int i = 0; i < FK_SLOTS * FK_MAXN; i++) {
    if (!c->reqs[i].used) {
      memset(&c->reqs[i], 0, sizeof(c->reqs[i]));
      c->reqs[i].used = 1;
      c->reqs[i].c = c;
      return &c->reqs[i];
    }
  }
  return NULL;
}

/* Sender: read CTS records {n, tags[n]} as they arrive. */
static int fk_send_progress(struct fk_comm *c) {
  for (;;) {
    size_t need = sizeof(int32_t);
    if (c->rbuf_len >= sizeof(int32_t)) {
      int32_t n;
      memcpy(&n, c->rbuf, 4);
      need = sizeof(int32_t) * (1 + (size_t)n);
    }
    ssize_t r = recv(c->fd, c->rbuf + c->rbuf_len, need - c->rbuf_len, MSG_DONTWAIT);
    if (r < 0) {
      return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    }
    if (r == 0) {
      return -1;
    }
    c->rbuf_len += (size_t)r;
    if (c->rbuf_len == need && need > sizeof(int32_t)) {
      struct fk_cts *s = &c->cts[c->cts_recv % FK_SLOTS];
      memset(s, 0, sizeof(*s));
      memcpy(&s->n, c->rbuf, 4);
      memcpy(s->tags, c->rbuf + 4, 4 * (size_t)s->n);
      c->cts_recv++;
      c->rbuf_len = 0;
    }
  }
}

static ncclResult_t fk_isend(void *comm, void *data, size_t size, int tag, void *mh, void *ph, void **req) {
  (void)mh;
  (void)ph;
  struct fk_comm *c = comm;
  *req = NULL;
  if (fk_send_progress(c) != 0) {
    FK_WARN("isend: connection lost");
    return ncclRemoteError;
  }
  if (c->cts_sent_data == c->cts_recv) {
    return ncclSuccess; /* no clear-to-send yet */
  }
  struct fk_cts *s = &c->cts[c->cts_sent_data % FK_SLOTS];
  int j = -1;
  for (int i = 0; i < s->n; i++) {
    if (s->tags[i] == tag && s->reqs[i] == NULL) {
      j = i;
    }
  }
  if (j < 0) {
    FK_WARN("isend: tag %d not in the receiver's posted tags", tag);
    return ncclInvalidUsage;
  }
  struct fk_req *r = fk_req_get(c);
  if (r == NULL) {
    return ncclSuccess;
  }
  r->is_send = 1;
  s->reqs[j] = r;
  s->data[j] = data;
  s->sizes[j] = (int)size;
  s->posted++;
  *req = r;
  if (s->posted == s->n) {
    int32_t hdr[1 + FK_MAXN];
    hdr[0] = s->n;
    for (int i = 0; i < s->n; i++) {
      hdr[1 + i] = s->sizes[i];
    }
    if (fk_full(c->fd, hdr, sizeof(int32_t) * (1 + (size_t)s->n), 1) != 0) {
      return ncclRemoteError;
    }
    for (int i = 0; i < s->n; i++) {
      if (fk_full(c->fd, s->data[i], (size_t)s->sizes[i], 1) != 0) {
        return ncclRemoteError;
      }
      s->reqs[i]->done = 1;
      s->reqs[i]->sizes[0] = s->sizes[i];
    }
    c->cts_sent_data++;
  }
  return ncclSuccess;
}

static ncclResult_t fk_irecv(void *comm, int n, void **data, size_t *sizes, int *tags, void **mhs, void **ph,
                             void **req) {
  (void)mhs;
  (void)ph;
  struct fk_comm *c = comm;
  *req = NULL;
  if (n < 1 || n > FK_MAXN) {
    return ncclInvalidArgument;
  }
  if (c->posted - c->completed >= FK_SLOTS) {
    return ncclSuccess;
  }
  struct fk_req *r = fk_req_get(c);
  if (r == NULL) {
    return ncclSuccess;
  }
  r->n = n;
  int slot = (int)(c->posted % FK_SLOTS);
  c->post[slot].n = n;
  for (int i = 0; i < n; i++) {
    c->post[slot].data[i] = data[i];
    c->post[slot].cap[i] = sizes[i];
  }
  c->post[slot].req = r;
  int32_t cts[1 + FK_MAXN];
  cts[0] = n;
  for (int i = 0; i < n; i++) {
    cts[1 + i] = tags[i];
  }
  if (fk_full(c->fd, cts, sizeof(int32_t) * (1 + (size_t)n), 1) != 0) {
    return ncclRemoteError;
  }
  c->posted++;
  *req = r;
  return ncclSuccess;
}

/* Receiver: read the head slot's header and pieces without blocking. */
static int fk_recv_progress(struct fk_comm *c) {
  while (c->completed < c->posted) {
    int slot = (int)(c->completed % FK_SLOTS);
    struct fk_req *r = c->post[slot].req;
    int n = c->post[slot].n;
    size_t hlen = sizeof(int32_t) * (1 + (size_t)n);
    if ((size_t)c->hdr_have < hlen) {
      ssize_t k = recv(c->fd, (uint8_t *)c->hdr + c->hdr_have, hlen - (size_t)c->hdr_have, MSG_DONTWAIT);
      if (k < 0) {
        return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
      }
      if (k == 0) {
        return -1;
      }
      c->hdr_have += (int)k;
      if ((size_t)c->hdr_have < hlen) {
        return 0;
      }
      for (int i = 0; i < n; i++) {
        if ((size_t)c->hdr[1 + i] > c->post[slot].cap[i]) {
          FK_WARN("message of %d bytes for a %zu-byte receive", c->hdr[1 + i], c->post[slot].cap[i]);
          return -1;
        }
      }
      c->piece = 0;
      c->piece_off = 0;
    }
    while (c->piece < n) {
      size_t len = (size_t)c->hdr[1 + c->piece];
      if (c->piece_off < len) {
        ssize_t k =
            recv(c->fd, (uint8_t *)c->post[slot].data[c->piece] + c->piece_off, len - c->piece_off, MSG_DONTWAIT);
        if (k < 0) {
          return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        }
        if (k == 0) {
          return -1;
        }
        c->piece_off += (size_t)k;
        if (c->piece_off < len) {
          continue;
        }
      }
      uint8_t *d = c->post[slot].data[c->piece];
      r->sizes[c->piece] = (int)len;
      if (c->msg_index == fk_corrupt && len > 0) {
        d[len / 2] ^= 0x40;
      }
      if (c->msg_index == fk_overrun) {
        memset(d + len, 0x5a, 16);
      }
      if (c->msg_index == fk_badsize) {
        r->sizes[c->piece] = (int)len + 1;
      }
      c->msg_index++;
      c->piece++;
      c->piece_off = 0;
    }
    r->done = 1;
    c->hdr_have = 0;
    c->completed++;
  }
  return 0;
}

static ncclResult_t fk_test(void *request, int *done, int *sizes) {
  struct fk_req *r = request;
  struct fk_comm *c = r->c;
  *done = 0;
  if (r->is_send) {
    if (fk_send_progress(c) != 0 && !r->done) {
      return ncclRemoteError;
    }
  } else if (fk_recv_progress(c) != 0) {
    FK_WARN("test: receive failed (connection lost or protocol error)");
    return ncclRemoteError;
  }
  if (r->done) {
    *done = 1;
    if (sizes) {
      for (int i = 0; i < (r->is_send ? 1 : r->n); i++) {
        sizes[i] = r->sizes[i];
      }
    }
    r->used = 0;
  }
  return ncclSuccess;
}

static ncclResult_t fk_iflush(void *comm, int n, void **data, int *sizes, void **mhs, void **req) {
  (void)comm;
  (void)n;
  (void)data;
  (void)sizes;
  (void)mhs;
  *req = NULL;
  return ncclSuccess;
}

static ncclResult_t fk_close(void *comm) {
  struct fk_comm *c = comm;
  close(c->fd);
  free(c);
  return ncclSuccess;
}

static ncclResult_t fk_close_listen(void *comm) {
  struct fk_listen *l = comm;
  close(l->fd);
  free(l);
  return ncclSuccess;
}

static ncclResult_t fk_init_v11(void **ctx, uint64_t id, ncclNetCommConfig_t *cfg, ncclDebugLogger_t lg,
                                ncclProfilerCallback_t pf) {
  (void)id;
  (void)cfg;
  (void)pf;
  *ctx = (void *)0x2;
  return fk_init(lg);
}

static ncclResult_t fk_listen_v11(void *ctx, int dev, void *handle, void **lcomm) {
  (void)ctx;
  return fk_listen(dev, handle, lcomm);
}

static ncclResult_t fk_finalize(void *ctx) {
  if (getenv("FAKENET_HANG_FINALIZE")) {
    for (;;) {
      pause();
    }
  }
  return ctx == (void *)0x2 ? ncclSuccess : ncclInvalidArgument;
}

const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = "FAKE",
    .init = fk_init_v11,
    .devices = fk_devices,
    .getProperties = fk_props,
    .listen = fk_listen_v11,
    .connect = fk_connect,
    .accept = fk_accept,
    .regMr = fk_regmr,
    .deregMr = fk_deregmr,
    .isend = fk_isend,
    .irecv = fk_irecv,
    .iflush = fk_iflush,
    .test = fk_test,
    .closeSend = fk_close,
    .closeRecv = fk_close,
    .closeListen = fk_close_listen,
    .finalize = fk_finalize,
};

/* v8 adapters: int sizes, no ctx, v8 properties. */
static ncclResult_t fk_props_v8(int dev, ncclNetProperties_v8_t *p) {
  ncclNetProperties_v11_t v;
  ncclResult_t rc = fk_props(dev, &v);
  memset(p, 0, sizeof(*p));
  p->name = v.name;
  p->pciPath = v.pciPath;
  p->ptrSupport = v.ptrSupport;
  p->regIsGlobal = v.regIsGlobal;
  p->speed = v.speed;
  p->latency = v.latency;
  p->maxComms = v.maxComms;
  p->maxRecvs = v.maxRecvs;
  return rc;
}
static ncclResult_t fk_connect_v8(int dev, void *h, void **s, ncclNetDeviceHandle_t **dh) {
  return fk_connect(NULL, dev, h, s, dh);
}
static ncclResult_t fk_isend_v8(void *c, void *d, int size, int tag, void *mh, void **req) {
  return fk_isend(c, d, (size_t)size, tag, mh, NULL, req);
}
static ncclResult_t fk_irecv_v8(void *c, int n, void **d, int *sizes, int *tags, void **mhs, void **req) {
  size_t sz[FK_MAXN];
  for (int i = 0; i < n && i < FK_MAXN; i++) {
    sz[i] = (size_t)sizes[i];
  }
  return fk_irecv(c, n, d, sz, tags, mhs, NULL, req);
}

const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "FAKE",
    .init = fk_init,
    .devices = fk_devices,
    .getProperties = fk_props_v8,
    .listen = fk_listen,
    .connect = fk_connect_v8,
    .accept = fk_accept,
    .regMr = fk_regmr,
    .deregMr = fk_deregmr,
    .isend = fk_isend_v8,
    .irecv = fk_irecv_v8,
    .iflush = fk_iflush,
    .test = fk_test,
    .closeSend = fk_close,
    .closeRecv = fk_close,
    .closeListen = fk_close_listen,
};

/* v7 adapters: v8 without regIsGlobal, an int size in regMr. */
static ncclResult_t fk_props_v7(int dev, ncclNetProperties_v7_t *p) {
  ncclNetProperties_v8_t v;
  ncclResult_t rc = fk_props_v8(dev, &v);
  memset(p, 0, sizeof(*p));
  p->name = v.name;
  p->pciPath = v.pciPath;
  p->ptrSupport = v.ptrSupport;
  p->speed = v.speed;
  p->latency = v.latency;
  p->maxComms = v.maxComms;
  p->maxRecvs = v.maxRecvs;
  return rc;
}
static ncclResult_t fk_regmr_v7(void *comm, void *data, int size, int type, void **mh) {
  return size < 0 ? ncclInvalidArgument : fk_regmr(comm, data, (size_t)size, type, mh);
}

const ncclNet_v7_t ncclNetPlugin_v7 = {
    .name = "FAKE",
    .init = fk_init,
    .devices = fk_devices,
    .getProperties = fk_props_v7,
    .listen = fk_listen,
    .connect = fk_connect_v8,
    .accept = fk_accept,
    .regMr = fk_regmr_v7,
    .deregMr = fk_deregmr,
    .isend = fk_isend_v8,
    .irecv = fk_irecv_v8,
    .iflush = fk_iflush,
    .test = fk_test,
    .closeSend = fk_close,
    .closeRecv = fk_close,
    .closeListen = fk_close_listen,
};
