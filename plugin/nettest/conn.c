/*
 * Connections: the connect/accept loops NCCL's proxy runs, the teardown in NCCL's order, and
 * MPIB's handle as a TCP peer sees it (for the modes that talk to a listener directly).
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nt_conn.h"
#include "nt_util.h"

/* One step of a connection-setup loop: whether to give up (deadline passed, or the peer gave
 * up on the side channel, checked every 64 spins), saying why. */
int nt_setup_give_up(const struct nt_opts *o, struct nt_oob *oob, const struct nt_conn *c, double deadline,
                     int *spins) {
  if (nt_now() > deadline) {
    nt_err("connection setup timed out after %d s: connect %s, accept %s", o->timeout_s, c->scomm ? "done" : "pending",
           c->rcomm ? "done" : "pending");
    return 1;
  }
  if (++*spins % 64 == 0 && (nt_heartbeat(), nt_oob_peek(oob) < 0)) {
    nt_err("peer gave up during connection setup");
    return 1;
  }
  return 0;
}

/* After giving up: what our own handshakes end with within half a second, as NCCL's next calls
 * would see it (the peer's give-up may race our connect's or accept's own failure). */
static void nt_setup_collect(const struct nt_opts *o, struct nt_net *n, struct nt_conn *c) {
  int cdone = c->scomm != NULL, adone = c->rcomm != NULL;
  for (double end = nt_now() + 0.5; (!cdone || !adone) && nt_now() < end; usleep(1000)) {
    ncclResult_t rc;
    if (!cdone && ((rc = nt_net_connect(n, o->dev, c->peer_handle, &c->scomm)) != ncclSuccess || c->scomm != NULL)) {
      cdone = 1;
      if (rc != ncclSuccess) nt_err("connect to the peer's handle failed: rc=%d", rc);
    }
    if (!adone && ((rc = nt_net_accept(n, c->lcomm, &c->rcomm)) != ncclSuccess || c->rcomm != NULL)) {
      adone = 1;
      if (rc != ncclSuccess) nt_err("accept failed: rc=%d", rc);
    }
  }
}

/* NCCL's proxy calls connect and accept repeatedly until both return a comm. */
int nt_establish(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  double start = nt_now(), deadline = start + o->timeout_s;
  int spins = 0;
  while (c->scomm == NULL || c->rcomm == NULL) {
    if (c->scomm == NULL) {
      ncclResult_t rc = nt_net_connect(n, o->dev, c->peer_handle, &c->scomm);
      if (rc != ncclSuccess) {
        nt_err("connect to the peer's handle failed: rc=%d", rc);
        return -1;
      }
    }
    if (c->rcomm == NULL) {
      ncclResult_t rc = nt_net_accept(n, c->lcomm, &c->rcomm);
      if (rc != ncclSuccess) {
        nt_err("accept failed: rc=%d", rc);
        return -1;
      }
    }
    if (c->scomm != NULL && c->rcomm != NULL) {
      break;
    }
    if (nt_setup_give_up(o, oob, c, deadline, &spins)) {
      nt_setup_collect(o, n, c);
      return -1;
    }
    /* many runs at once (--devs, --parallel): each polls less often, as one proxy thread would */
    usleep(o->ndevs > 1 ? 2000 : 50);
  }
  nt_err("connected in %.3f s (send comm and recv comm)", nt_now() - start);
  return 0;
}

int nt_establish_counting(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c,
                          int *accept_errors) {
  double start = nt_now(), deadline = start + o->timeout_s;
  int spins = 0;
  while (c->scomm == NULL || c->rcomm == NULL) {
    ncclResult_t rc;
    if (c->scomm == NULL && (rc = nt_net_connect(n, o->dev, c->peer_handle, &c->scomm)) != ncclSuccess) {
      nt_err("connect to the peer's handle failed: rc=%d", rc);
      return -1;
    }
    if (c->rcomm == NULL && (rc = nt_net_accept(n, c->lcomm, &c->rcomm)) != ncclSuccess) {
      if (accept_errors == NULL) {
        nt_err("accept failed: rc=%d", rc);
        return -1;
      }
      (*accept_errors)++;
      nt_err("accept returned an error (rc=%d, #%d): NCCL would abort here; calling accept again", rc, *accept_errors);
      if (*accept_errors > 64) {
        return -1;
      }
    }
    if (nt_setup_give_up(o, oob, c, deadline, &spins)) {
      return -1;
    }
    usleep(50);
  }
  nt_err("connected in %.3f s (send comm and recv comm)", nt_now() - start);
  return 0;
}

int nt_teardown(struct nt_net *n, struct nt_conn *c) {
  int bad = 0;
  ncclResult_t rc;
  if (c->scomm != NULL && (rc = nt_net_close_send(n, c->scomm)) != ncclSuccess) {
    nt_err("closeSend failed: rc=%d", rc);
    bad = 1;
  }
  if (c->rcomm != NULL && (rc = nt_net_close_recv(n, c->rcomm)) != ncclSuccess) {
    nt_err("closeRecv failed: rc=%d", rc);
    bad = 1;
  }
  if (c->lcomm != NULL && (rc = nt_net_close_listen(n, c->lcomm)) != ncclSuccess) {
    nt_err("closeListen failed: rc=%d", rc);
    bad = 1;
  }
  c->scomm = c->rcomm = c->lcomm = NULL;
  return bad ? -1 : 0;
}

/* ---- MPIB's handle ---- */

void nt_handle_addr(const uint8_t *handle, struct sockaddr_in *sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sin_family = AF_INET;
  memcpy(&sa->sin_addr.s_addr, handle + 8, 4);
  memcpy(&sa->sin_port, handle + 12, 2);
}

int nt_raw_connect(const struct sockaddr_in *sa) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  int err = 0;
  socklen_t len = sizeof(err);
  if (poll(&p, 1, 200) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    close(fd);
    return -1;
  }
  return fd;
}
