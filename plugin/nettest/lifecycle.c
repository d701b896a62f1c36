/*
 * Lifecycle modes: what NCCL does to a plugin besides moving data. Each prints one
 * `nettest-lifecycle: case=... key=value ...` line (docs/nettest.md).
 *
 * - finalize-during-handshake: the server starts 16 connects and calls finalize(ctx) before
 *   any completes, closing nothing (ncclCommAbort during init); the client then connects to
 *   the server's 16 listeners. The server must survive its own late handshakes.
 * - abort-mid-transfer: during a transfer one side (--abort-side) closes its comms with
 *   requests in flight and finalizes, then lingers; the peer, which does not watch the side
 *   channel meanwhile, must get an error from the plugin rather than hang.
 * - stray-client: before the real client connects, the server opens TCP connections of its
 *   own to its listen address (junk, idle, closed at once, 16 zero bytes); accept must still
 *   return the real peer's comm without an error, and a verify run follows.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nt_conn.h"
#include "nt_data.h"
#include "nt_modes.h"
#include "nt_util.h"
#include "nt_xfer.h"

#define NT_FHS_CONNS 16
#define NT_FHS_LINGER_S 3.0 /* server: stay alive after finalize for the late handshakes */
#define NT_FHS_CLIENT_S 4.0 /* client: connect/accept at least this long after the finalize */
#define NT_ABORT_LINGER_S 2.0
#define NT_ABORT_BEFORE 32 /* messages completed before the abort (unless --count) */
#define NT_STRAYS 4

/* finalize(ctx) came with v11. */
static int nt_need_finalize(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob) {
  if (n->abi >= 11) {
    return 0;
  }
  nt_err("--mode %s needs finalize(ctx): --abi 11 or later", nt_mode_name(o->mode));
  nt_oob_abort(oob, "%s: --mode %s needs --abi 11", nt_role_name(o->role), nt_mode_name(o->mode));
  return -1;
}

static void nt_linger(double seconds) {
  double end = nt_now() + seconds;
  while (nt_now() < end) {
    nt_heartbeat();
    usleep(20000);
  }
}

/* ---- finalize-during-handshake ---- */

struct nt_fhs {
  void *lcomm[NT_FHS_CONNS];
  uint8_t mine[NT_FHS_CONNS][NCCL_NET_HANDLE_MAXSIZE];
  uint8_t peer[NT_FHS_CONNS][NCCL_NET_HANDLE_MAXSIZE];
  void *scomm[NT_FHS_CONNS], *rcomm[NT_FHS_CONNS];
};

/* 16 listeners (the first is main's) and the handles of both sides' 16. */
static int nt_fhs_listen(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c, struct nt_fhs *f) {
  f->lcomm[0] = c->lcomm;
  memcpy(f->mine[0], c->local_handle, NCCL_NET_HANDLE_MAXSIZE);
  for (int i = 1; i < NT_FHS_CONNS; i++) {
    ncclResult_t rc = nt_net_listen(n, o->dev, f->mine[i], &f->lcomm[i]);
    if (rc != ncclSuccess || f->lcomm[i] == NULL) {
      nt_err("listen #%d failed: rc=%d", i, rc);
      nt_oob_abort(oob, "%s: listen #%d failed", nt_role_name(o->role), i);
      return -1;
    }
  }
  uint32_t len = 0;
  if (nt_oob_send(oob, NT_MSG_HANDLE, f->mine, sizeof(f->mine)) != 0 ||
      nt_oob_recv(oob, NT_MSG_HANDLE, f->peer, sizeof(f->peer), &len, o->timeout_s) != 0) {
    return -1;
  }
  if (len != sizeof(f->peer)) {
    nt_err("peer sent %u bytes of handles, expected %zu", len, sizeof(f->peer));
    return -1;
  }
  return 0;
}

static int nt_fhs_server(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c, struct nt_fhs *f) {
  int connected = 0, errors = 0;
  for (int i = 0; i < NT_FHS_CONNS; i++) {
    ncclResult_t rc = nt_net_connect(n, o->dev, f->peer[i], &f->scomm[i]);
    if (rc != ncclSuccess) {
      errors++;
    } else if (f->scomm[i] != NULL) {
      connected++;
    }
  }
  int inflight = NT_FHS_CONNS - connected - errors;
  nt_phase("finalize-during-handshake");
  double t0 = nt_now();
  ncclResult_t frc = nt_net_finalize(n);
  double fin_ms = (nt_now() - t0) * 1000;
  c->lcomm = NULL; /* like ncclCommAbort: nothing is closed, and nothing may be used any more */
  nt_err("finalize(ctx) returned rc=%d in %.1f ms with %d of %d connects in flight; lingering %.0f s", frc, fin_ms,
         inflight, NT_FHS_CONNS, NT_FHS_LINGER_S);
  int sync_ok = nt_oob_sync(oob, "finalized", o->timeout_s) == 0;
  nt_linger(NT_FHS_LINGER_S);
  nt_out("nettest-lifecycle: case=finalize-during-handshake role=server conns=%d inflight=%d connect_errors=%d "
         "finalize_rc=%d finalize_ms=%.1f linger_s=%.0f",
         NT_FHS_CONNS, inflight, errors, frc, fin_ms, NT_FHS_LINGER_S);
  return sync_ok ? NT_EXIT_OK : NT_EXIT_FAIL;
}

/* One round of connect and accept calls on every unfinished connection. */
static void nt_fhs_poll(struct nt_opts *o, struct nt_net *n, struct nt_fhs *f, int *cdone, int *adone, int cnt[4]) {
  for (int i = 0; i < NT_FHS_CONNS; i++) {
    ncclResult_t rc;
    if (!cdone[i]) {
      rc = nt_net_connect(n, o->dev, f->peer[i], &f->scomm[i]);
      if (rc != ncclSuccess || f->scomm[i] != NULL) {
        cdone[i] = 1;
        cnt[rc == ncclSuccess ? 0 : 1]++;
      }
    }
    if (!adone[i]) {
      rc = nt_net_accept(n, f->lcomm[i], &f->rcomm[i]);
      if (rc != ncclSuccess) {
        cnt[3]++; /* keep accepting: an error consumes one incoming connection */
      } else if (f->rcomm[i] != NULL) {
        adone[i] = 1;
        cnt[2]++;
      }
    }
  }
}

static int nt_fhs_client(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_fhs *f) {
  if (nt_oob_sync(oob, "finalized", o->timeout_s) != 0) {
    return NT_EXIT_FAIL;
  }
  int cdone[NT_FHS_CONNS] = {0}, adone[NT_FHS_CONNS] = {0};
  int cnt[4] = {0}; /* connect ok, connect errors, accept ok, accept errors */
  double t0 = nt_now();
  for (;;) {
    nt_fhs_poll(o, n, f, cdone, adone, cnt);
    double el = nt_now() - t0;
    if ((el >= NT_FHS_CLIENT_S && cnt[0] + cnt[1] == NT_FHS_CONNS) || el >= o->timeout_s) {
      break;
    }
    nt_heartbeat();
    usleep(1000);
  }
  int pending = NT_FHS_CONNS - cnt[0] - cnt[1];
  nt_out("nettest-lifecycle: case=finalize-during-handshake role=client connect_ok=%d connect_errors=%d "
         "connect_pending=%d accept_ok=%d accept_errors=%d seconds=%.3f",
         cnt[0], cnt[1], pending, cnt[2], cnt[3], nt_now() - t0);
  for (int i = 0; i < NT_FHS_CONNS; i++) {
    if (f->scomm[i] != NULL) {
      nt_net_close_send(n, f->scomm[i]);
    }
    if (f->rcomm[i] != NULL) {
      nt_net_close_recv(n, f->rcomm[i]);
    }
    if (i > 0) {
      nt_net_close_listen(n, f->lcomm[i]); /* #0 is main's, closed in its teardown */
    }
  }
  return NT_EXIT_OK;
}

int nt_mode_finalize_hs(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  if (nt_need_finalize(o, n, oob) != 0) {
    return NT_EXIT_USAGE;
  }
  static struct nt_fhs f;
  memset(&f, 0, sizeof(f));
  if (nt_fhs_listen(o, n, oob, c, &f) != 0) {
    return NT_EXIT_FAIL;
  }
  return o->role == NT_SERVER ? nt_fhs_server(o, n, oob, c, &f) : nt_fhs_client(o, n, oob, &f);
}

/* ---- abort-mid-transfer ---- */

static double nt_abort_exit_mono;
static void nt_abort_atexit(void) {
  printf("nettest-lifecycle-exit: mono=%.6f since_error_ms=%.0f\n", nt_now(), (nt_now() - nt_abort_exit_mono) * 1000);
  fflush(stdout);
}

struct nt_abort {
  struct nt_xfer x;
  struct nt_sched s;
  struct nt_stats st;
  size_t len;
};

/* Post up to a window of groups past the completed ones and do not wait for them. */
static int nt_abort_post(struct nt_abort *a, int sender) {
  int posted = 0;
  for (int w = 0; w < a->x.window; w++) {
    struct nt_group g;
    if (!nt_sched_next(&a->s, &g)) {
      break;
    }
    for (int j = 0; j < g.n; j++) {
      uint8_t *b = a->x.region + ((size_t)w * (size_t)a->x.k + (size_t)j) * a->x.stride;
      double until = nt_now() + 1.0;
      void *req = NULL;
      while (req == NULL && nt_now() < until) {
        ncclResult_t rc;
        if (sender) {
          nt_pattern_fill_sampled(b, g.sizes[j], a->x.seed, g.first_msg + (uint64_t)j, g.tags[j]);
          rc = nt_net_isend(a->x.net, a->x.comm, b, g.sizes[j], g.tags[j], a->x.mh, &req);
        } else {
          void *data[NT_MAX_MULTI], *mhs[NT_MAX_MULTI];
          size_t sizes[NT_MAX_MULTI];
          for (int k = 0; k < g.n; k++) {
            data[k] = a->x.region + ((size_t)w * (size_t)a->x.k + (size_t)k) * a->x.stride;
            mhs[k] = a->x.mh;
            sizes[k] = a->x.slot_size;
          }
          rc = nt_net_irecv(a->x.net, a->x.comm, g.n, data, sizes, g.tags, mhs, &req);
        }
        if (rc != ncclSuccess) {
          nt_err("abort-mid-transfer: %s before the abort failed: rc=%d", sender ? "isend" : "irecv", rc);
          return posted;
        }
      }
      if (req == NULL) {
        return posted;
      }
      posted++;
      if (!sender) {
        break; /* one irecv covers the group */
      }
    }
  }
  return posted;
}

/* The aborting side: N messages, a window posted, then close everything and finalize. */
static int nt_abort_side(struct nt_opts *o, struct nt_net *n, struct nt_conn *c, struct nt_abort *a, int sender) {
  a->s.msgs_left = o->count_set && o->count > 0 ? o->count : NT_ABORT_BEFORE;
  if (sender) {
    nt_xfer_send(&a->x, &a->s, &a->st);
  } else {
    nt_xfer_recv(&a->x, &a->s, &a->st);
  }
  if (a->st.fatal) {
    nt_err("abort-mid-transfer: the transfer before the abort failed: %s", a->st.first_err);
    return NT_EXIT_FAIL;
  }
  a->s.msgs_left = UINT64_MAX;
  int inflight = nt_abort_post(a, sender);
  double t0 = nt_now();
  ncclResult_t rc[5]; /* in NCCL's order: deregMr, closeSend, closeRecv, closeListen, finalize */
  rc[0] = nt_net_deregmr(n, a->x.comm, a->x.mh);
  rc[1] = nt_net_close_send(n, c->scomm);
  rc[2] = nt_net_close_recv(n, c->rcomm);
  rc[3] = nt_net_close_listen(n, c->lcomm);
  rc[4] = nt_net_finalize(n);
  double abort_ms = (nt_now() - t0) * 1000;
  c->scomm = c->rcomm = c->lcomm = NULL;
  nt_free_region(a->x.region, a->len);
  nt_out("nettest-lifecycle: case=abort-mid-transfer role=aborter side=%s messages_before=%" PRIu64
         " inflight=%d abort_mono=%.6f abort_ms=%.1f rc=%d,%d,%d,%d,%d linger_s=%.0f",
         sender ? "sender" : "receiver", a->st.msgs, inflight, t0, abort_ms, rc[0], rc[1], rc[2], rc[3], rc[4],
         NT_ABORT_LINGER_S);
  nt_linger(NT_ABORT_LINGER_S); /* the side channel stays open and silent */
  return NT_EXIT_OK;
}

/* The peer: an endless transfer that does not watch the side channel; only the plugin can end it. */
static int nt_abort_peer(struct nt_net *n, struct nt_abort *a, int sender) {
  a->x.oob = NULL;
  if (sender) {
    nt_xfer_send(&a->x, &a->s, &a->st);
  } else {
    nt_xfer_recv(&a->x, &a->s, &a->st);
  }
  nt_abort_exit_mono = nt_now();
  atexit(nt_abort_atexit);
  for (char *p = a->st.first_err; *p; p++) {
    *p = *p == ' ' ? '_' : *p; /* one token */
  }
  nt_out("nettest-lifecycle: case=abort-mid-transfer role=peer side=%s messages=%" PRIu64 " error_mono=%.6f error=%s",
         sender ? "sender" : "receiver", a->st.msgs, nt_abort_exit_mono, a->st.first_err[0] ? a->st.first_err : "none");
  nt_phase("abort-peer-teardown");
  nt_net_deregmr(n, a->x.comm, a->x.mh);
  nt_free_region(a->x.region, a->len);
  return NT_EXIT_FAIL; /* the transfer cannot have finished */
}

int nt_mode_abort(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  if (nt_need_finalize(o, n, oob) != 0) {
    return NT_EXIT_USAGE;
  }
  if (nt_establish_counting(o, n, oob, c, NULL) != 0) {
    nt_oob_abort(oob, "%s: connection setup failed", nt_role_name(o->role));
    return NT_EXIT_FAIL;
  }
  if (nt_oob_sync(oob, "connected", o->timeout_s) != 0) {
    return NT_EXIT_FAIL;
  }
  int sender = o->role == NT_CLIENT, aborter = o->abort_sender ? sender : !sender;
  static struct nt_abort a;
  memset(&a, 0, sizeof(a));
  a.x = (struct nt_xfer){.net = n,
                         .oob = oob,
                         .k = o->multi,
                         .vlevel = NT_V_SAMPLED,
                         .seed = o->seed,
                         .timeout_s = o->timeout_s,
                         .window = o->window};
  a.x.slot_size = o->max_size ? o->max_size : 64;
  a.x.stride = (a.x.slot_size + 4095) / 4096 * 4096;
  a.x.comm = sender ? c->scomm : c->rcomm;
  a.len = a.x.stride * (size_t)a.x.k * (size_t)a.x.window;
  a.x.region = nt_alloc_region(a.len);
  if (a.x.region == NULL || nt_net_regmr(n, a.x.comm, a.x.region, a.len, &a.x.mh) != ncclSuccess) {
    nt_err("abort-mid-transfer: cannot allocate or register %zu bytes", a.len);
    nt_oob_abort(oob, "%s: buffer registration failed", nt_role_name(o->role));
    return NT_EXIT_FAIL;
  }
  nt_sched_init(&a.s, o->seed, 0, o->multi);
  a.s.random = 1;
  a.s.max_size = o->max_size;
  if (nt_oob_sync(oob, "abort-start", o->timeout_s) != 0) {
    return NT_EXIT_FAIL;
  }
  return aborter ? nt_abort_side(o, n, c, &a, sender) : nt_abort_peer(n, &a, sender);
}

/* ---- stray-client ---- */

static int nt_stray_connect(const struct sockaddr_in *sa) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return -1;
  }
  if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) != 0) {
    nt_err("stray-client: connect to the plugin's listen address: %s", strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

/* Four TCP clients of the server's own listen address; fds[] keeps those left open. */
static int nt_strays_open(struct nt_opts *o, struct nt_oob *oob, const uint8_t *handle, int fds[NT_STRAYS]) {
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  memcpy(&sa.sin_addr.s_addr, handle + 8, 4);
  memcpy(&sa.sin_port, handle + 12, 2);
  if (sa.sin_addr.s_addr == htonl(INADDR_ANY)) {
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  uint8_t junk[512], zeros[NT_MPIB_HELLO_SIZE] = {0};
  uint64_t st = o->seed ^ 0xbb67ae8584caa73bULL;
  for (size_t i = 0; i < sizeof(junk); i += 8) {
    st += 0x9e3779b97f4a7c15ULL;
    uint64_t w = nt_mix64(st);
    memcpy(junk + i, &w, 8);
  }
  int ok = 0;
  for (int i = 0; i < NT_STRAYS; i++) {
    fds[i] = nt_stray_connect(&sa);
    if (fds[i] < 0) {
      continue;
    }
    ok++;
    if (i == 0) {
      send(fds[i], junk, sizeof(junk), MSG_NOSIGNAL); /* junk, then left open */
    } else if (i == 2) {
      close(fds[i]); /* connects and closes at once */
      fds[i] = -1;
    } else if (i == 3) {
      send(fds[i], zeros, sizeof(zeros), MSG_NOSIGNAL); /* a hello-sized message of zeros */
    } /* i == 1: connected, silent */
  }
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof(ip));
  nt_err("stray-client: %d of %d stray connections to %s:%d (junk, idle, closed, zeros)", ok, NT_STRAYS, ip,
         ntohs(sa.sin_port));
  (void)oob;
  return ok;
}

int nt_mode_stray(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  int fds[NT_STRAYS] = {-1, -1, -1, -1}, strays = 0, accept_errors = 0;
  if (o->role == NT_SERVER) {
    strays = nt_strays_open(o, oob, c->local_handle, fds);
    nt_linger(0.5); /* let the plugin read (and refuse) the strays first */
  }
  int ret = NT_EXIT_FAIL;
  if (nt_oob_sync(oob, "strays-open", o->timeout_s) != 0) {
    goto out;
  }
  int est = nt_establish_counting(o, n, oob, c, o->role == NT_SERVER ? &accept_errors : NULL);
  int accept_ok = est == 0 && accept_errors == 0;
  if (o->role == NT_SERVER) {
    nt_out("nettest-lifecycle: case=stray-client role=server strays=%d accept_ok=%s accept_errors=%d connected=%s",
           strays, accept_ok ? "true" : "false", accept_errors, est == 0 ? "true" : "false");
  }
  if (est != 0) {
    nt_oob_abort(oob, "%s: connection setup failed", nt_role_name(o->role));
    goto out;
  }
  if (nt_oob_sync(oob, "connected", o->timeout_s) != 0) {
    goto out;
  }
  ret = nt_verify_follow(o, n, oob, c, 200);
  if (ret == NT_EXIT_OK && !accept_ok) {
    ret = NT_EXIT_FAIL;
  }
out:
  for (int i = 0; i < NT_STRAYS; i++) {
    if (fds[i] >= 0) {
      close(fds[i]);
    }
  }
  return ret;
}
