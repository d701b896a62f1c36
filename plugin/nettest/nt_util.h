/*
 * util.c: mpib-nettest's base layer (nettest.h names the layers). Every other file may use it;
 * it uses none of them.
 */
#ifndef MPIB_NT_UTIL_H
#define MPIB_NT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "nettest.h"

/* ---- time ---- */
double nt_now(void);     /* CLOCK_MONOTONIC in seconds */
double nt_wall_ms(void); /* CLOCK_REALTIME in milliseconds (comparable with `date +%s%3N`) */

/* splitmix64's finalizer: both sides derive sizes, tags, send orders and payloads from it, so
 * it must never change. Inline: the payload patterns call it for every 8 bytes. */
static inline uint64_t nt_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/* ---- the watchdog ---- */
/* Starts the thread that exits the process (exit 1, the phase on stderr) when a watched slot
 * had no heartbeat for 2 x timeout_s + 30 s: a plugin call that never returns. */
void nt_watchdog_start(int timeout_s);
/* The watchdog's heartbeat and phase are per run: with --devs each device's thread has its
 * own (a hung plugin call on one device is not hidden by another device's progress). */
void nt_heartbeat(void);
void nt_phase(const char *phase);
/* This thread drives the --devs run in watchdog slot `slot` (1 + its list position) on device
 * dev: its lines carry dev=N, its heartbeats and phases go to that slot. */
void nt_run_thread_init(int slot, int dev);
/* Watch this thread's slot (after a fresh heartbeat) or stop watching it. */
void nt_wd_watch(int on);

/* ---- output ---- */
/* Result line (stdout and --stats-file), one whole line at a time; in a --devs run the line
 * ends with " dev=N" (the calling thread's device). */
void nt_out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "mpib-nettest: ..." on stderr; in a --devs run "mpib-nettest: [dev=N] ...". */
void nt_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* --stats-file: result lines also go to path from now on; -1 (errno set) when it cannot be
 * created. nt_out_close closes it at the end. */
int nt_out_open(const char *path);
void nt_out_close(void);

/* ---- the process ---- */
/* The driver's own threads (main, watchdog) before it loads the plugin: what a thread count
 * minus this is, the plugin added. */
extern int nt_threads_driver;
int nt_thread_count(void);
/* This process's threads and the context switches (voluntary and not) each has made so far,
 * from /proc/self/task: the connect mode's account of which threads switched during a setup. */
#define NT_MAX_TASKS 512
struct nt_tasks {
  int n;
  int tid[NT_MAX_TASKS];
  long ctxsw[NT_MAX_TASKS];
};
int nt_tasks_read(struct nt_tasks *t); /* -1 when /proc/self/task cannot be read */
int nt_gettid(void); /* the calling thread's id (glibc before 2.30, the release build's 2.28, has no gettid) */
/* What happened between two readings: the threads that appeared, and the context switches of
 * the calling thread (caller_tid) and of the busiest other thread. A thread that ended between
 * them is in neither reading, and its switches in neither figure. */
struct nt_tasks_change {
  int created;
  long caller, busiest;
};
void nt_tasks_change(const struct nt_tasks *before, const struct nt_tasks *after, int caller_tid,
                     struct nt_tasks_change *c);
/* Page-aligned anonymous memory for buffers the plugin registers (NULL when mmap fails). */
void *nt_alloc_region(size_t len);
void nt_free_region(void *p, size_t len);
/* --fork-every-ms: fork children while the plugin works, from start to stop (nettest-fork line).
 * With --fork-calls-plugin every third child runs calls(arg) and exits with what it returns. */
void nt_forker_start(const struct nt_opts *o, int (*calls)(void *), void *arg);
void nt_forker_stop(const struct nt_opts *o);

/* ---- parsing and names ---- */
/* 0 and the value, or -1: a plain unsigned number (any base strtoull takes); a size with an
 * optional K, M or G suffix (powers of 1024, "KiB" and "KB" too); an int in [lo, hi]. */
int nt_parse_u64(const char *s, uint64_t *v);
int nt_parse_size(const char *s, uint64_t *v);
int nt_parse_int(const char *s, int lo, int hi, int *v);
const char *nt_role_name(enum nt_role r);
int nt_mode_parse(const char *name, enum nt_mode *m); /* --mode's names; -1 for none */
const char *nt_mode_name(enum nt_mode m);
const char *nt_mode_list(void);           /* every mode's name, comma-separated (a bad --mode's message) */
int nt_mode_is_lifecycle(enum nt_mode m); /* lifecycle.c, hostile.c, silent.c */
int nt_mode_is_scale(enum nt_mode m);     /* scale.c */

#endif
