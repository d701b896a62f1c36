/*
 * Hostile-input modes (docs/security.md). They know MPIB's handle layout (the listener's IPv4
 * address at bytes 8..11, its port at 12..13, its nonce at 16..23; connect()'s own state at
 * 24..39; the listener's MPIB_SUP_RELAY at byte 41, bit 0) and its hello (NT_MPIB_HELLO_SIZE),
 * as the stray-client mode does.
 * - listener-flood: the server lowers its RLIMIT_NOFILE to a few descriptors above what it has
 *   open, the client floods the server's listen port with TCP clients (idle, junk, closed at
 *   once, zeros), and connects for real in the middle of the flood; then it presents the same
 *   handle's hello again, which the listener must refuse. The server samples its descriptors
 *   all along and checks they come back once the flood and the connection are gone.
 * - forged-handle: the client's honest connect runs to its end; before collecting its comm,
 *   the client calls connect with handles of another listener (its own) that carry the honest
 *   handle's attempt bytes, exactly and varied: none may return a comm. Then the honest
 *   connect collects its comm and a verify run follows.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nt_conn.h"
#include "nt_data.h"
#include "nt_modes.h"
#include "nt_util.h"

#define NT_FLOOD_HEADROOM 24 /* server: descriptors allowed above those open at the start */
#define NT_FLOOD_KEEP 1500   /* client: flood connections held open at once */
#define NT_FLOOD_BEFORE 2000 /* client: flood connections opened before the real connect */
/* ... or this long, whichever comes first. The count is what the case is about (the test wants
 * thousands of clients); the time only stops a flood that cannot connect at all. A lab run has
 * opened 1893 clients in about 10 s (8 s before the connect, 1.9 s during it), about 190 a
 * second, and a loaded VM opens a half or a third of that, so 60 s; the server's connect
 * deadline (--timeout-s, 90 s in runPair) starts at the same sync, which leaves 30 s for the
 * connect under the flood (1.9 s in that run). */
#define NT_FLOOD_BEFORE_S 60.0
#define NT_FORGED_GUESSES 64

static int nt_count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1; /* the directory's own descriptor */
}

/* ---- listener-flood: the server's descriptor watch ---- */

struct nt_fdwatch {
  pthread_t thread;
  volatile int stop;
  int peak;
};

static void *nt_fdwatch_run(void *arg) {
  struct nt_fdwatch *w = arg;
  while (!w->stop) {
    int n = nt_count_fds();
    if (n > w->peak) w->peak = n;
    usleep(2000);
  }
  return NULL;
}

/* ---- listener-flood: the client's flood ---- */

struct nt_flood {
  pthread_t thread;
  struct sockaddr_in sa;
  volatile int stop;
  volatile long clients; /* TCP connections that completed */
  int fds[NT_FLOOD_KEEP];
  int nfds, next;
};

static void *nt_flood_run(void *arg) {
  struct nt_flood *f = arg;
  uint8_t junk[64], zeros[NT_MPIB_HELLO_SIZE] = {0};
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (uint8_t)(i * 37 + 11);
  while (!f->stop) {
    int fd = nt_raw_connect(&f->sa);
    if (fd < 0) continue;
    long i = __atomic_add_fetch(&f->clients, 1, __ATOMIC_RELAXED);
    switch (i % 4) {
    case 1: (void)send(fd, junk, sizeof(junk), MSG_NOSIGNAL); break;
    case 2: close(fd); continue;
    case 3: (void)send(fd, zeros, sizeof(zeros), MSG_NOSIGNAL); break;
    default: break; /* idle */
    }
    if (f->nfds == NT_FLOOD_KEEP) close(f->fds[f->next]); /* the oldest goes */
    else f->nfds++;
    f->fds[f->next] = fd;
    f->next = (f->next + 1) % NT_FLOOD_KEEP;
  }
  for (int i = 0; i < f->nfds; i++) close(f->fds[i]);
  return NULL;
}

static void nt_raise_own_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

/* The listener's handle presented again with a valid hello (a replayed handle): 1 when the
 * plugin refused it within 3 s, as it must: its refusal ("MPIR", its version, reason 1: used
 * already, docs/security.md) and the close, or a close without a reply. Never metadata. */
static int nt_replay_hello(const uint8_t *handle) {
  struct sockaddr_in sa;
  nt_handle_addr(handle, &sa);
  int fd = nt_raw_connect(&sa);
  if (fd < 0) return 0;
  uint8_t hello[NT_MPIB_HELLO_SIZE] = {'M', 'P', 'I', 'L'};
  memcpy(hello + 4, handle + 4, 2); /* the handle's version: the hello's */
  memcpy(hello + 8, handle + 16, 8);
  hello[16] = handle[41] & 1; /* the listener's MPIB_SUP_RELAY: a peer's that matches; no SUP pair */
  (void)send(fd, hello, sizeof(hello), MSG_NOSIGNAL);
  struct pollfd p = {.fd = fd, .events = POLLIN};
  uint8_t b[64];
  int ready = poll(&p, 1, 3000) == 1;
  ssize_t got = ready ? recv(fd, b, sizeof(b), 0) : -1;
  int refused = ready && (got <= 0 || (got >= 8 && memcmp(b, "MPIR", 4) == 0 && b[6] == 1));
  close(fd);
  return refused;
}

static int nt_flood_client(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  nt_raise_own_nofile();
  struct nt_flood *f = calloc(1, sizeof(*f));
  if (f == NULL) return -1;
  nt_handle_addr(c->peer_handle, &f->sa);
  if (nt_oob_sync(oob, "flood-ready", o->timeout_s) != 0 || pthread_create(&f->thread, NULL, nt_flood_run, f) != 0) {
    free(f);
    return -1;
  }
  double t0 = nt_now();
  while (__atomic_load_n(&f->clients, __ATOMIC_RELAXED) < NT_FLOOD_BEFORE && nt_now() - t0 < NT_FLOOD_BEFORE_S)
    usleep(10000);
  long before = __atomic_load_n(&f->clients, __ATOMIC_RELAXED);
  double start = nt_now();
  int est = nt_establish_counting(o, n, oob, c, NULL);
  double connect_ms = (nt_now() - start) * 1000;
  f->stop = 1;
  pthread_join(f->thread, NULL);
  int refused = est == 0 && nt_replay_hello(c->peer_handle);
  nt_out("nettest-hostile: case=listener-flood role=client clients=%ld clients_before_connect=%ld connected=%s "
         "connect_ms=%.0f replayed_hello_refused=%s",
         f->clients, before, est == 0 ? "true" : "false", connect_ms, refused ? "true" : "false");
  free(f);
  return est;
}

/* Server: lowers its descriptor limit, accepts (and connects) under the flood, then restores it. */
static int nt_flood_server(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c, int *fds_start,
                           int *fds_peak, long long *limit) {
  struct rlimit saved, low;
  getrlimit(RLIMIT_NOFILE, &saved);
  *fds_start = nt_count_fds();
  low = saved;
  low.rlim_cur = (rlim_t)(*fds_start + NT_FLOOD_HEADROOM);
  *limit = (long long)low.rlim_cur;
  struct nt_fdwatch w = {.peak = *fds_start};
  pthread_create(&w.thread, NULL, nt_fdwatch_run, &w);
  setrlimit(RLIMIT_NOFILE, &low);
  int est = -1;
  if (nt_oob_sync(oob, "flood-ready", o->timeout_s) == 0) est = nt_establish_counting(o, n, oob, c, NULL);
  setrlimit(RLIMIT_NOFILE, &saved);
  w.stop = 1;
  pthread_join(w.thread, NULL);
  *fds_peak = w.peak;
  return est;
}

/* Server: closes the connection and waits (5 s at most) for its descriptors to come back to
 * what it had before the flood. */
static int nt_fds_settle(struct nt_net *n, struct nt_conn *c, int fds_start) {
  if (c->scomm) nt_net_close_send(n, c->scomm);
  if (c->rcomm) nt_net_close_recv(n, c->rcomm);
  c->scomm = c->rcomm = NULL;
  double end = nt_now() + 5;
  int now = nt_count_fds();
  while (now > fds_start && nt_now() < end) {
    usleep(50000);
    now = nt_count_fds();
  }
  return now;
}

int nt_mode_flood(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  int fds_start = 0, fds_peak = 0, est;
  long long limit = 0;
  if (o->role == NT_SERVER) est = nt_flood_server(o, n, oob, c, &fds_start, &fds_peak, &limit);
  else est = nt_flood_client(o, n, oob, c);
  if (est != 0) {
    nt_oob_abort(oob, "%s: connection setup under the flood failed", nt_role_name(o->role));
    return NT_EXIT_FAIL;
  }
  if (nt_oob_sync(oob, "connected", o->timeout_s + 10) != 0) return NT_EXIT_FAIL;
  int ret = nt_verify_follow(o, n, oob, c, 50); /* the connection made under the flood carries a verified transfer */
  if (o->role == NT_SERVER) {
    int fds_end = nt_fds_settle(n, c, fds_start);
    nt_out("nettest-hostile: case=listener-flood role=server fd_limit=%lld fds_start=%d fds_peak=%d fds_end=%d "
           "connected=true",
           limit, fds_start, fds_peak, fds_end);
  }
  return ret;
}

/* ---- forged-handle ---- */

/* Guess k: the honest handle's connect state (bytes 24..39), exact for k = 0, else its attempt
 * id and pending generation moved by k and its entry index by k % 3, never all zero (a fresh
 * handle would start a real connect). */
static void nt_forge(uint8_t *forged, const uint8_t *forger, const uint8_t *honest, int k) {
  memcpy(forged, forger, NCCL_NET_HANDLE_MAXSIZE);
  memcpy(forged + 24, honest + 24, 16);
  uint64_t id;
  uint32_t idx, gen;
  memcpy(&id, forged + 24, 8);
  memcpy(&idx, forged + 32, 4);
  memcpy(&gen, forged + 36, 4);
  id += (uint64_t)(k / 2) * ((k & 1) ? 1 : (uint64_t)-1);
  gen += (uint32_t)k;
  idx += (uint32_t)(k % 3);
  if (id == 0 && idx == 0) id = 1;
  memcpy(forged + 24, &id, 8);
  memcpy(forged + 32, &idx, 4);
  memcpy(forged + 36, &gen, 4);
}

/* Polls its own accept for 1.5 s so the server's connect to it completes too, and so that the
 * honest handshake ends: its comm then waits in the pending entry, not yet collected. */
static void nt_let_handshake_end(struct nt_net *n, struct nt_conn *c) {
  double end = nt_now() + 1.5;
  while (nt_now() < end) {
    if (c->rcomm == NULL) nt_net_accept(n, c->lcomm, &c->rcomm);
    nt_heartbeat();
    usleep(1000);
  }
}

static int nt_forged_client(struct nt_opts *o, struct nt_net *n, struct nt_conn *c) {
  uint8_t forger[NCCL_NET_HANDLE_MAXSIZE], forged[NCCL_NET_HANDLE_MAXSIZE];
  void *forger_lcomm = NULL;
  if (nt_net_listen(n, o->dev, forger, &forger_lcomm) != ncclSuccess || forger_lcomm == NULL) {
    nt_err("forged-handle: listen for the forger's handle failed");
    return -1;
  }
  if (nt_net_connect(n, o->dev, c->peer_handle, &c->scomm) != ncclSuccess) {
    nt_err("forged-handle: the honest connect failed at once");
    return -1;
  }
  nt_let_handshake_end(n, c);
  int collected = 0, refused = 0;
  for (int k = 0; k < NT_FORGED_GUESSES && c->scomm == NULL; k++) {
    void *got = NULL;
    nt_forge(forged, forger, c->peer_handle, k);
    ncclResult_t rc = nt_net_connect(n, o->dev, forged, &got);
    refused += rc != ncclSuccess;
    if (got != NULL) {
      collected++;
      nt_err("forged-handle: guess %d collected a comm: another connection's", k);
      nt_net_close_send(n, got);
    }
  }
  nt_net_close_listen(n, forger_lcomm);
  nt_out("nettest-hostile: case=forged-handle role=client guessed=%d collected_other=%d refused=%d", NT_FORGED_GUESSES,
         collected, refused);
  return collected == 0 ? 0 : -1;
}

int nt_mode_forged(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  int forged_ok = o->role == NT_CLIENT ? nt_forged_client(o, n, c) : 0;
  int est = nt_establish_counting(o, n, oob, c, NULL);
  if (o->role == NT_CLIENT)
    nt_out("nettest-hostile: case=forged-handle role=client honest_connected=%s", est == 0 ? "true" : "false");
  if (est != 0) {
    nt_oob_abort(oob, "%s: connection setup failed", nt_role_name(o->role));
    return NT_EXIT_FAIL;
  }
  if (nt_oob_sync(oob, "connected", o->timeout_s) != 0) return NT_EXIT_FAIL;
  int ret = nt_verify_follow(o, n, oob, c, 50);
  return forged_ok == 0 ? ret : NT_EXIT_FAIL;
}
