/*
 * What the data modes share: registered buffers, the window that fits --mem-limit, the peer's
 * result over the side channel, the nettest-result line, and verify's transfer, which the
 * lifecycle and hostile modes also run on the connections they made.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "nt_data.h"
#include "nt_util.h"

int nt_region_setup(struct nt_net *n, void *comm, size_t len, struct nt_region *r) {
  memset(r, 0, sizeof(*r));
  r->len = nt_round_page(len ? len : 1);
  r->p = nt_alloc_region(r->len);
  if (r->p == NULL) {
    nt_err("cannot allocate %zu bytes of buffers: %s (lower --window, --multi or --max-size)", r->len, strerror(errno));
    return -1;
  }
  ncclResult_t rc = nt_net_regmr(n, comm, r->p, r->len, &r->mh);
  if (rc != ncclSuccess || r->mh == NULL) {
    nt_err("regMr(%zu bytes, NCCL_PTR_HOST) failed: rc=%d (check ulimit -l)", r->len, rc);
    nt_free_region(r->p, r->len);
    r->p = NULL;
    return -1;
  }
  r->comm = comm;
  return 0;
}

int nt_region_free(struct nt_net *n, struct nt_region *r) {
  int ret = 0;
  if (r->mh != NULL) {
    ncclResult_t rc = nt_net_deregmr(n, r->comm, r->mh);
    if (rc != ncclSuccess) {
      nt_err("deregMr failed: rc=%d", rc);
      ret = -1;
    }
    r->mh = NULL;
  }
  nt_free_region(r->p, r->len);
  r->p = NULL;
  return ret;
}

double nt_mbps(uint64_t bytes, double s) { return s > 0 ? (double)bytes * 8.0 / 1e6 / s : 0.0; }

int nt_plan_window(const struct nt_opts *o, size_t stride) {
  size_t group = stride * (size_t)o->multi;
  int w = o->window;
  while (w > 1 && group * (size_t)w > o->mem_limit) {
    w--;
  }
  if (w < o->window) {
    nt_err("note: window lowered from %d to %d so that %d x %d x %zu-byte buffers fit in --mem-limit %zu MiB",
           o->window, w, w, o->multi, stride, o->mem_limit >> 20);
  }
  return w;
}

int nt_result_line(struct nt_opts *o, uint64_t msgs, uint64_t bytes, int verified, double secs, const char *extra) {
  nt_out("nettest-result: role=%s mode=%s messages=%" PRIu64 " payload_bytes=%" PRIu64
         " verified=%s seconds=%.6f mbps=%.3f%s%s",
         nt_role_name(o->role), nt_mode_name(o->mode), msgs, bytes, verified ? "true" : "false", secs,
         nt_mbps(bytes, secs), extra[0] ? " " : "", extra);
  return verified ? NT_EXIT_OK : NT_EXIT_FAIL;
}

int nt_send_result(struct nt_oob *oob, const struct nt_peer_result *r) {
  char buf[256];
  int len =
      snprintf(buf, sizeof(buf),
               "verified=%d msgs=%" PRIu64 " bytes=%" PRIu64 " iters=%" PRIu64 " mismatches=%" PRIu64 " seconds=%.9f",
               r->verified, r->msgs, r->bytes, r->iters, r->mismatches, r->seconds);
  return nt_oob_send(oob, NT_MSG_RESULT, buf, (uint32_t)len);
}

int nt_recv_result(struct nt_oob *oob, int timeout_s, struct nt_peer_result *r) {
  char buf[256];
  uint32_t len = 0;
  memset(r, 0, sizeof(*r));
  if (nt_oob_recv(oob, NT_MSG_RESULT, buf, sizeof(buf) - 1, &len, timeout_s) != 0) {
    return -1;
  }
  buf[len] = '\0';
  if (sscanf(buf, "verified=%d msgs=%" SCNu64 " bytes=%" SCNu64 " iters=%" SCNu64 " mismatches=%" SCNu64 " seconds=%lf",
             &r->verified, &r->msgs, &r->bytes, &r->iters, &r->mismatches, &r->seconds) != 6) {
    nt_err("oob: malformed RESULT from peer: '%s'", buf);
    return -1;
  }
  return 0;
}

/* ---- verify ---- */

/* --mr-cache-check: regMr of the whole region again and of a range inside it, then deregMr of
 * both, before the transfer uses the first handle. A plugin with a registration cache (MPIB,
 * net_ib) serves both from the region's registration; the transfer then proves the region is
 * still registered after those deregMr calls. Prints
 *   nettest-mr: role=R same_handle=B inside_handle=B reg_ms=X dereg_rc=N */
static int nt_mr_cache_check(struct nt_opts *o, struct nt_net *n, struct nt_region *r) {
  void *again = NULL, *inside = NULL;
  double t = nt_now();
  ncclResult_t rc1 = nt_net_regmr(n, r->comm, r->p, r->len, &again);
  ncclResult_t rc2 = nt_net_regmr(n, r->comm, r->p + 100, r->len > 4096 ? r->len - 4096 : 1, &inside);
  double reg_ms = (nt_now() - t) * 1000;
  int dereg_rc = 0;
  if (again != NULL) dereg_rc |= nt_net_deregmr(n, r->comm, again);
  if (inside != NULL) dereg_rc |= nt_net_deregmr(n, r->comm, inside);
  nt_out("nettest-mr: role=%s same_handle=%s inside_handle=%s reg_ms=%.3f dereg_rc=%d", nt_role_name(o->role),
         again == r->mh ? "true" : "false", inside == r->mh ? "true" : "false", reg_ms, dereg_rc);
  if (rc1 != ncclSuccess || rc2 != ncclSuccess || dereg_rc != 0) {
    nt_err("--mr-cache-check: regMr rc=%d,%d deregMr rc=%d", rc1, rc2, dereg_rc);
    return -1;
  }
  return 0;
}

int nt_verify_run(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  int sender = o->role == NT_CLIENT;
  struct nt_xfer x = {.net = n,
                      .oob = oob,
                      .k = o->multi,
                      .vlevel = NT_V_FULL,
                      .full_canary = o->full_canary,
                      .seed = o->seed,
                      .timeout_s = o->timeout_s};
  x.slot_size = o->max_size ? o->max_size : 64;
  x.stride = nt_round_page(x.slot_size);
  x.window = nt_plan_window(o, x.stride);
  x.comm = sender ? c->scomm : c->rcomm;
  struct nt_region r;
  if (nt_region_setup(n, x.comm, x.stride * (size_t)x.k * (size_t)x.window, &r) != 0) {
    nt_oob_abort(oob, "%s: buffer registration failed", nt_role_name(o->role));
    return NT_EXIT_FAIL;
  }
  if (o->mr_cache_check && nt_mr_cache_check(o, n, &r) != 0) {
    nt_oob_abort(oob, "%s: --mr-cache-check failed", nt_role_name(o->role));
    nt_region_free(n, &r);
    return NT_EXIT_FAIL;
  }
  x.region = r.p;
  x.mh = r.mh;
  if (!sender) {
    nt_canary_fill(r.p, r.len);
  }
  struct nt_sched s;
  nt_sched_init(&s, o->seed, 0, o->multi);
  s.random = 1;
  s.max_size = o->max_size;
  if (o->bytes_set) {
    s.by_bytes = 1;
    s.bytes_left = o->bytes;
  }
  if (o->count_set || !o->bytes_set) {
    s.msgs_left = o->count;
  }
  struct nt_stats st;
  memset(&st, 0, sizeof(st));
  int ret = NT_EXIT_FAIL;
  if (nt_oob_sync(oob, "verify-start", o->timeout_s) != 0) {
    goto out;
  }
  if (sender) {
    nt_xfer_send(&x, &s, &st);
  } else {
    st.max_rsize = -1;
    nt_xfer_recv(&x, &s, &st);
    /* What the plugin told NCCL against what it posted: never more (a peer's word is no bound). */
    nt_out("nettest-sizes: role=%s reported_bytes_max=%lld posted_bytes=%zu", nt_role_name(o->role),
           (long long)st.max_rsize, x.slot_size);
    if (!st.fatal) {
      nt_xfer_final_canary(&x, &st);
    }
  }
  if (st.fatal) {
    nt_oob_abort(oob, "%s: %s", nt_role_name(o->role), st.first_err);
    nt_result_line(o, st.msgs, st.bytes, 0, st.t1 - st.t0, "");
    goto out;
  }
  struct nt_peer_result pr = {.verified = st.mismatches == 0,
                              .msgs = st.msgs,
                              .bytes = st.bytes,
                              .iters = st.groups,
                              .mismatches = st.mismatches,
                              .seconds = st.t1 - st.t0};
  int verified = st.mismatches == 0;
  if (sender) {
    if (nt_recv_result(oob, o->timeout_s, &pr) != 0) {
      verified = 0;
    } else {
      if (pr.msgs != st.msgs || pr.bytes != st.bytes) {
        nt_err("receiver counted %" PRIu64 " messages / %" PRIu64 " bytes, sender %" PRIu64 " / %" PRIu64, pr.msgs,
               pr.bytes, st.msgs, st.bytes);
        verified = 0;
      }
      if (!pr.verified) {
        nt_err("receiver reported %" PRIu64 " mismatching messages (see the server's stderr)", pr.mismatches);
        verified = 0;
      }
    }
  } else if (nt_send_result(oob, &pr) != 0) {
    verified = 0;
  }
  char extra[128];
  snprintf(extra, sizeof(extra), "mismatches=%" PRIu64 " window=%d multi=%d flushes=%" PRIu64,
           sender ? pr.mismatches : st.mismatches, x.window, x.k, st.flushes);
  ret = nt_result_line(o, st.msgs, st.bytes, verified, st.t1 - st.t0, extra);
out:
  if (nt_region_free(n, &r) != 0 && ret == NT_EXIT_OK) {
    ret = NT_EXIT_FAIL;
  }
  return ret;
}

int nt_verify_follow(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c,
                     uint64_t default_count) {
  if (!o->count_set && !o->bytes_set) {
    o->count = default_count;
  }
  enum nt_mode mode = o->mode;
  o->mode = NT_VERIFY; /* the ordinary verify run and its result line */
  int ret = nt_verify_run(o, n, oob, c);
  o->mode = mode;
  if (ret == NT_EXIT_OK && nt_oob_sync(oob, "done", o->timeout_s) != 0) {
    ret = NT_EXIT_FAIL;
  }
  return ret;
}
