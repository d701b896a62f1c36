//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_shm_*.c shm_agent.c shm_decode.c

/* The control plane's own message on the control socket (mpib_comm_ctrl_send: a standby
 * rail's join and its answer) is sent whole or reported: one the queue cannot take whole is
 * dropped, and the caller must hear of it (its standby rail would otherwise never join, and
 * nothing said why). Over a socket pair: a message that fits arrives whole; one larger than
 * the queue returns -ENOBUFS, and nothing of it reaches the peer. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../mpib.h"
#include "../mpib_failover.h"
#include "../mpib_p2p.h"
#include "../mpib_profiler.h"

#include "check.h"

struct mpib_global mpib_g;
ncclProfilerCallback_t mpib_prof_fn;
uint64_t mpib_now_ns(void) { return 5000000000ull; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line, (void)fmt;
}
#include "p2p_stubs.h"

static struct ibv_context ctx;
static struct ibv_qp qp;
static struct ibv_cq cq;
static struct ibv_mr mr;
static struct mpib_comm *c;

int main(void) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  c = fake_recv_comm(&ctx, fake_post_taken, fake_poll_empty, &qp, &cq, &mr);
  close(c->ctrl_fd);
  c->ctrl_fd = sv[0];
  static uint8_t msg[sizeof c->ctrl_out + 1], got[sizeof msg];
  memset(msg, 'K', sizeof msg);
  int rc = mpib_comm_ctrl_send(c, msg, 2);
  ssize_t n = read(sv[1], got, sizeof got);
  CHECK(rc == 0 && n == 2 && got[0] == 'K', "a 2-byte message: rc %d, the peer read %zd bytes", rc, n);
  rc = mpib_comm_ctrl_send(c, msg, sizeof msg);
  n = read(sv[1], got, sizeof got);
  CHECK(rc == -ENOBUFS, "a message larger than the queue: rc %d, want -ENOBUFS (it was dropped)", rc);
  CHECK(n < 0 && errno == EAGAIN, "a dropped message reached the peer in part: %zd bytes", n);
  close(sv[1]);
  if (failures == 0) printf("ctrl_send: ok\n");
  return failures != 0;
}
