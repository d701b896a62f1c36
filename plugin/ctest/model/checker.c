/*
 * Failover model checker: the real data path and failover C of both ends of one connection
 * (mpib_p2p.c, mpib_flush.c, unchanged) driven over a FAKE fabric that models what real verbs
 * do at a fault, under every schedule of up to two faults of every kind (a grid of start times
 * and lengths, exhaustively) and seeded random schedules of up to three. Not a verbs test: the
 * lab's fault suite is. Built and run by ../model_test.go (CI budget, mutants) and `mage bench`.
 *
 * The connection: a send comm and a recv comm, SOUT with one QP, SUP with two lanes (striping:
 * two NIC ports, one QP each), the receiver's loopback flush QP per lane, the CTS FIFO of 32
 * slots wrapping many times, messages of mixed sizes, one in three a grouped receive of two,
 * every other completed receive flushed before its bytes are read (a GPU buffer; the others
 * are host memory, which NCCL does not flush). One step is 1 ms of the fake clock.
 *
 * What the fake fabric models of real verbs (rdma-core providers, RC transport):
 *   - a send queue of the QP's real depth: ibv_post_send returns ENOMEM when it is full;
 *   - writes land in order; the RC acknowledgement of a landed write reaches the sender in a
 *     later step, when the way back passes, possibly before the receiver polls its completion;
 *   - a write that cannot land or be acknowledged for RC_BUDGET steps fails the QP: the head
 *     completes with RETRY_EXC_ERR, the rest with WR_FLUSH_ERR; a QP forced to ERR flushes the
 *     same way; RESET discards what the QP had queued and its completions (as mlx5 cleans them);
 *   - a responder enforces its QP's access flags (a read needs REMOTE_READ: the flush loopback);
 *   - a device that dies (IBV_EVENT_DEVICE_FATAL) loses every completion it had queued and
 *     unpolled and completes nothing more; its responder may go on placing and acknowledging
 *     the peer's writes for up to DYING_MAX - 1 steps (the fault's length modulo DYING_MAX), as
 *     the kernel tears a device down after its process saw it die (rxe did, in the lab); a port
 *     down drops everything through it;
 *   - the receiver's reconnect fails while its rail is blocked (RoCE resolves the peer's MAC in
 *     the RTR transition) or while a refusal fault lasts;
 *   - the control socket (send() is interposed): a slow one takes a few bytes per call (short
 *     writes) and delivers a few per step; the peer's reader frames messages as lifecycle.go
 *     does, and takes an unknown byte for a peer that misbehaves (the connection is gone);
 *   - a peer process that stops: it calls nothing more, its QPs vanish, its socket closes.
 * Not modelled: reordering inside a QP, partial placement of one write, a device that returns
 * (MPIB never reopens a dead device, as net_ib), more than one connection per CQ, threads (the
 * QP rebuild runs in line here; its thread is mpib_rebuild.c's).
 *
 * Checked after every step and at the end of every schedule:
 *   - wrong_bytes: every completed receive holds exactly the bytes and sizes sent, and every
 *     byte the fabric lands in a receive buffer is what its current receive expects;
 *   - unordered: no flush completes while a read it posted failed or is still outstanding;
 *   - undelivered_sends: once both ends stop posting and drain, every completed send was received;
 *   - hangs: every request completes or errors within HANG_BOUND steps of the drain;
 *   - errors: a schedule whose faults all heal and leave a device alive errors nowhere (a
 *     peer that stops, devices under both rails dying, or the receiver's device dying under a
 *     lane that placed bytes a flush must order may error, with a message: a striped lane that
 *     placed none of them is no reason);
 *   - dead: a rail over a dead device ends DEAD on both ends (no endless recovery attempts);
 *   - leaks: at the end no request of either pool is in use and no fabric work is queued.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "mpib.h"
#include "mpib_comm.h"
#include "mpib_failover.h"
#include "mpib_flush.h"
#include "mpib_p2p.h"
#include "mpib_qp.h"

/* ---- what the data path needs from the rest of the plugin ---- */

struct mpib_global mpib_g;
static uint64_t fake_now;
static int verbose;
uint64_t mpib_now_ns(void) { return fake_now; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line;
  if (!verbose) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[%llu] ", (unsigned long long)(fake_now / 1000000ull));
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
const char *ibv_wc_status_str(enum ibv_wc_status status) { return status == IBV_WC_SUCCESS ? "ok" : "error"; }
void mpib_comm_destroy(struct mpib_comm *c) { (void)c; }

/* ---- the fake fabric ---- */

enum { SEND = 0, RECV = 1, NLANE = 3, NDATA = 3, NQPS = 2 * (NDATA + NLANE), RC_BUDGET = 30, CQDEPTH = 4096 };
enum { FWD = 1, REV = 2 }; /* sender -> receiver, receiver -> sender */
/* A schedule's small send queues (struct schedule): the sender's data takes one grouped
 * slot's chain at a time, beside the places kept for control writes. */
enum { SMALL_SQ = MPIB_SQ_CTRL_RESERVE + 3 };
enum { OP_WRITE, OP_WRITE_IMM, OP_READ };

struct wqe {
  uint64_t wr_id;
  int op, signalled, landed, age;
  uint32_t imm, len;
  uint8_t *dst, *src;
  uint8_t data[64]; /* small writes are copied at post time (inline or not, what was posted is what lands) */
  uint8_t *big;
};
struct fqp {
  int side, lane, flush, depth;
  int err, gone, access;
  uint32_t psn;
  struct wqe *q;
  int head, n;
};
static struct ibv_context ctx;
static struct ibv_qp vqp[NQPS];
static struct fqp fq[NQPS];
/* CQs: side * NLANE + lane (data), 2 * NLANE + lane (the receiver's flush CQs). */
enum { NCQ = 3 * NLANE };
static struct ibv_cq vcq[NCQ];
static struct ibv_wc cqe[NCQ][CQDEPTH];
static int cqe_head[NCQ], cqe_n[NCQ];
static struct ibv_srq vsrq[NLANE];
static int srq_avail[NLANE];
static struct ibv_mr fake_mr = {.lkey = 1, .rkey = 2};
static struct mpib_comm *comm_of[2];

/* Fault state, set by the schedule each step. */
static int hole[NLANE];         /* FWD | REV: that lane drops those directions */
static int port_down[2][NLANE]; /* mirrors nic->port_down */
static int fatal[2][NLANE];     /* mirrors nic->fatal */
enum { DYING_MAX = 64 };
static int answering[2][NLANE]; /* a dead device's responder still places and acknowledges writes */
static int refuse_rebuild;      /* the receiver's reconnects fail */
static int flush_fail[NLANE];   /* the next flush read on the lane fails */
static int stopped[2];          /* the side's process stopped */
static int ctrl_slow[2];        /* the side's control socket takes a few bytes per call */

static int qp_id(int side, int k) { return side * (NDATA + NLANE) + k; }
static int data_lane(int k) { return k; } /* data QP k: 0 SOUT, 1 SUP lane 1, 2 SUP lane 2 (index 2) */
static int cq_id(int side, int lane, int flush) { return flush ? 2 * NLANE + lane : side * NLANE + lane; }
static int qp_cq(const struct fqp *f) { return cq_id(f->side, f->lane, f->flush); }

static void push_cqe(int c, struct ibv_wc wc) {
  int side = c >= 2 * NLANE ? RECV : c / NLANE, lane = c % NLANE;
  if (fatal[side][lane]) return; /* a dead device completes nothing */
  if (cqe_n[c] == CQDEPTH) {
    fprintf(stderr, "model: CQ %d overflow\n", c);
    exit(3);
  }
  cqe[c][(cqe_head[c] + cqe_n[c]++) % CQDEPTH] = wc;
}

static void wqe_free(struct wqe *w) {
  free(w->big);
  w->big = NULL;
}

static void qp_discard(struct fqp *f) {
  for (int k = 0; k < f->n; k++) wqe_free(&f->q[(f->head + k) % f->depth]);
  f->n = 0;
}

/* The QP enters the error state: its queued work completes in error, the head with `status`. */
static void qp_error(struct fqp *f, enum ibv_wc_status status) {
  for (int k = 0; k < f->n; k++) {
    struct wqe *w = &f->q[(f->head + k) % f->depth];
    push_cqe(qp_cq(f), (struct ibv_wc){.wr_id = w->wr_id,
                                       .status = k == 0 ? status : IBV_WC_WR_FLUSH_ERR,
                                       .qp_num = (uint32_t)(f - fq)});
    wqe_free(w);
  }
  f->n = 0;
  f->err = 1;
}

static struct fqp *fqp_of(const struct ibv_qp *q) { return &fq[q - vqp]; }

int mpib_rail_base(const struct mpib_comm *c, int r) { return r == MPIB_RAIL_SOUT ? 0 : (int)c->nqps[MPIB_RAIL_SOUT]; }
static int side_of(const struct mpib_comm *c) { return c == comm_of[SEND] ? SEND : RECV; }

/* As mpib_rebuild.c's: every QP on a live lane; a dead device's are left (its responder may
 * still be answering). */
int mpib_rail_to_error(struct mpib_comm *c, int rail) {
  for (uint32_t i = 0; i < c->nqps[rail]; i++) {
    struct fqp *f = fqp_of(c->qps[mpib_rail_base(c, rail) + i].qp);
    if (!f->err && !fatal[side_of(c)][f->lane]) qp_error(f, IBV_WC_WR_FLUSH_ERR);
  }
  return 0;
}

/* RESET then INIT..RTS against the peer's same QPs: the queue and its completions are gone. */
/* Rebuilds of a standby rail before it joined: the real one has no QPs on the sender, and on
 * the receiver no peer QPs to connect to. */
static long standby_early;

int mpib_rail_reconnect(struct mpib_comm *c, int rail, uint32_t psn) {
  int side = side_of(c);
  if (c->rail[rail].join_wait) {
    standby_early++;
    return -EPROTO;
  }
  for (uint32_t i = 0; i < c->nqps[rail]; i++) {
    struct fqp *f = fqp_of(c->qps[mpib_rail_base(c, rail) + i].qp);
    qp_discard(f);
    int blocked = hole[f->lane] || port_down[0][f->lane] || port_down[1][f->lane];
    if (fatal[side][f->lane] || port_down[side][f->lane] || (side == RECV && (blocked || refuse_rebuild))) {
      f->err = 1; /* left in INIT: drops what arrives */
      return -ETIMEDOUT;
    }
    f->err = 0;
    f->psn = psn;
  }
  return 0;
}
int mpib_rail_rebuild_start(struct mpib_comm *c, int rail, uint32_t psn) {
  return (void)c, (void)rail, (void)psn, -EAGAIN;
}
int mpib_rail_rebuild_poll(struct mpib_comm *c, int rail, int *err) { return (void)c, (void)rail, *err = -EAGAIN, 1; }

/* The flush loopback's QP helpers (comm setup's, mpib_qp.h). */
int mpib_qp_reset_to_init(const struct mpib_comm *c, struct ibv_qp *qp, int lane, int access) {
  (void)c, (void)lane;
  struct fqp *f = fqp_of(qp);
  qp_discard(f);
  f->err = 1;
  f->access = access;
  return fatal[f->side][f->lane] ? -EIO : 0;
}
int mpib_qp_connect(struct mpib_comm *c, struct ibv_qp *qp, int lane, uint32_t rem_qpn,
                    const struct mpib_rail_info *rem, enum ibv_mtu mtu, uint8_t tc, uint32_t psn) {
  (void)c, (void)lane, (void)rem_qpn, (void)rem, (void)mtu, (void)tc, (void)psn;
  struct fqp *f = fqp_of(qp);
  if (fatal[f->side][f->lane] || port_down[f->side][f->lane]) return -ETIMEDOUT;
  f->err = 0;
  return 0;
}
void mpib_local_rail_info(const struct mpib_comm *c, int lane, struct mpib_rail_info *ri) {
  (void)c, (void)lane, memset(ri, 0, sizeof *ri);
}
int mpib_lane_gid_refresh(struct mpib_comm *c, int lane) { return (void)c, (void)lane, 0; } /* GIDs never move here */

static int fake_post_send(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  struct fqp *f = fqp_of(q);
  for (; wr != NULL; wr = wr->next) {
    if (f->n == f->depth) {
      *bad = wr;
      return ENOMEM;
    }
    if (f->err) { /* a QP in error flushes what is posted to it */
      push_cqe(qp_cq(f),
               (struct ibv_wc){.wr_id = wr->wr_id, .status = IBV_WC_WR_FLUSH_ERR, .qp_num = (uint32_t)(f - fq)});
      continue;
    }
    struct wqe *w = &f->q[(f->head + f->n++) % f->depth];
    uint32_t len = wr->num_sge ? wr->sg_list[0].length : 0;
    *w = (struct wqe){.wr_id = wr->wr_id,
                      .imm = wr->imm_data,
                      .len = len,
                      .signalled = (wr->send_flags & IBV_SEND_SIGNALED) != 0,
                      .op = wr->opcode == IBV_WR_RDMA_READ             ? OP_READ
                            : wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? OP_WRITE_IMM
                                                                       : OP_WRITE,
                      .dst = (uint8_t *)(uintptr_t)wr->wr.rdma.remote_addr};
    if (len && w->op != OP_READ) {
      uint8_t *buf = len <= sizeof w->data ? w->data : (w->big = malloc(len));
      memcpy(buf, (void *)(uintptr_t)wr->sg_list[0].addr, len);
    }
  }
  return 0;
}

static int fake_poll_cq(struct ibv_cq *vc, int n, struct ibv_wc *wc) {
  int c = (int)(vc - vcq), k = 0;
  for (; k < n && cqe_n[c] > 0; k++) {
    wc[k] = cqe[c][cqe_head[c]];
    cqe_head[c] = (cqe_head[c] + 1) % CQDEPTH;
    cqe_n[c]--;
  }
  return k;
}

static int fake_post_srq_recv(struct ibv_srq *s, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  (void)bad;
  for (; wr != NULL; wr = wr->next) srq_avail[s - vsrq]++;
  return 0;
}

/* ---- the transfer ---- */

enum { WINDOW = 6, NSRC = 8, MAXSZ = 9000, NGROUP = 2, MAXMSG = 4096 };
static uint8_t rbuf[WINDOW][NGROUP][MAXSZ];
static long rbuf_owner[WINDOW]; /* the message whose receive owns the buffers, -1 = NCCL has them */
/* Per buffer, while its receive owns it: the receiver's lanes whose NIC placed bytes there, and
 * once its flush is asked for, the lanes that flush may need alive (its own and those of the
 * flushes still open then, which its reads join: mpib_iflush). Only a dead lane among those
 * may fail a flush (errors_allowed). */
static uint8_t rbuf_lanes[WINDOW], flush_cover[WINDOW];
static int flushing[WINDOW];
static int recv_flush_dead; /* the receiver erred while such a flush needed a dead lane */
static uint8_t sbuf[NSRC][NGROUP][MAXSZ];
static long wrong_bytes, unordered;

static int msg_n(long m) { return m % 3 == 2 ? 2 : 1; }
static size_t msg_size(long m, int i) {
  static const size_t sizes[] = {1, 640, 4096, 8999, 300, 70};
  return sizes[(m * 7 + i * 3) % 6];
}
/* Byte off of request i of message m is (m*131 + i*17 + off*7 + 1) mod 256, 0xEE (an unwritten
 * receive buffer's fill) made 0x11. As a run of a table (7 * 183 = 1 mod 256): comparing a
 * request's bytes is one memcmp. */
static uint8_t pattern_table[256 + MAXSZ];
static const uint8_t *pattern_at(long m, int i, size_t off) {
  size_t q = (size_t)(183 * (uint64_t)(m * 131 + i * 17 + 1)) & 255;
  return &pattern_table[q + off];
}
static uint8_t msg_byte(long m, int i, size_t off) { return *pattern_at(m, i, off); }
static long mismatches(const uint8_t *a, const uint8_t *b, size_t n) {
  if (memcmp(a, b, n) == 0) return 0;
  long d = 0;
  for (size_t k = 0; k < n; k++) d += a[k] != b[k];
  return d;
}

/* A write landing in a receive buffer must carry what the buffer's current receive expects. */
static void check_landing(const uint8_t *dst, const uint8_t *data, uint32_t len, int lane) {
  const uint8_t *lo = &rbuf[0][0][0], *hi = lo + sizeof rbuf;
  if (dst < lo || dst >= hi) return;
  size_t at = (size_t)(dst - lo);
  int b = (int)(at / (NGROUP * MAXSZ)), i = (int)(at / MAXSZ % NGROUP);
  rbuf_lanes[b] |= (uint8_t)(1u << lane);
  size_t off = at % MAXSZ;
  long bad = rbuf_owner[b] < 0 ? (long)len : mismatches(data, pattern_at(rbuf_owner[b], i, off), len);
  if (bad && verbose)
    fprintf(stderr,
            "[%llu] stray: %ld of %u bytes landed wrong in buffer %d request %d offset %zu (owner message %ld)\n",
            (unsigned long long)(fake_now / 1000000ull), bad, len, b, i, off, rbuf_owner[b]);
  wrong_bytes += bad;
}

static void land(struct fqp *f, struct wqe *w) {
  if (w->op == OP_READ) {
    w->landed = 1;
    return;
  }
  const uint8_t *src = w->len <= sizeof w->data ? w->data : w->big;
  if (w->len) {
    check_landing(w->dst, src, w->len, f->lane);
    memcpy(w->dst, src, w->len);
  }
  if (w->op == OP_WRITE_IMM) {
    srq_avail[f->lane]--;
    push_cqe(cq_id(RECV, f->lane, 0), (struct ibv_wc){.wr_id = MPIB_WRID_RECV,
                                                      .status = IBV_WC_SUCCESS,
                                                      .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
                                                      .wc_flags = IBV_WC_WITH_IMM,
                                                      .imm_data = w->imm,
                                                      .qp_num = (uint32_t)(f - fq)});
  }
  w->landed = 1;
}

/* Whether `side`'s packets reach the other end of `lane`. */
static int path_ok(int side, int lane) {
  int dir = side == SEND ? FWD : REV;
  return !(hole[lane] & dir) && !port_down[0][lane] && !port_down[1][lane] &&
         (!fatal[1 - side][lane] || answering[1 - side][lane]) && !stopped[1 - side];
}

static void step_qp(struct fqp *f) {
  if (f->err || f->n == 0 || fatal[f->side][f->lane] || f->gone) return;
  struct fqp *peer = f->flush ? f : &fq[qp_id(1 - f->side, (int)(f - fq) - qp_id(f->side, 0))];
  int out = f->flush ? !port_down[f->side][f->lane] : path_ok(f->side, f->lane);
  int back = f->flush ? out : path_ok(1 - f->side, f->lane);
  int peer_ok = f->flush || (!peer->err && !peer->gone && peer->psn == f->psn);
  for (int k = 0; k < f->n; k++) {
    struct wqe *w = &f->q[(f->head + k) % f->depth];
    if (w->landed) continue;
    if (!out || !peer_ok || (w->op == OP_WRITE_IMM && srq_avail[f->lane] <= 0)) break;
    if (w->op == OP_READ && (!(peer->access & IBV_ACCESS_REMOTE_READ) || flush_fail[f->lane])) {
      flush_fail[f->lane] = 0;
      qp_error(f, IBV_WC_REM_ACCESS_ERR);
      return;
    }
    land(f, w);
    break;
  }
  struct wqe *w = &f->q[f->head];
  if (w->landed && back && peer_ok) {
    if (w->signalled)
      push_cqe(qp_cq(f), (struct ibv_wc){.wr_id = w->wr_id,
                                         .status = IBV_WC_SUCCESS,
                                         .opcode = w->op == OP_READ ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE,
                                         .qp_num = (uint32_t)(f - fq)});
    wqe_free(w);
    f->head = (f->head + 1) % f->depth;
    f->n--;
  } else if (++w->age > RC_BUDGET) {
    qp_error(f, IBV_WC_RETRY_EXC_ERR);
  }
}

/* ---- the control socket: send() is interposed; each side's reader frames as lifecycle.go ---- */

enum { CTRL_CAP = 1 << 16 };
static uint8_t ctrl_q[2][CTRL_CAP]; /* bytes side s sent, not yet delivered to the other */
static int ctrl_n[2], ctrl_closed[2];
static uint8_t rd_buf[2][4096]; /* the other side's reader of what side s sent */
static int rd_n[2];

ssize_t send(int fd, const void *buf, size_t len, int flags) {
  (void)flags;
  int side = fd - 100;
  if (side < 0 || side > 1 || ctrl_closed[side]) {
    errno = EPIPE;
    return -1;
  }
  size_t room = CTRL_CAP - (size_t)ctrl_n[side];
  static unsigned calls;
  if (ctrl_slow[side]) room = room < 5 ? room : (size_t)(++calls % 3 == 0 ? 0 : 5);
  if (room == 0) {
    errno = EAGAIN;
    return -1;
  }
  size_t n = len < room ? len : room;
  memcpy(ctrl_q[side] + ctrl_n[side], buf, n);
  ctrl_n[side] += (int)n;
  return (ssize_t)n;
}

/* Delivers what side s sent to the other side's comm: the framing of lifecycle.go's watch(). */
static void ctrl_pump(int s) {
  struct mpib_comm *c = comm_of[1 - s];
  int take = ctrl_slow[s] ? 24 : ctrl_n[s];
  if (take > ctrl_n[s]) take = ctrl_n[s];
  if (take > (int)sizeof rd_buf[s] - rd_n[s]) take = (int)sizeof rd_buf[s] - rd_n[s];
  memcpy(rd_buf[s] + rd_n[s], ctrl_q[s], (size_t)take);
  memmove(ctrl_q[s], ctrl_q[s] + take, (size_t)(ctrl_n[s] - take));
  ctrl_n[s] -= take;
  rd_n[s] += take;
  int k = 0;
  while (k < rd_n[s] && !ctrl_closed[s]) {
    uint8_t *m = rd_buf[s] + k;
    int left = rd_n[s] - k;
    if (m[0] == 'N' && left >= 10) {
      uint64_t word = 0;
      for (int b = 0; b < 8; b++) word |= (uint64_t)m[2 + b] << (8 * b);
      if (m[1] < MPIB_NRAILS) __atomic_store_n(&c->tcp_notice[m[1]], word, __ATOMIC_RELEASE);
      if (m[1] < MPIB_NRAILS) mpib_comm_answer_notice(c, m[1], word); /* lifecycle.go's watcher does */
      k += 10;
    } else if (m[0] == 'R' && left >= 2 + (int)sizeof(struct mpib_fence_rec)) {
      if (m[1] < MPIB_NRAILS) memcpy(&c->tcp_rec[m[1]], m + 2, sizeof(struct mpib_fence_rec));
      if (m[1] < MPIB_NRAILS) mpib_comm_answer_record(c, m[1], m + 2); /* lifecycle.go's watcher does */
      k += 2 + (int)sizeof(struct mpib_fence_rec);
    } else if (m[0] == 'C' && left >= 2 + (int)sizeof(struct mpib_confirm_rec)) {
      if (m[1] < MPIB_NRAILS) memcpy(&c->tcp_confirm[m[1]], m + 2, sizeof(struct mpib_confirm_rec));
      k += 2 + (int)sizeof(struct mpib_confirm_rec);
    } else if (m[0] == 'F') {
      uint64_t now = fake_now;
      __atomic_store_n(&c->peer_gone_ns, now > 2000000000ull ? now - 2000000000ull : 1, __ATOMIC_RELEASE);
      ctrl_closed[s] = 1;
      k++;
    } else if (m[0] == 'N' || m[0] == 'R' || m[0] == 'C') {
      break; /* the rest of a message still to come */
    } else { /* the watcher stops on anything else: the peer is gone */
      __atomic_store_n(&c->peer_gone_ns, fake_now, __ATOMIC_RELEASE);
      ctrl_closed[s] = 1;
    }
  }
  memmove(rd_buf[s], rd_buf[s] + k, (size_t)(rd_n[s] - k));
  rd_n[s] -= k;
}

/* ---- one connection ---- */

static struct mpib_comm *make_comm(int side, int small_sq) {
  struct mpib_comm *c = calloc(1, sizeof *c);
  for (int l = 0; l < NLANE; l++) {
    struct mpib_nic *n = &mpib_g.nic[side * NLANE + l];
    memset(n, 0, sizeof *n);
    snprintf(n->name, sizeof n->name, "%s_%s%d", side == SEND ? "s" : "r", l ? "sup" : "sout", l);
    n->link_layer = IBV_LINK_LAYER_INFINIBAND;
    c->nic[l] = n;
  }
  c->sup_lanes = 2;
  c->lane_port[mpib_lane(MPIB_RAIL_SUP, 1)] = 1;
  size_t area = (MPIB_NIC_AREA + MPIB_PAGE - 1) / MPIB_PAGE * MPIB_PAGE;
  c->cts = aligned_alloc(MPIB_PAGE, area);
  memset(c->cts, 0, area);
  c->sizes = (mpib_sizes_row *)((char *)c->cts + MPIB_SIZES_OFFSET);
  c->is_send = side == SEND;
  c->mode = MPIB_MODE_ADVANCED;
  c->path_class = MPIB_PATH_INTRA_ISLAND;
  c->cts_rail = MPIB_RAIL_SOUT;
  c->force_sup_bw = 512;  /* half on each rail: most slots have two byte ranges */
  c->whole_msg_max = 700; /* small slots go whole to one rail (deficit-counted) */
  c->shm_slot = -1;
  c->hint_due = 1; /* as mpib_comm_create leaves it */
  c->nreqs_pool = side == SEND ? MPIB_REQ_POOL_SEND : MPIB_REQ_POOL_RECV;
  c->reqs = calloc((size_t)c->nreqs_pool, sizeof *c->reqs);
  c->ctrl_fd = 100 + side;
  c->sq_depth = (uint16_t)(small_sq ? SMALL_SQ : side == SEND ? MPIB_SEND_WR_SENDER : MPIB_SEND_WR_RECEIVER);
  c->recv_idle_seq1 = 1;
  pthread_mutex_init(&c->ctrl_mu, NULL);
  c->nqps[MPIB_RAIL_SOUT] = 1;
  c->nqps[MPIB_RAIL_SUP] = 2;
  for (int k = 0; k < NDATA; k++) {
    int id = qp_id(side, k), lane = data_lane(k);
    vqp[id].context = &ctx;
    int depth = small_sq ? SMALL_SQ : side == SEND ? MPIB_SEND_WR_SENDER : MPIB_SEND_WR_RECEIVER;
    fq[id] =
        (struct fqp){.side = side, .lane = lane, .depth = depth, .access = MPIB_DATA_QP_ACCESS, .psn = mpib_gen_psn(1)};
    fq[id].q = calloc((size_t)fq[id].depth, sizeof(struct wqe));
    c->qps[k] = (struct mpib_qp){.qp = &vqp[id], .rail = mpib_lane_rail(lane), .lane = lane};
  }
  for (int l = 0; l < NLANE; l++) {
    int cqi = cq_id(side, l, 0);
    vcq[cqi].context = &ctx;
    c->cq[l] = &vcq[cqi];
    c->stage_mr[l] = c->inbox_mr[l] = &fake_mr;
    c->rem_rkey[l] = 2;
    if (side == RECV) {
      vsrq[l].context = &ctx;
      c->srq[l] = &vsrq[l];
      int id = qp_id(side, NDATA + l), fc = cq_id(side, l, 1);
      vqp[id].context = vcq[fc].context = &ctx;
      fq[id] = (struct fqp){.side = side, .lane = l, .flush = 1, .depth = 64, .access = MPIB_FLUSH_QP_ACCESS};
      fq[id].q = calloc(64, sizeof(struct wqe));
      c->flush_qp[l] = &vqp[id];
      c->flush_cq[l] = &vcq[fc];
      c->flush_mr[l] = &fake_mr;
    }
  }
  if (side == RECV) c->flush_buf = calloc(1, MPIB_PAGE);
  for (int r = 0; r < MPIB_NRAILS; r++) c->rail[r] = (struct mpib_rail_ctl){.state = MPIB_RAIL_UP, .gen = 1};
  comm_of[side] = c;
  return c;
}

static void free_comm(struct mpib_comm *c) {
  int side = side_of(c);
  for (int k = 0; k < NDATA + NLANE; k++) {
    struct fqp *f = &fq[qp_id(side, k)];
    qp_discard(f);
    free(f->q);
    f->q = NULL;
  }
  free(c->flush_buf);
  free(c->cts);
  free(c->reqs);
  free(c);
}

/* ---- schedules ---- */

enum { K_QPERR, K_PORT, K_FATAL, K_HOLE_LANE, K_HOLE_RAIL, K_REFUSE, K_FLUSHFAIL, K_PEERSTOP, K_CTRLSLOW, NKINDS };
static const char *const kind_names[NKINDS] = {"qp-error",        "port-down", "device-fatal",
                                               "lane-hole",       "rail-hole", "rebuild-refused",
                                               "flush-read-fail", "peer-stop", "ctrl-slow"};
struct fault {
  int kind, side, target, dirs, at, len;
};
enum { MAXF = 3 };
struct schedule {
  int nf;
  struct fault f[MAXF];
  int recv_every; /* the receiver is called every this many steps: acknowledgements outrun its polls */
  int test_every; /* the sender tests its requests every this many steps, isend every step: an
                   * acknowledgement can come in between a post and the next progress call, as
                   * when NCCL's proxy thread is descheduled */
  int host_only;  /* every receive buffer is host memory: nothing is flushed */
  int small_sq;   /* data QPs' send queues hold SMALL_SQ work requests: back-pressure happens */
  int at_end;     /* NCCL posts nothing after the first fault starts: the end of a collective,
                   * with every send completed and nothing of the sender's left to test */
  int standby;    /* > 0: SOUT is a standby rail that joins at this step (standby.go: built
                   * after the handshake), DOWN on both ends until then */
};

/* Targets of each kind: how many, and the fault for index i. */
static int ntargets(int kind) {
  switch (kind) {
  case K_QPERR: return 2 * NDATA;
  case K_PORT:
  case K_FATAL: return 2 * NLANE;
  case K_HOLE_LANE: return NLANE * 3;
  case K_HOLE_RAIL: return MPIB_NRAILS * 3;
  case K_REFUSE: return 1;
  case K_FLUSHFAIL: return NLANE;
  case K_PEERSTOP:
  case K_CTRLSLOW: return 2;
  default: return 0;
  }
}
static struct fault make_fault(int kind, int i, int at, int len) {
  struct fault f = {.kind = kind, .at = at, .len = len};
  switch (kind) {
  case K_QPERR: f.side = i / NDATA, f.target = i % NDATA; break;
  case K_PORT:
  case K_FATAL: f.side = i / NLANE, f.target = i % NLANE; break;
  case K_HOLE_LANE: f.target = i / 3, f.dirs = 1 + i % 3; break;
  case K_HOLE_RAIL: f.target = i / 3, f.dirs = 1 + i % 3; break;
  case K_FLUSHFAIL: f.target = i; break;
  case K_PEERSTOP:
  case K_CTRLSLOW: f.side = i; break;
  }
  return f;
}

static void describe(const struct schedule *s, char *out, size_t n) {
  int k = snprintf(out, n, "recv_every=%d test_every=%d host_only=%d small_sq=%d at_end=%d standby=%d", s->recv_every,
                   s->test_every, s->host_only, s->small_sq, s->at_end, s->standby);
  for (int i = 0; i < s->nf && k < (int)n; i++) {
    const struct fault *f = &s->f[i];
    k += snprintf(out + k, n - (size_t)k, " %s(side=%d target=%d dirs=%d at=%d len=%d)", kind_names[f->kind], f->side,
                  f->target, f->dirs, f->at, f->len);
  }
}

static int is_fatal_once(int kind) {
  return kind == K_FATAL || kind == K_PEERSTOP || kind == K_QPERR || kind == K_FLUSHFAIL;
}

/* Applies the faults active at `step` (one-shot kinds fire at their start). */
static void apply_faults(const struct schedule *s, int step) {
  memset(hole, 0, sizeof hole);
  memset(port_down, 0, sizeof port_down);
  refuse_rebuild = 0;
  ctrl_slow[0] = ctrl_slow[1] = 0;
  for (int i = 0; i < s->nf; i++) {
    const struct fault *f = &s->f[i];
    int active = step >= f->at && (is_fatal_once(f->kind) || step < f->at + f->len);
    if (!active) continue;
    switch (f->kind) {
    case K_QPERR:
      if (step == f->at) {
        struct fqp *q = &fq[qp_id(f->side, f->target)];
        if (!q->err) qp_error(q, IBV_WC_RETRY_EXC_ERR);
      }
      break;
    case K_PORT: port_down[f->side][f->target] = 1; break;
    case K_FATAL:
      answering[f->side][f->target] = step < f->at + f->len % DYING_MAX;
      if (step == f->at && !fatal[f->side][f->target]) {
        fatal[f->side][f->target] = 1;
        int lane = f->target;
        cqe_n[cq_id(f->side, lane, 0)] = 0; /* unpolled completions die with the device */
        if (f->side == RECV) cqe_n[cq_id(RECV, lane, 1)] = 0;
        __atomic_store_n(&mpib_g.nic[f->side * NLANE + lane].fatal, 1, __ATOMIC_RELEASE);
      }
      break;
    case K_HOLE_LANE: hole[f->target] |= f->dirs; break;
    case K_HOLE_RAIL:
      for (int l = 0; l < NLANE; l++)
        if (mpib_lane_rail(l) == f->target) hole[l] |= f->dirs;
      break;
    case K_REFUSE: refuse_rebuild = 1; break;
    case K_FLUSHFAIL:
      if (step == f->at) flush_fail[f->target] = 1;
      break;
    case K_PEERSTOP:
      if (!stopped[f->side]) {
        stopped[f->side] = 1;
        for (int k = 0; k < NDATA + NLANE; k++) fq[qp_id(f->side, k)].gone = 1;
        ctrl_closed[f->side] = 1; /* the other side's watcher sees the end of the stream */
        __atomic_store_n(&comm_of[1 - f->side]->peer_gone_ns, fake_now, __ATOMIC_RELEASE);
      }
      break;
    case K_CTRLSLOW: ctrl_slow[f->side] = 1; break;
    }
  }
  for (int side = 0; side < 2; side++)
    for (int l = 0; l < NLANE; l++) {
      struct mpib_nic *n = &mpib_g.nic[side * NLANE + l];
      if (n->port_down != port_down[side][l]) {
        n->port_down = port_down[side][l];
        n->port_change_ns = fake_now;
      }
    }
}

/* ---- the two ends, as NCCL drives them ---- */

/* Flush reads the fabric completed, per lane and recv-pool request: -1 none posted, 0 the last
 * one succeeded, 1 it failed, 2 one is outstanding. */
static signed char read_state[NLANE][MPIB_REQ_POOL_RECV];
static int pool_index(const struct mpib_comm *c, uint64_t wr_id) {
  const struct mpib_request *r = (const struct mpib_request *)(uintptr_t)wr_id;
  return r >= c->reqs && r < c->reqs + c->nreqs_pool ? (int)(r - c->reqs) : -1;
}

struct end {
  long posted, done;         /* messages */
  int posted_part;           /* sender: requests of message `posted` already handed to isend */
  void *req[WINDOW][NGROUP]; /* per message in the window: its requests (receiver: one) */
  void *flush[WINDOW];       /* receiver: the flush of a completed receive, NULL none */
  int recv_done[WINDOW];     /* receiver: its receive completed, its flush (if any) pending */
  int sizes[WINDOW][NGROUP];
  int error, error_step;
};
static struct end ends[2];
static long completed_sends, completed_recvs;

static void verify_recv(long m, int b) {
  completed_recvs++;
  for (int i = 0; i < msg_n(m); i++) {
    if ((size_t)ends[RECV].sizes[b][i] != msg_size(m, i)) {
      if (verbose)
        fprintf(stderr, "wrong: message %ld request %d: size %d, sent %zu\n", m, i, ends[RECV].sizes[b][i],
                msg_size(m, i));
      wrong_bytes += (long)msg_size(m, i);
      continue;
    }
    long bad = mismatches(rbuf[b][i], pattern_at(m, i, 0), msg_size(m, i));
    if (bad && verbose)
      fprintf(stderr, "[%llu] wrong: message %ld request %d: %ld of %zu bytes\n",
              (unsigned long long)(fake_now / 1000000ull), m, i, bad, msg_size(m, i));
    wrong_bytes += bad;
  }
}

static void flush_done_check(struct mpib_comm *c, void *flush) {
  int k = pool_index(c, (uintptr_t)flush);
  for (int l = 0; l < NLANE && k >= 0; l++) {
    unordered += read_state[l][k] == 1 || read_state[l][k] == 2;
    read_state[l][k] = -1;
  }
}

/* Receiver: posts receives up to the window, tests the oldest, flushes it (every other one,
 * unless `host_only`), checks its bytes. */
static int recv_side(struct mpib_comm *c, int posting, int host_only) {
  struct end *e = &ends[RECV];
  static struct mpib_mr mh = {.mr = {&fake_mr, &fake_mr, &fake_mr}, .fdev = 0}; /* NCCL's outlives the calls */
  while (posting && e->posted - e->done < WINDOW) {
    long m = e->posted;
    int b = (int)(m % WINDOW), n = msg_n(m);
    void *data[NGROUP], *mhs[NGROUP] = {&mh, &mh}, *req = NULL;
    size_t sizes[NGROUP];
    int tags[NGROUP];
    for (int i = 0; i < n; i++) data[i] = rbuf[b][i], sizes[i] = MAXSZ, tags[i] = i + 1;
    memset(rbuf[b], 0xEE, sizeof rbuf[b]);
    rbuf_owner[b] = m;
    rbuf_lanes[b] = 0;
    if (mpib_irecv(c, n, data, sizes, tags, mhs, NULL, &req) != ncclSuccess) return -1;
    if (req == NULL) {
      rbuf_owner[b] = -1;
      break;
    }
    e->req[b][0] = req;
    e->recv_done[b] = 0;
    e->posted++;
  }
  /* Every open receive and flush is tested, as NCCL's proxy does, oldest first; a receive's
   * bytes are read once its flush completed. */
  for (long m = e->done; m < e->posted; m++) {
    int b = (int)(m % WINDOW), fin = 0, n = msg_n(m);
    if (e->recv_done[b] == 2) continue;
    if (!e->recv_done[b]) {
      if (mpib_test(e->req[b][0], &fin, e->sizes[b]) != ncclSuccess) return -1;
      if (!fin) continue;
      e->recv_done[b] = 1;
      void *data[NGROUP], *mhs[NGROUP] = {&mh, &mh};
      int sizes[NGROUP];
      for (int i = 0; i < n; i++) data[i] = rbuf[b][i], sizes[i] = e->sizes[b][i];
      e->flush[b] = NULL; /* GPU buffers are flushed, host ones not (NCCL flushes only for GDR) */
      if (!host_only && m % 2 == 0) {
        flush_cover[b] = rbuf_lanes[b];
        for (int k = 0; k < WINDOW; k++)
          if (flushing[k]) flush_cover[b] |= flush_cover[k];
        flushing[b] = 1;
        if (mpib_iflush(c, n, data, sizes, mhs, &e->flush[b]) != ncclSuccess) return -1;
        flushing[b] = e->flush[b] != NULL;
      }
    }
    if (e->flush[b]) {
      fin = 0;
      if (mpib_test(e->flush[b], &fin, NULL) != ncclSuccess) return -1;
      if (!fin) continue;
      flush_done_check(c, e->flush[b]);
    }
    verify_recv(m, b);
    flushing[b] = 0;
    rbuf_owner[b] = -1;
    e->recv_done[b] = 2;
  }
  while (e->done < e->posted && e->recv_done[e->done % WINDOW] == 2) e->done++;
  return 0;
}

/* Sender: sends every receive the receiver posted, each grouped request by its own isend, and
 * tests them when `testing`. */
static int send_side(struct mpib_comm *c, long limit, int testing) {
  struct end *e = &ends[SEND];
  struct mpib_mr mh = {.mr = {&fake_mr, &fake_mr, &fake_mr}, .fdev = 0};
  static struct mpib_mr mh_keep;
  mh_keep = mh;
  while (e->posted < limit && e->posted - e->done < NSRC && e->posted - e->done < WINDOW) {
    long m = e->posted;
    int b = (int)(m % WINDOW), s = (int)(m % NSRC), i = e->posted_part;
    if (i == 0)
      for (int k = 0; k < msg_n(m); k++) memcpy(sbuf[s][k], pattern_at(m, k, 0), msg_size(m, k));
    void *req = NULL;
    if (mpib_isend(c, sbuf[s][i], msg_size(m, i), i + 1, &mh_keep, NULL, &req) != ncclSuccess) return -1;
    if (req == NULL) break;
    e->req[b][i] = req;
    if (++e->posted_part == msg_n(m)) e->posted++, e->posted_part = 0;
  }
  while (testing && e->done < e->posted) {
    long m = e->done;
    int b = (int)(m % WINDOW), all = 1;
    for (int i = 0; i < msg_n(m); i++) {
      if (e->req[b][i] == NULL) continue;
      int fin = 0;
      if (mpib_test(e->req[b][i], &fin, NULL) != ncclSuccess) return -1;
      if (fin) e->req[b][i] = NULL;
      else all = 0;
    }
    if (!all) break;
    completed_sends++;
    e->done++;
  }
  return 0;
}

/* ---- one schedule ---- */

enum { HANG_BOUND = 2500, SETTLE = 600 };
struct outcome {
  long wrong, unordered, undelivered;
  int hang, error, bad_error, not_dead, leaks, steps;
  int spurious;       /* rails failed over in a schedule with no fault */
  long standby_early; /* a standby rail rebuilt before its join */
};

static void fabric_reset(void) {
  memset(cqe_n, 0, sizeof cqe_n);
  memset(cqe_head, 0, sizeof cqe_head);
  memset(srq_avail, 0, sizeof srq_avail);
  memset(fatal, 0, sizeof fatal);
  memset(answering, 0, sizeof answering);
  memset(flush_fail, 0, sizeof flush_fail);
  memset(stopped, 0, sizeof stopped);
  memset(ctrl_n, 0, sizeof ctrl_n);
  memset(ctrl_closed, 0, sizeof ctrl_closed);
  memset(rd_n, 0, sizeof rd_n);
  memset(read_state, -1, sizeof read_state);
  memset(ends, 0, sizeof ends);
  for (int b = 0; b < WINDOW; b++) rbuf_owner[b] = -1;
  memset(flushing, 0, sizeof flushing);
  memset(rbuf_lanes, 0, sizeof rbuf_lanes);
  recv_flush_dead = 0;
}

/* A side that errors is aborted by NCCL: its process goes, with its QPs and its socket. */
static void side_gone(int side) {
  stopped[side] = 1;
  for (int k = 0; k < NDATA + NLANE; k++) fq[qp_id(side, k)].gone = 1;
  ctrl_closed[side] = 1;
  if (comm_of[1 - side]->peer_gone_ns == 0)
    __atomic_store_n(&comm_of[1 - side]->peer_gone_ns, fake_now, __ATOMIC_RELEASE);
}

static int in_use(const struct mpib_comm *c) {
  int n = 0;
  for (int i = 0; i < c->nreqs_pool; i++) n += c->reqs[i].type != MPIB_REQ_FREE;
  return n;
}

/* Whether a flush asked for and not done needs a lane whose device died (flush_cover): the
 * bytes that NIC placed cannot be ordered. */
static int flush_needs_dead_lane(void) {
  for (int b = 0; b < WINDOW; b++)
    for (int l = 0; l < NLANE; l++)
      if (flushing[b] && (flush_cover[b] & (1u << l)) && fatal[RECV][l]) return 1;
  return 0;
}

/* Whether errors are allowed: a peer stops, devices under both rails die, or the receiver erred
 * when a flush needed a lane whose device had died (the flush cannot order what that NIC
 * placed; a striped lane that placed none of the flushed bytes is no reason). */
static int errors_allowed(const struct schedule *s) {
  int dead_rails = 0;
  for (int i = 0; i < s->nf; i++) {
    if (s->f[i].kind == K_PEERSTOP) return 1;
    if (s->f[i].kind == K_FATAL) dead_rails |= 1 << mpib_lane_rail(s->f[i].target);
  }
  return dead_rails == 3 || recv_flush_dead;
}

static void dump(struct mpib_comm *s, struct mpib_comm *r) {
  fprintf(
      stderr,
      "hang: send posted=%ld done=%ld fifo_head=%llu replays_waiting=%d stall=%llu; recv posted=%ld done=%ld fifo_head=%llu cts_rail=%d\n",
      ends[SEND].posted, ends[SEND].done, (unsigned long long)s->fifo_head, s->replays_waiting,
      (unsigned long long)s->stall_since_ns, ends[RECV].posted, ends[RECV].done, (unsigned long long)r->fifo_head,
      r->cts_rail);
  for (int k = 0; k < MPIB_NRAILS; k++)
    fprintf(stderr, "  rail %d: send state=%d gen=%u pending=%u  recv state=%d gen=%u pending=%u\n", k,
            s->rail[k].state, s->rail[k].gen, s->pending[k], r->rail[k].state, r->rail[k].gen, r->pending[k]);
  for (int q = 0; q < NQPS; q++)
    if (fq[q].q)
      fprintf(stderr, "  qp %d side %d lane %d flush %d: err=%d psn=%u queued=%d\n", q, fq[q].side, fq[q].lane,
              fq[q].flush, fq[q].err, fq[q].psn, fq[q].n);
  for (int c = 0; c < NCQ; c++)
    if (cqe_n[c]) fprintf(stderr, "  cq %d: %d entries\n", c, cqe_n[c]);
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++) {
    if (s->slot_posted_seq1[slot] || s->slot_matched[slot])
      fprintf(stderr, "  send slot %d: seq1=%llu matched=%d rails=%u replay_on=%u/%u wait=%u acked=%u/%u\n", slot,
              (unsigned long long)s->slot_posted_seq1[slot], s->slot_matched[slot], s->slot_rails[slot],
              s->slot_replay_on[slot][0], s->slot_replay_on[slot][1], s->slot_replay_wait[slot],
              mpib_ack_ranges(s->slot_ack[slot][0]), mpib_ack_ranges(s->slot_ack[slot][1]));
    struct mpib_request *q = r->slot_reqs[slot][0];
    if (q)
      fprintf(stderr, "  recv slot %d: seq=%llu expected=%u have=%u\n", slot, (unsigned long long)q->seq,
              q->expected_mask, q->have_mask);
  }
  fprintf(stderr, "  sender fifo slot %d cts seq %llu (want %llu)\n", (int)(s->fifo_head % 32),
          (unsigned long long)s->cts[s->fifo_head % 32][0].seq, (unsigned long long)s->fifo_head + 1);
}

/* The standby SOUT rail as mpib_comm_connect leaves it when the sender deferred it: DOWN and
 * waiting on both ends, its QPs dropping what arrives (the sender's do not exist yet, the
 * receiver's never left INIT), the receiver without the sender's rkey and its CTS on SUP. */
static void standby_start(struct mpib_comm *sc, struct mpib_comm *rc) {
  struct mpib_comm *both[2] = {sc, rc};
  for (int side = 0; side < 2; side++) {
    struct mpib_rail_ctl *r = &both[side]->rail[MPIB_RAIL_SOUT];
    r->state = MPIB_RAIL_DOWN;
    r->since_ns = fake_now;
    r->join_wait = 1;
    fq[qp_id(side, 0)].err = 1;
  }
  rc->rem_rkey[MPIB_RAIL_SOUT] = rc->rem_rail[MPIB_RAIL_SOUT].rkey = 0;
  rc->cts_rail = MPIB_RAIL_SUP;
}

/* The control plane's join: the sender's QPs built and sent ('J'), the receiver's answer ('K'). */
static void standby_join(struct mpib_comm *sc, struct mpib_comm *rc) {
  rc->join_peer[MPIB_RAIL_SOUT] = (struct mpib_join_info){.rkey = fake_mr.rkey, .nqps = rc->nqps[MPIB_RAIL_SOUT]};
  __atomic_store_n(&rc->rail[MPIB_RAIL_SOUT].join_arrived, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&sc->rail[MPIB_RAIL_SOUT].join_built, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&sc->rail[MPIB_RAIL_SOUT].join_arrived, 1, __ATOMIC_RELEASE);
}

static struct outcome run(const struct schedule *s) {
  fabric_reset();
  fake_now = 10000000000ull;
  struct mpib_comm *sc = make_comm(SEND, s->small_sq), *rc = make_comm(RECV, s->small_sq);
  sc->rem_addr = (uint64_t)(uintptr_t)rc->sizes;
  rc->rem_addr = (uint64_t)(uintptr_t)sc->cts;
  if (s->standby) standby_start(sc, rc);
  int horizon = SETTLE;
  for (int i = 0; i < s->nf; i++) {
    int end = s->f[i].at + (is_fatal_once(s->f[i].kind) ? 0 : s->f[i].len);
    if (end + SETTLE > horizon) horizon = end + SETTLE;
  }
  int stop_posting = s->at_end && s->nf ? s->f[0].at : horizon;
  struct outcome o = {0};
  long wrong0 = wrong_bytes, unordered0 = unordered, early0 = standby_early;
  int step;
  for (step = 0; step < horizon + HANG_BOUND; step++) {
    int posting = step < horizon && step < stop_posting;
    apply_faults(s, step);
    if (s->standby && step == s->standby) standby_join(sc, rc);
    struct end *re = &ends[RECV], *se = &ends[SEND];
    if (!stopped[RECV] && step % s->recv_every == 0 && recv_side(rc, posting, s->host_only) != 0) {
      re->error = 1, re->error_step = step;
      recv_flush_dead = flush_needs_dead_lane();
      side_gone(RECV);
    }
    if (!stopped[SEND] && send_side(sc, posting ? NSRC + re->posted : re->posted, step % s->test_every == 0) != 0) {
      se->error = 1, se->error_step = step;
      side_gone(SEND);
    }
    int send_idle = stopped[SEND] || (se->done == re->posted && !posting);
    int recv_idle = stopped[RECV] || (re->done == re->posted && !posting);
    if (send_idle && recv_idle) break;
    for (int q = 0; q < NQPS; q++) {
      if (fq[q].q == NULL) continue;
      struct fqp *f = &fq[q];
      int pending_read = f->flush && f->n > 0;
      uint64_t head_id = pending_read ? f->q[f->head].wr_id : 0;
      int before = f->n;
      step_qp(f);
      if (f->flush) { /* what the fabric did to the flush reads, for the ordering check */
        for (int k = 0; k < f->n; k++) {
          int i = pool_index(rc, f->q[(f->head + k) % f->depth].wr_id);
          if (i >= 0) read_state[f->lane][i] = 2;
        }
        if (pending_read && f->n < before) {
          int i = pool_index(rc, head_id);
          if (i >= 0) read_state[f->lane][i] = f->err ? 1 : 0;
        }
      }
    }
    ctrl_pump(SEND);
    ctrl_pump(RECV);
    fake_now += 1000000ull;
  }
  o.steps = step;
  o.hang = step == horizon + HANG_BOUND;
  if (o.hang && verbose) dump(sc, rc);
  o.error = ends[SEND].error || ends[RECV].error;
  o.bad_error = o.error && !errors_allowed(s);
  if (!o.error && !stopped[SEND] && !stopped[RECV]) {
    o.undelivered = ends[SEND].done - ends[RECV].done;
    if (o.undelivered < 0) o.undelivered = 0;
    for (int i = 0; i < s->nf && !s->at_end; i++) { /* an idle connection's rails move only when it is called */
      if (s->f[i].kind != K_FATAL) continue;
      int r = mpib_lane_rail(s->f[i].target);
      o.not_dead += sc->rail[r].state != MPIB_RAIL_DEAD;
    }
    o.leaks = in_use(sc) + in_use(rc); /* every request was tested to completion */
  }
  for (int r = 0; r < MPIB_NRAILS && s->nf == 0; r++) {       /* nothing failed: no rail may have left service */
    uint32_t gen = s->standby && r == MPIB_RAIL_SOUT ? 2 : 1; /* a standby came into service once */
    o.spurious += (sc->rail[r].gen != gen || sc->rail[r].state != MPIB_RAIL_UP) +
                  (rc->rail[r].gen != gen || rc->rail[r].state != MPIB_RAIL_UP);
  }
  o.standby_early = standby_early - early0;
  o.wrong = wrong_bytes - wrong0;
  o.unordered = unordered - unordered0;
  mpib_comm_close(sc);
  mpib_comm_close(rc);
  free_comm(sc);
  free_comm(rc);
  return o;
}

static int failed(const struct outcome *o) {
  return o->wrong || o->unordered || o->undelivered || o->hang || o->bad_error || o->not_dead || o->leaks ||
         o->spurious || o->standby_early;
}

/* ---- the schedules explored ---- */

static const int starts[] = {10, 35, 80, 160};
static const int lens[] = {25, 350};
static const int gaps[] = {0, 15, 45, 120, 400};
enum {
  NSTART = sizeof starts / sizeof starts[0],
  NLEN = sizeof lens / sizeof lens[0],
  NGAP = sizeof gaps / sizeof gaps[0]
};
static int durational(int kind) { return !is_fatal_once(kind); }

/* Every single fault of the grid: kind, target, start, length. */
static int singles(struct fault *out, int at_override) {
  int n = 0;
  for (int k = 0; k < NKINDS; k++)
    for (int t = 0; t < ntargets(k); t++)
      for (int a = 0; a < (at_override >= 0 ? 1 : NSTART); a++)
        for (int l = 0; l < (durational(k) ? NLEN : 1); l++)
          if (out) out[n++] = make_fault(k, t, at_override >= 0 ? at_override : starts[a], lens[l]);
          else n++;
  return n;
}

static struct fault *single_tab, *later_tab;
static int nsingle, nlater;

/* Schedule `id` of the exhaustive enumeration: ids [0, VARIANTS) have no fault (no rail may fail
 * over), then one fault each, then every pair (a first fault, and a second one starting gaps[g]
 * after it). Each in VARIANTS forms: the receiver runs every step or every third, with the real
 * send queues or small ones. */
enum { VARIANTS = 8 };
static long enum_count(void) { return VARIANTS * (1 + (long)nsingle + (long)nsingle * nlater * NGAP); }
static struct schedule enum_schedule(long id) {
  struct schedule s = {.recv_every = id % 2 ? 3 : 1, .test_every = 1, .small_sq = (id / 2) % 2, .at_end = (id / 4) % 2};
  id /= VARIANTS;
  if (id-- == 0) return s; /* no fault */
  if (id < nsingle) {
    s.nf = 1;
    s.f[0] = single_tab[id];
    return s;
  }
  id -= nsingle;
  s.nf = 2;
  s.f[0] = single_tab[id % nsingle];
  id /= nsingle;
  s.f[1] = later_tab[id % nlater];
  s.f[1].at = s.f[0].at + gaps[id / nlater];
  return s;
}

static uint64_t rng_next(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}
/* A random schedule of 1..3 faults at any step of the first 500, lengths 1..600. */
static struct schedule random_schedule(uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  struct schedule s = {.recv_every = 1 + (int)(rng_next(&x) % 3), .nf = 1 + (int)(rng_next(&x) % MAXF)};
  s.small_sq = (int)(rng_next(&x) % 2);
  s.at_end = (int)(rng_next(&x) % 4 == 0);
  for (int i = 0; i < s.nf; i++) {
    int kind = (int)(rng_next(&x) % NKINDS);
    s.f[i] = make_fault(kind, (int)(rng_next(&x) % (uint64_t)ntargets(kind)), 5 + (int)(rng_next(&x) % 500),
                        1 + (int)(rng_next(&x) % 600));
  }
  s.test_every = 1 + (int)(rng_next(&x) % 3);
  s.host_only = (int)(rng_next(&x) % 2);
  if (rng_next(&x) % 3 == 0) s.standby = 1 + (int)(rng_next(&x) % 250); /* a third: before, among, after the faults */
  return s;
}

struct totals {
  long schedules, wrong, unordered, undelivered, hangs, errors, bad_errors, not_dead, leaks, spurious;
  long standby, standby_early;
};

static int check_one(const struct schedule *s, const char *id, struct totals *t, int report) {
  struct outcome o = run(s);
  t->schedules++;
  t->wrong += o.wrong, t->unordered += o.unordered, t->undelivered += o.undelivered;
  t->hangs += o.hang, t->errors += o.error, t->bad_errors += o.bad_error, t->not_dead += o.not_dead,
      t->leaks += o.leaks, t->spurious += o.spurious;
  t->standby += s->standby > 0, t->standby_early += o.standby_early;
  if (!failed(&o)) return 0;
  if (report) {
    char d[512];
    describe(s, d, sizeof d);
    printf("model-fail: schedule=%s steps=%d wrong_bytes=%ld unordered_flushes=%ld undelivered_sends=%ld hang=%d "
           "error=%d error_allowed=%d not_dead=%d leaks=%d spurious_failovers=%d standby_early=%ld faults: %s\n",
           id, o.steps, o.wrong, o.unordered, o.undelivered, o.hang, o.error, !o.bad_error, o.not_dead, o.leaks,
           o.spurious, o.standby_early, d);
  }
  return o.steps > 0 ? o.steps : 1;
}

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct schedule schedule_of(const char *id) {
  return id[0] == 'r' ? random_schedule(strtoull(id + 1, NULL, 10)) : enum_schedule(strtol(id + 1, NULL, 10));
}

int main(int argc, char **argv) {
  ctx.ops.post_send = fake_post_send;
  ctx.ops.poll_cq = fake_poll_cq;
  ctx.ops.post_srq_recv = fake_post_srq_recv;
  mpib_g.failover = 1;
  mpib_g.flush_enabled = 1;
  mpib_g.recovery_backoff_ms = 20;
  mpib_g.recovery_backoff_max_ms = 160;
  mpib_g.failover_timeout_ms = 300;
  mpib_g.stall_timeout_ms = 3000;
  mpib_g.detect_ms = 12; /* the no-progress watch, shorter than RC_BUDGET: it finds the holes first */
  for (size_t i = 0; i < sizeof pattern_table; i++) {
    uint8_t b = (uint8_t)(i * 7);
    pattern_table[i] = b == 0xEE ? 0x11 : b;
  }
  for (long m = 0; m < 50; m++) /* the table says what the formula says */
    for (size_t off = 0; off < MAXSZ; off += 97) {
      uint8_t b = (uint8_t)(m * 131 + 17 + off * 7 + 1);
      if (msg_byte(m, 1, off) != (b == 0xEE ? 0x11 : b)) {
        fprintf(stderr, "model: pattern table disagrees at message %ld offset %zu\n", m, off);
        return 2;
      }
    }
  nsingle = singles(NULL, -1);
  single_tab = calloc((size_t)nsingle, sizeof *single_tab);
  singles(single_tab, -1);
  nlater = singles(NULL, 0) * NLEN; /* the second fault: any kind and target, either length */
  later_tab = calloc((size_t)nlater, sizeof *later_tab);
  for (int k = 0, n = 0; k < NKINDS; k++)
    for (int t = 0; t < ntargets(k); t++)
      for (int l = 0; l < NLEN; l++) later_tab[n++] = make_fault(k, t, 0, lens[l]);
  /* usage: checker replay ID | explore SECONDS [MIN_SCHEDULES [SHARD NSHARDS]] | first-failure SECONDS
   * explore: every enumerated schedule (singles first), then random ones, until SECONDS have
   * passed and MIN_SCHEDULES were run; a shard runs the schedules i with i % NSHARDS == SHARD.
   * first-failure: stops at the first failing schedule (the mutants' search). */
  const char *mode = argc > 1 ? argv[1] : "explore";
  struct totals t = {0};
  double t0 = seconds();
  if (strcmp(mode, "replay") == 0 && argc > 2) {
    verbose = 1;
    struct schedule s = schedule_of(argv[2]);
    int bad = check_one(&s, argv[2], &t, 1);
    return bad ? 1 : 0;
  }
  double budget = argc > 2 ? atof(argv[2]) : 60;
  long min_schedules = argc > 3 ? atol(argv[3]) : 0;
  long shard = argc > 5 ? atol(argv[4]) : 0, nshards = argc > 5 ? atol(argv[5]) : 1;
  int first_failure = strcmp(mode, "first-failure") == 0;
  long total = enum_count(), failures = 0;
  /* Singles and pairs in enumeration order (singles first: the shortest schedules), then, past
   * the enumeration or once the budget says so, seeded random schedules of up to three faults.
   * The pairs are visited in a stride that spreads a partial run over every kind. */
  long stride = 7919, done = 0, enumerated = 0;
  char id[64];
  for (long i = shard;; i += nshards) {
    struct schedule s;
    /* Every fourth schedule past the singles is a random one of up to three faults. */
    long singles_n = VARIANTS * (long)nsingle,
         j = i < singles_n ? i : singles_n + (i - singles_n) - (i - singles_n) / 4;
    if (i < singles_n) {
      snprintf(id, sizeof id, "e%ld", i);
    } else if ((i - singles_n) % 4 == 3 || j >= total) {
      snprintf(id, sizeof id, "r%ld", i);
    } else {
      snprintf(id, sizeof id, "e%ld", singles_n + ((j - singles_n) * stride) % (total - singles_n));
    }
    s = schedule_of(id);
    int steps = check_one(&s, id, &t, failures < (getenv("MODEL_REPORT") ? 100000 : 5));
    done++;
    enumerated += id[0] == 'e';
    if (steps) {
      failures++;
      if (first_failure) {
        printf("model-first-failure: schedule=%s steps=%d schedules=%ld\n", id, steps, done);
        return 0;
      }
    }
    double el = seconds() - t0;
    if (done >= min_schedules && el > budget) break;
    if (first_failure && el > budget) break;
  }
  char kinds[256] = "";
  for (int k = 0; k < NKINDS; k++)
    snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s", k ? "," : "", kind_names[k]);
  printf(
      "model: schedules=%ld max_faults=%d fault_kinds=%s lanes=2 wrong_bytes=%ld undelivered_sends=%ld hangs=%ld "
      "errors=%ld leaks=%ld seconds=%.0f unordered_flushes=%ld unexpected_errors=%ld not_dead=%ld enumerated=%ld/%ld "
      "completed_sends=%ld completed_recvs=%ld spurious_failovers=%ld standby_schedules=%ld standby_early=%ld\n",
      t.schedules, done > enumerated ? MAXF : 2, kinds, t.wrong, t.undelivered, t.hangs, t.errors, t.leaks,
      seconds() - t0, t.unordered, t.bad_errors, t.not_dead, enumerated, total, completed_sends, completed_recvs,
      t.spurious, t.standby, t.standby_early);
  if (first_failure) {
    printf("model-first-failure: none schedules=%ld\n", done);
    return 0;
  }
  return failures ? 1 : 0;
}
