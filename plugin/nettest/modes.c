/*
 * The data modes. Direction: the client sends and the server receives (verify, bw); lat is a
 * ping-pong client -> server -> client. Buffers are page-aligned host memory registered with
 * regMr(NCCL_PTR_HOST) on the comm that uses them.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nt_data.h"
#include "nt_modes.h"
#include "nt_util.h"

/* ---- verify: data.c's run, which other modes follow their setup with too ---- */

int nt_mode_verify(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  return nt_verify_run(o, n, oob, c);
}

/* ---- bw ---- */

int nt_mode_bw(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  int sender = o->role == NT_CLIENT;
  size_t maxsz = 0;
  for (int i = 0; i < o->nsizes; i++) {
    maxsz = o->sizes[i] > maxsz ? o->sizes[i] : maxsz;
  }
  struct nt_xfer x = {.net = n,
                      .oob = oob,
                      .k = o->multi,
                      .vlevel = o->verify ? NT_V_SAMPLED : NT_V_NONE,
                      .seed = o->seed,
                      .timeout_s = o->timeout_s};
  x.slot_size = maxsz ? maxsz : 64;
  x.stride = nt_round_page(x.slot_size);
  x.window = nt_plan_window(o, x.stride);
  x.comm = sender ? c->scomm : c->rcomm;
  struct nt_region r;
  if (nt_region_setup(n, x.comm, x.stride * (size_t)x.k * (size_t)x.window, &r) != 0) {
    nt_oob_abort(oob, "%s: buffer registration failed", nt_role_name(o->role));
    return NT_EXIT_FAIL;
  }
  x.region = r.p;
  x.mh = r.mh;
  uint64_t tot_msgs = 0, tot_bytes = 0;
  double tot_secs = 0;
  int verified = 1, ret = NT_EXIT_FAIL;
  for (int i = 0; i < o->nsizes; i++) {
    char label[64];
    struct nt_stats st;
    struct nt_sched s;
    snprintf(label, sizeof(label), "bw-size-%d", i);
    if (nt_oob_sync(oob, label, o->timeout_s) != 0) {
      goto out;
    }
    if (o->warmup > 0) {
      nt_sched_init(&s, o->seed, 1000 + (uint64_t)i, o->multi);
      s.fixed_size = o->sizes[i];
      s.msgs_left = o->warmup * (uint64_t)o->multi;
      memset(&st, 0, sizeof(st));
      x.seconds = 0;
      if (sender) {
        nt_xfer_send(&x, &s, &st);
      } else {
        st.max_rsize = -1;
        nt_xfer_recv(&x, &s, &st);
        /* What the plugin told NCCL against what it posted: never more (a peer's word is no bound). */
        nt_out("nettest-sizes: role=%s reported_bytes_max=%lld posted_bytes=%zu", nt_role_name(o->role),
               (long long)st.max_rsize, x.slot_size);
      }
      if (st.fatal) {
        nt_oob_abort(oob, "%s: warmup of size %zu: %s", nt_role_name(o->role), o->sizes[i], st.first_err);
        goto out;
      }
      verified &= st.mismatches == 0;
      snprintf(label, sizeof(label), "bw-run-%d", i);
      if (nt_oob_sync(oob, label, o->timeout_s) != 0) {
        goto out;
      }
    }
    nt_sched_init(&s, o->seed, 1 + (uint64_t)i, o->multi);
    s.fixed_size = o->sizes[i];
    if (o->seconds > 0) {
      x.seconds = o->seconds;
    } else {
      x.seconds = 0;
      s.msgs_left = o->iters * (uint64_t)o->multi;
    }
    memset(&st, 0, sizeof(st));
    if (sender) {
      nt_xfer_send(&x, &s, &st);
    } else {
      st.max_rsize = -1;
      nt_xfer_recv(&x, &s, &st);
      /* What the plugin told NCCL against what it posted: never more (a peer's word is no bound). */
      nt_out("nettest-sizes: role=%s reported_bytes_max=%lld posted_bytes=%zu", nt_role_name(o->role),
             (long long)st.max_rsize, x.slot_size);
    }
    if (st.fatal) {
      nt_oob_abort(oob, "%s: size %zu: %s", nt_role_name(o->role), o->sizes[i], st.first_err);
      goto out;
    }
    double secs = st.t1 - st.t0;
    struct nt_peer_result pr = {.verified = st.mismatches == 0,
                                .msgs = st.msgs,
                                .bytes = st.bytes,
                                .iters = st.groups,
                                .mismatches = st.mismatches,
                                .seconds = secs};
    int ok = st.mismatches == 0;
    if (sender) {
      if (nt_recv_result(oob, o->timeout_s, &pr) != 0) {
        goto out;
      }
      ok = pr.verified && pr.msgs == st.msgs && pr.bytes == st.bytes;
      if (!ok) {
        nt_err("size %zu: receiver reported verified=%d messages=%" PRIu64 " bytes=%" PRIu64 " (sender: %" PRIu64
               " / %" PRIu64 ")",
               o->sizes[i], pr.verified, pr.msgs, pr.bytes, st.msgs, st.bytes);
      }
      nt_out("nettest-bw: size=%zu iters=%" PRIu64 " seconds=%.6f mbps=%.3f role=client rx_mbps=%.3f verified=%s",
             o->sizes[i], st.groups, secs, nt_mbps(st.bytes, secs), nt_mbps(pr.bytes, pr.seconds),
             ok ? "true" : "false");
    } else {
      if (nt_send_result(oob, &pr) != 0) {
        goto out;
      }
      nt_out("nettest-bw: size=%zu iters=%" PRIu64 " seconds=%.6f mbps=%.3f role=server verified=%s", o->sizes[i],
             st.groups, secs, nt_mbps(st.bytes, secs), ok ? "true" : "false");
    }
    verified &= ok;
    tot_msgs += st.msgs;
    tot_bytes += st.bytes;
    tot_secs += secs;
  }
  char extra[96];
  snprintf(extra, sizeof(extra), "sizes=%d window=%d multi=%d sampled_verify=%s", o->nsizes, x.window, x.k,
           o->verify ? "on" : "off");
  ret = nt_result_line(o, tot_msgs, tot_bytes, verified, tot_secs, extra);
out:
  if (nt_region_free(n, &r) != 0 && ret == NT_EXIT_OK) {
    ret = NT_EXIT_FAIL;
  }
  return ret;
}

/* ---- lat ---- */

#define NT_TAG_PING 0x11
#define NT_TAG_PONG 0x22

static int nt_post_isend(struct nt_net *n, struct nt_oob *oob, void *comm, void *buf, size_t size, int tag, void *mh,
                         int timeout_s, void **req, struct nt_stats *st) {
  double deadline = nt_now() + timeout_s;
  unsigned spins = 0;
  for (;;) {
    *req = NULL;
    ncclResult_t rc = nt_net_isend(n, comm, buf, size, tag, mh, req);
    if (rc != ncclSuccess) {
      nt_stats_fail(st, 1, "isend(size=%zu) failed: rc=%d", size, rc);
      return -1;
    }
    if (*req != NULL) {
      return 0;
    }
    if (++spins % 1024 == 0) {
      nt_heartbeat();
      if (nt_now() > deadline) {
        nt_stats_fail(st, 1, "isend(size=%zu) not accepted within %d s (no receive posted by the peer?)", size,
                      timeout_s);
        return -1;
      }
      if (nt_oob_peek(oob) < 0) {
        nt_stats_fail(st, 1, "peer aborted or closed the side channel");
        return -1;
      }
    }
  }
}

static int nt_post_irecv(struct nt_net *n, void *comm, void *buf, size_t size, int tag, void *mh, int timeout_s,
                         void **req, struct nt_stats *st) {
  double deadline = nt_now() + timeout_s;
  for (;;) {
    *req = NULL;
    void *data[1] = {buf}, *mhs[1] = {mh};
    size_t sizes[1] = {size};
    int tags[1] = {tag};
    ncclResult_t rc = nt_net_irecv(n, comm, 1, data, sizes, tags, mhs, req);
    if (rc != ncclSuccess) {
      nt_stats_fail(st, 1, "irecv(size=%zu) failed: rc=%d", size, rc);
      return -1;
    }
    if (*req != NULL) {
      return 0;
    }
    if (nt_now() > deadline) {
      nt_stats_fail(st, 1, "irecv(size=%zu) not accepted within %d s", size, timeout_s);
      return -1;
    }
  }
}

/* Test a send and a receive together until both are done (either may be NULL). */
static int nt_wait_pair(struct nt_net *n, struct nt_oob *oob, void *sreq, void *rreq, int *rsize, int timeout_s,
                        struct nt_stats *st) {
  double deadline = nt_now() + timeout_s;
  unsigned spins = 0;
  int sdone = sreq == NULL, rdone = rreq == NULL;
  while (!sdone || !rdone) {
    int sizes[NT_MAX_MULTI] = {-1};
    ncclResult_t rc;
    if (!sdone && (rc = nt_net_test(n, sreq, &sdone, sizes)) != ncclSuccess) {
      nt_stats_fail(st, 1, "test(send) failed: rc=%d", rc);
      return -1;
    }
    sizes[0] = -1;
    if (!rdone && (rc = nt_net_test(n, rreq, &rdone, sizes)) != ncclSuccess) {
      nt_stats_fail(st, 1, "test(recv) failed: rc=%d", rc);
      return -1;
    }
    if (rreq != NULL && rdone && rsize != NULL && *rsize < 0) {
      *rsize = sizes[0];
    }
    if (++spins % 1024 == 0) {
      nt_heartbeat();
      if (nt_now() > deadline) {
        nt_stats_fail(st, 1, "ping-pong: no completion within %d s (send done=%d recv done=%d)", timeout_s, sdone,
                      rdone);
        return -1;
      }
      if (nt_oob_peek(oob) < 0) {
        nt_stats_fail(st, 1, "peer aborted or closed the side channel");
        return -1;
      }
    }
  }
  return 0;
}

static void nt_lat_check(struct nt_opts *o, const uint8_t *buf, size_t size, int rsize, uint64_t msg, int tag,
                         struct nt_stats *st) {
  size_t off = 0;
  uint8_t got = 0, want = 0;
  if (rsize < 0 || (size_t)rsize != size) {
    nt_stats_fail(st, 0, "msg=%" PRIu64 ": received size %d, sent size %zu", msg, rsize, size);
    st->mismatches++;
  } else if (o->verify && nt_pattern_check_sampled(buf, size, o->seed, msg, tag, &off, &got, &want)) {
    nt_stats_fail(st, 0, "msg=%" PRIu64 " size=%zu: sampled byte at offset %zu: got 0x%02x expected 0x%02x", msg, size,
                  off, got, want);
    st->mismatches++;
  }
}

static int nt_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double nt_pct(const double *v, uint64_t n, double q) {
  if (n == 0) {
    return 0;
  }
  uint64_t i = (uint64_t)(q * (double)n + 0.999999);
  i = i == 0 ? 0 : i - 1;
  return v[i < n ? i : n - 1];
}

/* --prepost: one size of ping-pong as NCCL's proxy runs its steps. Each side keeps W = --window
 * receives posted ahead in W buffers (slot i % W for message i), and reposts a slot as soon as
 * its message is checked: the server posts the receive for ping i+W before it sends pong i.
 * So the CTS for every message left long before the message is sent, and a round trip is one
 * data write each way. The receives are tested oldest first. */
static int nt_lat_size_prepost(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c,
                               struct nt_region *sr, struct nt_region *rr, size_t stride, int si, double *rtt,
                               struct nt_stats *st) {
  size_t size = o->sizes[si];
  uint64_t total = o->warmup + o->iters, base = (uint64_t)si << 40;
  uint64_t w = (uint64_t)o->window < total ? (uint64_t)o->window : total;
  int client = o->role == NT_CLIENT;
  int rtag = client ? NT_TAG_PONG : NT_TAG_PING, stag = client ? NT_TAG_PING : NT_TAG_PONG;
  void *rreq[NT_MAX_WINDOW] = {0}, *sreq = NULL;
  for (uint64_t j = 0; j < w; j++) {
    if (nt_post_irecv(n, c->rcomm, rr->p + j * stride, size, rtag, rr->mh, o->timeout_s, &rreq[j], st) != 0) {
      return -1;
    }
  }
  for (uint64_t i = 0; i < total; i++) {
    int rsize = -1;
    uint8_t *rb = rr->p + (i % w) * stride;
    double t0 = nt_now(), t1;
    if (client) {
      if (o->verify) {
        nt_pattern_fill_sampled(sr->p, size, o->seed, base + i, NT_TAG_PING);
      }
      t0 = nt_now();
      if (nt_post_isend(n, oob, c->scomm, sr->p, size, stag, sr->mh, o->timeout_s, &sreq, st) != 0 ||
          nt_wait_pair(n, oob, sreq, rreq[i % w], &rsize, o->timeout_s, st) != 0) {
        return -1;
      }
      t1 = nt_now();
    } else {
      if (nt_wait_pair(n, oob, NULL, rreq[i % w], &rsize, o->timeout_s, st) != 0) {
        return -1;
      }
      t1 = nt_now();
    }
    rreq[i % w] = NULL;
    nt_lat_check(o, rb, size, rsize, base + i, rtag, st);
    if (i >= o->warmup) {
      if (client) {
        rtt[i - o->warmup] = (t1 - t0) * 1e6;
      }
      st->msgs++;
      st->bytes += (uint64_t)(rsize > 0 ? rsize : 0);
      if (i == o->warmup) {
        st->t0 = client ? t0 : t1;
      }
      st->t1 = t1;
    }
    /* The slot is checked: post it again for message i + W, before this side sends. */
    if (i + w < total && nt_post_irecv(n, c->rcomm, rb, size, rtag, rr->mh, o->timeout_s, &rreq[i % w], st) != 0) {
      return -1;
    }
    if (!client) {
      if (o->verify) {
        nt_pattern_fill_sampled(sr->p, size, o->seed, base + i, NT_TAG_PONG);
      }
      if (nt_post_isend(n, oob, c->scomm, sr->p, size, stag, sr->mh, o->timeout_s, &sreq, st) != 0 ||
          nt_wait_pair(n, oob, sreq, NULL, NULL, o->timeout_s, st) != 0) {
        return -1;
      }
    }
  }
  return 0;
}

/* One size of ping-pong. Message index i of this size is (size index << 40) + i on both sides. */
static int nt_lat_size(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c, struct nt_region *sr,
                       struct nt_region *rr, int si, double *rtt, struct nt_stats *st) {
  size_t size = o->sizes[si];
  uint64_t total = o->warmup + o->iters, base = (uint64_t)si << 40;
  void *sreq = NULL, *rreq = NULL;
  if (o->role == NT_CLIENT) {
    for (uint64_t i = 0; i < total; i++) {
      int rsize = -1;
      if (o->verify) {
        nt_pattern_fill_sampled(sr->p, size, o->seed, base + i, NT_TAG_PING);
      }
      if (nt_post_irecv(n, c->rcomm, rr->p, size, NT_TAG_PONG, rr->mh, o->timeout_s, &rreq, st) != 0) {
        return -1;
      }
      double t0 = nt_now();
      if (nt_post_isend(n, oob, c->scomm, sr->p, size, NT_TAG_PING, sr->mh, o->timeout_s, &sreq, st) != 0 ||
          nt_wait_pair(n, oob, sreq, rreq, &rsize, o->timeout_s, st) != 0) {
        return -1;
      }
      double t1 = nt_now();
      nt_lat_check(o, rr->p, size, rsize, base + i, NT_TAG_PONG, st);
      if (i >= o->warmup) {
        rtt[i - o->warmup] = (t1 - t0) * 1e6;
        st->msgs++;
        st->bytes += (uint64_t)(rsize > 0 ? rsize : 0);
        if (i == o->warmup) {
          st->t0 = t0;
        }
        st->t1 = t1;
      }
    }
    return 0;
  }
  if (nt_post_irecv(n, c->rcomm, rr->p, size, NT_TAG_PING, rr->mh, o->timeout_s, &rreq, st) != 0) {
    return -1;
  }
  for (uint64_t i = 0; i < total; i++) {
    int rsize = -1;
    if (nt_wait_pair(n, oob, NULL, rreq, &rsize, o->timeout_s, st) != 0) {
      return -1;
    }
    double t1 = nt_now();
    nt_lat_check(o, rr->p, size, rsize, base + i, NT_TAG_PING, st);
    if (i >= o->warmup) {
      st->msgs++;
      st->bytes += (uint64_t)(rsize > 0 ? rsize : 0);
      if (i == o->warmup) {
        st->t0 = t1;
      }
      st->t1 = t1;
    }
    if (o->verify) {
      nt_pattern_fill_sampled(sr->p, size, o->seed, base + i, NT_TAG_PONG);
    }
    /* The pong goes out before the next ping's receive is posted: the client waits on the
     * pong, while the CTS for the next ping only has to beat the client's next isend.
     * Receive buffer reuse is safe: the next ping cannot land before that CTS exists. */
    if (nt_post_isend(n, oob, c->scomm, sr->p, size, NT_TAG_PONG, sr->mh, o->timeout_s, &sreq, st) != 0) {
      return -1;
    }
    if (i + 1 < total && nt_post_irecv(n, c->rcomm, rr->p, size, NT_TAG_PING, rr->mh, o->timeout_s, &rreq, st) != 0) {
      return -1;
    }
    if (nt_wait_pair(n, oob, sreq, NULL, NULL, o->timeout_s, st) != 0) {
      return -1;
    }
  }
  return 0;
}

int nt_mode_lat(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  size_t maxsz = 0;
  for (int i = 0; i < o->nsizes; i++) {
    maxsz = o->sizes[i] > maxsz ? o->sizes[i] : maxsz;
  }
  struct nt_region sr, rr;
  memset(&rr, 0, sizeof(rr));
  /* --prepost: --window receive buffers, a page apart at least */
  size_t stride = nt_round_page(maxsz ? maxsz : 1), rlen = o->prepost ? stride * (size_t)o->window : maxsz;
  if (nt_region_setup(n, c->scomm, maxsz, &sr) != 0 || nt_region_setup(n, c->rcomm, rlen, &rr) != 0) {
    nt_oob_abort(oob, "%s: buffer registration failed", nt_role_name(o->role));
    if (sr.p != NULL) {
      nt_region_free(n, &sr);
    }
    return NT_EXIT_FAIL;
  }
  double *rtt = calloc(o->iters ? o->iters : 1, sizeof(double));
  uint64_t tot_msgs = 0, tot_bytes = 0, mismatches = 0;
  double tot_secs = 0;
  int ret = NT_EXIT_FAIL, verified = 1;
  if (rtt == NULL) {
    nt_err("out of memory for %" PRIu64 " latency samples", o->iters);
    goto out;
  }
  for (int si = 0; si < o->nsizes; si++) {
    char label[64];
    struct nt_stats st;
    memset(&st, 0, sizeof(st));
    snprintf(label, sizeof(label), "lat-size-%d", si);
    if (nt_oob_sync(oob, label, o->timeout_s) != 0) {
      goto out;
    }
    if ((o->prepost ? nt_lat_size_prepost(o, n, oob, c, &sr, &rr, stride, si, rtt, &st)
                    : nt_lat_size(o, n, oob, c, &sr, &rr, si, rtt, &st)) != 0) {
      nt_oob_abort(oob, "%s: size %zu: %s", nt_role_name(o->role), o->sizes[si], st.first_err);
      goto out;
    }
    /* Peer's view: the server reports what it received, so the client can fail on it. */
    struct nt_peer_result pr = {.verified = st.mismatches == 0,
                                .msgs = st.msgs,
                                .bytes = st.bytes,
                                .iters = o->iters,
                                .mismatches = st.mismatches,
                                .seconds = st.t1 - st.t0};
    int ok = st.mismatches == 0;
    if (o->role == NT_SERVER) {
      if (nt_send_result(oob, &pr) != 0) {
        goto out;
      }
    } else {
      if (nt_recv_result(oob, o->timeout_s, &pr) != 0) {
        goto out;
      }
      ok &= pr.verified;
      uint64_t m = o->iters;
      double sum = 0;
      for (uint64_t i = 0; i < m; i++) {
        sum += rtt[i];
      }
      qsort(rtt, m, sizeof(double), nt_cmp_double);
      double avg = m ? sum / (double)m : 0;
      nt_out("nettest-lat: size=%zu iters=%" PRIu64 " avg_us=%.3f p50_us=%.3f p99_us=%.3f rtt_avg_us=%.3f "
             "rtt_p50_us=%.3f rtt_p99_us=%.3f rtt_min_us=%.3f rtt_max_us=%.3f role=client verified=%s prepost=%s",
             o->sizes[si], m, avg / 2, nt_pct(rtt, m, 0.5) / 2, nt_pct(rtt, m, 0.99) / 2, avg, nt_pct(rtt, m, 0.5),
             nt_pct(rtt, m, 0.99), m ? rtt[0] : 0.0, m ? rtt[m - 1] : 0.0, ok ? "true" : "false",
             o->prepost ? "true" : "false");
    }
    verified &= ok;
    mismatches += st.mismatches;
    tot_msgs += st.msgs;
    tot_bytes += st.bytes;
    tot_secs += st.t1 - st.t0;
  }
  char extra[64];
  snprintf(extra, sizeof(extra), "mismatches=%" PRIu64 " sizes=%d", mismatches, o->nsizes);
  ret = nt_result_line(o, tot_msgs, tot_bytes, verified, tot_secs, extra);
out:
  free(rtt);
  if (nt_region_free(n, &sr) != 0 || nt_region_free(n, &rr) != 0) {
    ret = ret == NT_EXIT_OK ? NT_EXIT_FAIL : ret;
  }
  return ret;
}
