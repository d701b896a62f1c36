/*
 * The base layer of mpib-nettest: what every other file uses and that uses nothing of theirs
 * (time, output lines, the watchdog, number parsing, mode names, buffers, the forker).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nt_util.h"

/* ---- time ---- */

double nt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double nt_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---- the watchdog ---- */

/* Watchdog: every loop of the driver has its own deadline, but a plugin call that never
 * returns would still hang the process. A thread exits the process when no heartbeat came
 * for 2 * --timeout-s + 30 seconds.
 *
 * Heartbeats and phases live in slots: slot 0 is the main thread's (and the only one without
 * --devs); with --devs, device run i beats in slot 1 + i while it runs, and the main thread's
 * slot rests while it waits for the runs. Every active slot must beat. */
#define NT_WD_SLOTS (1 + NT_MAX_RUNS)
static struct {
  uint64_t beat_ms;
  const char *phase;
  int active;
  int dev;
} nt_wd[NT_WD_SLOTS] = {{0, "start", 1, -1}};
static int nt_wd_limit_s = 150;

/* The run this thread drives (--devs): its device, printed in its lines, and its watchdog
 * slot. -1 and 0 in the main thread and whenever --devs is not given. */
static __thread int nt_tls_dev = -1;
static __thread int nt_tls_slot;

void nt_run_thread_init(int slot, int dev) {
  nt_tls_dev = dev;
  nt_tls_slot = slot;
  nt_wd[slot].dev = dev;
}

void nt_heartbeat(void) {
  __atomic_store_n(&nt_wd[nt_tls_slot].beat_ms, (uint64_t)(nt_now() * 1000), __ATOMIC_RELAXED);
}

void nt_phase(const char *phase) {
  __atomic_store_n(&nt_wd[nt_tls_slot].phase, phase, __ATOMIC_RELAXED);
  nt_heartbeat();
}

void nt_wd_watch(int on) {
  if (on) {
    nt_heartbeat();
  }
  __atomic_store_n(&nt_wd[nt_tls_slot].active, on, __ATOMIC_RELEASE);
}

static void *nt_watchdog(void *arg) {
  (void)arg;
  for (;;) {
    usleep(200000);
    for (int i = 0; i < NT_WD_SLOTS; i++) {
      if (!__atomic_load_n(&nt_wd[i].active, __ATOMIC_ACQUIRE)) {
        continue;
      }
      uint64_t beat = __atomic_load_n(&nt_wd[i].beat_ms, __ATOMIC_RELAXED);
      double idle = nt_now() - (double)beat / 1000;
      if (idle > nt_wd_limit_s) {
        char msg[256], dev[32] = "";
        if (i > 0) {
          snprintf(dev, sizeof(dev), " of dev=%d", nt_wd[i].dev);
        }
        int n = snprintf(msg, sizeof(msg),
                         "mpib-nettest: watchdog: nothing moved for %.0f s in phase '%s'%s (a plugin call did not "
                         "return?); exiting\n",
                         idle, __atomic_load_n(&nt_wd[i].phase, __ATOMIC_RELAXED), dev);
        ssize_t w = write(STDERR_FILENO, msg, (size_t)n);
        (void)w;
        _exit(NT_EXIT_FAIL);
      }
    }
  }
  return NULL;
}

void nt_watchdog_start(int timeout_s) {
  pthread_t t;
  nt_wd_limit_s = 2 * timeout_s + 30;
  nt_phase("load");
  if (pthread_create(&t, NULL, nt_watchdog, NULL) == 0) {
    pthread_detach(t);
  }
}

/* ---- output ---- */

/* Result lines: stdout, and the --stats-file when given. One line at a time (--devs runs
 * print from several threads); a device run's lines end with its dev=N. */
static pthread_mutex_t nt_out_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *nt_stats;

int nt_out_open(const char *path) {
  nt_stats = fopen(path, "w");
  return nt_stats == NULL ? -1 : 0;
}

void nt_out_close(void) {
  if (nt_stats != NULL) {
    fclose(nt_stats);
  }
}

void nt_out(const char *fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&nt_out_mu);
  va_start(ap, fmt);
  vfprintf(stdout, fmt, ap);
  va_end(ap);
  if (nt_tls_dev >= 0) {
    fprintf(stdout, " dev=%d", nt_tls_dev);
  }
  fputc('\n', stdout);
  fflush(stdout);
  if (nt_stats != NULL) {
    va_start(ap, fmt);
    vfprintf(nt_stats, fmt, ap);
    va_end(ap);
    if (nt_tls_dev >= 0) {
      fprintf(nt_stats, " dev=%d", nt_tls_dev);
    }
    fputc('\n', nt_stats);
    fflush(nt_stats);
  }
  pthread_mutex_unlock(&nt_out_mu);
}

void nt_err(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (nt_tls_dev >= 0) {
    fprintf(stderr, "mpib-nettest: [dev=%d] %s\n", nt_tls_dev, buf);
  } else {
    fprintf(stderr, "mpib-nettest: %s\n", buf);
  }
}

/* ---- the process ---- */

int nt_threads_driver = -1;

/* This process's threads now (field 20 of /proc/self/stat), -1 if unreadable. One read of a
 * short file: cheap enough to sample every millisecond of a connect burst. */
int nt_thread_count(void) {
  char buf[1024];
  FILE *f = fopen("/proc/self/stat", "r");
  if (f == NULL) {
    return -1;
  }
  size_t len = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[len] = '\0';
  char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  long n = -1;
  for (int field = 2; p != NULL && field < 20; field++) {
    p = strchr(p + 1, ' ');
  }
  if (p != NULL) {
    n = strtol(p + 1, NULL, 10);
  }
  return (int)n;
}

/* One thread's context switches so far (its status file), -1 when it has ended. */
static long nt_task_ctxsw(const char *tid) {
  char path[320], line[256];
  snprintf(path, sizeof(path), "/proc/self/task/%s/status", tid);
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    return -1;
  }
  long vol = -1, nvol = -1, v;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1) {
      vol = v;
    } else if (sscanf(line, "nonvoluntary_ctxt_switches: %ld", &v) == 1) {
      nvol = v;
    }
  }
  fclose(f);
  return vol < 0 || nvol < 0 ? -1 : vol + nvol;
}

int nt_tasks_read(struct nt_tasks *t) {
  t->n = 0;
  DIR *d = opendir("/proc/self/task");
  if (d == NULL) {
    return -1;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL && t->n < NT_MAX_TASKS) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') {
      continue;
    }
    long sw = nt_task_ctxsw(e->d_name);
    if (sw >= 0) {
      t->tid[t->n] = atoi(e->d_name);
      t->ctxsw[t->n++] = sw;
    }
  }
  closedir(d);
  return 0;
}

int nt_gettid(void) { return (int)syscall(SYS_gettid); }

void nt_tasks_change(const struct nt_tasks *before, const struct nt_tasks *after, int caller_tid,
                     struct nt_tasks_change *c) {
  memset(c, 0, sizeof(*c));
  for (int i = 0; i < after->n; i++) {
    int j = 0;
    while (j < before->n && before->tid[j] != after->tid[i]) {
      j++;
    }
    long sw = after->ctxsw[i] - (j < before->n ? before->ctxsw[j] : 0);
    c->created += j == before->n;
    if (after->tid[i] == caller_tid) {
      c->caller = sw;
    } else if (sw > c->busiest) {
      c->busiest = sw;
    }
  }
}

void *nt_alloc_region(size_t len) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void nt_free_region(void *p, size_t len) {
  if (p != NULL) {
    munmap(p, len);
  }
}

/* ---- --fork-every-ms: a thread forks children every N ms while the mode runs, and reaps
 * them. The children take turns: one calls _exit(0) at once, one execv's /bin/true, and with
 * --fork-calls-plugin one makes the plugin's control calls (nt_fk.calls) ---- */

enum { NT_CHILD_EXIT, NT_CHILD_EXEC, NT_CHILD_CALLS };

static struct {
  pthread_t thread;
  int running, stop, ms;
  int (*calls)(void *);
  void *calls_arg;
  uint64_t forks, exits, execs, plugin_calls, failed;
} nt_fk;

static void nt_fork_child(int kind) {
  if (kind == NT_CHILD_EXEC) {
    char *argv[] = {"/bin/true", NULL};
    execv("/bin/true", argv);
    _exit(127);
  }
  if (kind == NT_CHILD_CALLS) _exit(nt_fk.calls(nt_fk.calls_arg));
  _exit(0);
}

static void *nt_forker(void *arg) {
  (void)arg;
  int kinds = nt_fk.calls != NULL ? 3 : 2;
  while (!__atomic_load_n(&nt_fk.stop, __ATOMIC_RELAXED)) {
    int kind = (int)(nt_fk.forks % (uint64_t)kinds);
    pid_t pid = fork();
    if (pid == 0) nt_fork_child(kind);
    nt_fk.forks++;
    int st = 0;
    if (pid < 0) {
      nt_fk.failed++;
    } else {
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        nt_fk.failed++;
        if (kind == NT_CHILD_CALLS)
          nt_err("--fork-calls-plugin: child %d %s %d", (int)pid, WIFSIGNALED(st) ? "ended by signal" : "exited",
                 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      } else if (kind == NT_CHILD_EXEC) {
        nt_fk.execs++;
      } else if (kind == NT_CHILD_CALLS) {
        nt_fk.plugin_calls++;
      } else {
        nt_fk.exits++;
      }
    }
    usleep((useconds_t)nt_fk.ms * 1000);
  }
  return NULL;
}

void nt_forker_start(const struct nt_opts *o, int (*calls)(void *), void *arg) {
  if (o->fork_ms <= 0 || nt_fk.running) {
    return;
  }
  nt_fk.ms = o->fork_ms;
  nt_fk.calls = o->fork_calls ? calls : NULL;
  nt_fk.calls_arg = arg;
  if (pthread_create(&nt_fk.thread, NULL, nt_forker, NULL) != 0) {
    nt_err("--fork-every-ms: cannot start the fork thread: %s", strerror(errno));
    return;
  }
  nt_fk.running = 1;
}

void nt_forker_stop(const struct nt_opts *o) {
  if (!nt_fk.running) {
    return;
  }
  __atomic_store_n(&nt_fk.stop, 1, __ATOMIC_RELAXED);
  pthread_join(nt_fk.thread, NULL);
  nt_fk.running = 0;
  nt_out("nettest-fork: role=%s every_ms=%d forks=%" PRIu64 " exit_children=%" PRIu64 " exec_children=%" PRIu64
         " failed=%" PRIu64 " plugin_call_children=%" PRIu64,
         nt_role_name(o->role), o->fork_ms, nt_fk.forks, nt_fk.exits, nt_fk.execs, nt_fk.failed, nt_fk.plugin_calls);
}

/* ---- parsing ---- */

int nt_parse_u64(const char *s, uint64_t *v) {
  char *end;
  errno = 0;
  if (s == NULL || *s == '\0' || *s == '-') {
    return -1;
  }
  unsigned long long x = strtoull(s, &end, 0);
  if (errno != 0 || *end != '\0') {
    return -1;
  }
  *v = x;
  return 0;
}

int nt_parse_size(const char *s, uint64_t *v) {
  char *end;
  errno = 0;
  if (s == NULL || *s == '\0' || *s == '-') {
    return -1;
  }
  unsigned long long x = strtoull(s, &end, 10);
  if (errno != 0 || end == s) {
    return -1;
  }
  unsigned shift = 0;
  switch (*end) {
  case 'k':
  case 'K':
    shift = 10;
    end++;
    break;
  case 'm':
  case 'M':
    shift = 20;
    end++;
    break;
  case 'g':
  case 'G':
    shift = 30;
    end++;
    break;
  default: break;
  }
  if (shift && (strcasecmp(end, "iB") == 0 || strcasecmp(end, "B") == 0)) {
    end += strlen(end);
  }
  if (*end != '\0' || (shift && x > (UINT64_MAX >> shift))) {
    return -1;
  }
  *v = (uint64_t)x << shift;
  return 0;
}

int nt_parse_int(const char *s, int lo, int hi, int *v) {
  uint64_t x;
  if (nt_parse_u64(s, &x) != 0 || x < (uint64_t)lo || x > (uint64_t)hi) {
    return -1;
  }
  *v = (int)x;
  return 0;
}

/* ---- names ---- */

const char *nt_role_name(enum nt_role r) { return r == NT_SERVER ? "server" : "client"; }

/* --mode's names; a mode's first entry is the name it is printed with. */
static const struct {
  const char *name;
  enum nt_mode mode;
} nt_modes[] = {
    {"verify", NT_VERIFY},
    {"bw", NT_BW},
    {"lat", NT_LAT},
    {"badhandle", NT_BADHANDLE},
    {"garbage-peer", NT_GARBAGE},
    {"garbage", NT_GARBAGE},
    {"finalize-during-handshake", NT_FINALIZE_HS},
    {"abort-mid-transfer", NT_ABORT},
    {"stray-client", NT_STRAY},
    {"listener-flood", NT_FLOOD},
    {"forged-handle", NT_FORGED},
    {"silent-hold", NT_SILENT_HOLD},
    {"evict-race", NT_EVICT_RACE},
    {"connect", NT_CONNECT},
    {"resources", NT_RESOURCES},
};

int nt_mode_parse(const char *name, enum nt_mode *m) {
  for (size_t i = 0; i < sizeof(nt_modes) / sizeof(nt_modes[0]); i++) {
    if (strcmp(name, nt_modes[i].name) == 0) {
      *m = nt_modes[i].mode;
      return 0;
    }
  }
  return -1;
}

const char *nt_mode_list(void) {
  static char list[512];
  if (list[0] == '\0') {
    size_t len = 0;
    for (size_t i = 0; i < sizeof(nt_modes) / sizeof(nt_modes[0]); i++) {
      if (i > 0 && nt_modes[i].mode == nt_modes[i - 1].mode) {
        continue; /* an alias: the table lists it after its mode's name */
      }
      len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s", len ? ", " : "", nt_modes[i].name);
    }
  }
  return list;
}

const char *nt_mode_name(enum nt_mode m) {
  for (size_t i = 0; i < sizeof(nt_modes) / sizeof(nt_modes[0]); i++) {
    if (nt_modes[i].mode == m) {
      return nt_modes[i].name;
    }
  }
  return "?";
}

int nt_mode_is_lifecycle(enum nt_mode m) {
  return m == NT_FINALIZE_HS || m == NT_ABORT || m == NT_STRAY || m == NT_FLOOD || m == NT_FORGED ||
         m == NT_SILENT_HOLD || m == NT_EVICT_RACE;
}

int nt_mode_is_scale(enum nt_mode m) { return m == NT_CONNECT || m == NT_RESOURCES; }
