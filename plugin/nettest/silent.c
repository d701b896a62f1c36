/*
 * Silent-client modes (docs/security.md): a party on the network holds TCP clients of the
 * server's listeners that never send a byte, while the client process connects for real.
 * - silent-hold: the server listens 8 times; the client's attacker thread holds 32 silent
 *   clients on each listener and reopens each one the server drops, for --seconds (default
 *   15), while the client connects for real to each listener in turn, spread over the hold.
 *   Every real connection must succeed.
 * - evict-race: --rounds times, the server listens once more; the client opens a burst of
 *   silent clients on that listener (more than any of the plugin's limits) while it connects
 *   for real, the real hello racing the burst. Every real connection must succeed.
 * The attacker shares the real peer's address (the client node's): the plugin's per-source
 * bound then applies to both, the hardest case for the real peer.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nt_conn.h"
#include "nt_modes.h"
#include "nt_util.h"

#define NT_SH_LISTENERS 8
#define NT_SH_PER 32         /* silent clients held on each listener */
#define NT_SH_DEFAULT_S 15.0 /* the hold when --seconds is not given */
#define NT_ER_BURST 320      /* evict-race: silent clients per burst (above every limit) */
#define NT_ER_ROUND_S 20.0   /* evict-race: one round's connect/accept limit */

/* ---- the attacker: silent clients held on a set of listeners, reopened when dropped ---- */

struct nt_silent {
  pthread_t thread;
  struct sockaddr_in sa[NT_SH_LISTENERS];
  int nl, per; /* listeners, clients per listener */
  int burst;   /* > 0: open this many on sa[0] once, as fast as possible, and hold them */
  volatile int stop;
  volatile long opened, reopened, held;
  int *fds; /* nl * per (or burst) */
};

static void *nt_silent_run(void *arg) {
  struct nt_silent *s = arg;
  int n = s->burst > 0 ? s->burst : s->nl * s->per;
  struct pollfd *p = calloc((size_t)n, sizeof(*p));
  if (p == NULL) return NULL;
  for (int i = 0; i < n; i++) s->fds[i] = -1;
  while (!s->stop) {
    long held = 0;
    for (int i = 0; i < n && !s->stop; i++) {
      if (s->fds[i] >= 0) {
        held++;
        continue;
      }
      if (s->burst > 0 && s->opened >= s->burst) continue; /* a burst is not reopened */
      int fd = nt_raw_connect(&s->sa[s->burst > 0 ? 0 : i / s->per]);
      if (fd < 0) continue;
      s->fds[i] = fd;
      held++;
      if (__atomic_add_fetch(&s->opened, 1, __ATOMIC_RELAXED) > n)
        __atomic_add_fetch(&s->reopened, 1, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&s->held, held, __ATOMIC_RELAXED);
    /* A client the server dropped reads end-of-file (or a reset): close it, reopen it next turn. */
    for (int i = 0; i < n; i++) p[i] = (struct pollfd){.fd = s->fds[i], .events = POLLIN};
    if (poll(p, (nfds_t)n, 50) <= 0) continue;
    for (int i = 0; i < n; i++) {
      if (s->fds[i] >= 0 && p[i].revents != 0) {
        close(s->fds[i]);
        s->fds[i] = -1;
      }
    }
  }
  for (int i = 0; i < n; i++)
    if (s->fds[i] >= 0) close(s->fds[i]);
  free(p);
  return NULL;
}

static struct nt_silent *nt_silent_start(const uint8_t handles[][NCCL_NET_HANDLE_MAXSIZE], int nl, int per, int burst) {
  struct nt_silent *s = calloc(1, sizeof(*s));
  if (s == NULL) return NULL;
  s->nl = nl;
  s->per = per;
  s->burst = burst;
  s->fds = calloc((size_t)(burst > 0 ? burst : nl * per), sizeof(int));
  for (int i = 0; i < nl; i++) nt_handle_addr(handles[i], &s->sa[i]);
  if (s->fds == NULL || pthread_create(&s->thread, NULL, nt_silent_run, s) != 0) {
    free(s->fds);
    free(s);
    return NULL;
  }
  return s;
}

static void nt_silent_stop(struct nt_silent *s) {
  s->stop = 1;
  pthread_join(s->thread, NULL);
  free(s->fds);
}

/* Connects to handle until a comm comes back: 0 and the milliseconds it took, or -1. */
static int nt_connect_one(struct nt_opts *o, struct nt_net *n, uint8_t *handle, void **scomm, double limit_s,
                          double *ms) {
  double start = nt_now();
  *scomm = NULL;
  while (*scomm == NULL) {
    ncclResult_t rc = nt_net_connect(n, o->dev, handle, scomm);
    if (rc != ncclSuccess) {
      nt_err("real connect failed: rc=%d after %.0f ms", rc, (nt_now() - start) * 1000);
      *ms = (nt_now() - start) * 1000;
      return -1;
    }
    if (nt_now() - start > limit_s) {
      nt_err("real connect still pending after %.0f s", limit_s);
      *ms = (nt_now() - start) * 1000;
      return -1;
    }
    nt_heartbeat();
    usleep(200);
  }
  *ms = (nt_now() - start) * 1000;
  return 0;
}

/* ---- silent-hold ---- */

static int nt_sh_server(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c, double hold_s) {
  void *lcomm[NT_SH_LISTENERS] = {c->lcomm}, *rcomm[NT_SH_LISTENERS] = {0};
  uint8_t mine[NT_SH_LISTENERS][NCCL_NET_HANDLE_MAXSIZE];
  memcpy(mine[0], c->local_handle, NCCL_NET_HANDLE_MAXSIZE);
  for (int i = 1; i < NT_SH_LISTENERS; i++) {
    if (nt_net_listen(n, o->dev, mine[i], &lcomm[i]) != ncclSuccess || lcomm[i] == NULL) {
      nt_oob_abort(oob, "server: listen #%d failed", i);
      return NT_EXIT_FAIL;
    }
  }
  if (nt_oob_send(oob, NT_MSG_HANDLE, mine, sizeof(mine)) != 0) return NT_EXIT_FAIL;
  int accepted = 0, errors = 0;
  double end = nt_now() + hold_s + o->timeout_s;
  while (accepted < NT_SH_LISTENERS && nt_now() < end && nt_oob_peek(oob) >= 0) {
    for (int i = 0; i < NT_SH_LISTENERS; i++) {
      if (rcomm[i] != NULL) continue;
      if (nt_net_accept(n, lcomm[i], &rcomm[i]) != ncclSuccess) errors++;
      else if (rcomm[i] != NULL) accepted++;
    }
    nt_heartbeat();
    usleep(200);
  }
  int ok = nt_oob_sync(oob, "silent-hold-done", (int)hold_s + o->timeout_s) == 0;
  nt_out("nettest-hostile: case=silent-hold role=server listeners=%d accepted=%d accept_errors=%d", NT_SH_LISTENERS,
         accepted, errors);
  for (int i = 0; i < NT_SH_LISTENERS; i++) {
    if (rcomm[i] != NULL) nt_net_close_recv(n, rcomm[i]);
    if (i > 0) nt_net_close_listen(n, lcomm[i]);
  }
  return ok && accepted == NT_SH_LISTENERS && errors == 0 ? NT_EXIT_OK : NT_EXIT_FAIL;
}

static int nt_sh_client(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, double hold_s) {
  uint8_t peer[NT_SH_LISTENERS][NCCL_NET_HANDLE_MAXSIZE];
  void *scomm[NT_SH_LISTENERS] = {0};
  uint32_t len = 0;
  if (nt_oob_recv(oob, NT_MSG_HANDLE, peer, sizeof(peer), &len, o->timeout_s) != 0 || len != sizeof(peer)) {
    nt_err("silent-hold: expected %zu bytes of handles, got %u", sizeof(peer), len);
    return NT_EXIT_FAIL;
  }
  struct nt_silent *s = nt_silent_start((const uint8_t(*)[NCCL_NET_HANDLE_MAXSIZE])peer, NT_SH_LISTENERS, NT_SH_PER, 0);
  if (s == NULL) return NT_EXIT_FAIL;
  double t0 = nt_now();
  /* The hold is in place (every client opened once) before the first real connect. */
  while (__atomic_load_n(&s->opened, __ATOMIC_RELAXED) < NT_SH_LISTENERS * NT_SH_PER && nt_now() - t0 < 5)
    usleep(10000);
  double held_at_start = (double)__atomic_load_n(&s->held, __ATOMIC_RELAXED);
  int connected = 0;
  double ms_max = 0, ms[NT_SH_LISTENERS] = {0};
  for (int i = 0; i < NT_SH_LISTENERS; i++) {
    double at = t0 + hold_s * i / NT_SH_LISTENERS;
    while (nt_now() < at) {
      nt_heartbeat();
      usleep(20000);
    }
    if (nt_connect_one(o, n, peer[i], &scomm[i], o->timeout_s, &ms[i]) == 0) connected++;
    if (ms[i] > ms_max) ms_max = ms[i];
    nt_err("silent-hold: real connect %d of %d: %s in %.0f ms (%ld silent clients held)", i + 1, NT_SH_LISTENERS,
           scomm[i] ? "connected" : "FAILED", ms[i], __atomic_load_n(&s->held, __ATOMIC_RELAXED));
  }
  while (nt_now() < t0 + hold_s) {
    nt_heartbeat();
    usleep(20000);
  }
  double held_s = nt_now() - t0;
  long held = __atomic_load_n(&s->held, __ATOMIC_RELAXED);
  nt_silent_stop(s);
  nt_out(
      "nettest-hostile: case=silent-hold role=client listeners=%d silent_clients=%d held_at_start=%.0f held_at_end=%ld "
      "opened=%ld reopened=%ld hold_s=%.1f connected=%d connect_ms_max=%.0f",
      NT_SH_LISTENERS, NT_SH_LISTENERS * NT_SH_PER, held_at_start, held, s->opened, s->reopened, held_s, connected,
      ms_max);
  free(s);
  int ok = nt_oob_sync(oob, "silent-hold-done", o->timeout_s) == 0;
  for (int i = 0; i < NT_SH_LISTENERS; i++)
    if (scomm[i] != NULL) nt_net_close_send(n, scomm[i]);
  return ok && connected == NT_SH_LISTENERS ? NT_EXIT_OK : NT_EXIT_FAIL;
}

int nt_mode_silent_hold(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  double hold_s = o->seconds > 0 ? o->seconds : NT_SH_DEFAULT_S;
  return o->role == NT_SERVER ? nt_sh_server(o, n, oob, c, hold_s) : nt_sh_client(o, n, oob, hold_s);
}

/* ---- evict-race ---- */

static int nt_er_server_round(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, int *errors) {
  uint8_t h[NCCL_NET_HANDLE_MAXSIZE];
  void *lcomm = NULL, *rcomm = NULL;
  if (nt_net_listen(n, o->dev, h, &lcomm) != ncclSuccess || lcomm == NULL) return -1;
  if (nt_oob_send(oob, NT_MSG_HANDLE, h, sizeof(h)) != 0) return -1;
  double end = nt_now() + NT_ER_ROUND_S;
  while (rcomm == NULL && nt_now() < end && nt_oob_peek(oob) >= 0) {
    if (nt_net_accept(n, lcomm, &rcomm) != ncclSuccess) (*errors)++;
    nt_heartbeat();
    usleep(200);
  }
  int ok = nt_oob_sync(oob, "evict-race-round", o->timeout_s) == 0;
  if (rcomm != NULL) nt_net_close_recv(n, rcomm);
  nt_net_close_listen(n, lcomm);
  return ok ? (rcomm != NULL ? 1 : 0) : -1;
}

static int nt_er_client_round(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, int round, double *ms) {
  uint8_t h[1][NCCL_NET_HANDLE_MAXSIZE];
  uint32_t len = 0;
  void *scomm = NULL;
  if (nt_oob_recv(oob, NT_MSG_HANDLE, h[0], sizeof(h[0]), &len, o->timeout_s) != 0 || len != sizeof(h[0])) return -1;
  struct nt_silent *s = nt_silent_start((const uint8_t(*)[NCCL_NET_HANDLE_MAXSIZE])h, 1, 0, NT_ER_BURST);
  if (s == NULL) return -1;
  /* Vary where in the burst the real connect lands: at once, or after up to 7 ms of it. */
  usleep((useconds_t)(round % 8) * 1000);
  int got = nt_connect_one(o, n, h[0], &scomm, NT_ER_ROUND_S, ms) == 0;
  long opened = s->opened;
  nt_silent_stop(s);
  free(s);
  if (!got) nt_err("evict-race: round %d: the real connect failed (%ld silent clients opened)", round, opened);
  int ok = nt_oob_sync(oob, "evict-race-round", o->timeout_s) == 0;
  if (scomm != NULL) nt_net_close_send(n, scomm);
  return ok ? got : -1;
}

int nt_mode_evict_race(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  (void)c;
  int connected = 0, errors = 0, r;
  double ms_max = 0;
  for (r = 0; r < o->rounds; r++) {
    double ms = 0;
    int got = o->role == NT_SERVER ? nt_er_server_round(o, n, oob, &errors) : nt_er_client_round(o, n, oob, r, &ms);
    if (got < 0) break;
    connected += got;
    if (ms > ms_max) ms_max = ms;
  }
  if (o->role == NT_SERVER)
    nt_out("nettest-hostile: case=evict-race role=server rounds=%d accepted=%d accept_errors=%d", r, connected, errors);
  else
    nt_out("nettest-hostile: case=evict-race role=client rounds=%d burst=%d connected=%d connect_ms_max=%.0f", r,
           NT_ER_BURST, connected, ms_max);
  return r == o->rounds && connected == o->rounds ? NT_EXIT_OK : NT_EXIT_FAIL;
}
