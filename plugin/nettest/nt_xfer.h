/*
 * xfer.c: schedules, payload patterns and the windowed transfer engine (layer 3, nettest.h).
 */
#ifndef MPIB_NT_XFER_H
#define MPIB_NT_XFER_H

#include <stddef.h>
#include <stdint.h>

#include "nettest.h"
#include "nt_net.h"
#include "nt_oob.h"

enum nt_vlevel { NT_V_NONE = 0, NT_V_SAMPLED = 1, NT_V_FULL = 2 };

struct nt_group {
  int n;
  uint64_t first_msg;
  size_t sizes[NT_MAX_MULTI];
  int tags[NT_MAX_MULTI];
  int order[NT_MAX_MULTI]; /* sender's isend order (a permutation of 0..n-1) */
};

struct nt_sched {
  int random; /* random sizes in [0, max_size]; else fixed_size */
  size_t max_size, fixed_size;
  int k;               /* messages per group */
  uint64_t msgs_left;  /* UINT64_MAX: unbounded (time-bounded runs) */
  uint64_t bytes_left; /* used when by_bytes */
  int by_bytes;
  uint64_t next_msg;
  uint64_t rng;
};

void nt_sched_init(struct nt_sched *s, uint64_t seed, uint64_t stream, int k);
int nt_sched_next(struct nt_sched *s, struct nt_group *g);

struct nt_xfer {
  struct nt_net *net;
  struct nt_oob *oob;
  void *comm;
  void *mh;
  uint8_t *region;  /* window * k buffers, stride bytes apart, registered as mh */
  size_t slot_size; /* posted receive size (the largest message) */
  size_t stride;    /* slot_size rounded up to a page; the gap is canary too */
  int window;
  int k;
  enum nt_vlevel vlevel;
  int full_canary;
  uint64_t seed;
  double seconds; /* > 0: the receiver stops posting after this long and sends STOP */
  int timeout_s;  /* no-progress limit */
};

struct nt_stats {
  uint64_t msgs, bytes, groups;
  /* fault watch (always kept; printed as nettest-stall with --gap-ms, --stop-file or --ignore-peer-abort) */
  uint64_t nccl_errors; /* non-success returns of plugin calls in the engine */
  double error_at_ms;   /* unix ms of the first one, 0 when none */
  double last_done_ms;  /* unix ms of the last completed request (or of the start) */
  double max_gap_ms, max_gap_from_ms;
  uint64_t gaps; /* gaps of at least --gap-ms */
  double t0, t1;
  uint64_t mismatches;
  uint64_t flushes;
  int64_t max_rsize; /* receiver: the largest size test() reported (-1: none) */
  char first_err[512];
  int fatal; /* plugin error, stall or peer abort: the run cannot continue */
};

/* Fault-watch options of verify (main.c sets them; docs/nettest.md "Fault watch"). */
struct nt_watch {
  int enabled;           /* any of the options below was given */
  int gap_ms;            /* --gap-ms: print each gap between completions of at least this long */
  const char *stop_file; /* --stop-file: the receiver stops posting once this file exists */
  int ignore_peer;       /* --ignore-peer-abort: the data loop ignores the peer's ABORT / closed side channel */
  int idle_us;           /* --idle-us: sleep this long after a data-loop turn that moved nothing */
};
extern struct nt_watch nt_watch;

void nt_canary_fill(uint8_t *p, size_t len);
int nt_xfer_send(const struct nt_xfer *x, struct nt_sched *s, struct nt_stats *st);
int nt_xfer_recv(const struct nt_xfer *x, struct nt_sched *s, struct nt_stats *st);
int nt_xfer_final_canary(const struct nt_xfer *x, struct nt_stats *st);
void nt_stats_fail(struct nt_stats *st, int fatal, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void nt_pattern_fill_sampled(uint8_t *buf, size_t size, uint64_t seed, uint64_t msg, int tag);
int nt_pattern_check_sampled(const uint8_t *buf, size_t size, uint64_t seed, uint64_t msg, int tag, size_t *bad_off,
                             uint8_t *got, uint8_t *want);
int nt_wait_req(struct nt_net *net, struct nt_oob *oob, void *req, int *sizes, int timeout_s, const char *what,
                struct nt_stats *st);

#endif
