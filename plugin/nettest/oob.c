/*
 * The out-of-band side channel: one TCP connection between server and client carrying framed
 * messages {u32 type, u32 len, payload}, big-endian. Every wait has a deadline.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nt_oob.h"
#include "nt_util.h"

#define NT_OOB_MAX_PAYLOAD 65536

/* "HOST:PORT", "[V6]:PORT" or ":PORT" (any address). */
int nt_parse_hostport(const char *addr, char *host, size_t hostlen, char *port, size_t portlen) {
  const char *colon;
  const char *h = addr;
  size_t hl;
  if (addr[0] == '[') {
    const char *rb = strchr(addr, ']');
    if (rb == NULL || rb[1] != ':') {
      return -1;
    }
    h = addr + 1;
    hl = (size_t)(rb - h);
    colon = rb + 1;
  } else {
    colon = strrchr(addr, ':');
    if (colon == NULL) {
      return -1;
    }
    hl = (size_t)(colon - addr);
  }
  if (hl >= hostlen || strlen(colon + 1) == 0 || strlen(colon + 1) >= portlen) {
    return -1;
  }
  memcpy(host, h, hl);
  host[hl] = '\0';
  snprintf(port, portlen, "%s", colon + 1);
  char *end;
  long p = strtol(port, &end, 10);
  if (*end != '\0' || p < 0 || p > 65535) {
    return -1;
  }
  return 0;
}

static void nt_oob_set_peer(struct nt_oob *o) {
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  o->peer_ip[0] = '\0';
  if (getpeername(o->fd, (struct sockaddr *)&ss, &sl) != 0) {
    return;
  }
  if (ss.ss_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, o->peer_ip, sizeof(o->peer_ip));
  } else if (ss.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, o->peer_ip, sizeof(o->peer_ip));
  }
}

static void nt_oob_tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int nt_ms_left(double deadline) {
  double left = deadline - nt_now();
  if (left <= 0) {
    return 0;
  }
  return left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

int nt_oob_server(struct nt_oob *o, const char *addr, int timeout_s) {
  memset(o, 0, sizeof(*o));
  o->fd = -1;
  char host[256], port[16];
  if (nt_parse_hostport(addr, host, sizeof(host), port, sizeof(port)) != 0) {
    nt_err("bad --oob-listen address '%s' (want IP:PORT)", addr);
    return -1;
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  struct addrinfo *res = NULL;
  int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (gai != 0) {
    nt_err("oob: cannot resolve '%s': %s", addr, gai_strerror(gai));
    return -1;
  }
  int lfd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0) {
    nt_err("oob: socket: %s", strerror(errno));
    freeaddrinfo(res);
    return -1;
  }
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(lfd, res->ai_addr, res->ai_addrlen) != 0 || listen(lfd, 4) != 0) {
    nt_err("oob: cannot listen on %s: %s", addr, strerror(errno));
    freeaddrinfo(res);
    close(lfd);
    return -1;
  }
  freeaddrinfo(res);
  double deadline = nt_now() + timeout_s;
  for (;;) {
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    int ms = nt_ms_left(deadline);
    if (ms == 0) {
      nt_err("oob: no client connected to %s within %d s", addr, timeout_s);
      close(lfd);
      return -1;
    }
    int r = poll(&p, 1, ms);
    if (r < 0 && errno != EINTR) {
      nt_err("oob: poll: %s", strerror(errno));
      close(lfd);
      return -1;
    }
    if (r > 0) {
      int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
      if (fd >= 0) {
        o->fd = fd;
        break;
      }
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        nt_err("oob: accept: %s", strerror(errno));
        close(lfd);
        return -1;
      }
    }
  }
  close(lfd);
  nt_oob_tune(o->fd);
  nt_oob_set_peer(o);
  return 0;
}

/* Connect with retries until the deadline: the server may start after the client. */
int nt_oob_client(struct nt_oob *o, const char *addr, int timeout_s) {
  memset(o, 0, sizeof(*o));
  o->fd = -1;
  char host[256], port[16];
  if (nt_parse_hostport(addr, host, sizeof(host), port, sizeof(port)) != 0 || host[0] == '\0') {
    nt_err("bad --oob-connect address '%s' (want HOST:PORT)", addr);
    return -1;
  }
  double deadline = nt_now() + timeout_s;
  const char *last = "timed out";
  char lastbuf[256];
  while (nt_ms_left(deadline) > 0) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host, port, &hints, &res);
    if (gai != 0) {
      snprintf(lastbuf, sizeof(lastbuf), "cannot resolve: %s", gai_strerror(gai));
      last = lastbuf;
      usleep(200000);
      continue;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      nt_err("oob: socket: %s", strerror(errno));
      freeaddrinfo(res);
      return -1;
    }
    int r = connect(fd, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (r != 0 && errno == EINPROGRESS) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int pr = poll(&p, 1, nt_ms_left(deadline));
      int soerr = ETIMEDOUT;
      socklen_t sl = sizeof(soerr);
      if (pr > 0) {
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
      }
      r = soerr == 0 ? 0 : -1;
      errno = soerr;
    }
    if (r == 0) {
      int fl = fcntl(fd, F_GETFL);
      fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
      o->fd = fd;
      nt_oob_tune(fd);
      nt_oob_set_peer(o);
      return 0;
    }
    snprintf(lastbuf, sizeof(lastbuf), "%s", strerror(errno));
    last = lastbuf;
    close(fd);
    usleep(200000);
  }
  nt_err("oob: cannot connect to %s within %d s (last error: %s)", addr, timeout_s, last);
  return -1;
}

static int nt_io_full(int fd, void *buf, size_t len, int is_send, double deadline) {
  uint8_t *p = buf;
  while (len > 0) {
    struct pollfd pf = {.fd = fd, .events = is_send ? POLLOUT : POLLIN};
    int ms = nt_ms_left(deadline);
    if (ms == 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    int r = poll(&pf, 1, ms > 1000 ? 1000 : ms);
    nt_heartbeat();
    if (r < 0) {
      if (errno == EINTR) {
        continue;
      }
      return -1;
    }
    if (r == 0) {
      continue;
    }
    ssize_t n = is_send ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, len, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
        continue;
      }
      return -1;
    }
    if (n == 0) {
      errno = ECONNRESET;
      return -2; /* EOF */
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int nt_oob_send(struct nt_oob *o, uint32_t type, const void *buf, uint32_t len) {
  if (o->fd < 0) {
    return -1;
  }
  uint32_t hdr[2] = {htonl(type), htonl(len)};
  double deadline = nt_now() + 30;
  if (nt_io_full(o->fd, hdr, sizeof(hdr), 1, deadline) != 0 ||
      (len > 0 && nt_io_full(o->fd, (void *)buf, len, 1, deadline) != 0)) {
    nt_err("oob: send to peer failed: %s", strerror(errno));
    return -1;
  }
  return 0;
}

static const char *nt_msg_name(uint32_t t) {
  switch (t) {
  case NT_MSG_HELLO: return "HELLO";
  case NT_MSG_HANDLE: return "HANDLE";
  case NT_MSG_SYNC: return "SYNC";
  case NT_MSG_STOP: return "STOP";
  case NT_MSG_RESULT: return "RESULT";
  case NT_MSG_ABORT: return "ABORT";
  default: return "?";
  }
}

/* Receive one message of the given type. A peer's ABORT is printed and returns -2, like EOF. */
int nt_oob_recv(struct nt_oob *o, uint32_t type, void *buf, uint32_t cap, uint32_t *len, int timeout_s) {
  if (o->fd < 0 || o->aborted) {
    return -2;
  }
  double deadline = nt_now() + timeout_s;
  uint32_t hdr[2];
  int r = nt_io_full(o->fd, hdr, sizeof(hdr), 0, deadline);
  if (r != 0) {
    if (r == -2) {
      o->aborted = 1;
      nt_err("oob: peer closed the connection while %s was expected", nt_msg_name(type));
      return -2;
    }
    nt_err("oob: no %s from peer within %d s: %s", nt_msg_name(type), timeout_s, strerror(errno));
    return -1;
  }
  uint32_t t = ntohl(hdr[0]), l = ntohl(hdr[1]);
  if (l > NT_OOB_MAX_PAYLOAD) {
    nt_err("oob: bad message from peer (type %u, length %u)", t, l);
    return -1;
  }
  char *tmp = malloc(l + 1);
  if (tmp == NULL) {
    return -1;
  }
  if (l > 0 && nt_io_full(o->fd, tmp, l, 0, deadline) != 0) {
    nt_err("oob: truncated %s message from peer", nt_msg_name(t));
    free(tmp);
    o->aborted = 1;
    return -2;
  }
  tmp[l] = '\0';
  if (t == NT_MSG_ABORT) {
    nt_err("peer aborted: %s", tmp);
    o->aborted = 1;
    free(tmp);
    return -2;
  }
  if (t != type) {
    nt_err("oob: expected %s from peer, got %s (%u bytes): peers out of step", nt_msg_name(type), nt_msg_name(t), l);
    free(tmp);
    return -1;
  }
  if (l > cap) {
    nt_err("oob: %s message too long (%u > %u)", nt_msg_name(t), l, cap);
    free(tmp);
    return -1;
  }
  if (buf != NULL) {
    memcpy(buf, tmp, l);
    if (l < cap) {
      ((char *)buf)[l] = '\0';
    }
  }
  if (len != NULL) {
    *len = l;
  }
  free(tmp);
  return 0;
}

/* Non-blocking look at the next message: its type, 0 when none is waiting, -1 when the peer
 * has closed or sent ABORT (the ABORT is consumed and printed). */
int nt_oob_peek(struct nt_oob *o) {
  if (o->fd < 0 || o->aborted) {
    return -1;
  }
  uint32_t hdr[2];
  ssize_t n = recv(o->fd, hdr, sizeof(hdr), MSG_PEEK | MSG_DONTWAIT);
  if (n < 0) {
    return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
  }
  if (n == 0) {
    o->aborted = 1;
    nt_err("oob: peer closed the connection");
    return -1;
  }
  if ((size_t)n < sizeof(hdr)) {
    return 0;
  }
  uint32_t t = ntohl(hdr[0]);
  if (t == NT_MSG_ABORT) {
    nt_oob_recv(o, NT_MSG_ABORT, NULL, 0, NULL, 5);
    o->aborted = 1;
    return -1;
  }
  return (int)t;
}

/* Barrier: both sides send the label and expect the same label back. */
int nt_oob_sync(struct nt_oob *o, const char *label, int timeout_s) {
  char got[128];
  uint32_t len = 0;
  if (nt_oob_send(o, NT_MSG_SYNC, label, (uint32_t)strlen(label)) != 0) {
    return -1;
  }
  if (nt_oob_recv(o, NT_MSG_SYNC, got, sizeof(got) - 1, &len, timeout_s) != 0) {
    return -1;
  }
  got[len] = '\0';
  if (strcmp(got, label) != 0) {
    nt_err("oob: sync mismatch: here '%s', peer '%s'", label, got);
    return -1;
  }
  return 0;
}

/* Best effort: tell the peer why we give up so that it exits now rather than at its timeout. */
void nt_oob_abort(struct nt_oob *o, const char *fmt, ...) {
  if (o == NULL || o->fd < 0 || o->aborted) {
    return;
  }
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  nt_oob_send(o, NT_MSG_ABORT, msg, (uint32_t)strlen(msg));
}

void nt_oob_close(struct nt_oob *o) {
  if (o->fd >= 0) {
    close(o->fd);
    o->fd = -1;
  }
}
