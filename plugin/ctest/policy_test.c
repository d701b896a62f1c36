//go:build ignore

/* Table tests for the pure data-path decisions in mpib_policy.h. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mpib_policy.h"

static int failures;

#define EXPECT_EQ(what, got, want)                                                      \
  do {                                                                                  \
    unsigned long long g_ = (unsigned long long)(got), w_ = (unsigned long long)(want); \
    if (g_ != w_) {                                                                     \
      fprintf(stderr, "FAIL %s: expected %llu but got %llu\n", what, w_, g_);           \
      failures++;                                                                       \
    }                                                                                   \
  } while (0)

static void test_split(void) {
  static const struct {
    size_t size;
    uint32_t sup_bw;
    size_t sout;
  } cases[] = {
      {0, 512, 0},                       /* empty: boundary 0 */
      {1 << 20, 0, 1 << 20},             /* all SOUT */
      {1 << 20, 1024, 0},                /* all SUP */
      {1 << 20, 2000, 0},                /* above 1024 acts as all SUP */
      {1 << 20, 512, 1 << 19},           /* half */
      {1 << 20, 256, 786432},            /* SOUT 3/4 */
      {1000, 512, 512},                  /* 500 rounds to the nearest 128 */
      {1000, 640, 384},                  /* 375 rounds down to 384 */
      {100, 512, 0},                     /* 50 rounds to 0: SUP carries it all */
      {100, 256, 100},                   /* 75 rounds to 128, capped at the size: all SOUT */
      {64u << 20, 300, 47448064},        /* 64 MiB * 724/1024, 128-aligned */
      {(size_t)3 << 30, 1, 3218079744u}, /* > 2^32 intermediate products do not overflow */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char what[96];
    snprintf(what, sizeof what, "split(%zu, %u)", cases[i].size, cases[i].sup_bw);
    size_t got = mpib_split_sout_bytes(cases[i].size, cases[i].sup_bw);
    EXPECT_EQ(what, got, cases[i].sout);
    if (got % MPIB_SPLIT_ALIGN != 0 && got != cases[i].size) {
      fprintf(stderr, "FAIL %s: boundary %zu is not 128-aligned\n", what, got);
      failures++;
    }
  }
}

static void test_imm(void) {
  static const struct {
    uint32_t slot, mask;
    uint64_t seq;
    uint32_t size;
  } cases[] = {
      {0, 1, 0, MPIB_IMM_NO_SIZE}, {31, 3, 255, MPIB_IMM_NO_SIZE}, {17, 2, 256 + 9, 8},
      {5, 3, 0xFFFFFFFFFFull, 0},  {9, 1, 3, MPIB_IMM_MAX_SIZE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint32_t imm = mpib_imm_encode(cases[i].slot, cases[i].mask, cases[i].seq, cases[i].size);
    uint32_t slot, mask, seq8, size;
    EXPECT_EQ("imm decodes", mpib_imm_decode(imm, &slot, &mask, &seq8, &size), 0);
    EXPECT_EQ("imm slot", slot, cases[i].slot);
    EXPECT_EQ("imm mask", mask, cases[i].mask);
    EXPECT_EQ("imm seq", seq8, cases[i].seq & 0xFF);
    EXPECT_EQ("imm size", size, cases[i].size);
  }
  uint32_t s, m, q, z;
  EXPECT_EQ("imm too large for the immediate", mpib_imm_encode(1, 1, 1, 65536) >> 7, 1u << 1);
  EXPECT_EQ("imm zero mask rejected", mpib_imm_decode(0x00000003u, &s, &m, &q, &z), -1);
  EXPECT_EQ("imm high bits without size flag rejected",
            mpib_imm_decode(mpib_imm_encode(1, 1, 1, MPIB_IMM_NO_SIZE) | 0x20000u, &s, &m, &q, &z), -1);
  EXPECT_EQ("imm garbage rejected", mpib_imm_decode(0xDEADBE1Fu, &s, &m, &q, &z), -1);
  /* A replay: slot, the ranges it carries and sequence as usual, no size, the replay bit, the
   * slot's full range mask in bits 17..18. */
  uint32_t rep = mpib_imm_encode_replay(30, 2, 3, 0x1234);
  EXPECT_EQ("replay imm decodes", mpib_imm_decode(rep, &s, &m, &q, &z), 0);
  EXPECT_EQ("replay slot", s, 30);
  EXPECT_EQ("replay ranges", m, 2);
  EXPECT_EQ("replay full mask", mpib_imm_replay_full(rep), 3);
  EXPECT_EQ("replay seq", q, 0x34);
  EXPECT_EQ("replay carries no size", z, MPIB_IMM_NO_SIZE);
  EXPECT_EQ("replay is a replay", mpib_imm_is_replay(rep), 1);
  EXPECT_EQ("replay of both ranges", mpib_imm_decode(mpib_imm_encode_replay(1, 3, 3, 9), &s, &m, &q, &z) == 0 && m == 3,
            1);
  EXPECT_EQ("replay ranges outside the full mask rejected",
            mpib_imm_decode(mpib_imm_encode_replay(1, 2, 1, 9), &s, &m, &q, &z), -1);
  EXPECT_EQ("replay without a full mask rejected",
            mpib_imm_decode(mpib_imm_encode(1, 2, 9, MPIB_IMM_NO_SIZE) | MPIB_IMM_REPLAY_FLAG, &s, &m, &q, &z), -1);
  EXPECT_EQ("replay with bits above the full mask rejected",
            mpib_imm_decode(mpib_imm_encode_replay(1, 2, 3, 9) | (1u << 19), &s, &m, &q, &z), -1);
  EXPECT_EQ("plain imm is no replay", mpib_imm_is_replay(mpib_imm_encode(30, 2, 0x1234, MPIB_IMM_NO_SIZE)), 0);
  /* Bit 16 of an immediate that carries the size is part of the size, not a replay mark. */
  EXPECT_EQ("size 1 is no replay", mpib_imm_is_replay(mpib_imm_encode(3, 1, 7, 1)), 0);
}

/* Receiver: arrivals of one slot's immediates, in order, and what each returns. */
static void test_recv_ranges(void) {
  enum { O = 1u << MPIB_RAIL_SOUT, U = 1u << MPIB_RAIL_SUP, B = 3 };
  static const struct {
    const char *why;
    int n;
    struct {
      uint32_t full, ranges;
      int replay, want;
    } a[4];
  } cases[] = {
      {"one rail, original", 1, {{O, O, 0, 1}}},
      {"split: both originals", 2, {{B, O, 0, 0}, {B, U, 0, 1}}},
      {"split: SUP replayed on SOUT after SOUT's own", 2, {{B, O, 0, 0}, {B, U, 1, 1}}},
      {"double fault: a replay of SUP alone never completes a slot missing SOUT", 1, {{B, U, 1, 0}}},
      {"double fault: both ranges replayed in one chain", 1, {{B, B, 1, 1}}},
      {"double fault: SUP's replay, then SOUT's", 2, {{B, U, 1, 0}, {B, O, 1, 1}}},
      {"a replay of a confirmed range is harmless", 3, {{B, U, 0, 0}, {B, U, 1, 0}, {B, O, 1, 1}}},
      {"an original range twice (a corrupt peer, or soft-RoCE executing one write twice) is refused",
       2,
       {{B, O, 0, 0}, {B, O, 0, -1}}},
      {"another full mask is a corrupt peer", 2, {{B, O, 0, 0}, {U, U, 0, -1}}},
      {"a range outside the full mask is a corrupt peer", 1, {{O, U, 1, -1}}},
      {"no range", 1, {{B, 0, 1, -1}}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint32_t expected = 0, have = 0;
    for (int k = 0; k < cases[i].n; k++)
      EXPECT_EQ(
          cases[i].why,
          mpib_recv_ranges_arrived(&expected, &have, cases[i].a[k].full, cases[i].a[k].ranges, cases[i].a[k].replay),
          cases[i].a[k].want);
  }
}

/* A slot against the receiver's fence record (open_seq1, have, next_seq), with the ranges the
 * fenced rail carried (replays: lost) or had acknowledged (confirms: acked). */
struct record_case {
  uint64_t open_seq1;
  uint32_t have;
  uint64_t next;
  uint64_t seq;
  uint32_t ranges, want;
  const char *why;
};

static void test_failover(void) {
  enum { O = 1u << MPIB_RAIL_SOUT, U = 1u << MPIB_RAIL_SUP, B = 3 };
  static const struct record_case cases[] = {
      {101, 0, 110, 100, U, U, "open, nothing confirmed: SUP's range can only come by a replay"},
      {101, O, 110, 100, U, U, "open, only the surviving rail's range confirmed"},
      {101, U, 110, 100, U, 0, "open, the failed rail's range confirmed: only its ACK was lost"},
      {101, B, 110, 100, U, 0, "both confirmed"},
      {0, 0, 110, 100, U, 0, "no open receive in the slot: it completed"},
      {133, 0, 140, 100, U, 0, "the slot holds a later receive: this one completed"},
      {101, U, 110, 100, O, O, "SOUT failed, only SUP's range confirmed"},
      {68, 0, 100, 100, U, U, "posted after the report (the receiver fenced first): its range is lost"},
      {0, 0, 100, 131, U, U, "far past the report: lost too"},
      {101, 0, 110, 100, B, B, "the replay's carrier failed too: its own range and the replayed one"},
      {101, U, 110, 100, B, O, "carrier failed, the replayed range had landed: only the carrier's own"},
      {101, O, 110, 100, B, U, "carrier failed, its own range had landed: the replayed one again"},
      {0, 0, 110, 100, B, 0, "carrier failed after the receive completed: nothing"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    EXPECT_EQ(cases[i].why,
              mpib_replay_ranges(cases[i].open_seq1, cases[i].have, cases[i].next, cases[i].seq, cases[i].ranges),
              cases[i].want);
  static const struct record_case confirms[] = {
      {101, 0, 110, 100, U, U, "open, nothing confirmed: the acknowledged range"},
      {101, U, 110, 100, U, 0, "open, the range already confirmed by its immediate"},
      {101, O, 110, 100, B, U, "open, SOUT's range arrived: only SUP's"},
      {101, 0, 110, 100, 0, 0, "open, nothing acknowledged: nothing (a replay carries it)"},
      {0, 0, 110, 100, U, 0, "no open receive in the slot: it completed"},
      {133, 0, 140, 100, U, 0, "the slot holds a later receive: this one completed"},
      {68, 0, 100, 100, U, U, "posted after the report, acknowledged: the receiver drops the fenced rail's completion"},
      {68, 0, 100, 100, B, B, "posted after the report, both acknowledged on the fenced rail"},
      {0, 0, 100, 105, 0, 0, "posted after the report, not acknowledged: nothing"},
  };
  for (size_t i = 0; i < sizeof confirms / sizeof confirms[0]; i++)
    EXPECT_EQ(confirms[i].why,
              mpib_confirm_ranges(confirms[i].open_seq1, confirms[i].have, confirms[i].next, confirms[i].seq,
                                  confirms[i].ranges),
              confirms[i].want);
  static const struct {
    uint32_t attempts;
    uint64_t want;
  } backoff[] = {{0, 250}, {1, 500}, {2, 1000}, {3, 2000}, {4, 2000}, {60, 2000}};
  for (size_t i = 0; i < sizeof backoff / sizeof backoff[0]; i++)
    EXPECT_EQ("backoff doubles to the cap", mpib_recovery_backoff_ms(backoff[i].attempts, 250, 2000), backoff[i].want);
  EXPECT_EQ("backoff cap below the start", mpib_recovery_backoff_ms(0, 3000, 2000), 2000);
  uint32_t g, cmd;
  EXPECT_EQ("notice decodes", mpib_notice_decode(mpib_notice_encode(7, MPIB_NOTICE_RECOVER), &g, &cmd), 0);
  EXPECT_EQ("notice gen", g, 7);
  EXPECT_EQ("notice cmd", cmd, MPIB_NOTICE_RECOVER);
  EXPECT_EQ("empty notice rejected", mpib_notice_decode(0, &g, &cmd), -1);
  EXPECT_EQ("unknown command rejected", mpib_notice_decode(mpib_notice_encode(7, 9), &g, &cmd), -1);
  EXPECT_EQ("high garbage rejected", mpib_notice_decode(0xFFFFull << 48 | 0x701, &g, &cmd), -1);
  /* Notices of one rail in the order the sender sends them: each must order after the last. */
  const uint64_t seq[] = {mpib_notice_encode(1, MPIB_NOTICE_FAIL),     mpib_notice_encode(2, MPIB_NOTICE_RECOVER),
                          mpib_notice_encode(2, MPIB_NOTICE_FAIL),     mpib_notice_encode(3, MPIB_NOTICE_RECOVER),
                          mpib_notice_encode(3, MPIB_NOTICE_UP),       mpib_notice_encode(3, MPIB_NOTICE_FAIL),
                          mpib_notice_encode(300, MPIB_NOTICE_RECOVER)};
  uint64_t prev = 0;
  for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
    EXPECT_EQ("notices only move forward", mpib_notice_order(seq[i]) > prev, 1);
    prev = mpib_notice_order(seq[i]);
  }
  EXPECT_EQ("no notice orders first", mpib_notice_order(0), 0);
  EXPECT_EQ("a malformed word orders first", mpib_notice_order(mpib_notice_encode(5, 77)), 0);
  EXPECT_EQ("generations start far apart", mpib_gen_psn(1) != mpib_gen_psn(2) && mpib_gen_psn(2) != 0, 1);
  EXPECT_EQ("psn fits 24 bits", mpib_gen_psn(0xFFFFFFFFu) >> 24, 0);
  struct mpib_fence_rec rec = {.fence_gen = 3, .ready_gen = 2};
  rec.open_seq1[5] = 42;
  rec.have[5] = 1;
  rec.check = mpib_fence_check(&rec);
  uint64_t good = rec.check;
  rec.have[5] = 2; /* a torn copy: one field from a newer store */
  EXPECT_EQ("torn record detected", mpib_fence_check(&rec) != good, 1);
  rec.have[5] = 1;
  rec.fence_gen = 4;
  EXPECT_EQ("record generation covered", mpib_fence_check(&rec) != good, 1);
  rec.fence_gen = 3;
  rec.refused_gen = 5; /* a refused rebuild is covered once named; unnamed, records check as before */
  EXPECT_EQ("refused generation covered", mpib_fence_check(&rec) != good, 1);
  rec.refused_gen = 0;
  EXPECT_EQ("no refusal: the same check", mpib_fence_check(&rec) == good, 1);
}

static void test_idle_probe(void) {
  const uint64_t ms = 1000000, period = 100 * ms;
  static const struct {
    int idle;
    uint64_t now_ms;
    int want;
    uint64_t since_ms_after;
    const char *why;
  } steps[] = {
      {1, 1000, 0, 1000, "first idle check starts the count"},
      {1, 1050, 0, 1000, "idle 50 ms: not yet"},
      {1, 1099, 0, 1000, "idle 99 ms: not yet"},
      {1, 1100, 1, 0, "idle 100 ms: probe, count restarts"},
      {0, 1110, 0, 0, "the probe pending: busy"},
      {1, 1130, 0, 1130, "probe done: idle again from here"},
      {0, 1200, 0, 0, "traffic: busy resets"},
      {1, 1250, 0, 1250, "idle again"},
      {1, 1500, 1, 0, "long idle (ticks far apart): one probe, not several"},
  };
  uint64_t since = 0;
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    EXPECT_EQ(steps[i].why, mpib_idle_probe_due(&since, steps[i].idle, steps[i].now_ms * ms, period), steps[i].want);
    EXPECT_EQ(steps[i].why, since, steps[i].since_ms_after * ms);
  }
}

static void test_qp_index(void) {
  /* The seed's table: SOUT_QP=2, SUP_QP=3. */
  static const int sout[] = {0, 1, 0, 1, 0, 1};
  static const int sup[] = {2, 3, 4, 2, 3, 4};
  for (int seq = 0; seq < 6; seq++) {
    EXPECT_EQ("qp SOUT", mpib_qp_index(MPIB_RAIL_SOUT, (uint64_t)seq, 2, 3), sout[seq]);
    EXPECT_EQ("qp SUP", mpib_qp_index(MPIB_RAIL_SUP, (uint64_t)seq, 2, 3), sup[seq]);
  }
  EXPECT_EQ("qp SUP suppressed", mpib_qp_index(MPIB_RAIL_SUP, 7, 2, 0), (unsigned long long)-1);
}

static void test_policy(void) {
  EXPECT_EQ("vanilla intra", mpib_vanilla_sup_bw(MPIB_PATH_INTRA_ISLAND), 1024);
  EXPECT_EQ("vanilla inter", mpib_vanilla_sup_bw(MPIB_PATH_INTER_ISLAND), 0);
  EXPECT_EQ("cts vanilla intra", mpib_cts_rail(MPIB_MODE_VANILLA, MPIB_PATH_INTRA_ISLAND, 1), MPIB_RAIL_SUP);
  EXPECT_EQ("cts vanilla intra, no SUP pair", mpib_cts_rail(MPIB_MODE_VANILLA, MPIB_PATH_INTRA_ISLAND, 0),
            MPIB_RAIL_SOUT);
  EXPECT_EQ("cts vanilla inter", mpib_cts_rail(MPIB_MODE_VANILLA, MPIB_PATH_INTER_ISLAND, 1), MPIB_RAIL_SOUT);
  EXPECT_EQ("cts advanced intra", mpib_cts_rail(MPIB_MODE_ADVANCED, MPIB_PATH_INTRA_ISLAND, 1), MPIB_RAIL_SOUT);
  EXPECT_EQ("sup qps vanilla inter", mpib_sup_qps_wanted(MPIB_MODE_VANILLA, MPIB_PATH_INTER_ISLAND, 1), 0);
  EXPECT_EQ("sup qps vanilla intra", mpib_sup_qps_wanted(MPIB_MODE_VANILLA, MPIB_PATH_INTRA_ISLAND, 0), 1);
  EXPECT_EQ("sup qps advanced inter", mpib_sup_qps_wanted(MPIB_MODE_ADVANCED, MPIB_PATH_INTER_ISLAND, 0), 0);
  EXPECT_EQ("sup qps advanced relay", mpib_sup_qps_wanted(MPIB_MODE_ADVANCED, MPIB_PATH_INTER_ISLAND, 1), 1);
  EXPECT_EQ("guard clamp", mpib_guard_sup_bw(5000, MPIB_PATH_INTRA_ISLAND, 0, 1), 1024);
  EXPECT_EQ("guard no relay", mpib_guard_sup_bw(512, MPIB_PATH_INTER_ISLAND, 0, 1), 0);
  EXPECT_EQ("guard relay", mpib_guard_sup_bw(512, MPIB_PATH_INTER_ISLAND, 1, 1), 512);
  EXPECT_EQ("guard no SUP QPs", mpib_guard_sup_bw(512, MPIB_PATH_INTRA_ISLAND, 0, 0), 0);
}

static struct mpib_cts cts_element(uint64_t seq, uint32_t nreqs) {
  struct mpib_cts e = {
      .addr = 0x7f0000001000ull, .size = 1 << 20, .rkey = {0x1234, 0x5678}, .tag = 42, .nreqs = nreqs, .seq = seq};
  e.check = mpib_cts_check(&e);
  return e;
}

/* An element is trusted only when its sequence number is the one wanted and every field
 * matches the checksum: a half-copied element (rxe writes with memcpy) must be refused. */
static void test_cts_landed(void) {
  struct mpib_cts whole = cts_element(7, 2);
  EXPECT_EQ("cts whole", mpib_cts_landed(&whole, 7), 1);
  EXPECT_EQ("cts other seq", mpib_cts_landed(&whole, 8), 0);
  struct mpib_cts stale_nreqs = whole; /* seq and check landed, nreqs not yet */
  stale_nreqs.nreqs = 0;
  EXPECT_EQ("cts stale nreqs", mpib_cts_landed(&stale_nreqs, 7), 0);
  struct mpib_cts stale_addr = whole;
  stale_addr.addr = 0;
  EXPECT_EQ("cts stale addr", mpib_cts_landed(&stale_addr, 7), 0);
  struct mpib_cts stale_rkey = whole;
  stale_rkey.rkey[1] = 0;
  EXPECT_EQ("cts stale rkey", mpib_cts_landed(&stale_rkey, 7), 0);
  struct mpib_cts stale_check = whole; /* fields landed, checksum still the old lap's */
  stale_check.check = cts_element(7 - 32, 2).check;
  EXPECT_EQ("cts stale check", mpib_cts_landed(&stale_check, 7), 0);
  struct mpib_cts never = {0};
  EXPECT_EQ("cts never written", mpib_cts_landed(&never, 1), 0);
  /* A torn copy: any one or two bytes of the element still the slot's previous lap's (another
   * buffer, size, keys and tag, 32 sequence numbers back), the rest this lap's. */
  struct mpib_cts prev = {.addr = 0x7f00deadb000ull,
                          .size = 4096,
                          .rkey = {0x9abc, 0xdef0},
                          .tag = 41,
                          .nreqs = 1,
                          .seq = 7 - 32,
                          .stripe_rkey = {0x11, 0x22, 0x33}};
  prev.check = mpib_cts_check(&prev);
  struct mpib_cts striped = whole;
  for (int i = 0; i < MPIB_MAX_STRIPE - 1; i++) striped.stripe_rkey[i] = 0x4000u + (uint32_t)i;
  striped.check = mpib_cts_check(&striped);
  int missed = 0;
  const size_t seq_at = offsetof(struct mpib_cts, seq), fields_end = offsetof(struct mpib_cts, pad);
  for (size_t a = 0; a < fields_end; a++) {
    for (size_t b = a; b < fields_end; b++) {
      if ((a >= seq_at && a < seq_at + 16) || (b >= seq_at && b < seq_at + 16)) continue; /* seq, check */
      struct mpib_cts torn = striped;
      ((unsigned char *)&torn)[a] = ((const unsigned char *)&prev)[a];
      ((unsigned char *)&torn)[b] = ((const unsigned char *)&prev)[b];
      if (memcmp(&torn, &striped, sizeof torn) != 0 && mpib_cts_landed(&torn, 7)) {
        if (missed++ < 4) fprintf(stderr, "a CTS with bytes %zu and %zu of the previous lap passes the check\n", a, b);
      }
    }
  }
  EXPECT_EQ("cts torn bytes passing", missed, 0);
  /* Both ends compute it: a change of its value is a change of the wire (wire.Version). */
  EXPECT_EQ("cts check vector", mpib_cts_check(&whole), 0x36c3ad3b80db8bc0ull);
  volatile struct mpib_cts fifo = whole;
  struct mpib_cts copy;
  mpib_cts_snapshot(&fifo, &copy);
  EXPECT_EQ("cts snapshot", mpib_cts_landed(&copy, 7), 1);
  EXPECT_EQ("cts snapshot tag", copy.tag, 42);
}

/* When receives are flushed: the lab has no GPU, so this table is the proof (docs). */
static void test_flush_needed(void) {
  static const struct {
    int peermem, dmabuf, disable, force, want;
  } cases[] = {
      {0, 0, 0, 0, 0}, /* host memory only: nothing to order */
      {1, 0, 0, 0, 1}, /* nvidia_peermem */
      {0, 1, 0, 0, 1}, /* DMA-BUF alone (A100, open driver, no peermem): the case the old code missed */
      {1, 1, 0, 0, 1}, /* nvidia_peermem and DMA-BUF */
      {1, 1, 1, 0, 0}, /* NCCL_GDR_FLUSH_DISABLE=1 */
      {0, 1, 1, 0, 0}, /* NCCL_GDR_FLUSH_DISABLE=1, DMA-BUF alone */
      {0, 0, 0, 1, 1}, /* MPIB_FORCE_FLUSH / mlx5 Data Direct */
      {1, 1, 1, 1, 1}, /* Data Direct wins over the disable knob */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char what[96];
    snprintf(what, sizeof what, "flush_needed(peermem %d, dmabuf %d, disable %d, force %d)", cases[i].peermem,
             cases[i].dmabuf, cases[i].disable, cases[i].force);
    EXPECT_EQ(what, mpib_flush_needed(cases[i].peermem, cases[i].dmabuf, cases[i].disable, cases[i].force),
              cases[i].want);
  }
}

/* Address vectors for RoCE and native InfiniBand (the lab is RoCE only: the IB rows are the
 * proof, checked against net_ib's ncclIbRtrQp). */
static void test_build_ah(void) {
  const int IB = IBV_LINK_LAYER_INFINIBAND, ETH = IBV_LINK_LAYER_ETHERNET;
  static const uint8_t roce_a[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 1, 11};
  static const uint8_t roce_b[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 11};
  /* IB GIDs: fe80 | 22 bits 0 | FLID (bytes 4..5) | 16-bit subnet (bytes 6..7) | GUID */
  static const uint8_t ib_a[16] = {0xfe, 0x80, 0, 0, 0, 0, 0x00, 0x01, 1, 2, 3, 4, 5, 6, 7, 8};
  static const uint8_t ib_b_same[16] = {0xfe, 0x80, 0, 0, 0, 0, 0x00, 0x01, 9, 9, 9, 9, 9, 9, 9, 9};
  static const uint8_t ib_b_routed[16] = {0xfe, 0x80, 0, 0, 0x12, 0x34, 0x00, 0x02, 9, 9, 9, 9, 9, 9, 9, 9};
  static const uint8_t ib_b_routed_noflid[16] = {0xfe, 0x80, 0, 0, 0, 0, 0x00, 0x02, 9, 9, 9, 9, 9, 9, 9, 9};
  static const struct {
    const char *name;
    int lll, rll;
    const uint8_t *lgid, *rgid;
    uint16_t rlid;
    int rc, is_global, dlid, tc;
  } cases[] = {
      {"RoCE: GRH with the class, no DLID", ETH, ETH, roce_a, roce_b, 0, 0, 1, 0, 106},
      {"IB same subnet: LID, no GRH", IB, IB, ib_a, ib_b_same, 0x42, 0, 0, 0x42, 0},
      {"IB across a router: GRH + FLID", IB, IB, ib_a, ib_b_routed, 0x42, 0, 1, 0x1234, 0},
      {"IB across a router without FLID: GRH + LID", IB, IB, ib_a, ib_b_routed_noflid, 0x42, 0, 1, 0x42, 0},
      {"IB same subnet without a LID: refused", IB, IB, ib_a, ib_b_same, 0, -1, 0, 0, 0},
      {"link layers differ: refused", IB, ETH, ib_a, roce_b, 0x42, -1, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct ibv_ah_attr ah;
    int rc = mpib_build_ah(&ah, cases[i].lll, cases[i].rll, 1, 3, cases[i].lgid, cases[i].rgid, cases[i].rlid, 106, 5);
    char what[128];
    snprintf(what, sizeof what, "build_ah(%s) rc", cases[i].name);
    EXPECT_EQ(what, rc, cases[i].rc);
    if (rc != 0) continue;
    snprintf(what, sizeof what, "build_ah(%s) is_global", cases[i].name);
    EXPECT_EQ(what, ah.is_global, cases[i].is_global);
    snprintf(what, sizeof what, "build_ah(%s) dlid", cases[i].name);
    EXPECT_EQ(what, ah.dlid, cases[i].dlid);
    snprintf(what, sizeof what, "build_ah(%s) sl/port", cases[i].name);
    EXPECT_EQ(what, ah.sl * 1000 + ah.port_num, 5001);
    if (ah.is_global) {
      snprintf(what, sizeof what, "build_ah(%s) grh", cases[i].name);
      EXPECT_EQ(what,
                memcmp(ah.grh.dgid.raw, cases[i].rgid, 16) == 0 && ah.grh.sgid_index == 3 && ah.grh.hop_limit == 255,
                1);
      snprintf(what, sizeof what, "build_ah(%s) traffic class", cases[i].name);
      EXPECT_EQ(what, ah.grh.traffic_class, cases[i].tc);
    }
  }
}

/* Whole-message mode keeps the weight's byte share within 1 % over a stream of messages. */
static void test_whole_message(void) {
  static const uint32_t weights[] = {1, 100, 300, 512, 700, 1000, 1023};
  static const uint64_t sizes[] = {8, 4096, 65536, 4000};
  for (size_t w = 0; w < sizeof weights / sizeof weights[0]; w++) {
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
      int64_t owed = 0;
      uint64_t sup = 0, total = 0, rng = 12345;
      for (int i = 0; i < 20000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t b = sizes[z] == 4000 ? 1 + (rng >> 33) % 8000 : sizes[z]; /* 4000: random 1..8000 */
        if (mpib_whole_message_rail(b, weights[w], &owed) == MPIB_RAIL_SUP) sup += b;
        total += b;
      }
      double share = (double)sup / (double)total, want = weights[w] / 1024.0;
      char what[96];
      snprintf(what, sizeof what, "whole-message share weight %u size %llu within 1%%", weights[w],
               (unsigned long long)sizes[z]);
      EXPECT_EQ(what, share > want - 0.01 && share < want + 0.01, 1);
      snprintf(what, sizeof what, "whole-message deficit bounded (weight %u)", weights[w]);
      int64_t bound = (int64_t)(sizes[z] == 4000 ? 8000 : sizes[z]) * 1024;
      EXPECT_EQ(what, owed >= -bound && owed <= bound, 1);
    }
  }
  int64_t owed = 0;
  EXPECT_EQ("weight 0 -> SOUT", mpib_whole_message_rail(4096, 0, &owed), MPIB_RAIL_SOUT);
  EXPECT_EQ("weight 1024 -> SUP", mpib_whole_message_rail(4096, 1024, &owed), MPIB_RAIL_SUP);
  EXPECT_EQ("weight >1024 -> SUP", mpib_whole_message_rail(4096, 5000, &owed), MPIB_RAIL_SUP);
  EXPECT_EQ("zero bytes at 600 -> SUP", mpib_whole_message_rail(0, 600, &owed), MPIB_RAIL_SUP);
  EXPECT_EQ("zero bytes at 400 -> SOUT", mpib_whole_message_rail(0, 400, &owed), MPIB_RAIL_SOUT);
  EXPECT_EQ("pure rails leave the counter alone", owed, 0);
  /* At 512 with equal sizes the rails alternate, SUP first (owed exactly half a message). */
  owed = 0;
  int seq[4];
  for (int i = 0; i < 4; i++) seq[i] = mpib_whole_message_rail(4096, 512, &owed);
  EXPECT_EQ("512 alternates", seq[0] * 1000 + seq[1] * 100 + seq[2] * 10 + seq[3], 1010);
}

/* mpib_ack_seq1_near: the 40 bits an ack word keeps of seq + 1, made whole again near the
 * receiver's next_seq + 1, across the wrap of the 40 bits both ways. */
static void test_ack_seq1_near(void) {
  const uint64_t span = 1ull << 40;
  struct {
    uint64_t seq1, near;
  } cases[] = {
      {5, 10},                       /* no wrap yet */
      {40, 10},                      /* posted after the record's next_seq */
      {span - 2, span + 3},          /* the slot before the wrap, the receiver past it */
      {span + 1, span - 3},          /* the slot past the wrap, the receiver before it */
      {span, span + 7},              /* seq + 1 = 2^40: its 40 bits are 0, the word is not */
      {3 * span + 7, 3 * span + 30}, /* a later wrap */
      {5 * span - 31, 5 * span + 1}, /* the oldest slot a record can name, across a wrap */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t w = mpib_ack_word(cases[i].seq1, 1u << MPIB_RAIL_SUP, 0, 100);
    EXPECT_EQ("ack word's seq1 made whole", mpib_ack_seq1_near(w, cases[i].near), cases[i].seq1);
  }
  EXPECT_EQ("a slot never posted", mpib_ack_seq1_near(0, 12345), 0);
}

/* The registration cache's span and match (mpib_device.c, mpib_reg_mr): whole pages around a
 * buffer; a range is served only when it lies wholly inside a registration. */
static void test_mr_span(void) {
  struct {
    uintptr_t data;
    size_t size, start, len;
  } spans[] = {
      {0x10000, 4096, 0x10000, 4096},                                    /* one whole page */
      {0x10010, 100, 0x10000, 4096},                                     /* inside one page */
      {0x10ff0, 32, 0x10000, 8192},                                      /* across a page boundary */
      {0x10000, 1 << 20, 0x10000, 1 << 20}, {0x10800, 0, 0x10000, 4096}, /* 0 bytes: its page */
  };
  for (size_t i = 0; i < sizeof spans / sizeof spans[0]; i++) {
    uintptr_t start = 0;
    size_t len = 0;
    mpib_mr_span(spans[i].data, spans[i].size, 4096, &start, &len);
    EXPECT_EQ("mr span start", start, spans[i].start);
    EXPECT_EQ("mr span length", len, spans[i].len);
  }
  struct {
    uintptr_t data;
    size_t size;
    int served;
  } serves[] = {
      {0x10000, 8192, 1}, /* the whole registration */
      {0x10100, 100, 1},  /* inside */
      {0x11f00, 256, 1},  /* up to its last byte */
      {0x11f00, 257, 0},  /* one byte past it */
      {0xff00, 512, 0},   /* starting before it */
      {0x12000, 1, 0},    /* just after it */
      {0x10000, 0, 1},
  };
  for (size_t i = 0; i < sizeof serves / sizeof serves[0]; i++)
    EXPECT_EQ("registration [0x10000, +8192) serves", mpib_mr_serves(0x10000, 8192, serves[i].data, serves[i].size),
              serves[i].served);
}

static void test_sq_admits(void) {
  EXPECT_EQ("empty queue, a grouped slot", mpib_sq_admits(0, 9, 79, 7), 1);
  EXPECT_EQ("eight grouped slots fill the data places", mpib_sq_admits(63, 9, 79, 7), 1);
  EXPECT_EQ("a ninth waits", mpib_sq_admits(72, 9, 79, 7), 0);
  EXPECT_EQ("a one-write slot in the last data place", mpib_sq_admits(71, 1, 79, 7), 1);
  EXPECT_EQ("the reserve stays for control writes", mpib_sq_admits(72, 1, 79, 7), 0);
  EXPECT_EQ("no reserve: the whole queue", mpib_sq_admits(70, 9, 79, 0), 1);
  EXPECT_EQ("a queue taken past its depth admits nothing", mpib_sq_admits(80, 1, 79, 0), 0);
}

static void test_lane_cq_depth(void) {
  EXPECT_EQ("1 QP on 1 lane", mpib_qps_on_lane(1, 1, 0), 1);
  EXPECT_EQ("2 QPs on 1 lane", mpib_qps_on_lane(2, 1, 0), 2);
  EXPECT_EQ("3 QPs on 2 lanes: lane 0", mpib_qps_on_lane(3, 2, 0), 2);
  EXPECT_EQ("3 QPs on 2 lanes: lane 1", mpib_qps_on_lane(3, 2, 1), 1);
  EXPECT_EQ("1 QP on 4 lanes: lane 3", mpib_qps_on_lane(1, 4, 3), 0);
  EXPECT_EQ("16 QPs on 4 lanes: lane 2", mpib_qps_on_lane(16, 4, 2), 4);
  EXPECT_EQ("one QP: the base", mpib_lane_cq_depth(344, 296, 1), 344);
  EXPECT_EQ("a lane without QPs: the base", mpib_lane_cq_depth(344, 296, 0), 344);
  EXPECT_EQ("two QPs: a second send queue", mpib_lane_cq_depth(344, 296, 2), 640);
  EXPECT_EQ("sixteen receiver QPs", mpib_lane_cq_depth(112, 40, 16), 712);
}

static void test_event_for_port(void) {
  EXPECT_EQ("port 1 down, the NIC on port 1", mpib_event_for_port(IBV_EVENT_PORT_ERR, 1, 1), 1);
  EXPECT_EQ("port 2 down, the NIC on port 1", mpib_event_for_port(IBV_EVENT_PORT_ERR, 2, 1), 0);
  EXPECT_EQ("port 2 active, the NIC on port 1", mpib_event_for_port(IBV_EVENT_PORT_ACTIVE, 2, 1), 0);
  EXPECT_EQ("port 2 active, the NIC on port 2", mpib_event_for_port(IBV_EVENT_PORT_ACTIVE, 2, 2), 1);
  EXPECT_EQ("port 2's GID table, the NIC on port 1", mpib_event_for_port(IBV_EVENT_GID_CHANGE, 2, 1), 0);
  EXPECT_EQ("port 1's LID, the NIC on port 1", mpib_event_for_port(IBV_EVENT_LID_CHANGE, 1, 1), 1);
  EXPECT_EQ("the device's fatal error, whatever the union holds", mpib_event_for_port(IBV_EVENT_DEVICE_FATAL, 7, 1), 1);
  EXPECT_EQ("a QP's event", mpib_event_for_port(IBV_EVENT_QP_LAST_WQE_REACHED, 0, 2), 1);
}

int main(void) {
  test_event_for_port();
  test_ack_seq1_near();
  test_mr_span();
  test_sq_admits();
  test_lane_cq_depth();
  test_recv_ranges();
  test_failover();
  test_idle_probe();
  test_whole_message();
  test_flush_needed();
  test_build_ah();
  test_split();
  test_cts_landed();
  test_imm();
  test_qp_index();
  test_policy();
  if (failures) {
    fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  printf("policy_test: ok\n");
  return 0;
}
