//go:build ignore
// link: ../mpib_p2p.c ../mpib_failover.c ../mpib_watch.c ../mpib_slots.c ../mpib_shm_*.c shm_agent.c shm_decode.c

/* A FIFO slot taken again while its previous sequence is not confirmed (mpib_p2p.c,
 * slot_still_held), on fake verbs. The sender keeps a posted slot's requests, split and CTS
 * snapshot until that slot's acknowledgements are in (a failover replays from them); the
 * receiver may already have completed that sequence and sent the CTS of the one 32 later into
 * the same slot. Here sequence 0 (one request) is posted and its acknowledgement held back,
 * sequences 1..31 complete, and the CTS of sequence 32 arrives in slot 0 as a group of two
 * receives. Checks:
 *   - both isends of sequence 32 wait (no request, nothing posted, the FIFO head stays) while
 *     sequence 0 holds the slot, and sequence 0's CTS snapshot, which a replay would write to,
 *     is still sequence 0's;
 *   - once sequence 0's acknowledgement is polled and its request is done, sequence 32 is
 *     matched and posted as a write to each of the group's two buffers and the write of their
 *     sizes with an immediate of slot 0 and sequence 32, and completes. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib.h"
#include "../mpib_p2p.h"
#include "../mpib_profiler.h"
#include "../mpib_slots.h"

#include "check.h"

/* ---- what mpib_p2p.c needs from the rest of the plugin ---- */

struct mpib_global mpib_g;
ncclProfilerCallback_t mpib_prof_fn;
uint64_t mpib_now_ns(void) { return 1000000000ull; }
void mpib_log(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...) {
  (void)level, (void)file, (void)line, (void)fmt;
}
#include "p2p_stubs.h"

/* ---- fake verbs: SUP's writes recorded; the acknowledgement of sequence 0 held back ---- */

static struct ibv_context ctx;
static struct ibv_qp qp[MPIB_NRAILS];
static struct ibv_cq cq[MPIB_NRAILS];
static struct ibv_mr mr;
static uint64_t done_q[MPIB_NRAILS][256]; /* wr_ids of signalled writes the next poll returns */
static int done_n[MPIB_NRAILS];
static uint64_t held_wr_id; /* sequence 0's signalled write, 0 until posted */
static int posts;           /* ibv_post_send calls */
static int last_nwr;        /* the last chain: its writes, their remote addresses, its immediate */
static uint64_t last_remote[16];
static uint32_t last_imm;

static int fake_post_send(struct ibv_qp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  int rail = (int)(q - qp);
  (void)bad;
  posts++;
  last_nwr = 0;
  for (; wr != NULL; wr = wr->next) {
    last_remote[last_nwr++] = wr->wr.rdma.remote_addr;
    if (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) last_imm = wr->imm_data;
    if (!(wr->send_flags & IBV_SEND_SIGNALED)) continue;
    if (held_wr_id == 0 && (wr->wr_id & MPIB_WRID_SEQ_MASK) == 0) held_wr_id = wr->wr_id;
    else done_q[rail][done_n[rail]++] = wr->wr_id;
  }
  return 0;
}

static int fake_poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc) {
  int rail = (int)(c - cq), k = 0;
  for (; k < n && k < done_n[rail]; k++)
    wc[k] = (struct ibv_wc){.wr_id = done_q[rail][k], .opcode = IBV_WC_RDMA_WRITE, .status = IBV_WC_SUCCESS};
  memmove(done_q[rail], done_q[rail] + k, (size_t)(done_n[rail] - k) * sizeof done_q[0][0]);
  done_n[rail] -= k;
  return k;
}

/* The receiver's CTS for the FIFO head's sequence: nreqs receives of 4 KiB with tags[r], the
 * r-th at base + r MiB. */
static void cts_lands(struct mpib_comm *c, int nreqs, const int *tags, uint64_t base) {
  for (int r = 0; r < nreqs; r++) {
    struct mpib_cts *e = &c->cts[c->fifo_head % MPIB_MAX_REQUESTS][r];
    *e = (struct mpib_cts){.addr = base + ((uint64_t)r << 20),
                           .size = 4096,
                           .tag = tags[r],
                           .nreqs = (uint32_t)nreqs,
                           .seq = c->fifo_head + 1};
    e->check = mpib_cts_check(e);
  }
}

int main(void) {
  mpib_g.failover = 1;
  struct mpib_comm *c = fake_send_comm(&ctx, fake_post_send, fake_poll_cq, qp, cq, &mr);
  c->whole_msg_max = 1 << 20; /* a message goes whole to SUP (vanilla inside the island) */
  struct mpib_mr mh = {.mr = {&mr, &mr}};
  static char buf[8192];
  const int one[1] = {7}, two[2] = {7, 8};
  const uint64_t seq0_buf = 0xA0000000ull, seq32_buf = 0xC0000000ull;

  void *r0 = NULL;
  cts_lands(c, 1, one, seq0_buf);
  CHECK(mpib_isend(c, buf, 100, 7, &mh, NULL, &r0) == ncclSuccess && r0 != NULL, "sequence 0 not posted");
  for (int s = 1; s < MPIB_MAX_REQUESTS; s++) {
    void *r = NULL;
    int done = 0;
    cts_lands(c, 1, one, 0xB0000000ull);
    CHECK(mpib_isend(c, buf, 100, 7, &mh, NULL, &r) == ncclSuccess && r != NULL, "sequence %d not posted", s);
    CHECK(r != NULL && mpib_test(r, &done, NULL) == ncclSuccess && done, "sequence %d not done", s);
  }
  int done = 0;
  CHECK(held_wr_id != 0 && mpib_test(r0, &done, NULL) == ncclSuccess && !done,
        "sequence 0 done without its acknowledgement");

  /* The receiver completed sequence 0 (its immediate arrived) and sends sequence 32's CTS. */
  cts_lands(c, 2, two, seq32_buf);
  int posts_before = posts;
  void *r32[2] = {NULL, NULL};
  for (int k = 1; k >= 0; k--) { /* tag 8 first: the receive sequence 0 never had */
    CHECK(mpib_isend(c, buf + 4096 * k, 200, two[k], &mh, NULL, &r32[k]) == ncclSuccess && r32[k] == NULL,
          "sequence 32's isend of tag %d matched while sequence 0 holds its slot", two[k]);
  }
  CHECK(posts == posts_before && c->fifo_head == MPIB_MAX_REQUESTS,
        "a chain went out while sequence 0 holds the slot (posts %d -> %d, FIFO head %llu)", posts_before, posts,
        (unsigned long long)c->fifo_head);
  CHECK(c->cts_snap[0][0].addr == seq0_buf && c->cts_snap[0][0].seq == 1,
        "sequence 0's CTS snapshot was replaced (addr 0x%llx, seq %llu) while a replay could still need it",
        (unsigned long long)c->cts_snap[0][0].addr, (unsigned long long)c->cts_snap[0][0].seq);

  /* Sequence 0's acknowledgement arrives: the slot is free for sequence 32. */
  done_q[MPIB_RAIL_SUP][done_n[MPIB_RAIL_SUP]++] = held_wr_id;
  done = 0;
  CHECK(mpib_test(r0, &done, NULL) == ncclSuccess && done, "sequence 0 not done after its acknowledgement");
  for (int k = 0; k < 2; k++) {
    for (int tries = 0; tries < 4 && r32[k] == NULL; tries++)
      CHECK(mpib_isend(c, buf + 4096 * k, 200, two[k], &mh, NULL, &r32[k]) == ncclSuccess, "isend failed");
    CHECK(r32[k] != NULL, "sequence 32's isend of tag %d never matched after the slot was freed", two[k]);
  }
  uint32_t slot = 99, mask = 0, seq8 = 0, size = 0;
  mpib_imm_decode(last_imm, &slot, &mask, &seq8, &size);
  CHECK(c->fifo_head == MPIB_MAX_REQUESTS + 1 && last_nwr == 3 && last_remote[0] == seq32_buf &&
            last_remote[1] == seq32_buf + (1u << 20) && slot == 0 && seq8 == MPIB_MAX_REQUESTS,
        "sequence 32 posted as %d writes to 0x%llx, 0x%llx with slot %u seq8 %u (FIFO head %llu)", last_nwr,
        (unsigned long long)last_remote[0], (unsigned long long)last_remote[1], slot, seq8,
        (unsigned long long)c->fifo_head);
  for (int k = 0; k < 2; k++) {
    done = 0;
    CHECK(r32[k] != NULL && mpib_test(r32[k], &done, NULL) == ncclSuccess && done, "sequence 32's request %d not done",
          k);
  }
  free(c->reqs);
  free(c->cts);
  free(c->sizes);
  free(c);
  if (failures == 0) printf("slot-reuse: ok\n");
  return failures ? 1 : 0;
}
