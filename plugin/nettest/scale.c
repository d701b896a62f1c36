/*
 * Scale modes: many connections between two processes (docs/nettest.md, "Scale modes").
 *
 * - connect: each side listens N times (--comms N), the two sides swap the N handles over the
 *   side channel, then one thread calls connect on the N peer handles and accept on the N
 *   listen comms, interleaved, until every one has returned a comm (NCCL's proxy: one thread
 *   progressing every pending connection). It measures the wall time of the whole setup and
 *   the longest single connect() or accept() call. Then one verified message (--sizes, default
 *   4 KiB; --count messages) travels on every comm in both directions at once, and
 *   everything is closed in NCCL's order.
 * - resources: the same run (default 64 KiB messages), read as a resource figure: the
 *   process's VmRSS, open fds and threads before the first listen, once connected, after the
 *   data and after close. per_conn_kib = (RSS connected - RSS before) / N, where one
 *   connection is what a process holds for one peer in both directions: a listen comm, a
 *   send comm and a recv comm. Nothing may leak: the fds after close must come back to what
 *   they were before the first listen.
 *
 * Both modes print both lines (the mode only sets the default message size):
 *   nettest-connect: comms=N total_s=X longest_call_ms=X verified=B role=R ...
 *   nettest-resources: conns=N per_conn_kib=N verified=B role=R ...
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/resource.h>
#include <unistd.h>

#include "nt_modes.h"
#include "nt_util.h"

#define NT_SC_PAGE 4096
#define NT_SC_TAG 7
#define NT_SC_HANDLES_PER_MSG 128 /* 16 KiB of handles per side-channel message */
#define NT_SC_SETTLE_S 5.0        /* after close: wait this long for fds to come back */
#define NT_SC_REST_S 0.5          /* leak series: read the process this long after close, at rest */

/* ---- process resources ---- */

/* --rdma-res: QPs or MRs ("qp", "mr") on the RDMA devices this process sees, from the
 * kernel's per-device counts (`rdma res`): one driver per node, as in the lab, so they are
 * this process's. The per-object dumps (`rdma res show qp`) would name the creating process,
 * but they give no pid (so no comm) for a process of a lab container in exclusive netns mode:
 * matching this process's comm there would count nothing. -1 when the command
 * fails or prints no count. */
static int nt_rdma_res_count(const char *what) {
  char line[1024];
  FILE *f = popen("rdma res 2>/dev/null", "r");
  if (f == NULL) {
    return -1;
  }
  int n = 0, seen = 0;
  while (fgets(line, sizeof(line), f) != NULL) {
    char *save = NULL, *prev = NULL;
    for (char *tok = strtok_r(line, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save)) {
      if (prev != NULL && strcmp(prev, what) == 0) {
        n += atoi(tok);
        seen = 1;
      }
      prev = tok;
    }
  }
  return pclose(f) == 0 && seen ? n : -1;
}

/* This node's verbs objects: QPs, CQs and SRQs (rdma res; -1 each when it cannot be read). */
struct nt_objs {
  int qps, cqs, srqs;
};

static void nt_objs_read(struct nt_objs *o) {
  o->qps = nt_rdma_res_count("qp");
  o->cqs = nt_rdma_res_count("cq");
  o->srqs = nt_rdma_res_count("srq");
}

/* What grew from a to b, -1 when either was not read. */
static int nt_grown(int a, int b) { return a < 0 || b < 0 ? -1 : b - a; }

struct nt_proc {
  long rss_kib, hwm_kib;
  int threads, fds;
};

/* Resident KiB of the verbs mappings (queues and doorbells the provider mapped from
 * /dev/infiniband/uverbsN: rxe's QP, CQ and SRQ rings) and of anonymous memory (heaps: the
 * plugin's C allocations, the Go heap and goroutine stacks), from /proc/self/smaps. */
static void nt_smaps(long *verbs_kib, long *anon_kib) {
  *verbs_kib = *anon_kib = 0;
  FILE *f = fopen("/proc/self/smaps", "r");
  if (f == NULL) {
    return;
  }
  char line[512];
  int kind = 0; /* 1 verbs, 2 anonymous */
  while (fgets(line, sizeof(line), f) != NULL) {
    unsigned long a, b;
    if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, ':') != NULL && line[0] != 'R') {
      /* a mapping header: address range, perms, offset, dev, inode, [path] */
      char *path = NULL;
      int field = 0;
      for (char *p = line; *p && *p != '\n'; p++) {
        if (*p != ' ' && (p == line || p[-1] == ' ') && ++field == 6) {
          path = p;
          break;
        }
      }
      kind = path == NULL                                 ? 2
             : strncmp(path, "/dev/infiniband/", 16) == 0 ? 1
             : strncmp(path, "[heap]", 6) == 0            ? 2
                                                          : 0;
    } else if (strncmp(line, "Rss:", 4) == 0) {
      long kib = strtol(line + 4, NULL, 10);
      if (kind == 1) {
        *verbs_kib += kib;
      } else if (kind == 2) {
        *anon_kib += kib;
      }
    }
  }
  fclose(f);
}

static void nt_proc_read(struct nt_proc *p) {
  memset(p, 0, sizeof(*p));
  FILE *f = fopen("/proc/self/status", "r");
  if (f != NULL) {
    char line[256];
    while (fgets(line, sizeof(line), f) != NULL) {
      if (strncmp(line, "VmRSS:", 6) == 0) {
        p->rss_kib = strtol(line + 6, NULL, 10);
      } else if (strncmp(line, "VmHWM:", 6) == 0) {
        p->hwm_kib = strtol(line + 6, NULL, 10);
      } else if (strncmp(line, "Threads:", 8) == 0) {
        p->threads = (int)strtol(line + 8, NULL, 10);
      }
    }
    fclose(f);
  }
  DIR *d = opendir("/proc/self/fd");
  if (d != NULL) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] != '.') {
        p->fds++;
      }
    }
    closedir(d);
    p->fds--; /* the directory's own fd */
  }
}

/* The fds open now with their targets, to tell afterwards which ones are new. */
struct nt_fdset {
  int n;
  int *fd;
  char (*target)[64];
};

static void nt_fd_target(int fd, char *buf, size_t len) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  ssize_t r = readlink(path, buf, len - 1);
  buf[r > 0 ? (size_t)r : 0] = '\0';
}

static void nt_fdset_free(struct nt_fdset *f) {
  free(f->fd);
  free(f->target);
  memset(f, 0, sizeof(*f));
}

static void nt_fdset_read(struct nt_fdset *f) {
  nt_fdset_free(f);
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL) {
    return;
  }
  int cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d)) {
      continue;
    }
    if (f->n == cap) {
      cap = cap ? 2 * cap : 256;
      int *nfd = realloc(f->fd, (size_t)cap * sizeof(int));
      char(*nt)[64] = nfd ? realloc(f->target, (size_t)cap * 64) : NULL;
      if (nfd) f->fd = nfd;
      if (nt == NULL) break;
      f->target = nt;
    }
    f->fd[f->n] = atoi(e->d_name);
    nt_fd_target(f->fd[f->n], f->target[f->n], 64);
    f->n++;
  }
  closedir(d);
}

/* Counts the fds in `now` that were not in `before` (same number and target). The Go
 * runtime's netpoller (an epoll fd and an eventfd, created at the plugin's first listen and
 * kept for the life of the process) is counted apart; anything else is a leak, and the first
 * few are named on stderr. */
static int nt_fd_leaks(const struct nt_fdset *before, const struct nt_fdset *now, int *runtime, int quiet) {
  int leaked = 0;
  *runtime = 0;
  for (int i = 0; i < now->n; i++) {
    int found = 0;
    for (int j = 0; j < before->n && !found; j++) {
      found = before->fd[j] == now->fd[i] && strcmp(before->target[j], now->target[i]) == 0;
    }
    if (found) {
      continue;
    }
    if (strcmp(now->target[i], "anon_inode:[eventpoll]") == 0 || strcmp(now->target[i], "anon_inode:[eventfd]") == 0) {
      (*runtime)++;
    } else if (++leaked <= 8 && !quiet) {
      nt_err("fd %d is open after every comm was closed: %s", now->fd[i], now->target[i]);
    }
  }
  return leaked;
}

/* Many connections need many fds: use the hard limit, as launchers of large jobs do. */
static void nt_raise_nofile(struct rlimit *out) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
      getrlimit(RLIMIT_NOFILE, &rl);
    }
    *out = rl;
  } else {
    memset(out, 0, sizeof(*out));
  }
}

static long long nt_lim(rlim_t v) { return v == RLIM_INFINITY ? -1 : (long long)v; }

/* ---- payload: a function of (sender role, comm index, message index, word) ---- */

static uint64_t nt_sc_word(uint64_t seed, int sender_role, int comm, uint64_t msg, size_t w) {
  return nt_mix64(seed ^ nt_mix64(((uint64_t)sender_role << 62) ^ ((uint64_t)comm << 32) ^ (msg << 8)) ^
                  (w * 0x9e3779b97f4a7c15ULL));
}

static void nt_sc_fill(uint8_t *b, size_t size, uint64_t seed, int role, int comm, uint64_t msg) {
  for (size_t off = 0; off < size; off += 8) {
    uint64_t v = nt_sc_word(seed, role, comm, msg, off / 8);
    size_t n = size - off < 8 ? size - off : 8;
    memcpy(b + off, &v, n);
  }
}

/* Returns the first bad offset, or (size_t)-1 when every byte matches. */
static size_t nt_sc_check(const uint8_t *b, size_t size, uint64_t seed, int role, int comm, uint64_t msg) {
  for (size_t off = 0; off < size; off += 8) {
    uint64_t v = nt_sc_word(seed, role, comm, msg, off / 8);
    size_t n = size - off < 8 ? size - off : 8;
    if (memcmp(b + off, &v, n) != 0) {
      for (size_t j = 0; j < n; j++) {
        if (b[off + j] != ((uint8_t *)&v)[j]) {
          return off + j;
        }
      }
    }
  }
  return (size_t)-1;
}

/* ---- the run ---- */

struct nt_sc {
  int n;
  void **lcomm, **scomm, **rcomm;
  uint8_t (*mine)[NCCL_NET_HANDLE_MAXSIZE];
  uint8_t (*peer)[NCCL_NET_HANDLE_MAXSIZE];
  void **smh, **rmh, **sreq, **rreq;
  uint64_t *smsg, *rmsg; /* next message index to post / complete per comm */
  uint8_t *region;
  size_t region_len, stride;
  double reg_sum_ms, reg_max_ms; /* every regMr call of the round (connect-phases' mr_ms) */
  int nreg;
};

static int nt_sc_alloc(struct nt_sc *s, int n) {
  memset(s, 0, sizeof(*s));
  s->n = n;
  s->lcomm = calloc((size_t)n, sizeof(void *));
  s->scomm = calloc((size_t)n, sizeof(void *));
  s->rcomm = calloc((size_t)n, sizeof(void *));
  s->smh = calloc((size_t)n, sizeof(void *));
  s->rmh = calloc((size_t)n, sizeof(void *));
  s->sreq = calloc((size_t)n, sizeof(void *));
  s->rreq = calloc((size_t)n, sizeof(void *));
  s->smsg = calloc((size_t)n, sizeof(uint64_t));
  s->rmsg = calloc((size_t)n, sizeof(uint64_t));
  s->mine = calloc((size_t)n, NCCL_NET_HANDLE_MAXSIZE);
  s->peer = calloc((size_t)n, NCCL_NET_HANDLE_MAXSIZE);
  return s->lcomm && s->scomm && s->rcomm && s->smh && s->rmh && s->sreq && s->rreq && s->smsg && s->rmsg && s->mine &&
                 s->peer
             ? 0
             : -1;
}

static void nt_sc_free(struct nt_sc *s) {
  free(s->lcomm), free(s->scomm), free(s->rcomm), free(s->smh), free(s->rmh), free(s->sreq), free(s->rreq);
  free(s->smsg), free(s->rmsg), free(s->mine), free(s->peer);
  nt_free_region(s->region, s->region_len);
}

/* Swap the handles in messages of NT_SC_HANDLES_PER_MSG (each side sends a chunk, then reads
 * the peer's, so neither can fill the socket while the other is not reading). */
static int nt_sc_swap_handles(struct nt_opts *o, struct nt_oob *oob, struct nt_sc *s) {
  for (int i = 0; i < s->n; i += NT_SC_HANDLES_PER_MSG) {
    int k = s->n - i < NT_SC_HANDLES_PER_MSG ? s->n - i : NT_SC_HANDLES_PER_MSG;
    uint32_t want = (uint32_t)k * NCCL_NET_HANDLE_MAXSIZE, len = 0;
    if (nt_oob_send(oob, NT_MSG_HANDLE, s->mine[i], want) != 0 ||
        nt_oob_recv(oob, NT_MSG_HANDLE, s->peer[i], want, &len, o->timeout_s) != 0) {
      return -1;
    }
    if (len != want) {
      nt_err("peer sent %u bytes of handles %d.., expected %u", len, i, want);
      return -1;
    }
  }
  return 0;
}

/* --call-stats: what the calling thread went through inside each connect and accept call,
 * sampled after the call and after the previous call or pause (two syscalls more per call, so
 * off by default): its context switches (getrusage) and, from /proc/thread-self/schedstat, its
 * time on a CPU and its time runnable but kept off one (the scheduler's run delay). A call
 * with a voluntary switch waited for something (a lock, a sleep, I/O): blocked. One with an
 * involuntary switch or run delay in the call was descheduled: the kernel ran another thread
 * on its CPU, which on the lab's two emulated CPUs is often the plugin's own handshakes or the
 * peer. A call's own time is its wall time less its run delay: what the plugin made it take.
 * The samples span a little more than the call (the sampling itself, the loop between calls),
 * and run delay that margin can hold is taken as outside the call, never subtracted: own time
 * is an upper bound. Without schedstat (a kernel without CONFIG_SCHED_INFO) the times read -1. */
struct nt_call_stats {
  int on, schedstat_fd;
  struct rusage last;
  uint64_t last_cpu_ns, last_wait_ns;
  double last_at;                                            /* nt_now() before the last sample was taken */
  uint64_t blocked, descheduled;                             /* calls */
  double blocked_ms, unswitched_ms, cpu_ms, wait_ms, own_ms; /* the longest of each */
};

struct nt_sc_setup {
  double total_s, longest_connect_ms, longest_accept_ms;
  int longest_connect_i, longest_accept_i;
  uint64_t connect_calls, accept_calls, sweeps;
  /* The longest call of each kind: a comm's first connect (starts the handshake), a poll
   * that returned no comm, and the call that returned the comm. */
  double connect_first_ms, connect_poll_ms, connect_done_ms, accept_poll_ms, accept_done_ms;
  int threads_peak;   /* the most threads seen, sampled at most every millisecond of the setup */
  double cpu_ms;      /* the process's CPU time (user + system) from the first call to the last comm */
  double sys_ms;      /* of which in the kernel (verbs objects, sockets; rxe's work is the kernel's) */
  double poll_cpu_ms; /* of which this thread's: the calls, the sweeps and their pauses */
  long minflt;        /* page faults the process took meanwhile (first touches of memory) */
  long ctxsw;         /* context switches of its threads, voluntary and not */
  /* Which threads switched (nt_tasks_change): this one (the calls and its pauses), the
   * busiest other one (a plugin's), and how many threads appeared meanwhile. */
  struct nt_tasks_change tasks;
  struct nt_call_stats calls;
};

/* getrusage's sample for who (RUSAGE_SELF or RUSAGE_THREAD), zeros if it fails. */
static struct rusage nt_rusage(int who) {
  struct rusage ru;
  if (getrusage(who, &ru) != 0) {
    memset(&ru, 0, sizeof(ru));
  }
  return ru;
}

/* A sample's CPU time (user + system), in milliseconds; its system part in *sys_ms when that
 * is not NULL. */
static double nt_ru_ms(const struct rusage *ru, double *sys_ms) {
  double sys = (double)ru->ru_stime.tv_sec * 1000 + (double)ru->ru_stime.tv_usec / 1000;
  if (sys_ms != NULL) {
    *sys_ms = sys;
  }
  return (double)ru->ru_utime.tv_sec * 1000 + (double)ru->ru_utime.tv_usec / 1000 + sys;
}

static void nt_max(double *m, double v) { *m = v > *m ? v : *m; }

/* The calling thread's time on a CPU and its run delay, in ns (nt_call_stats); -1 when
 * schedstat cannot be read. */
static int nt_schedstat(int fd, uint64_t *cpu_ns, uint64_t *wait_ns) {
  char buf[128];
  ssize_t n = fd >= 0 ? pread(fd, buf, sizeof(buf) - 1, 0) : -1;
  if (n <= 0) {
    return -1;
  }
  buf[n] = '\0';
  return sscanf(buf, "%" SCNu64 " %" SCNu64, cpu_ns, wait_ns) == 2 ? 0 : -1;
}

static void nt_calls_open(struct nt_call_stats *cs, int on) {
  memset(cs, 0, sizeof(*cs));
  cs->on = on;
  cs->schedstat_fd = on ? open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC) : -1;
  if (on && cs->schedstat_fd < 0) {
    nt_err("--call-stats: /proc/thread-self/schedstat: %s; the calls' times read -1", strerror(errno));
    cs->cpu_ms = cs->wait_ms = cs->own_ms = -1;
  }
}

static void nt_calls_close(struct nt_call_stats *cs) {
  if (cs->schedstat_fd >= 0) {
    close(cs->schedstat_fd);
    cs->schedstat_fd = -1;
  }
}

/* Starts the next call's sample where the thread did something else than calls (a pause). */
static void nt_calls_resume(struct nt_call_stats *cs) {
  if (cs->on) {
    cs->last_at = nt_now();
    cs->last = nt_rusage(RUSAGE_THREAD);
    nt_schedstat(cs->schedstat_fd, &cs->last_cpu_ns, &cs->last_wait_ns);
  }
}

/* Accounts for a call that took wall_ms (nt_call_stats). */
static void nt_calls_add(struct nt_call_stats *cs, double wall_ms) {
  if (!cs->on) {
    return;
  }
  double at = nt_now();
  struct rusage now = nt_rusage(RUSAGE_THREAD);
  long voluntary = now.ru_nvcsw - cs->last.ru_nvcsw, involuntary = now.ru_nivcsw - cs->last.ru_nivcsw;
  cs->last = now;
  double wait_in_call = 0;
  uint64_t cpu_ns, wait_ns;
  if (nt_schedstat(cs->schedstat_fd, &cpu_ns, &wait_ns) == 0) {
    double span_ms = (nt_now() - cs->last_at) * 1000; /* the samples' span: the call and a margin */
    double wait_ms = (double)(wait_ns - cs->last_wait_ns) / 1e6;
    wait_in_call = wait_ms - (span_ms - wall_ms); /* what the margin cannot hold */
    nt_max(&cs->cpu_ms, (double)(cpu_ns - cs->last_cpu_ns) / 1e6);
    nt_max(&cs->wait_ms, wait_ms);
    nt_max(&cs->own_ms, wait_in_call > 0 ? wall_ms - wait_in_call : wall_ms);
    cs->last_cpu_ns = cpu_ns, cs->last_wait_ns = wait_ns;
  }
  cs->last_at = at;
  if (voluntary > 0) {
    cs->blocked++;
    nt_max(&cs->blocked_ms, wall_ms);
  }
  if (involuntary > 0 || wait_in_call > 0) {
    cs->descheduled++;
  }
  if (voluntary == 0 && involuntary == 0) {
    nt_max(&cs->unswitched_ms, wall_ms);
  }
}

/* One thread, every pending connect and accept per sweep, until all returned a comm (r was
 * cleared, its call stats opened). */
static int nt_sc_sweep(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_sc *s,
                       struct nt_sc_setup *r) {
  int ndone = 0, total = 2 * s->n;
  uint8_t *started = calloc((size_t)s->n, 1);
  if (started == NULL) {
    return -1;
  }
  struct rusage ru0 = nt_rusage(RUSAGE_SELF), th0 = nt_rusage(RUSAGE_THREAD);
  double t0 = nt_now(), deadline = t0 + o->timeout_s, sampled = 0;
  while (ndone < total) {
    int progressed = 0;
    if (nt_now() - sampled >= 0.001) { /* the plugin's threads peak while handshakes run */
      int th = nt_thread_count();
      r->threads_peak = th > r->threads_peak ? th : r->threads_peak;
      sampled = nt_now();
    }
    nt_calls_resume(&r->calls);
    for (int i = 0; i < s->n; i++) {
      if (s->scomm[i] == NULL) {
        double a = nt_now();
        ncclResult_t rc = nt_net_connect(n, o->dev, s->peer[i], &s->scomm[i]);
        double ms = (nt_now() - a) * 1000;
        nt_calls_add(&r->calls, ms);
        r->connect_calls++;
        if (ms > r->longest_connect_ms) {
          r->longest_connect_ms = ms;
          r->longest_connect_i = i;
        }
        if (rc != ncclSuccess) {
          nt_err("connect #%d of %d failed: rc=%d (%d of %d comms were up)", i, s->n, rc, ndone, total);
          free(started);
          return -1;
        }
        nt_max(!started[i] ? &r->connect_first_ms : s->scomm[i] ? &r->connect_done_ms : &r->connect_poll_ms, ms);
        started[i] = 1;
        if (s->scomm[i] != NULL) {
          ndone++, progressed = 1;
        }
      }
      if (s->rcomm[i] == NULL) {
        double a = nt_now();
        ncclResult_t rc = nt_net_accept(n, s->lcomm[i], &s->rcomm[i]);
        double ms = (nt_now() - a) * 1000;
        nt_calls_add(&r->calls, ms);
        r->accept_calls++;
        if (ms > r->longest_accept_ms) {
          r->longest_accept_ms = ms;
          r->longest_accept_i = i;
        }
        if (rc != ncclSuccess) {
          nt_err("accept #%d of %d failed: rc=%d (%d of %d comms were up)", i, s->n, rc, ndone, total);
          free(started);
          return -1;
        }
        nt_max(s->rcomm[i] ? &r->accept_done_ms : &r->accept_poll_ms, ms);
        if (s->rcomm[i] != NULL) {
          ndone++, progressed = 1;
        }
      }
    }
    r->sweeps++;
    nt_heartbeat();
    if (ndone == total) {
      break;
    }
    if (nt_now() > deadline) {
      int sc = 0, rc = 0;
      for (int i = 0; i < s->n; i++) {
        sc += s->scomm[i] != NULL;
        rc += s->rcomm[i] != NULL;
      }
      nt_err("connection setup timed out after %d s: %d of %d connects and %d of %d accepts done", o->timeout_s, sc,
             s->n, rc, s->n);
      free(started);
      return -1;
    }
    if (r->sweeps % 16 == 0 && nt_oob_peek(oob) < 0) {
      nt_err("peer gave up during connection setup");
      free(started);
      return -1;
    }
    if (!progressed) {
      usleep(50);
    }
  }
  r->total_s = nt_now() - t0;
  struct rusage ru1 = nt_rusage(RUSAGE_SELF), th1 = nt_rusage(RUSAGE_THREAD);
  double sys0, sys1;
  r->cpu_ms = nt_ru_ms(&ru1, &sys1) - nt_ru_ms(&ru0, &sys0);
  r->sys_ms = sys1 - sys0;
  r->minflt = ru1.ru_minflt - ru0.ru_minflt;
  r->ctxsw = ru1.ru_nvcsw + ru1.ru_nivcsw - ru0.ru_nvcsw - ru0.ru_nivcsw;
  r->poll_cpu_ms = nt_ru_ms(&th1, NULL) - nt_ru_ms(&th0, NULL);
  free(started);
  return 0;
}

/* nt_sc_sweep with its figures cleared first. */
static int nt_sc_establish(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_sc *s,
                           struct nt_sc_setup *r) {
  memset(r, 0, sizeof(*r));
  nt_calls_open(&r->calls, o->call_stats);
  int rc = nt_sc_sweep(o, n, oob, s, r);
  nt_calls_close(&r->calls);
  return rc;
}

struct nt_sc_data {
  double seconds;
  uint64_t msgs_sent, msgs_recv, bytes_recv, mismatches;
  char first_err[256];
};

static void nt_sc_fail(struct nt_sc_data *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void nt_sc_fail(struct nt_sc_data *d, const char *fmt, ...) {
  d->mismatches++;
  if (d->first_err[0] == '\0') {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->first_err, sizeof(d->first_err), fmt, ap);
    va_end(ap);
    nt_err("%s", d->first_err);
  }
}

/* Every comm carries `count` messages of `size` bytes in each direction, one outstanding
 * per comm, all comms at once. Returns -1 on a plugin error or a stall. */
static int nt_sc_transfer(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_sc *s, size_t size,
                          uint64_t count, struct nt_sc_data *d) {
  int peer_role = o->role == NT_SERVER ? NT_CLIENT : NT_SERVER;
  uint64_t need = (uint64_t)s->n * count * 2, done = 0;
  double t0 = nt_now(), last = t0;
  unsigned spins = 0;
  while (done < need) {
    int progressed = 0;
    for (int i = 0; i < s->n; i++) {
      uint8_t *sb = s->region + (size_t)i * 2 * s->stride, *rb = sb + s->stride;
      ncclResult_t rc;
      int isdone = 0, sizes[NT_MAX_MULTI] = {-1};
      /* receive side */
      if (s->rmsg[i] < count) {
        if (s->rreq[i] == NULL) {
          void *data[1] = {rb}, *mhs[1] = {s->rmh[i]};
          size_t sz[1] = {size};
          int tags[1] = {NT_SC_TAG};
          if ((rc = nt_net_irecv(n, s->rcomm[i], 1, data, sz, tags, mhs, &s->rreq[i])) != ncclSuccess) {
            nt_err("irecv on comm #%d failed: rc=%d", i, rc);
            return -1;
          }
        } else if ((rc = nt_net_test(n, s->rreq[i], &isdone, sizes)) != ncclSuccess) {
          nt_err("test(recv) on comm #%d failed: rc=%d", i, rc);
          return -1;
        } else if (isdone) {
          s->rreq[i] = NULL;
          if (sizes[0] < 0 || (size_t)sizes[0] != size) {
            nt_sc_fail(d, "comm #%d msg %" PRIu64 ": received size %d, expected %zu", i, s->rmsg[i], sizes[0], size);
          } else {
            size_t bad = nt_sc_check(rb, size, o->seed, peer_role, i, s->rmsg[i]);
            if (bad != (size_t)-1) {
              nt_sc_fail(d, "comm #%d msg %" PRIu64 ": first mismatch at offset %zu (a message of another comm?)", i,
                         s->rmsg[i], bad);
            }
          }
          s->rmsg[i]++;
          d->msgs_recv++;
          d->bytes_recv += size;
          done++, progressed = 1;
        }
      }
      /* send side */
      if (s->smsg[i] < count) {
        if (s->sreq[i] == NULL) {
          nt_sc_fill(sb, size, o->seed, (int)o->role, i, s->smsg[i]);
          if ((rc = nt_net_isend(n, s->scomm[i], sb, size, NT_SC_TAG, s->smh[i], &s->sreq[i])) != ncclSuccess) {
            nt_err("isend on comm #%d failed: rc=%d", i, rc);
            return -1;
          }
        } else if ((rc = nt_net_test(n, s->sreq[i], &isdone, sizes)) != ncclSuccess) {
          nt_err("test(send) on comm #%d failed: rc=%d", i, rc);
          return -1;
        } else if (isdone) {
          s->sreq[i] = NULL;
          s->smsg[i]++;
          d->msgs_sent++;
          done++, progressed = 1;
        }
      }
    }
    double now = nt_now();
    if (progressed) {
      last = now;
      nt_heartbeat();
    } else if (now - last > o->timeout_s) {
      nt_err("data: no progress for %d s (%" PRIu64 " of %" PRIu64 " sends and receives done)", o->timeout_s, done,
             need);
      return -1;
    }
    if (++spins % 64 == 0 && nt_oob_peek(oob) < 0) {
      nt_err("peer gave up during the data phase");
      return -1;
    }
  }
  d->seconds = nt_now() - t0;
  return 0;
}

static void nt_sc_note_reg(struct nt_sc *s, double since) {
  double ms = (nt_now() - since) * 1000;
  s->reg_sum_ms += ms;
  s->reg_max_ms = ms > s->reg_max_ms ? ms : s->reg_max_ms;
  s->nreg++;
}

static int nt_sc_register(struct nt_net *n, struct nt_sc *s, size_t size) {
  s->stride = (size + NT_SC_PAGE - 1) / NT_SC_PAGE * NT_SC_PAGE;
  s->region_len = s->stride * 2 * (size_t)s->n;
  s->region = nt_alloc_region(s->region_len);
  if (s->region == NULL) {
    nt_err("cannot allocate %zu bytes of buffers: %s", s->region_len, strerror(errno));
    return -1;
  }
  for (int i = 0; i < s->n; i++) {
    uint8_t *sb = s->region + (size_t)i * 2 * s->stride, *rb = sb + s->stride;
    double a = nt_now();
    ncclResult_t rc = nt_net_regmr(n, s->scomm[i], sb, s->stride, &s->smh[i]);
    nt_sc_note_reg(s, a);
    if (rc == ncclSuccess) {
      a = nt_now();
      rc = nt_net_regmr(n, s->rcomm[i], rb, s->stride, &s->rmh[i]);
      nt_sc_note_reg(s, a);
    }
    if (rc != ncclSuccess) {
      nt_err("regMr on comm #%d failed: rc=%d (check ulimit -l)", i, rc);
      return -1;
    }
  }
  return 0;
}

/* NCCL's order: deregMr, closeSend, closeRecv, closeListen. Returns the number of errors. */
static int nt_sc_close(struct nt_net *n, struct nt_sc *s) {
  int bad = 0;
  for (int i = 0; i < s->n; i++) {
    if (s->smh[i] != NULL && nt_net_deregmr(n, s->scomm[i], s->smh[i]) != ncclSuccess) {
      bad++;
    }
    if (s->rmh[i] != NULL && nt_net_deregmr(n, s->rcomm[i], s->rmh[i]) != ncclSuccess) {
      bad++;
    }
    s->smh[i] = s->rmh[i] = NULL;
  }
  for (int i = 0; i < s->n; i++) {
    if (s->scomm[i] != NULL && nt_net_close_send(n, s->scomm[i]) != ncclSuccess) {
      bad++;
    }
    s->scomm[i] = NULL;
  }
  for (int i = 0; i < s->n; i++) {
    if (s->rcomm[i] != NULL && nt_net_close_recv(n, s->rcomm[i]) != ncclSuccess) {
      bad++;
    }
    s->rcomm[i] = NULL;
  }
  for (int i = 0; i < s->n; i++) {
    if (s->lcomm[i] != NULL && nt_net_close_listen(n, s->lcomm[i]) != ncclSuccess) {
      bad++;
    }
    s->lcomm[i] = NULL;
  }
  if (bad) {
    nt_err("%d close/deregMr calls failed", bad);
  }
  return bad;
}

/* The connect-phases line: per key, the mean over this round's comms that had it of the
 * plugin's per-comm setup steps (nt_phases_take), the keys of the bench first; mr_ms is the
 * mean regMr on a new comm, timed here (MPIB registers its own CTS area's MRs in qp_create). */
static void nt_sc_phases_line(const struct nt_opts *o, int N, int round, const struct nt_phases *ph,
                              const struct nt_sc *s, const struct nt_sc_setup *su) {
  static const char *const first[] = {"dial", "hello", "metadata", "qp_create", "rtr_rts"};
  const size_t nfirst = sizeof(first) / sizeof(first[0]);
  char line[1536];
  size_t len = 0;
  double max_total = -1;
  for (size_t i = 0; i < nfirst && len < sizeof(line); i++) {
    int k = 0;
    while (k < ph->nkeys && strcmp(ph->key[k].name, first[i]) != 0) k++;
    if (k < ph->nkeys) {
      len +=
          (size_t)snprintf(line + len, sizeof(line) - len, " %s_ms=%.1f", first[i], ph->key[k].sum_ms / ph->key[k].n);
    } else {
      len += (size_t)snprintf(line + len, sizeof(line) - len, " %s_ms=-", first[i]);
    }
  }
  if (len < sizeof(line)) {
    len += s->nreg > 0 ? (size_t)snprintf(line + len, sizeof(line) - len, " mr_ms=%.1f", s->reg_sum_ms / s->nreg)
                       : (size_t)snprintf(line + len, sizeof(line) - len, " mr_ms=-");
  }
  for (int k = 0; k < ph->nkeys && len < sizeof(line); k++) {
    int listed = 0;
    for (size_t i = 0; i < nfirst; i++) listed |= strcmp(ph->key[k].name, first[i]) == 0;
    if (strcmp(ph->key[k].name, "total") == 0) max_total = ph->key[k].max_ms;
    if (!listed) {
      len += (size_t)snprintf(line + len, sizeof(line) - len, " %s_ms=%.1f", ph->key[k].name,
                              ph->key[k].sum_ms / ph->key[k].n);
    }
  }
  if (len >= sizeof(line)) {
    len = sizeof(line) - 1;
  }
  line[len] = '\0';
  nt_out("connect-phases: comms=%d role=%s round=%d lines=%d%s max_total_ms=%.1f mr_max_ms=%.1f setup_ms=%.1f "
         "setup_cpu_ms=%.1f poll_cpu_ms=%.1f setup_sys_ms=%.1f setup_minflt=%ld setup_ctxsw=%ld "
         "setup_ctxsw_caller=%ld setup_ctxsw_busiest=%ld setup_threads_new=%d",
         N, nt_role_name(o->role), round, ph->lines, line, max_total, s->reg_max_ms, su->total_s * 1000, su->cpu_ms,
         su->poll_cpu_ms, su->sys_ms, su->minflt, su->ctxsw, su->tasks.caller, su->tasks.busiest, su->tasks.created);
}

static int nt_scale_round(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, int round,
                          const struct rlimit *nofile, const struct rlimit *memlock) {
  int N = o->comms;
  size_t size = o->nsizes > 0 ? o->sizes[0] : (o->mode == NT_RESOURCES ? 65536 : 4096);
  uint64_t count = o->count_set ? o->count : 1;
  struct nt_fdset fds0 = {0}, fds4 = {0};
  struct nt_sc s;
  struct nt_sc_setup su;
  struct nt_sc_data d;
  memset(&su, 0, sizeof(su));
  memset(&d, 0, sizeof(d));
  int ret = NT_EXIT_FAIL, up = 0;
  double listen_s = 0, close_s = 0;
  long verbs_kib = 0, anon_kib = 0;
  if (nt_sc_alloc(&s, N) != 0) {
    nt_err("out of memory for %d comms", N);
    nt_oob_abort(oob, "%s: out of memory", nt_role_name(o->role));
    nt_sc_free(&s);
    return NT_EXIT_FAIL;
  }
  struct nt_proc p0, p1, p2, p3, p4;
  memset(&p0, 0, sizeof(p0)), p1 = p2 = p3 = p4 = p0;
  struct nt_objs objs0 = {-1, -1, -1}, objs2 = {-1, -1, -1}; /* --rdma-res, first round */
  struct nt_phases phases;
  memset(&phases, 0, sizeof(phases));
  if (nt_oob_sync(oob, "scale-start", o->timeout_s) != 0) {
    goto out;
  }
  if (o->rdma_res && round == 1) nt_objs_read(&objs0);
  nt_proc_read(&p0);
  nt_fdset_read(&fds0);
  nt_phase("scale-listen");
  double t = nt_now();
  for (int i = 0; i < N; i++) {
    ncclResult_t rc = nt_net_listen(n, o->dev, s.mine[i], &s.lcomm[i]);
    if (rc != ncclSuccess || s.lcomm[i] == NULL) {
      nt_proc_read(&p1);
      nt_err("listen #%d of %d failed: rc=%d (fds open %d, RLIMIT_NOFILE %lld)", i, N, rc, p1.fds,
             nt_lim(nofile->rlim_cur));
      nt_oob_abort(oob, "%s: listen #%d failed rc=%d", nt_role_name(o->role), i, rc);
      goto out;
    }
    nt_heartbeat();
  }
  listen_s = nt_now() - t;
  if (nt_sc_swap_handles(o, oob, &s) != 0) {
    goto out;
  }
  nt_proc_read(&p1);
  if (nt_oob_sync(oob, "scale-connect", o->timeout_s) != 0) {
    goto out;
  }
  nt_phase("scale-connect");
  nt_phases_take(&phases); /* from here on: this round's comms */
  struct nt_tasks tasks0, tasks1;
  int tasks_ok = nt_tasks_read(&tasks0) == 0;
  if (nt_sc_establish(o, n, oob, &s, &su) != 0) {
    nt_oob_abort(oob, "%s: connection setup of %d comms failed", nt_role_name(o->role), N);
    goto out;
  }
  if (tasks_ok && nt_tasks_read(&tasks1) == 0) {
    nt_tasks_change(&tasks0, &tasks1, nt_gettid(), &su.tasks);
  }
  up = 1;
  nt_phases_take(&phases); /* each comm logs its line before connect/accept can return it */
  nt_proc_read(&p2);
  nt_smaps(&verbs_kib, &anon_kib);
  if (o->rdma_res && round == 1) nt_objs_read(&objs2);
  nt_err("scale: %d send + %d recv comms up in %.3f s (longest connect %.1f ms, accept %.1f ms)", N, N, su.total_s,
         su.longest_connect_ms, su.longest_accept_ms);
  nt_phase("scale-data");
  if (nt_sc_register(n, &s, size) != 0) {
    nt_oob_abort(oob, "%s: buffer registration failed", nt_role_name(o->role));
    goto out;
  }
  if (nt_oob_sync(oob, "scale-data", o->timeout_s) != 0) {
    goto out;
  }
  if (nt_sc_transfer(o, n, oob, &s, size, count, &d) != 0) {
    nt_oob_abort(oob, "%s: data phase failed", nt_role_name(o->role));
    goto out;
  }
  nt_proc_read(&p3);
  /* Each side checked what it received; the verdicts are swapped. */
  char mine[64], theirs[64];
  uint32_t len = 0;
  int peer_ok = 0;
  snprintf(mine, sizeof(mine), "verified=%d", d.mismatches == 0);
  if (nt_oob_send(oob, NT_MSG_RESULT, mine, (uint32_t)strlen(mine)) != 0 ||
      nt_oob_recv(oob, NT_MSG_RESULT, theirs, sizeof(theirs) - 1, &len, o->timeout_s) != 0) {
    goto out;
  }
  theirs[len] = '\0';
  peer_ok = strcmp(theirs, "verified=1") == 0;
  if (nt_oob_sync(oob, "scale-close", o->timeout_s) != 0) {
    goto out;
  }
  ret = d.mismatches == 0 && peer_ok ? NT_EXIT_OK : NT_EXIT_FAIL;
out:
  nt_phase("scale-close");
  t = nt_now();
  if (nt_sc_close(n, &s) != 0 && ret == NT_EXIT_OK) {
    ret = NT_EXIT_FAIL;
  }
  close_s = nt_now() - t;
  if (!up) {
    nt_sc_free(&s);
    nt_fdset_free(&fds0);
    return ret;
  }
  /* The plugin may close sockets from its own threads: give the fds a moment to come back. */
  double settle_end = nt_now() + NT_SC_SETTLE_S;
  int verified = ret == NT_EXIT_OK, runtime_fds = 0, leaked_fds;
  for (;;) {
    nt_fdset_read(&fds4);
    leaked_fds = nt_fd_leaks(&fds0, &fds4, &runtime_fds, 1);
    if (leaked_fds == 0 || nt_now() > settle_end) {
      break;
    }
    nt_heartbeat();
    usleep(50000);
  }
  /* The leak series reads the process at rest: the plugin ends its idle threads once its
   * control plane has been idle for a while (200 ms), as it would between a job's bursts. */
  int series_round = o->report_every > 0 && (round == 1 || round % o->report_every == 0 || round == o->rounds);
  while (series_round && nt_now() < t + close_s + NT_SC_REST_S) {
    nt_heartbeat();
    usleep(20000);
  }
  nt_proc_read(&p4);
  /* threads_peak: the most threads this round, the setup's samples and the other readings */
  int peak = su.threads_peak;
  const int seen[] = {p0.threads, p1.threads, p2.threads, p3.threads, p4.threads};
  for (size_t i = 0; i < sizeof(seen) / sizeof(seen[0]); i++) {
    peak = seen[i] > peak ? seen[i] : peak;
  }
  if (leaked_fds > 0) {
    nt_fd_leaks(&fds0, &fds4, &runtime_fds, 0); /* name them */
  }
  nt_fdset_free(&fds0);
  nt_fdset_free(&fds4);
  if (leaked_fds > 0) {
    nt_err("round %d: %d fds still open after closing every comm (not counting %d of the Go runtime's)", round,
           leaked_fds, runtime_fds);
    ret = NT_EXIT_FAIL;
  }
  int report =
      o->report_every == 0 || round == 1 || round % o->report_every == 0 || round == o->rounds || ret != NT_EXIT_OK;
  if (!report) {
    nt_sc_free(&s);
    return ret;
  }
  if (o->report_every > 0 || o->rdma_res) {
    int qps = o->rdma_res ? nt_rdma_res_count("qp") : -1, mrs = o->rdma_res ? nt_rdma_res_count("mr") : -1;
    /* malloc's own view (the C heap: the driver, libibverbs, the provider, the plugin's C):
     * bytes in use, and bytes its arenas hold from the kernel. In use flat while held grows
     * is memory spread over more threads' arenas, not a leak. */
    struct mallinfo2 mi = mallinfo2();
    nt_out("nettest-leak: round=%d role=%s fds=%d threads=%d rss_kib=%ld qps=%d mrs=%d leaked_fds=%d"
           " malloc_inuse_kib=%zu malloc_held_kib=%zu threads_driver=%d threads_peak=%d",
           round, nt_role_name(o->role), p4.fds, p4.threads, p4.rss_kib, qps, mrs, leaked_fds,
           (mi.uordblks + mi.hblkhd) / 1024, (mi.arena + mi.hblkhd) / 1024, nt_threads_driver, peak);
  }
  double longest = su.longest_connect_ms > su.longest_accept_ms ? su.longest_connect_ms : su.longest_accept_ms;
  char calls[256] = "";
  if (su.calls.on) {
    snprintf(calls, sizeof(calls),
             " calls_blocked=%" PRIu64 " calls_descheduled=%" PRIu64
             " longest_blocked_ms=%.1f longest_unswitched_ms=%.1f longest_call_cpu_ms=%.1f longest_call_wait_ms=%.1f"
             " longest_own_ms=%.1f",
             su.calls.blocked, su.calls.descheduled, su.calls.blocked_ms, su.calls.unswitched_ms, su.calls.cpu_ms,
             su.calls.wait_ms, su.calls.own_ms);
  }
  nt_out("nettest-connect: comms=%d total_s=%.3f longest_call_ms=%.1f verified=%s role=%s longest_connect_ms=%.1f "
         "longest_accept_ms=%.1f connect_calls=%" PRIu64 " accept_calls=%" PRIu64 " sweeps=%" PRIu64
         " listen_s=%.3f data_s=%.3f close_s=%.3f size=%zu count=%" PRIu64 " round=%d"
         " connect_first_ms=%.1f connect_poll_ms=%.1f connect_done_ms=%.1f accept_poll_ms=%.1f accept_done_ms=%.1f%s",
         N, su.total_s, longest, verified ? "true" : "false", nt_role_name(o->role), su.longest_connect_ms,
         su.longest_accept_ms, su.connect_calls, su.accept_calls, su.sweeps, listen_s, d.seconds, close_s, size, count,
         round, su.connect_first_ms, su.connect_poll_ms, su.connect_done_ms, su.accept_poll_ms, su.accept_done_ms,
         calls);
  nt_sc_phases_line(o, N, round, &phases, &s, &su);
  nt_out("nettest-resources: conns=%d per_conn_kib=%ld verified=%s role=%s rss_before_kib=%ld rss_listen_kib=%ld "
         "rss_connected_kib=%ld rss_data_kib=%ld rss_closed_kib=%ld hwm_kib=%ld fds_before=%d fds_listen=%d "
         "fds_connected=%d fds_closed=%d leaked_fds=%d runtime_fds=%d threads_before=%d threads_connected=%d "
         "threads_closed=%d nofile=%lld memlock=%lld round=%d rss_verbs_connected_kib=%ld rss_anon_connected_kib=%ld"
         " qps_grown=%d cqs_grown=%d srqs_grown=%d",
         N, N > 0 ? (p2.rss_kib - p0.rss_kib) / N : 0, verified ? "true" : "false", nt_role_name(o->role), p0.rss_kib,
         p1.rss_kib, p2.rss_kib, p3.rss_kib, p4.rss_kib, p4.hwm_kib, p0.fds, p1.fds, p2.fds, p4.fds, leaked_fds,
         runtime_fds, p0.threads, p2.threads, p4.threads, nt_lim(nofile->rlim_cur), nt_lim(memlock->rlim_cur), round,
         verbs_kib, anon_kib, nt_grown(objs0.qps, objs2.qps), nt_grown(objs0.cqs, objs2.cqs),
         nt_grown(objs0.srqs, objs2.srqs));
  nt_sc_free(&s);
  return ret;
}

/* --round-gate F: says "between rounds" by creating F.ready, then waits (heartbeating) until F
 * exists or the timeout passes. */
static int nt_sc_gate(struct nt_opts *o) {
  char ready[PATH_MAX];
  snprintf(ready, sizeof(ready), "%s.ready", o->round_gate);
  FILE *f = fopen(ready, "w");
  if (f == NULL) {
    nt_err("round gate: cannot create %s: %s", ready, strerror(errno));
    return -1;
  }
  fclose(f);
  double deadline = nt_now() + o->timeout_s;
  while (access(o->round_gate, F_OK) != 0) {
    if (nt_now() > deadline) {
      nt_err("round gate: %s did not appear within %d s", o->round_gate, o->timeout_s);
      return -1;
    }
    nt_heartbeat();
    usleep(20000);
  }
  return 0;
}

/* --rounds R: the whole cycle R times in one process. The first round pays for what the
 * process keeps (the Go runtime's threads and netpoller); later rounds must end where the
 * first ended. */
int nt_mode_scale(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob) {
  struct rlimit nofile, memlock;
  nt_raise_nofile(&nofile);
  if (getrlimit(RLIMIT_MEMLOCK, &memlock) != 0) {
    memset(&memlock, 0, sizeof(memlock));
  }
  int ret = NT_EXIT_OK;
  for (int r = 1; r <= o->rounds && ret == NT_EXIT_OK; r++) {
    if (r > 1 && o->round_gate && nt_sc_gate(o) != 0) {
      nt_oob_abort(oob, "%s: round gate %s never opened", nt_role_name(o->role), o->round_gate);
      return NT_EXIT_FAIL;
    }
    ret = nt_scale_round(o, n, oob, r, &nofile, &memlock);
  }
  return ret;
}
