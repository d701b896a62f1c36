//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_shm_*.c ../mpib_profiler.c

/* Replay bookkeeping under every fault sequence: a model test on FAKE verbs (not a verbs
 * test: the lab's fault cases are). The unchanged data path (mpib_p2p.c) runs both ends of
 * one connection in this process, a send comm and a recv comm with one QP per rail, over a
 * fake fabric that behaves like RC on a lossy link:
 *   - a posted write waits in its QP's send queue; each 1 ms step the head write of every QP
 *     lands (memcpy into the peer's memory, the immediate as a receive completion on the
 *     peer's SRQ) when its direction of the rail passes and the peer QP is connected in the
 *     same generation, and is acknowledged (a send completion) when the way back passes;
 *   - a write that cannot land or be acknowledged for RC_BUDGET steps fails the QP: the head
 *     completes with RETRY_EXC_ERR and the rest with WR_FLUSH_ERR (what the RC retry budget
 *     does); mpib_rail_to_error flushes a QP the same way; a reconnect discards its queue;
 *   - the receiver's reconnect fails while its rail is blocked either way (RoCE resolves the
 *     peer's MAC in the RTR transition, and the lab's loss case lost the ARP reply), the
 *     sender's succeeds (its neighbour entry still cached): the receiver refuses the attempt;
 *   - the TCP control socket is a real socketpair that never fails (the lab drops RoCE only,
 *     UDP 4791, when a sequence needs the control path alive).
 * Faults are one-way or two-way black holes on a rail, healed later. Sequences: every
 * combination of a first fault (rail, direction) and a second one (the other rail or the
 * same, direction), the second starting before detection, during the fence, around the
 * replay and after the recovery, each healed early or late.
 * Checked for every sequence:
 *   - every completed receive holds exactly the bytes sent, with the size sent;
 *   - every byte the fabric lands in a receive buffer equals what that buffer's current
 *     receive expects there (no late or stray write into a buffer NCCL got back);
 *   - the transfer completes (every outage heals within the stall timeout, so the connection
 *     rides through even when no rail works for a while), never an error or a hang;
 *   - outages that never heal, with a short stall timeout: both ends fail, no hang;
 *   - NCCL's profiler (mpib_profiler.c, real): every event of a completed request was stopped
 *     exactly once, through replays and failovers;
 *   - the sender never waits out MPIB_FAILOVER_TIMEOUT_MS for an answer to a RECOVER (the
 *     control socket never fails here, so the receiver always answers: ready or refused).
 * Prints: replay-model: sequences=N completions_checked=N wrong_bytes=0 ... */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../mpib.h"
#include "../mpib_p2p.h"
#include "../mpib_profiler.h"

#include "check.h"

/* ---- what mpib_p2p.c needs from the rest of the plugin ---- */

struct mpib_global mpib_g;
static uint64_t fake_now = 10000000000ull;
static int verbose;

static long refusals_seen, answer_timeouts; /* the sender's log of its recovery attempts */

uint64_t mpib_now_ns(void) { return fake_now; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  refusals_seen += strstr(msg, "the receiver could not rebuild it") != NULL;
  answer_timeouts += strstr(msg, "the receiver did not answer its RECOVER") != NULL;
  if (verbose) fprintf(stderr, "[%llu ms] %s\n", (unsigned long long)(fake_now / 1000000ull), msg);
}
const char *ibv_wc_status_str(enum ibv_wc_status status) { return status == IBV_WC_SUCCESS ? "ok" : "error"; }
int mpib_rail_rebuild_start(struct mpib_comm *c, int rail, uint32_t psn) {
  return (void)c, (void)rail, (void)psn, -EAGAIN;
}
int mpib_rail_rebuild_poll(struct mpib_comm *c, int rail, int *err) { return (void)c, (void)rail, *err = -EAGAIN, 1; }
#include "../mpib_flush.h"
/* no flushes here */
ncclResult_t mpib_flush_test(struct mpib_comm *c, struct mpib_request *req) {
  return (void)c, (void)req, ncclInternalError;
}

/* ---- a profiler (mpib_profiler.c, real): every event of a completed request must be stopped,
 * replays and failovers included ---- */

enum { MAX_EVENTS = 16384 };
static char prof_handle[2][1024]; /* NCCL's per-request handle: &prof_handle[side][message] */
static struct {
  const char *phandle;
  int stopped;
} prof_ev[MAX_EVENTS];
static int prof_n, prof_overflow;

static ncclResult_t prof_cb(void **ev, int type, void *phandle, int64_t plugin_id, void *data) {
  (void)plugin_id, (void)data;
  if (type == ncclProfilerNetEventStart) {
    if (prof_n == MAX_EVENTS) {
      prof_overflow = 1;
      *ev = NULL;
      return ncclSuccess;
    }
    prof_ev[prof_n] = (typeof(prof_ev[0])){.phandle = phandle};
    *ev = &prof_ev[prof_n++];
  } else if (type == ncclProfilerNetEventStop) {
    ((typeof(prof_ev[0]) *)*ev)->stopped++;
  }
  return ncclSuccess;
}

/* Events of completed requests (message < done[side]) not stopped exactly once. */
static int prof_unbalanced(const long done[2]) {
  int bad = 0;
  for (int i = 0; i < prof_n; i++) {
    long side = prof_ev[i].phandle >= prof_handle[1], m = prof_ev[i].phandle - prof_handle[side];
    if (m < done[side] && prof_ev[i].stopped != 1) bad++;
    if (prof_ev[i].stopped > 1) bad++;
  }
  return bad;
}

/* ---- the fake fabric: QP index = side * 2 + rail, side 0 the sender, 1 the receiver ---- */

enum { SEND = 0, RECV = 1, NQP = 4, QDEPTH = 1024, CQDEPTH = 8192, RC_BUDGET = 50 };
enum { FWD = 1, REV = 2 }; /* sender -> receiver, receiver -> sender */

struct wqe {
  uint64_t wr_id;
  int has_imm, signalled, landed, age;
  uint32_t imm, len;
  uint8_t *dst, *data;
};
struct fqp {
  int err;
  uint32_t psn;
  struct wqe q[QDEPTH];
  int head, n;
};
static struct ibv_context ctx;
static struct ibv_qp qp[NQP];
static struct ibv_cq cq[NQP];
static struct ibv_srq srq[MPIB_NRAILS];
static struct ibv_mr fake_mr;
static struct fqp fq[NQP];
static struct ibv_wc cqe[NQP][CQDEPTH];
static int cqe_head[NQP], cqe_n[NQP];
static int srq_avail[MPIB_NRAILS];
static int blocked[MPIB_NRAILS]; /* FWD | REV */
static struct mpib_comm *comm_of[2];

static int side_of(const struct mpib_comm *c) { return c == comm_of[SEND] ? SEND : RECV; }

static void push_cqe(int i, struct ibv_wc wc) {
  CHECK(cqe_n[i] < CQDEPTH, "CQ %d overflow", i);
  cqe[i][(cqe_head[i] + cqe_n[i]++) % CQDEPTH] = wc;
}

static void wqe_free(struct wqe *w) { free(w->data), w->data = NULL; }

/* The QP enters the error state: its writes complete in error, the head with `head_status`. */
static void qp_error(int i, enum ibv_wc_status head_status) {
  struct fqp *f = &fq[i];
  for (int k = 0; k < f->n; k++) {
    struct wqe *w = &f->q[(f->head + k) % QDEPTH];
    push_cqe(i, (struct ibv_wc){
                    .wr_id = w->wr_id, .status = k == 0 ? head_status : IBV_WC_WR_FLUSH_ERR, .qp_num = (uint32_t)i});
    wqe_free(w);
  }
  f->n = 0;
  f->err = 1;
}

void mpib_comm_destroy(struct mpib_comm *c) { (void)c; } /* mpib_comm_close's last step (comm setup) */
int mpib_rail_to_error(struct mpib_comm *c, int rail) {
  int i = side_of(c) * 2 + rail;
  if (!fq[i].err) qp_error(i, IBV_WC_WR_FLUSH_ERR);
  return 0;
}

int mpib_rail_reconnect(struct mpib_comm *c, int rail, uint32_t psn) {
  struct fqp *f = &fq[side_of(c) * 2 + rail];
  for (int k = 0; k < f->n; k++) wqe_free(&f->q[(f->head + k) % QDEPTH]);
  f->n = 0;
  f->err = side_of(c) == RECV && blocked[rail]; /* its RTR could not resolve the peer: left in INIT */
  if (f->err) return -ETIMEDOUT;
  f->psn = psn;
  return 0;
}

static int fake_post_send(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  int i = (int)(q - qp);
  struct fqp *f = &fq[i];
  for (; wr != NULL; wr = wr->next) {
    if (f->n == QDEPTH) {
      *bad = wr;
      return ENOMEM;
    }
    if (f->err) { /* posting to a QP in error: flushed at once */
      push_cqe(i, (struct ibv_wc){.wr_id = wr->wr_id, .status = IBV_WC_WR_FLUSH_ERR, .qp_num = (uint32_t)i});
      continue;
    }
    struct wqe *w = &f->q[(f->head + f->n++) % QDEPTH];
    uint32_t len = wr->num_sge ? wr->sg_list[0].length : 0;
    *w = (struct wqe){.wr_id = wr->wr_id,
                      .has_imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM,
                      .imm = wr->imm_data,
                      .len = len,
                      .dst = (uint8_t *)(uintptr_t)wr->wr.rdma.remote_addr};
    w->signalled = (wr->send_flags & IBV_SEND_SIGNALED) != 0; /* unsignalled: no success completion */
    if (len) {
      w->data = malloc(len);
      memcpy(w->data, (void *)(uintptr_t)wr->sg_list[0].addr, len);
    }
  }
  return 0;
}

static int fake_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc) {
  int i = (int)(c - cq), k = 0;
  for (; k < n && cqe_n[i] > 0; k++) {
    wc[k] = cqe[i][cqe_head[i]];
    cqe_head[i] = (cqe_head[i] + 1) % CQDEPTH;
    cqe_n[i]--;
  }
  return k;
}

static int fake_post_srq_recv(struct ibv_srq *s, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  (void)bad;
  for (; wr != NULL; wr = wr->next) srq_avail[s - srq]++;
  return 0;
}

/* ---- the transfer: messages, receive buffers, what every byte must be ---- */

/* NMSG messages must arrive; both ends go on posting up to NMAX meanwhile, as NCCL's next
 * operations would: a receiver with no receive open answers a failover only when NCCL posts
 * its next receive (docs/failover.md). */
enum { NMSG = 240, NMAX = NMSG + 64, WINDOW = 28, NBUF = WINDOW, NSRC = 64, MAXSIZE = 70000 };
static uint8_t *rbuf[NBUF];
static long rbuf_owner[NBUF]; /* the message whose receive owns the buffer, -1 = NCCL has it */
static uint8_t *sbuf[NSRC];
static long wrong_bytes, stray_bytes, completions_checked;

static size_t msg_size(long m) { return m % 3 == 0 ? 70000 : m % 3 == 1 ? 4096 : 640 + (size_t)m; }
/* Message m's byte at offset off is (m*131 + off*7 + 1) mod 256, with 0xEE (the fill of an
 * unwritten receive buffer) replaced by 0x11. The checks compare whole ranges against a table
 * instead of computing each byte: byte off of m is pattern_table[q + off] for the phase q of m
 * (7 * 183 = 1 mod 256), so a message's bytes from any offset are one contiguous run of the
 * table, and checking them is a memcmp (per-byte checks under AddressSanitizer made this test
 * take three minutes of CI). */
static uint8_t pattern_table[256 + MAXSIZE];

static void pattern_init(void) {
  for (size_t i = 0; i < sizeof pattern_table; i++) {
    uint8_t b = (uint8_t)(i * 7);
    pattern_table[i] = b == 0xEE ? 0x11 : b;
  }
}

/* The expected bytes of message m from offset off on (at most MAXSIZE of them). */
static const uint8_t *pattern_at(long m, size_t off) {
  size_t q = (size_t)(183 * (uint64_t)(m * 131 + 1)) & 255;
  return &pattern_table[(q + off) & 255];
}

/* How many of n bytes differ. */
static long mismatches(const uint8_t *a, const uint8_t *b, size_t n) {
  if (memcmp(a, b, n) == 0) return 0;
  long d = 0;
  for (size_t k = 0; k < n; k++) d += a[k] != b[k];
  return d;
}

/* A write landing in a receive buffer must carry what the buffer's current receive expects. */
static void check_landing(const uint8_t *dst, const uint8_t *data, uint32_t len) {
  for (int b = 0; b < NBUF; b++) {
    if (dst < rbuf[b] || dst >= rbuf[b] + MAXSIZE) continue;
    size_t off = (size_t)(dst - rbuf[b]);
    stray_bytes += rbuf_owner[b] < 0 ? (long)len : mismatches(data, pattern_at(rbuf_owner[b], off), len);
  }
}

/* One step of the fabric, per QP: the first write not landed yet lands when its direction of
 * the rail passes and the peer QP is connected in the same generation (RC streams writes
 * without waiting for acknowledgements, so later writes land while earlier ones wait for
 * theirs), and the head write is acknowledged when it landed and the way back passes. A head
 * that goes unacknowledged for RC_BUDGET steps fails the QP. */
static void land(int i, struct wqe *w) {
  int rail = i % 2, side = i / 2, peer = (1 - side) * 2 + rail;
  if (verbose && side == RECV && w->len >= sizeof(struct mpib_cts) &&
      w->dst < (uint8_t *)comm_of[SEND]->cts + MPIB_CTS_BYTES) {
    const struct mpib_cts *e = (const void *)w->data;
    fprintf(stderr, "[%llu ms] CTS lands on rail %d: slot %d seq1 %llu (was %llu)\n",
            (unsigned long long)(fake_now / 1000000ull), rail,
            (int)((w->dst - (uint8_t *)comm_of[SEND]->cts) / sizeof(mpib_cts_row)), (unsigned long long)e->seq,
            (unsigned long long)((const struct mpib_cts *)w->dst)->seq);
  }
  if (w->len) {
    check_landing(w->dst, w->data, w->len);
    memcpy(w->dst, w->data, w->len);
  }
  if (w->has_imm) {
    srq_avail[rail]--;
    push_cqe(peer, (struct ibv_wc){.wr_id = MPIB_WRID_SPECIAL | MPIB_WR_RECV,
                                   .status = IBV_WC_SUCCESS,
                                   .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
                                   .wc_flags = IBV_WC_WITH_IMM,
                                   .imm_data = w->imm,
                                   .qp_num = (uint32_t)peer});
  }
  w->landed = 1;
}

static void fabric_step(void) {
  for (int i = 0; i < NQP; i++) {
    struct fqp *f = &fq[i];
    if (f->err || f->n == 0) continue;
    int rail = i % 2, side = i / 2, peer = (1 - side) * 2 + rail;
    int out = side == SEND ? FWD : REV, back = side == SEND ? REV : FWD;
    int peer_ok = !fq[peer].err && fq[peer].psn == f->psn;
    for (int k = 0; k < f->n; k++) {
      struct wqe *w = &f->q[(f->head + k) % QDEPTH];
      if (w->landed) continue;
      if (!(blocked[rail] & out) && peer_ok && (!w->has_imm || srq_avail[rail] > 0)) land(i, w);
      break;
    }
    struct wqe *w = &f->q[f->head];
    if (w->landed && !(blocked[rail] & back) && peer_ok) {
      if (w->signalled)
        push_cqe(i,
                 (struct ibv_wc){
                     .wr_id = w->wr_id, .status = IBV_WC_SUCCESS, .opcode = IBV_WC_RDMA_WRITE, .qp_num = (uint32_t)i});
      wqe_free(w);
      f->head = (f->head + 1) % QDEPTH;
      f->n--;
    } else if (++w->age > RC_BUDGET) {
      qp_error(i, IBV_WC_RETRY_EXC_ERR);
    }
  }
}

/* The control socket: notices, fence records and failure bytes from one end, delivered to the
 * other as lifecycle.go does. */
static int ctrl[2];
static uint8_t cbuf[2][4096];
static int cbuf_n[2];
static void ctrl_pump(void) {
  for (int side = 0; side < 2; side++) { /* ctrl[side] is side's socket; it reads what the other sent */
    ssize_t got = recv(ctrl[side], cbuf[side] + cbuf_n[side], sizeof cbuf[side] - (size_t)cbuf_n[side], MSG_DONTWAIT);
    if (got > 0) cbuf_n[side] += (int)got;
    struct mpib_comm *c = comm_of[side];
    int k = 0;
    while (k < cbuf_n[side]) {
      if (cbuf[side][k] == 'F') {
        __atomic_store_n(&c->peer_gone_ns, fake_now - 2000000000ull, __ATOMIC_RELEASE);
        k++;
      } else if (cbuf[side][k] == 'N' && cbuf_n[side] - k >= 10) {
        uint64_t word = 0;
        for (int b = 0; b < 8; b++) word |= (uint64_t)cbuf[side][k + 2 + b] << (8 * b);
        __atomic_store_n(&c->tcp_notice[cbuf[side][k + 1] & 1], word, __ATOMIC_RELEASE);
        k += 10;
      } else if (cbuf[side][k] == 'R' && cbuf_n[side] - k >= 2 + (int)sizeof(struct mpib_fence_rec)) {
        memcpy(&c->tcp_rec[cbuf[side][k + 1] & 1], cbuf[side] + k + 2, sizeof(struct mpib_fence_rec));
        k += 2 + (int)sizeof(struct mpib_fence_rec);
      } else {
        break; /* the rest of a message still to come */
      }
    }
    memmove(cbuf[side], cbuf[side] + k, (size_t)(cbuf_n[side] - k));
    cbuf_n[side] -= k;
  }
}

/* ---- one connection ---- */

static struct mpib_comm *make_comm(int side) {
  struct mpib_comm *c = calloc(1, sizeof *c);
  for (int n = 0; n < MPIB_NRAILS; n++) c->nic[n] = &mpib_g.nic[n]; /* fused device 0: NICs 0 and 1 */
  c->sup_lanes = 1;                                                 /* one lane per rail: lane r is rail r's */
  size_t area = (MPIB_NIC_AREA + MPIB_PAGE - 1) / MPIB_PAGE * MPIB_PAGE;
  c->cts = aligned_alloc(MPIB_PAGE, area);
  memset(c->cts, 0, area);
  c->sizes = (mpib_sizes_row *)((char *)c->cts + MPIB_SIZES_OFFSET);
  c->is_send = side == SEND;
  c->mode = MPIB_MODE_ADVANCED;
  c->path_class = MPIB_PATH_INTRA_ISLAND;
  c->cts_rail = MPIB_RAIL_SOUT;
  c->force_sup_bw = 512; /* half on each rail: every slot has two byte ranges */
  c->whole_msg_max = 0;
  c->shm_slot = -1;
  c->hint_due = 1; /* as mpib_comm_create leaves it */
  c->nreqs_pool = side == SEND ? MPIB_REQ_POOL_SEND : MPIB_REQ_POOL_RECV;
  c->reqs = calloc((size_t)c->nreqs_pool, sizeof *c->reqs);
  c->ctrl_fd = ctrl[side];
  c->sq_depth = side == SEND ? MPIB_SEND_WR_SENDER : MPIB_SEND_WR_RECEIVER;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    int i = side * 2 + r;
    qp[i].context = &ctx;
    cq[i].context = &ctx;
    c->nqps[r] = 1;
    c->qps[mpib_qp_index(r, 0, 1, 1)] = (struct mpib_qp){.qp = &qp[i], .rail = r, .lane = r};
    c->cq[r] = &cq[i];
    c->stage_mr[r] = &fake_mr;
    c->rail[r] = (struct mpib_rail_ctl){.state = MPIB_RAIL_UP, .gen = 1};
    if (side == RECV) {
      srq[r].context = &ctx;
      c->srq[r] = &srq[r];
    }
  }
  comm_of[side] = c;
  return c;
}

static void free_comm(struct mpib_comm *c) {
  free(c->cts);
  free(c->reqs);
  free(c);
}

static void fabric_reset(void) {
  for (int i = 0; i < NQP; i++) {
    for (int k = 0; k < fq[i].n; k++) wqe_free(&fq[i].q[(fq[i].head + k) % QDEPTH]);
    fq[i].n = fq[i].head = fq[i].err = 0;
    fq[i].psn = 0;
    cqe_n[i] = cqe_head[i] = 0;
  }
  srq_avail[0] = srq_avail[1] = 0;
  blocked[0] = blocked[1] = 0;
  cbuf_n[0] = cbuf_n[1] = 0;
  uint8_t junk[4096]; /* what the previous connection's ends sent last */
  for (int side = 0; side < 2; side++)
    while (recv(ctrl[side], junk, sizeof junk, MSG_DONTWAIT) > 0) {}
  for (int b = 0; b < NBUF; b++) rbuf_owner[b] = -1;
}

/* A fault: from step `at`, rail `rail` drops the directions `dirs` until step `at + len`. */
struct fault {
  int rail, dirs, at, len;
};
struct outcome {
  int completed, send_error, recv_error, hang, prof_unbalanced;
  long received;
};

static void apply_faults(const struct fault *f, int nf, int step) {
  for (int r = 0; r < MPIB_NRAILS; r++) blocked[r] = 0;
  for (int k = 0; k < nf; k++)
    if (step >= f[k].at && step < f[k].at + f[k].len) blocked[f[k].rail] |= f[k].dirs;
}

/* Receiver: posts receives up to the window, tests them, checks every completed one. */
static int recv_side(struct mpib_comm *c, struct mpib_mr *mh, struct mpib_request **open, long *posted, long *done) {
  while (*posted < NMAX && *posted - *done < WINDOW) {
    int b = (int)(*posted % NBUF);
    void *data = rbuf[b];
    size_t size = MAXSIZE;
    int tag = 1;
    void *mhp = mh;
    memset(rbuf[b], 0xEE, MAXSIZE);
    rbuf_owner[b] = *posted;
    void *req = NULL, *ph = &prof_handle[RECV][*posted];
    if (mpib_irecv(c, 1, &data, &size, &tag, &mhp, &ph, &req) != ncclSuccess) return -1;
    if (req == NULL) {
      rbuf_owner[b] = -1;
      break;
    }
    open[b] = req;
    (*posted)++;
  }
  while (*done < *posted) {
    int b = (int)(*done % NBUF), fin = 0, size = -1;
    if (mpib_test(open[b], &fin, &size) != ncclSuccess) return -1;
    if (!fin) break;
    long m = *done;
    completions_checked++;
    if ((size_t)size != msg_size(m)) wrong_bytes += (long)msg_size(m);
    else wrong_bytes += mismatches(rbuf[b], pattern_at(m, 0), msg_size(m));
    rbuf_owner[b] = -1;
    (*done)++;
  }
  return 0;
}

static int send_side(struct mpib_comm *c, struct mpib_mr *mh, struct mpib_request **open, long *posted, long *done) {
  while (*posted < NMAX) {
    int s = (int)(*posted % NSRC);
    if (*posted - *done >= NSRC) break;
    memcpy(sbuf[s], pattern_at(*posted, 0), msg_size(*posted));
    void *req = NULL;
    if (mpib_isend(c, sbuf[s], msg_size(*posted), 1, mh, &prof_handle[SEND][*posted], &req) != ncclSuccess) return -1;
    if (req == NULL) break;
    open[s] = req;
    (*posted)++;
  }
  while (*done < *posted) {
    int fin = 0;
    if (mpib_test(open[*done % NSRC], &fin, NULL) != ncclSuccess) return -1;
    if (!fin) break;
    (*done)++;
  }
  return 0;
}

enum { MAX_STEPS = 30000 };

static void dump(struct mpib_comm *s, struct mpib_comm *r, long sp, long sd, long rp, long rd) {
  fprintf(stderr,
          "hang: send posted=%ld done=%ld fifo_head=%llu replays_waiting=%d; recv posted=%ld done=%ld fifo_head=%llu\n",
          sp, sd, (unsigned long long)s->fifo_head, s->replays_waiting, rp, rd, (unsigned long long)r->fifo_head);
  for (int k = 0; k < MPIB_NRAILS; k++)
    fprintf(stderr, "  rail %d: send state=%d gen=%u pending=%u  recv state=%d gen=%u pending=%u  cts_rail=%d\n", k,
            s->rail[k].state, s->rail[k].gen, s->pending[k], r->rail[k].state, r->rail[k].gen, r->pending[k],
            r->cts_rail);
  for (int i = 0; i < NQP; i++)
    fprintf(stderr, "  qp %d: err=%d psn=%u queued=%d cqes=%d\n", i, fq[i].err, fq[i].psn, fq[i].n, cqe_n[i]);
  for (int slot = 0; slot < MPIB_MAX_REQUESTS; slot++) {
    if (s->slot_posted_seq1[slot] || s->slot_matched[slot])
      fprintf(stderr, "  send slot %d: seq1=%llu matched=%d rails=%u replay_on=%u/%u wait=%u\n", slot,
              (unsigned long long)s->slot_posted_seq1[slot], s->slot_matched[slot], s->slot_rails[slot],
              s->slot_replay_on[slot][0], s->slot_replay_on[slot][1], s->slot_replay_wait[slot]);
    struct mpib_request *q = r->slot_reqs[slot][0];
    if (q)
      fprintf(stderr, "  recv slot %d: seq=%llu expected=%u have=%u\n", slot, (unsigned long long)q->seq,
              q->expected_mask, q->have_mask);
  }
}

/* A degraded start (mpib_comm_connect): `side`'s QPs of `rail` never came up, so its comm
 * starts with the rail DOWN; -1: none. */
static int degraded_side = -1, degraded_rail;

/* A standby SOUT rail (mpib_comm_connect with the sender's rail deferred): both ends start with
 * it DOWN, waiting for its join, which the control plane completes at step standby_join_at
 * (the sender's QPs built and taken by the receiver: standby.go); -1: no standby. */
static int standby_join_at = -1;

static void standby_start(struct mpib_comm *s, struct mpib_comm *r) {
  struct mpib_comm *both[2] = {s, r};
  for (int k = 0; k < 2; k++) {
    struct mpib_rail_ctl *rc = &both[k]->rail[MPIB_RAIL_SOUT];
    rc->state = MPIB_RAIL_DOWN;
    rc->since_ns = fake_now;
    rc->join_wait = 1;
    fq[k * 2 + MPIB_RAIL_SOUT].err = 1; /* not built, or never left INIT: drops what arrives */
  }
  r->cts_rail = MPIB_RAIL_SUP;
}

static void standby_join(struct mpib_comm *s, struct mpib_comm *r) {
  r->join_peer[MPIB_RAIL_SOUT] = (struct mpib_join_info){.nqps = r->nqps[MPIB_RAIL_SOUT]};
  __atomic_store_n(&r->rail[MPIB_RAIL_SOUT].join_arrived, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&s->rail[MPIB_RAIL_SOUT].join_built, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&s->rail[MPIB_RAIL_SOUT].join_arrived, 1, __ATOMIC_RELEASE);
}

static struct outcome run(const struct fault *f, int nf) {
  fabric_reset();
  prof_n = prof_overflow = 0;
  struct mpib_comm *s = make_comm(SEND), *r = make_comm(RECV);
  s->rem_addr = (uint64_t)(uintptr_t)r->sizes;
  r->rem_addr = (uint64_t)(uintptr_t)s->cts;
  if (degraded_side >= 0) {
    struct mpib_comm *d = comm_of[degraded_side];
    fq[degraded_side * 2 + degraded_rail].err = 1; /* never left INIT: drops what arrives */
    d->rail[degraded_rail].state = MPIB_RAIL_DOWN;
    d->rail[degraded_rail].since_ns = fake_now;
    d->rail[degraded_rail].retry_at_ns = fake_now + mpib_g.recovery_backoff_ms * 1000000ull;
    if (d->cts_rail == degraded_rail) d->cts_rail = 1 - degraded_rail;
  }
  if (standby_join_at >= 0) standby_start(s, r);
  struct mpib_mr mh = {.mr = {&fake_mr, &fake_mr}};
  struct mpib_request *sopen[NSRC], *ropen[NBUF];
  long sposted = 0, sdone = 0, rposted = 0, rdone = 0;
  struct outcome o = {0};
  int step;
  for (step = 0; step < MAX_STEPS; step++) {
    apply_faults(f, nf, step);
    if (step == standby_join_at) standby_join(s, r);
    if (!o.recv_error && recv_side(r, &mh, ropen, &rposted, &rdone) != 0) o.recv_error = step + 1;
    if (!o.send_error && send_side(s, &mh, sopen, &sposted, &sdone) != 0) o.send_error = step + 1;
    if (sdone >= NMSG && rdone >= NMSG) break;
    if ((o.send_error || sdone >= NMSG) && (o.recv_error || rdone >= NMSG)) break;
    fabric_step();
    ctrl_pump();
    fake_now += 1000000ull;
  }
  o.completed = sdone >= NMSG && rdone >= NMSG;
  o.hang = step == MAX_STEPS;
  long done[2] = {sdone, rdone};
  o.prof_unbalanced = prof_overflow ? -1 : prof_unbalanced(done);
  if (o.hang && verbose) dump(s, r, sposted, sdone, rposted, rdone);
  o.received = rdone;
  free_comm(s);
  free_comm(r);
  return o;
}

static const char *dirs_name(int d) { return d == FWD ? "fwd" : d == REV ? "rev" : "both"; }

int main(void) {
  /* MPIB_MODEL_SEQ=N runs sequence N alone with the data path's log on stderr. */
  int only = getenv("MPIB_MODEL_SEQ") ? atoi(getenv("MPIB_MODEL_SEQ")) : -1;
  verbose = getenv("MPIB_MODEL_VERBOSE") != NULL;
  ctx.ops.post_send = fake_post_send;
  ctx.ops.poll_cq = fake_poll_cq;
  ctx.ops.post_srq_recv = fake_post_srq_recv;
  mpib_prof_set(prof_cb);
  mpib_g.failover = 1;
  /* Shorter than the RC budget, as on a real fabric (250 ms against ~700 ms): a rail can come
   * back while the other's silent loss is still being retried. */
  mpib_g.recovery_backoff_ms = 20;
  mpib_g.recovery_backoff_max_ms = 160;
  mpib_g.failover_timeout_ms = 5000;
  mpib_g.stall_timeout_ms = 30000; /* every outage here heals within 2.6 s: ride through */
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, ctrl) == 0, "socketpair");
  pattern_init();
  for (long m = 0; m < NMAX; m += 7) /* the table says what the formula says */
    for (size_t off = 0; off < MAXSIZE; off += 997) {
      uint8_t b = (uint8_t)(m * 131 + off * 7 + 1);
      CHECK(pattern_at(m, off)[0] == (b == 0xEE ? 0x11 : b), "pattern table: message %ld offset %zu", m, off);
    }
  for (int b = 0; b < NBUF; b++) rbuf[b] = malloc(MAXSIZE);
  for (int k = 0; k < NSRC; k++) sbuf[k] = malloc(MAXSIZE);

  static const int gaps[] = {0, 30, 40, 50, 70, 100, 150, 400};
  static const int lens[] = {60, 2500};
  static const int kinds[] = {FWD, REV, FWD | REV};
  int sequences = 0, errors = 0, hangs = 0, bad = 0, prof_bad = 0;
  struct outcome base = run(NULL, 0);
  CHECK(base.completed && wrong_bytes == 0 && stray_bytes == 0, "no fault: completed=%d wrong=%ld stray=%ld",
        base.completed, wrong_bytes, stray_bytes);
  for (int a = 0; a < MPIB_NRAILS; a++)
    for (int same = 0; same < 2; same++)
      for (int k1 = 0; k1 < 3; k1++)
        for (int k2 = 0; k2 < 3; k2++)
          for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++)
            for (int l1 = 0; l1 < 2; l1++)
              for (int l2 = 0; l2 < 2; l2++) {
                struct fault f[2] = {{a, kinds[k1], 20, lens[l1]},
                                     {same ? a : 1 - a, kinds[k2], 20 + gaps[g], lens[l2]}};
                if (same && gaps[g] < lens[l1]) continue; /* the same rail again only once it healed */
                long wrong0 = wrong_bytes, stray0 = stray_bytes;
                if (only >= 0 && sequences != only) {
                  sequences++;
                  continue;
                }
                verbose = verbose || only >= 0;
                struct outcome o = run(f, 2);
                sequences++;
                /* Every outage heals well within the stall timeout: whatever the order, the
                 * connection rides through and the transfer completes. */
                int failed =
                    wrong_bytes != wrong0 || stray_bytes != stray0 || o.hang || !o.completed || o.prof_unbalanced;
                prof_bad += o.prof_unbalanced != 0;
                errors += !o.completed && !o.hang;
                hangs += o.hang;
                if (failed && bad++ < 12)
                  fprintf(
                      stderr,
                      "FAIL sequence %d: %s %s at 20 for %d, then %s %s at %d for %d: completed=%d received=%ld "
                      "send_error_step=%d recv_error_step=%d hang=%d wrong_bytes=%ld stray_bytes=%ld prof_unbalanced=%d\n",
                      sequences - 1, a ? "SUP" : "SOUT", dirs_name(f[0].dirs), f[0].len, f[1].rail ? "SUP" : "SOUT",
                      dirs_name(f[1].dirs), f[1].at, f[1].len, o.completed, o.received, o.send_error, o.recv_error,
                      o.hang, wrong_bytes - wrong0, stray_bytes - stray0, o.prof_unbalanced);
              }
  printf("replay-model: sequences=%d completions_checked=%ld wrong_bytes=%ld stray_bytes=%ld errors=%d hangs=%d "
         "failed_sequences=%d profiler_unbalanced_sequences=%d refused_rebuilds=%ld answer_timeouts=%ld\n",
         sequences, completions_checked, wrong_bytes, stray_bytes, errors, hangs, bad, prof_bad, refusals_seen,
         answer_timeouts);
  CHECK(bad == 0, "%d of %d sequences failed", bad, sequences);
  CHECK(refusals_seen > 0 && answer_timeouts == 0,
        "recovery: %ld refused rebuilds, %ld attempts that waited out the failover timeout (want some, none)",
        refusals_seen, answer_timeouts);
  /* Outages that never heal: with the stall timeout short, both ends fail with an error, no
   * hang and no wrong byte; and a peer that goes away during a stall fails the other at once. */
  mpib_g.stall_timeout_ms = 500;
  int permanent = 0, permanent_bad = 0;
  for (int k = 0; k < 3; k++)
    for (int g = 0; g < 3; g++) {
      struct fault f[2] = {{MPIB_RAIL_SOUT, kinds[k], 20, MAX_STEPS},
                           {MPIB_RAIL_SUP, kinds[(k + g) % 3], 20 + 40 * g, MAX_STEPS}};
      long wrong0 = wrong_bytes, stray0 = stray_bytes;
      struct outcome o = run(f, 2);
      permanent++;
      int ok = !o.hang && o.send_error && o.recv_error && wrong_bytes == wrong0 && stray_bytes == stray0 &&
               o.send_error < 20 + 40 * g + 2000 && o.recv_error < 20 + 40 * g + 2000;
      if (!ok && permanent_bad++ < 4)
        fprintf(stderr,
                "FAIL permanent outage %d/%d: send_error_step=%d recv_error_step=%d hang=%d wrong=%ld stray=%ld\n", k,
                g, o.send_error, o.recv_error, o.hang, wrong_bytes - wrong0, stray_bytes - stray0);
    }
  printf("replay-model: permanent_outages=%d both_ends_failed=%d hangs=0\n", permanent, permanent - permanent_bad);
  /* Degraded starts: one end's rail never came up at connect (its port was down), the other
   * end's did; the rail joins later. With and without a fault on the other rail meanwhile. */
  mpib_g.stall_timeout_ms = 30000;
  int degraded = 0, degraded_bad = 0;
  for (degraded_side = 0; degraded_side < 2; degraded_side++)
    for (degraded_rail = 0; degraded_rail < MPIB_NRAILS; degraded_rail++)
      for (int k = 0; k < 2; k++) {
        struct fault f = {1 - degraded_rail, FWD | REV, 400, 300};
        long wrong0 = wrong_bytes, stray0 = stray_bytes;
        struct outcome o = run(&f, k);
        degraded++;
        if ((!o.completed || wrong_bytes != wrong0 || stray_bytes != stray0) && degraded_bad++ < 4)
          fprintf(stderr,
                  "FAIL degraded start: side %d rail %d fault %d: completed=%d hang=%d send_error=%d recv_error=%d\n",
                  degraded_side, degraded_rail, k, o.completed, o.hang, o.send_error, o.recv_error);
      }
  degraded_side = -1;
  printf("replay-model: degraded_starts=%d completed=%d\n", degraded, degraded - degraded_bad);
  /* Standby rails: SOUT joins at some step, before any traffic or during it, with SUP faulted
   * before, across or after the join, healing or never; the transfer completes every time. */
  static const int joins[] = {0, 50, 300, 1500};
  static const struct fault sup_faults[] = {{MPIB_RAIL_SUP, FWD | REV, 20, 300},
                                            {MPIB_RAIL_SUP, FWD | REV, 100, 2500},
                                            {MPIB_RAIL_SUP, REV, 400, 600},
                                            {MPIB_RAIL_SUP, FWD, 400, MAX_STEPS}};
  int standbys = 0, standby_bad = 0;
  for (size_t j = 0; j < sizeof joins / sizeof joins[0]; j++)
    for (int k = -1; k < (int)(sizeof sup_faults / sizeof sup_faults[0]); k++) {
      standby_join_at = joins[j];
      long wrong0 = wrong_bytes, stray0 = stray_bytes;
      struct outcome o = run(k < 0 ? NULL : &sup_faults[k], k < 0 ? 0 : 1);
      standbys++;
      if ((!o.completed || wrong_bytes != wrong0 || stray_bytes != stray0) && standby_bad++ < 4)
        fprintf(stderr, "FAIL standby join at %d, SUP fault %d: completed=%d hang=%d send_error=%d recv_error=%d\n",
                joins[j], k, o.completed, o.hang, o.send_error, o.recv_error);
    }
  standby_join_at = -1;
  printf("replay-model: standby_joins=%d completed=%d\n", standbys, standbys - standby_bad);
  CHECK(standby_bad == 0, "%d of %d standby joins did not complete", standby_bad, standbys);
  CHECK(degraded_bad == 0, "%d of %d degraded starts did not complete", degraded_bad, degraded);
  CHECK(permanent_bad == 0, "%d of %d permanent outages did not fail both ends within the stall timeout", permanent_bad,
        permanent);
  return failures ? 1 : 0;
}
