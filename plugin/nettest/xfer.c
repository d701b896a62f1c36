/*
 * Message schedules, payload patterns and the windowed transfer engine shared by the verify
 * and bw modes. Both sides generate the same schedule from (seed, stream) in the same order,
 * so sizes, tags and contents never travel over the side channel.
 *
 * Window rules (like NCCL's proxy): the receiver keeps up to `window` irecv requests posted
 * (each for a group of n <= k messages with distinct tags), the sender up to `window` groups
 * of isends; both test only the oldest outstanding group, in order. isend/irecv returning a
 * NULL request means "not now": the engine keeps testing and retries.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "nt_util.h"
#include "nt_xfer.h"

#define NT_CANARY 0xA5
#define NT_CANARY_NEAR 65536 /* bytes past the received size checked after every message */
#define NT_CANARY_FULL_EVERY 16
#define NT_SAMPLES 6
#define NT_PEEK_INTERVAL 0.005

static uint64_t nt_rng_next(uint64_t *s) {
  *s += 0x9e3779b97f4a7c15ULL;
  return nt_mix64(*s);
}

void nt_stats_fail(struct nt_stats *st, int fatal, const char *fmt, ...) {
  if (fatal) {
    st->fatal = 1;
  }
  if (st->first_err[0] != '\0') {
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(st->first_err, sizeof(st->first_err), fmt, ap);
  va_end(ap);
  nt_err("%s", st->first_err);
}

/* ---- fault watch: gaps between completions, plugin error returns (docs/nettest.md) ---- */

struct nt_watch nt_watch;

/* A plugin call returned rc != ncclSuccess: count it and print the moment at once. */
static void nt_plugin_error(struct nt_stats *st, const char *side, const char *call, int rc) {
  double now = nt_wall_ms();
  st->nccl_errors++;
  if (st->error_at_ms == 0) {
    st->error_at_ms = now;
  }
  nt_out("nettest-error: side=%s call=%s rc=%d at_ms=%.0f", side, call, rc, now);
}

static void nt_watch_start(struct nt_stats *st) { st->last_done_ms = nt_wall_ms(); }

/* A request completed: close the gap since the previous completion. */
static void nt_watch_done(struct nt_stats *st, const char *side) {
  double now = nt_wall_ms(), gap = now - st->last_done_ms;
  if (gap > st->max_gap_ms) {
    st->max_gap_ms = gap;
    st->max_gap_from_ms = st->last_done_ms;
  }
  if (nt_watch.gap_ms > 0 && gap >= nt_watch.gap_ms) {
    st->gaps++;
    nt_out("nettest-gap: side=%s from_ms=%.0f to_ms=%.0f gap_ms=%.0f", side, st->last_done_ms, now, gap);
  }
  st->last_done_ms = now;
}

/* End of a transfer: a failed run's open gap (last completion to now) counts too. */
static void nt_watch_end(struct nt_stats *st, const char *side, uint64_t completed) {
  double now = nt_wall_ms();
  if (st->fatal && now - st->last_done_ms > st->max_gap_ms) {
    st->max_gap_ms = now - st->last_done_ms;
    st->max_gap_from_ms = st->last_done_ms;
  }
  if (nt_watch.enabled) {
    nt_out("nettest-stall: side=%s max_gap_ms=%.0f max_gap_from_ms=%.0f gaps=%" PRIu64 " completed=%" PRIu64
           " nccl_errors=%" PRIu64 " error_at_ms=%.0f end_ms=%.0f fatal=%s",
           side, st->max_gap_ms, st->max_gap_from_ms, st->gaps, completed, st->nccl_errors,
           st->error_at_ms > 0 ? st->error_at_ms : -1.0, now, st->fatal ? "true" : "false");
  }
}

/* --stop-file: checked at most every 100 ms. */
static int nt_stop_file_seen(double *next_check) {
  if (nt_watch.stop_file == NULL) {
    return 0;
  }
  double now = nt_now();
  if (now < *next_check) {
    return 0;
  }
  *next_check = now + 0.1;
  return access(nt_watch.stop_file, F_OK) == 0;
}

/* ---- schedule ---- */

void nt_sched_init(struct nt_sched *s, uint64_t seed, uint64_t stream, int k) {
  memset(s, 0, sizeof(*s));
  s->rng = nt_mix64(seed ^ nt_mix64(stream + 1));
  s->k = k;
  s->msgs_left = UINT64_MAX;
  s->next_msg = stream << 40;
}

/* Weighted towards small sizes: 5% empty, 5% exactly max, else log-uniform over [1, max]. */
static size_t nt_rand_size(struct nt_sched *s) {
  size_t max = s->max_size;
  if (max == 0) {
    return 0;
  }
  uint64_t r = nt_rng_next(&s->rng);
  unsigned p = (unsigned)(r % 100);
  if (p < 5) {
    return 0;
  }
  if (p < 10) {
    return max;
  }
  int bits = 64 - __builtin_clzll((unsigned long long)max);
  int e = (int)(nt_rng_next(&s->rng) % (uint64_t)(bits + 1));
  size_t lo = e == 0 ? 1 : (size_t)1 << (e - 1);
  size_t hi = e == 0 ? 1 : (size_t)1 << e;
  if (hi > max) {
    hi = max;
  }
  if (lo > hi) {
    lo = hi;
  }
  return lo + (size_t)(nt_rng_next(&s->rng) % (uint64_t)(hi - lo + 1));
}

/* Next group of up to k messages; 0 when the schedule is exhausted. */
int nt_sched_next(struct nt_sched *s, struct nt_group *g) {
  if (s->msgs_left == 0 || (s->by_bytes && s->bytes_left == 0)) {
    return 0;
  }
  memset(g, 0, sizeof(*g));
  g->first_msg = s->next_msg;
  uint64_t tagbase = nt_rng_next(&s->rng) & 0xfffff;
  int n = 0;
  while (n < s->k && s->msgs_left > 0 && !(s->by_bytes && s->bytes_left == 0)) {
    size_t sz = s->random ? nt_rand_size(s) : s->fixed_size;
    g->sizes[n] = sz;
    g->tags[n] = (int)((tagbase << 3) | (uint64_t)n); /* distinct within the group */
    if (s->msgs_left != UINT64_MAX) {
      s->msgs_left--;
    }
    if (s->by_bytes) {
      s->bytes_left = sz >= s->bytes_left ? 0 : s->bytes_left - sz;
      if (sz == 0 && s->bytes_left > 0 && s->fixed_size == 0 && !s->random) {
        s->bytes_left = 0; /* fixed 0-byte messages never reach a byte total */
      }
    }
    n++;
  }
  g->n = n;
  s->next_msg += (uint64_t)n;
  for (int i = 0; i < n; i++) {
    g->order[i] = i;
  }
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(nt_rng_next(&s->rng) % (uint64_t)(i + 1));
    int t = g->order[i];
    g->order[i] = g->order[j];
    g->order[j] = t;
  }
  return 1;
}

/* ---- payload patterns: byte o of message (seed, msg, tag) is byte o%8 of word o/8 ---- */

static inline uint64_t nt_pat_base(uint64_t seed, uint64_t msg, int tag) {
  return nt_mix64(seed ^ nt_mix64(msg * 0x9e3779b97f4a7c15ULL + (uint64_t)(uint32_t)tag));
}

static inline uint64_t nt_pat_word(uint64_t base, uint64_t q) { return nt_mix64(base + q * 0xd1b54a32d192ed03ULL); }

static inline uint8_t nt_pat_byte(uint64_t base, size_t off) {
  uint64_t w = nt_pat_word(base, off / 8);
  uint8_t b[8];
  memcpy(b, &w, 8);
  return b[off % 8];
}

static void nt_pattern_fill(uint8_t *buf, size_t size, uint64_t seed, uint64_t msg, int tag) {
  uint64_t base = nt_pat_base(seed, msg, tag);
  size_t q = 0;
  for (; (q + 1) * 8 <= size; q++) {
    uint64_t w = nt_pat_word(base, q);
    memcpy(buf + q * 8, &w, 8);
  }
  for (size_t o = q * 8; o < size; o++) {
    buf[o] = nt_pat_byte(base, o);
  }
}

/* 0 when equal, else 1 with the first differing offset and bytes. */
static int nt_pattern_check(const uint8_t *buf, size_t size, uint64_t seed, uint64_t msg, int tag, size_t *bad_off,
                            uint8_t *got, uint8_t *want) {
  uint64_t base = nt_pat_base(seed, msg, tag);
  size_t q = 0;
  for (; (q + 1) * 8 <= size; q++) {
    uint64_t w = nt_pat_word(base, q), g;
    memcpy(&g, buf + q * 8, 8);
    if (g != w) {
      break;
    }
  }
  for (size_t o = q * 8; o < size; o++) {
    uint8_t e = nt_pat_byte(base, o);
    if (buf[o] != e) {
      *bad_off = o;
      *got = buf[o];
      *want = e;
      return 1;
    }
  }
  return 0;
}

static size_t nt_sample_off(uint64_t base, size_t size, int i) {
  switch (i) {
  case 0: return 0;
  case 1: return size - 1;
  case 2: return size / 2;
  default: return (size_t)(nt_mix64(base ^ (uint64_t)i) % size);
  }
}

void nt_pattern_fill_sampled(uint8_t *buf, size_t size, uint64_t seed, uint64_t msg, int tag) {
  if (size == 0) {
    return;
  }
  uint64_t base = nt_pat_base(seed, msg, tag);
  for (int i = 0; i < NT_SAMPLES; i++) {
    size_t o = nt_sample_off(base, size, i);
    buf[o] = nt_pat_byte(base, o);
  }
}

int nt_pattern_check_sampled(const uint8_t *buf, size_t size, uint64_t seed, uint64_t msg, int tag, size_t *bad_off,
                             uint8_t *got, uint8_t *want) {
  if (size == 0) {
    return 0;
  }
  uint64_t base = nt_pat_base(seed, msg, tag);
  for (int i = 0; i < NT_SAMPLES; i++) {
    size_t o = nt_sample_off(base, size, i);
    uint8_t e = nt_pat_byte(base, o);
    if (buf[o] != e) {
      *bad_off = o;
      *got = buf[o];
      *want = e;
      return 1;
    }
  }
  return 0;
}

void nt_canary_fill(uint8_t *p, size_t len) { memset(p, NT_CANARY, len); }

/* 0 when [p, p+len) is all canary, else 1 with the first touched offset. */
static int nt_canary_check(const uint8_t *p, size_t len, size_t *bad_off) {
  const uint64_t c = 0x0101010101010101ULL * NT_CANARY;
  size_t i = 0;
  while (i < len && ((uintptr_t)(p + i) & 7) != 0) {
    if (p[i] != NT_CANARY) {
      *bad_off = i;
      return 1;
    }
    i++;
  }
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    if (w != c) {
      break;
    }
  }
  for (; i < len; i++) {
    if (p[i] != NT_CANARY) {
      *bad_off = i;
      return 1;
    }
  }
  return 0;
}

/* ---- progress bookkeeping: stall detection and the peer's ABORT/STOP ---- */

struct nt_pacer {
  double last_progress;
  double next_peek;
  unsigned spins;
  int progressed; /* since the last check point */
  int idle;       /* this turn made no progress (--idle-us) */
  int peer_gone;
};

static void nt_pacer_init(struct nt_pacer *p) {
  memset(p, 0, sizeof(*p));
  p->last_progress = nt_now();
}

/* Called once per loop turn. Returns the peeked OOB message type (> 0) when one is waiting
 * at a check point, 0 otherwise, -1 when the run must stop (stall or peer gone). */
static int nt_pace(struct nt_pacer *p, struct nt_oob *oob, int timeout_s, struct nt_stats *st, const char *who,
                   uint64_t posted, uint64_t completed) {
  /* --idle-us: a turn that moved nothing sleeps, so that a polling loop leaves the CPU to the
   * soft-RoCE kernel threads and the lab's commands (the emulated lab has 2 CPUs). */
  if (nt_watch.idle_us > 0 && p->idle) usleep((useconds_t)nt_watch.idle_us);
  if (++p->spins % 128 != 0) {
    return 0;
  }
  double now = nt_now();
  if (p->progressed) {
    p->last_progress = now;
    p->progressed = 0;
    nt_heartbeat();
  }
  if (now - p->last_progress > timeout_s) {
    nt_stats_fail(st, 1, "%s: no progress for %d s (groups posted=%llu completed=%llu)", who, timeout_s,
                  (unsigned long long)posted, (unsigned long long)completed);
    return -1;
  }
  if (oob != NULL && now >= p->next_peek) {
    p->next_peek = now + NT_PEEK_INTERVAL;
    int t = nt_oob_peek(oob);
    if (t < 0 && nt_watch.ignore_peer) {
      if (!p->peer_gone) {
        p->peer_gone = 1;
        nt_err("%s: peer aborted or closed the side channel; ignored (--ignore-peer-abort)", who);
      }
      p->next_peek = 1e300; /* only the plugin or the stall limit ends the run now */
      return 0;
    }
    if (t < 0) {
      nt_stats_fail(st, 1, "%s: peer aborted or closed the side channel", who);
      return -1;
    }
    return t;
  }
  return 0;
}

/* Test one request until done, with the same stall and abort rules. */
int nt_wait_req(struct nt_net *net, struct nt_oob *oob, void *req, int *sizes, int timeout_s, const char *what,
                struct nt_stats *st) {
  struct nt_pacer p;
  nt_pacer_init(&p);
  int sz[NT_MAX_MULTI];
  if (sizes == NULL) {
    sizes = sz;
  }
  for (;;) {
    int done = 0;
    ncclResult_t rc = nt_net_test(net, req, &done, sizes);
    if (rc != ncclSuccess) {
      nt_plugin_error(st, what, "test", rc);
      nt_stats_fail(st, 1, "test(%s) failed: rc=%d", what, rc);
      return -1;
    }
    if (done) {
      return 0;
    }
    if (nt_pace(&p, oob, timeout_s, st, what, 0, 0) < 0) {
      return -1;
    }
  }
}

static inline uint8_t *nt_slot_buf(const struct nt_xfer *x, int slot, int j) {
  return x->region + ((size_t)slot * (size_t)x->k + (size_t)j) * x->stride;
}

/* ---- sender ---- */

struct nt_sslot {
  struct nt_group g;
  void *req[NT_MAX_MULTI];
  int done[NT_MAX_MULTI];
  int posted;
};

static void nt_prepare_send(const struct nt_xfer *x, int slot, const struct nt_group *g) {
  for (int j = 0; j < g->n; j++) {
    uint8_t *b = nt_slot_buf(x, slot, j);
    if (x->vlevel == NT_V_FULL) {
      nt_pattern_fill(b, g->sizes[j], x->seed, g->first_msg + (uint64_t)j, g->tags[j]);
    } else if (x->vlevel == NT_V_SAMPLED) {
      nt_pattern_fill_sampled(b, g->sizes[j], x->seed, g->first_msg + (uint64_t)j, g->tags[j]);
    }
  }
}

/* Issue the group's remaining isends in its shuffled order; stops at the first NULL request. */
static int nt_post_send(const struct nt_xfer *x, int slot, struct nt_sslot *s, struct nt_stats *st, int *progressed) {
  while (s->posted < s->g.n) {
    int j = s->g.order[s->posted];
    void *req = NULL;
    ncclResult_t rc = nt_net_isend(x->net, x->comm, nt_slot_buf(x, slot, j), s->g.sizes[j], s->g.tags[j], x->mh, &req);
    if (rc != ncclSuccess) {
      nt_plugin_error(st, "send", "isend", rc);
      nt_stats_fail(st, 1, "isend(msg=%llu size=%zu tag=%d) failed: rc=%d",
                    (unsigned long long)(s->g.first_msg + (uint64_t)j), s->g.sizes[j], s->g.tags[j], rc);
      return -1;
    }
    if (req == NULL) {
      return 0;
    }
    s->req[j] = req;
    s->done[j] = 0;
    s->posted++;
    *progressed = 1;
  }
  return 0;
}

/* 1 when every request of the group is done. */
static int nt_test_send(const struct nt_xfer *x, struct nt_sslot *s, struct nt_stats *st) {
  int all = 1;
  for (int j = 0; j < s->g.n; j++) {
    if (s->done[j]) {
      continue;
    }
    int done = 0, sizes[NT_MAX_MULTI];
    ncclResult_t rc = nt_net_test(x->net, s->req[j], &done, sizes);
    if (rc != ncclSuccess) {
      nt_plugin_error(st, "send", "test", rc);
      nt_stats_fail(st, 1, "test(send msg=%llu) failed: rc=%d", (unsigned long long)(s->g.first_msg + (uint64_t)j), rc);
      return -1;
    }
    if (!done) {
      all = 0;
      break; /* in order, like NCCL */
    }
    s->done[j] = 1;
  }
  return all;
}

int nt_xfer_send(const struct nt_xfer *x, struct nt_sched *sch, struct nt_stats *st) {
  struct nt_sslot slots[NT_MAX_WINDOW];
  int head = 0, tail = 0, outstanding = 0, cur_open = 0, sched_done = 0;
  uint64_t limit = UINT64_MAX, started = 0, completed = 0;
  struct nt_pacer p;
  nt_pacer_init(&p);
  st->t0 = nt_now();
  st->t1 = st->t0;
  nt_watch_start(st);
  for (;;) {
    int progressed = 0;
    if (!cur_open && !sched_done && outstanding < x->window && started < limit) {
      if (nt_sched_next(sch, &slots[tail].g)) {
        nt_prepare_send(x, tail, &slots[tail].g);
        slots[tail].posted = 0;
        cur_open = 1;
        started++;
      } else {
        sched_done = 1;
      }
    }
    if (cur_open) {
      if (nt_post_send(x, tail, &slots[tail], st, &progressed) != 0) {
        break;
      }
      if (slots[tail].posted == slots[tail].g.n) {
        cur_open = 0;
        tail = (tail + 1) % x->window;
        outstanding++;
      }
    }
    if (outstanding > 0) {
      int r = nt_test_send(x, &slots[head], st);
      if (r < 0) {
        break;
      }
      if (r == 1) {
        for (int j = 0; j < slots[head].g.n; j++) {
          st->bytes += slots[head].g.sizes[j];
        }
        st->msgs += (uint64_t)slots[head].g.n;
        st->groups++;
        completed++;
        st->t1 = nt_now();
        nt_watch_done(st, "send");
        head = (head + 1) % x->window;
        outstanding--;
        progressed = 1;
      }
    }
    if ((sched_done || started >= limit) && !cur_open && outstanding == 0) {
      break;
    }
    p.progressed |= progressed;
    p.idle = !progressed;
    int t = nt_pace(&p, x->oob, x->timeout_s, st, "sender", started, completed);
    if (t < 0) {
      break;
    }
    if (t == NT_MSG_STOP && (x->seconds > 0 || nt_watch.stop_file != NULL) && limit == UINT64_MAX) {
      uint8_t b[8];
      uint32_t len = 0;
      if (nt_oob_recv(x->oob, NT_MSG_STOP, b, sizeof(b), &len, x->timeout_s) != 0 || len != 8) {
        nt_stats_fail(st, 1, "sender: bad STOP message");
        break;
      }
      limit = 0;
      for (int i = 0; i < 8; i++) {
        limit = (limit << 8) | b[i];
      }
      /* A group started past the receiver's last post cannot have an isend accepted: no CTS. */
      if (cur_open && started > limit) {
        if (slots[tail].posted > 0) {
          nt_stats_fail(st, 1, "sender: isend accepted for group %llu beyond the receiver's %llu posted",
                        (unsigned long long)started, (unsigned long long)limit);
          break;
        }
        cur_open = 0;
        started--;
      }
      if (started > limit) {
        nt_stats_fail(st, 1, "sender: %llu groups sent but receiver posted only %llu", (unsigned long long)started,
                      (unsigned long long)limit);
        break;
      }
    }
  }
  nt_watch_end(st, "send", completed);
  return st->fatal ? -1 : 0;
}

/* ---- receiver ---- */

struct nt_rslot {
  struct nt_group g;
  void *req;
};

static void nt_check_msg(const struct nt_xfer *x, const struct nt_group *g, int j, int rsize, uint8_t *b,
                         struct nt_stats *st) {
  uint64_t msg = g->first_msg + (uint64_t)j;
  size_t es = g->sizes[j];
  int bad = 0;
  if (rsize < 0 || (size_t)rsize != es) {
    nt_stats_fail(st, 0, "msg=%llu tag=%d: received size %d, sent size %zu", (unsigned long long)msg, g->tags[j], rsize,
                  es);
    bad = 1;
  }
  size_t rs = rsize < 0 ? 0 : (size_t)rsize;
  if (rs > x->slot_size) {
    rs = x->slot_size;
  }
  size_t cmp = rs < es ? rs : es;
  size_t off = 0;
  uint8_t got = 0, want = 0;
  if (x->vlevel == NT_V_FULL) {
    if (nt_pattern_check(b, cmp, x->seed, msg, g->tags[j], &off, &got, &want)) {
      nt_stats_fail(st, 0, "msg=%llu tag=%d size=%zu: first mismatch at offset %zu: got 0x%02x expected 0x%02x",
                    (unsigned long long)msg, g->tags[j], es, off, got, want);
      bad = 1;
    }
    int full = x->full_canary || msg % NT_CANARY_FULL_EVERY == 0;
    size_t clen = x->stride - rs;
    if (!full && clen > NT_CANARY_NEAR) {
      clen = NT_CANARY_NEAR;
    }
    if (nt_canary_check(b + rs, clen, &off)) {
      nt_stats_fail(st, 0,
                    "msg=%llu tag=%d size=%zu: byte at offset %zu past the received size was overwritten "
                    "(0x%02x, canary 0x%02x)",
                    (unsigned long long)msg, g->tags[j], es, rs + off, b[rs + off], NT_CANARY);
      bad = 1;
    }
    nt_canary_fill(b, bad ? x->stride : rs);
  } else if (x->vlevel == NT_V_SAMPLED) {
    if (nt_pattern_check_sampled(b, cmp, x->seed, msg, g->tags[j], &off, &got, &want)) {
      nt_stats_fail(st, 0, "msg=%llu tag=%d size=%zu: sampled byte at offset %zu: got 0x%02x expected 0x%02x",
                    (unsigned long long)msg, g->tags[j], es, off, got, want);
      bad = 1;
    }
  }
  if (bad) {
    st->mismatches++;
  }
}

/* NCCL flushes a completed receive before the data is consumed; so do we, every time. */
static int nt_flush(const struct nt_xfer *x, int slot, const struct nt_group *g, int *rsizes, struct nt_stats *st) {
  if (!nt_net_has_iflush(x->net)) {
    return 0;
  }
  void *data[NT_MAX_MULTI], *mhs[NT_MAX_MULTI];
  for (int j = 0; j < g->n; j++) {
    data[j] = nt_slot_buf(x, slot, j);
    mhs[j] = x->mh;
  }
  void *req = NULL;
  ncclResult_t rc = nt_net_iflush(x->net, x->comm, g->n, data, rsizes, mhs, &req);
  if (rc != ncclSuccess) {
    nt_plugin_error(st, "recv", "iflush", rc);
    nt_stats_fail(st, 1, "iflush(msg=%llu) failed: rc=%d", (unsigned long long)g->first_msg, rc);
    return -1;
  }
  if (req != NULL) {
    st->flushes++;
    return nt_wait_req(x->net, x->oob, req, NULL, x->timeout_s, "flush", st);
  }
  return 0;
}

static int nt_post_recv(const struct nt_xfer *x, int slot, struct nt_rslot *s, struct nt_stats *st) {
  void *data[NT_MAX_MULTI], *mhs[NT_MAX_MULTI];
  size_t sizes[NT_MAX_MULTI];
  for (int j = 0; j < s->g.n; j++) {
    data[j] = nt_slot_buf(x, slot, j);
    mhs[j] = x->mh;
    sizes[j] = x->slot_size; /* posted size: the largest message, not this one */
  }
  s->req = NULL;
  ncclResult_t rc = nt_net_irecv(x->net, x->comm, s->g.n, data, sizes, s->g.tags, mhs, &s->req);
  if (rc != ncclSuccess) {
    nt_plugin_error(st, "recv", "irecv", rc);
    nt_stats_fail(st, 1, "irecv(n=%d first_msg=%llu) failed: rc=%d", s->g.n, (unsigned long long)s->g.first_msg, rc);
    return -1;
  }
  return 0;
}

int nt_xfer_recv(const struct nt_xfer *x, struct nt_sched *sch, struct nt_stats *st) {
  struct nt_rslot slots[NT_MAX_WINDOW];
  int head = 0, tail = 0, outstanding = 0, pending = 0, sched_done = 0, stopped = 0;
  uint64_t posted = 0, completed = 0;
  struct nt_pacer p;
  nt_pacer_init(&p);
  st->t0 = 0;
  double next_stop_check = 0;
  nt_watch_start(st);
  for (;;) {
    int progressed = 0;
    if (!sched_done && !stopped && outstanding < x->window) {
      if (posted > 0 && ((x->seconds > 0 && nt_now() - st->t0 >= x->seconds) || nt_stop_file_seen(&next_stop_check))) {
        uint8_t b[8];
        for (int i = 0; i < 8; i++) {
          b[i] = (uint8_t)(posted >> (56 - 8 * i));
        }
        if (nt_oob_send(x->oob, NT_MSG_STOP, b, 8) != 0) {
          nt_stats_fail(st, 1, "receiver: cannot send STOP to the sender");
          break;
        }
        stopped = 1;
        pending = 0;
      } else {
        if (!pending) {
          if (nt_sched_next(sch, &slots[tail].g)) {
            pending = 1;
          } else {
            sched_done = 1;
          }
        }
        if (pending) {
          double t = nt_now();
          if (nt_post_recv(x, tail, &slots[tail], st) != 0) {
            break;
          }
          if (slots[tail].req != NULL) {
            if (posted == 0) {
              st->t0 = t;
            }
            posted++;
            pending = 0;
            tail = (tail + 1) % x->window;
            outstanding++;
            progressed = 1;
          }
        }
      }
    }
    if (outstanding > 0) {
      struct nt_rslot *s = &slots[head];
      int done = 0, rsizes[NT_MAX_MULTI];
      for (int j = 0; j < NT_MAX_MULTI; j++) {
        rsizes[j] = -1;
      }
      ncclResult_t rc = nt_net_test(x->net, s->req, &done, rsizes);
      if (rc != ncclSuccess) {
        nt_plugin_error(st, "recv", "test", rc);
        nt_stats_fail(st, 1, "test(recv first_msg=%llu) failed: rc=%d", (unsigned long long)s->g.first_msg, rc);
        break;
      }
      if (done) {
        st->t1 = nt_now();
        if (nt_flush(x, head, &s->g, rsizes, st) != 0) {
          break;
        }
        for (int j = 0; j < s->g.n; j++) {
          nt_check_msg(x, &s->g, j, rsizes[j], nt_slot_buf(x, head, j), st);
          st->bytes += rsizes[j] > 0 ? (uint64_t)rsizes[j] : 0;
          if (rsizes[j] > st->max_rsize) st->max_rsize = rsizes[j];
        }
        st->msgs += (uint64_t)s->g.n;
        st->groups++;
        completed++;
        nt_watch_done(st, "recv");
        head = (head + 1) % x->window;
        outstanding--;
        progressed = 1;
      }
    }
    if ((sched_done || stopped) && !pending && outstanding == 0) {
      break;
    }
    p.progressed |= progressed;
    p.idle = !progressed;
    if (nt_pace(&p, x->oob, x->timeout_s, st, "receiver", posted, completed) < 0) {
      break;
    }
  }
  if (st->t0 == 0) {
    st->t0 = st->t1 = nt_now();
  }
  nt_watch_end(st, "recv", completed);
  return st->fatal ? -1 : 0;
}

/* After a verify run every receive buffer must be canary again from end to end. */
int nt_xfer_final_canary(const struct nt_xfer *x, struct nt_stats *st) {
  for (int s = 0; s < x->window; s++) {
    for (int j = 0; j < x->k; j++) {
      size_t off;
      if (nt_canary_check(nt_slot_buf(x, s, j), x->stride, &off)) {
        nt_stats_fail(st, 0, "receive buffer slot=%d part=%d: byte at offset %zu written outside any message", s, j,
                      off);
        st->mismatches++;
        return -1;
      }
    }
  }
  return 0;
}
