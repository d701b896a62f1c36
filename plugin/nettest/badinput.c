/*
 * Bad-input modes: the plugin must answer a corrupt handle (badhandle) or a peer that speaks
 * garbage on its listen socket (garbage-peer) with an error return, never a crash or a hang.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nt_modes.h"
#include "nt_util.h"

#define NT_MAGIC_BYTES 8 /* handle bytes [0, 8): the plugin's magic */
#define NT_GARBAGE_BYTES 4096

/* The side that is not under test waits for the verdict of the side that is, while polling
 * accept so that a plugin which needs accept calls to progress is served. */
static int nt_wait_verdict(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c,
                           const char *mode) {
  double deadline = nt_now() + o->timeout_s + 10;
  ncclResult_t arc = ncclSuccess;
  int accepting = 1;
  while (nt_now() < deadline) {
    if (accepting) {
      void *rc = NULL;
      arc = nt_net_accept(n, c->lcomm, &rc);
      if (arc != ncclSuccess) {
        accepting = 0; /* the corrupt connection attempt may surface here: fine */
      } else if (rc != NULL) {
        nt_err("%s: accept returned a comm for a peer that never connected correctly", mode);
        nt_net_close_recv(n, rc);
        accepting = 0;
      }
    }
    int t = nt_oob_peek(oob);
    if (t < 0) {
      return NT_EXIT_FAIL;
    }
    if (t == NT_MSG_RESULT) {
      char buf[128];
      uint32_t len = 0;
      if (nt_oob_recv(oob, NT_MSG_RESULT, buf, sizeof(buf) - 1, &len, o->timeout_s) != 0) {
        return NT_EXIT_FAIL;
      }
      buf[len] = '\0';
      int pass = strcmp(buf, "pass") == 0;
      nt_out("nettest-result: role=%s mode=%s peer_verdict=%s accept_rc=%d", nt_role_name(o->role), mode, buf,
             (int)arc);
      return pass ? NT_EXIT_OK : NT_EXIT_FAIL;
    }
    nt_heartbeat();
    usleep(1000);
  }
  nt_err("%s: no verdict from the peer within %d s", mode, o->timeout_s + 10);
  return NT_EXIT_FAIL;
}

static void nt_send_verdict(struct nt_oob *oob, int pass) {
  const char *v = pass ? "pass" : "fail";
  nt_oob_send(oob, NT_MSG_RESULT, v, (uint32_t)strlen(v));
}

/* Client: connect with the server's handle after flipping its magic; connect must fail. */
int nt_mode_badhandle(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  if (o->role == NT_SERVER) {
    return nt_wait_verdict(o, n, oob, c, "badhandle");
  }
  uint8_t h[NCCL_NET_HANDLE_MAXSIZE];
  memcpy(h, c->peer_handle, sizeof(h));
  for (int i = 0; i < NT_MAGIC_BYTES; i++) {
    h[i] ^= 0xff;
  }
  double deadline = nt_now() + o->timeout_s;
  ncclResult_t rc = ncclSuccess;
  void *scomm = NULL;
  while (nt_now() < deadline) {
    rc = nt_net_connect(n, o->dev, h, &scomm);
    if (rc != ncclSuccess || scomm != NULL) {
      break;
    }
    usleep(1000);
  }
  int pass = rc != ncclSuccess;
  if (rc == ncclSuccess && scomm != NULL) {
    nt_err("badhandle: connect with a corrupt handle (magic flipped) returned a comm");
    nt_net_close_send(n, scomm);
  } else if (rc == ncclSuccess) {
    nt_err("badhandle: connect with a corrupt handle neither failed nor returned within %d s", o->timeout_s);
  }
  nt_out("nettest-badinput: case=handle rc=%d", (int)rc);
  nt_send_verdict(oob, pass);
  return pass ? NT_EXIT_OK : NT_EXIT_FAIL;
}

/* Raw TCP to the plugin's listen address from the handle: bytes [8,12) IPv4 in network order,
 * [12,14) port big-endian. An unspecified address means the server's side-channel address. */
static int nt_send_garbage(struct nt_opts *o, struct nt_oob *oob, const uint8_t *handle) {
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  memcpy(&sa.sin_addr.s_addr, handle + 8, 4);
  memcpy(&sa.sin_port, handle + 12, 2);
  if (sa.sin_addr.s_addr == htonl(INADDR_ANY) && inet_pton(AF_INET, oob->peer_ip, &sa.sin_addr) != 1) {
    nt_err("garbage-peer: handle has no IPv4 address and the side channel peer %s is not IPv4", oob->peer_ip);
    return -1;
  }
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
  int port = ntohs(sa.sin_port);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    nt_err("garbage-peer: socket: %s", strerror(errno));
    return -1;
  }
  int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
  if (r != 0 && errno == EINPROGRESS) {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int soerr = ETIMEDOUT;
    socklen_t sl = sizeof(soerr);
    if (poll(&p, 1, o->timeout_s * 1000) > 0) {
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
    }
    errno = soerr;
    r = soerr == 0 ? 0 : -1;
  }
  if (r != 0) {
    nt_err("garbage-peer: cannot connect to the plugin's listen address %s:%d: %s", ip, port, strerror(errno));
    close(fd);
    return -1;
  }
  uint8_t junk[NT_GARBAGE_BYTES];
  uint64_t st = o->seed ^ 0x6a09e667f3bcc908ULL;
  for (size_t i = 0; i < sizeof(junk); i += 8) {
    st += 0x9e3779b97f4a7c15ULL;
    uint64_t w = nt_mix64(st);
    memcpy(junk + i, &w, 8);
  }
  size_t off = 0;
  double deadline = nt_now() + o->timeout_s;
  while (off < sizeof(junk) && nt_now() < deadline) {
    ssize_t w = send(fd, junk + off, sizeof(junk) - off, MSG_NOSIGNAL);
    if (w > 0) {
      off += (size_t)w;
    } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      break; /* the plugin may close on the first bad bytes: that is a fine answer */
    } else {
      usleep(1000);
    }
  }
  close(fd);
  nt_out("nettest-garbage: sent=%zu to=%s:%d", off, ip, port);
  return 0;
}

/* Server: a TCP client that sends garbage instead of an MPIB hello is not a peer: the plugin
 * drops it (an INFO line), and accept neither fails nor returns a comm for it. The server
 * watches accept for NT_GARBAGE_WATCH_S seconds (the client sends at once; the plugin drops
 * it on the first bytes). */
#define NT_GARBAGE_WATCH_S 5
int nt_mode_garbage(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  if (o->role == NT_CLIENT) {
    if (nt_send_garbage(o, oob, c->peer_handle) != 0) {
      nt_oob_abort(oob, "client: could not deliver the garbage");
      return NT_EXIT_FAIL;
    }
    char buf[128];
    uint32_t len = 0;
    if (nt_oob_recv(oob, NT_MSG_RESULT, buf, sizeof(buf) - 1, &len, o->timeout_s + 10) != 0) {
      return NT_EXIT_FAIL;
    }
    buf[len] = '\0';
    nt_out("nettest-result: role=client mode=garbage-peer peer_verdict=%s", buf);
    return strcmp(buf, "pass") == 0 ? NT_EXIT_OK : NT_EXIT_FAIL;
  }
  double deadline = nt_now() + NT_GARBAGE_WATCH_S;
  ncclResult_t rc = ncclSuccess;
  void *rcomm = NULL;
  int peer_failed = 0;
  while (nt_now() < deadline) {
    rc = nt_net_accept(n, c->lcomm, &rcomm);
    if (rc != ncclSuccess || rcomm != NULL) {
      break;
    }
    if (nt_oob_peek(oob) < 0) {
      peer_failed = 1; /* the client could not deliver: nothing was tested */
      break;
    }
    nt_heartbeat();
    usleep(1000);
  }
  int pass = rc == ncclSuccess && rcomm == NULL && !peer_failed;
  if (rcomm != NULL) {
    nt_err("garbage-peer: accept returned a comm for a peer that sent %d bytes of garbage", NT_GARBAGE_BYTES);
    nt_net_close_recv(n, rcomm);
  } else if (rc != ncclSuccess) {
    nt_err("garbage-peer: accept failed (%d) because of a client that is not a peer", (int)rc);
  }
  nt_out("nettest-badinput: case=metadata rc=%d", (int)rc);
  nt_send_verdict(oob, pass);
  return pass ? NT_EXIT_OK : NT_EXIT_FAIL;
}
