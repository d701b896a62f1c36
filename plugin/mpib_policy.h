/*
 * Pure data-path decisions: no verbs, no I/O, no state. Each is table-tested in plugin/ctest.
 * Rails are numbered MPIB_RAIL_SOUT (0) and MPIB_RAIL_SUP (1); a rail mask has bit r set
 * when rail r carries part of a request.
 */
#ifndef MPIB_POLICY_H
#define MPIB_POLICY_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { MPIB_RAIL_SOUT = 0, MPIB_RAIL_SUP = 1, MPIB_NRAILS = 2 };
enum { MPIB_PATH_INTRA_ISLAND = 0, MPIB_PATH_INTER_ISLAND = 1 };
enum { MPIB_MODE_VANILLA = 0, MPIB_MODE_ADVANCED = 1 };

/* sup_bw is the SUP share of a request in parts per 1024. */
#define MPIB_SUP_BW_MAX 1024u
/* Rail boundaries inside a request are 128-byte aligned so LL128 lines never straddle rails. */
#define MPIB_SPLIT_ALIGN 128u

/* imm_data layout (32 bits, host order as delivered by verbs):
 *   bits 0..4   CTS slot (0..31)
 *   bits 5..6   active rail mask (1 = SOUT, 2 = SUP, 3 = both)
 *   bit  7      the size is in bits 16..31 (a single request below 64 KiB): the write that
 *               carries the immediate carries data and no size record is written
 *   bits 8..15  low 8 bits of the request's FIFO sequence number, checked by the receiver
 *   bits 16..31 the size when bit 7 is set; else bit 16 marks a REPLAY and bits 17..31 are
 *               zero (non-zero means a corrupt peer), except in a replay's immediate:
 * A slot's bytes are cut into at most two byte RANGES, named by the rail that first carried
 * them (range SOUT: each request's first sout bytes; range SUP: the rest). An original chain
 * on rail r carries range r, and its immediate's mask (bits 5..6) is the slot's full range
 * mask. A REPLAY chain (after a failover, see mpib_replay_ranges) carries the ranges in bits
 * 5..6, whichever rail it travels on, and the slot's full range mask in bits 17..18. */
#define MPIB_IMM_MASK_SHIFT 5u
#define MPIB_IMM_SIZE_FLAG 0x80u
#define MPIB_IMM_SEQ_SHIFT 8u
#define MPIB_IMM_SIZE_SHIFT 16u
#define MPIB_IMM_MAX_SIZE 0xFFFFu
#define MPIB_IMM_NO_SIZE UINT32_MAX
#define MPIB_IMM_REPLAY_FLAG (1u << MPIB_IMM_SIZE_SHIFT)

/* size: the request size to carry in the immediate, or MPIB_IMM_NO_SIZE. */
static inline uint32_t mpib_imm_encode(uint32_t slot, uint32_t mask, uint64_t seq, uint32_t size) {
  uint32_t imm =
      (slot & 0x1Fu) | ((mask & 0x3u) << MPIB_IMM_MASK_SHIFT) | ((uint32_t)(seq & 0xFFu) << MPIB_IMM_SEQ_SHIFT);
  if (size <= MPIB_IMM_MAX_SIZE) imm |= MPIB_IMM_SIZE_FLAG | (size << MPIB_IMM_SIZE_SHIFT);
  return imm;
}

#define MPIB_IMM_FULL_SHIFT 17u

/* Returns 0 and fills the fields (*size = MPIB_IMM_NO_SIZE when the size travels in the
 * size record), or -1 when imm cannot come from an MPIB sender. */
static inline int mpib_imm_decode(uint32_t imm, uint32_t *slot, uint32_t *mask, uint32_t *seq8, uint32_t *size) {
  uint32_t m = (imm >> MPIB_IMM_MASK_SHIFT) & 0x3u;
  int has_size = (imm & MPIB_IMM_SIZE_FLAG) != 0;
  if (m == 0) return -1;
  if (!has_size) {
    uint32_t high = imm >> (MPIB_IMM_SIZE_SHIFT + 1);
    int replay = (imm & MPIB_IMM_REPLAY_FLAG) != 0;
    /* a replay names the slot's full mask (non-zero, holding the ranges it carries); nothing else */
    if (replay ? (high & ~0x3u) != 0 || (m & ~high) != 0 : high != 0) return -1;
  }
  *slot = imm & 0x1Fu;
  *mask = m;
  *seq8 = (imm >> MPIB_IMM_SEQ_SHIFT) & 0xFFu;
  *size = has_size ? imm >> MPIB_IMM_SIZE_SHIFT : MPIB_IMM_NO_SIZE;
  return 0;
}

/* A replay's immediate: the byte ranges in `ranges` of the slot whose full range mask is
 * `full` came again, on whichever rail carries it. It never carries the size (a replay always
 * writes the size records). */
static inline uint32_t mpib_imm_encode_replay(uint32_t slot, uint32_t ranges, uint32_t full, uint64_t seq) {
  return mpib_imm_encode(slot, ranges, seq, MPIB_IMM_NO_SIZE) | MPIB_IMM_REPLAY_FLAG |
         (full & 0x3u) << MPIB_IMM_FULL_SHIFT;
}

static inline int mpib_imm_is_replay(uint32_t imm) {
  return (imm & MPIB_IMM_SIZE_FLAG) == 0 && (imm & MPIB_IMM_REPLAY_FLAG) != 0;
}

/* The slot's full range mask named by a decoded replay immediate. */
static inline uint32_t mpib_imm_replay_full(uint32_t imm) { return (imm >> MPIB_IMM_FULL_SHIFT) & 0x3u; }

/* Receiver: a write-with-immediate of an open slot arrived, confirming that the byte ranges
 * `ranges` of a slot whose full range mask is `full` have landed (an original chain on rail r
 * confirms range r; a replay names its ranges). *expected (0 until the first arrival) and
 * *have are the receive's. Returns 1 when every range of the slot is confirmed (the receive
 * completes), 0 while some are missing, -1 when the arrival contradicts the receive (another
 * full mask, ranges outside it, an original range twice): a corrupt or confused peer. A
 * replay of a range already confirmed is harmless (the same bytes again) and accepted. A
 * receive completes only on confirmed ranges, never on "a replay came": a replay may carry
 * one range while the other's carrier failed too (docs/failover.md, double faults). */
static inline int mpib_recv_ranges_arrived(uint32_t *expected, uint32_t *have, uint32_t full, uint32_t ranges,
                                           int replay) {
  if (full == 0 || (full & ~0x3u) || ranges == 0 || (ranges & ~full) || (*expected && *expected != full)) return -1;
  if (!replay && (*have & ranges)) return -1;
  *expected = full;
  *have |= ranges;
  return (*have & full) == full;
}

static inline uint32_t mpib_clamp_sup_bw(uint32_t sup_bw) {
  return sup_bw > MPIB_SUP_BW_MAX ? MPIB_SUP_BW_MAX : sup_bw;
}

/* Bytes of a request carried by SOUT; SUP carries the rest, starting at this offset.
 * The boundary is SOUT's exact share rounded to the nearest multiple of MPIB_SPLIT_ALIGN
 * (never past the end), so over many requests neither rail is favoured by the rounding. */
static inline size_t mpib_split_sout_bytes(size_t size, uint32_t sup_bw) {
  if (sup_bw == 0) return size;
  if (sup_bw >= MPIB_SUP_BW_MAX) return 0;
  unsigned __int128 exact = (unsigned __int128)size * (MPIB_SUP_BW_MAX - sup_bw) / MPIB_SUP_BW_MAX;
  size_t sout = (size_t)(exact + MPIB_SPLIT_ALIGN / 2) & ~(size_t)(MPIB_SPLIT_ALIGN - 1);
  return sout > size ? size : sout;
}

/* Whole-message mode: a slot whose bytes are at most the threshold (MPIB_WHOLE_MSG_MAX) goes
 * whole to ONE rail instead of being cut in two: one WQE, one CQE, one SRQ receive and one
 * doorbell instead of two each, and no waiting for the slower rail. The rail comes from a
 * deficit counter so that the long-run byte share still equals the weight: *sup_owed is what
 * SUP is owed in bytes x 1024 (its exact share of everything sent so far minus what it
 * carried, kept scaled so that no fraction is lost); SUP takes a message when it is owed at
 * least half of it. |*sup_owed| stays below the largest message (x 1024), so over N bytes the
 * share is off by at most max_size / N. A zero-byte message goes to the rail the weight
 * favours. */
static inline int mpib_whole_message_rail(uint64_t bytes, uint32_t sup_bw, int64_t *sup_owed) {
  if (sup_bw == 0) return MPIB_RAIL_SOUT;
  if (sup_bw >= MPIB_SUP_BW_MAX) return MPIB_RAIL_SUP;
  if (bytes == 0) return sup_bw >= MPIB_SUP_BW_MAX / 2 ? MPIB_RAIL_SUP : MPIB_RAIL_SOUT;
  int64_t whole = (int64_t)(bytes * MPIB_SUP_BW_MAX);
  *sup_owed += (int64_t)(bytes * sup_bw);
  if (2 * *sup_owed >= whole) {
    *sup_owed -= whole;
    return MPIB_RAIL_SUP;
  }
  return MPIB_RAIL_SOUT;
}

/* Index into the contiguous QP array [SOUT_0..SOUT_{n-1}, SUP_0..SUP_{m-1}] for request `seq`
 * on `rail`: round-robin within the rail's pool. Returns -1 when the rail has no QPs. */
static inline int mpib_qp_index(int rail, uint64_t seq, uint32_t nqps_sout, uint32_t nqps_sup) {
  if (rail == MPIB_RAIL_SOUT) return nqps_sout ? (int)(seq % nqps_sout) : -1;
  return nqps_sup ? (int)(nqps_sout + seq % nqps_sup) : -1;
}

/* Whether SUP QPs exist for a connection. Inside an island always. Across islands the SUP
 * fabric has no route (RoCE address resolution in the RTR transition fails or times out), so
 * vanilla never builds them, and advanced mode builds them only when the operator declared a
 * relay (MPIB_SUP_RELAY=1) that carries SUP between islands. */
static inline int mpib_sup_qps_wanted(int mode, int path_class, int sup_relay) {
  if (path_class == MPIB_PATH_INTRA_ISLAND) return 1;
  return mode == MPIB_MODE_ADVANCED && sup_relay;
}

/* The rail that carries the receiver's CTS writes (always its first QP on that rail). A comm
 * without SUP QPs (its peer's SUP ports share no cable with ours: docs/topology.md) sends it
 * on SOUT, whatever the path. */
static inline int mpib_cts_rail(int mode, int path_class, uint32_t sup_qps) {
  return (mode == MPIB_MODE_VANILLA && path_class == MPIB_PATH_INTRA_ISLAND && sup_qps > 0) ? MPIB_RAIL_SUP
                                                                                            : MPIB_RAIL_SOUT;
}

/* Vanilla policy: all intra-island traffic on SUP, all inter-island traffic on SOUT. */
static inline uint32_t mpib_vanilla_sup_bw(int path_class) {
  return path_class == MPIB_PATH_INTRA_ISLAND ? MPIB_SUP_BW_MAX : 0;
}

/* The guard between a hint and the fabric: SUP cannot reach another island unless the
 * operator declared a relay (MPIB_SUP_RELAY=1), and rails without QPs carry nothing. */
static inline uint32_t mpib_guard_sup_bw(uint32_t sup_bw, int path_class, int sup_relay, uint32_t nqps_sup) {
  if (nqps_sup == 0) return 0;
  if (path_class == MPIB_PATH_INTER_ISLAND && !sup_relay) return 0;
  return mpib_clamp_sup_bw(sup_bw);
}

/* A CTS FIFO element: the receiver RDMA-writes one per grouped receive into the sender's
 * FIFO. 64 bytes, 64-byte aligned, so one element never straddles a cache line. */
/* A connection's lanes: the NIC ports its rails' QPs live on (mpib.h). Lane 0 is SOUT's port,
 * lane 1 SUP's first port (a rail's first lane has the rail's index), lanes 2.. the further
 * SUP ports one connection stripes over (parallel cables to one peer). */
#define MPIB_MAX_STRIPE 4
#define MPIB_NLANES (MPIB_NRAILS + MPIB_MAX_STRIPE - 1)

struct mpib_cts {
  uint64_t addr;
  uint64_t size;
  uint32_t rkey[MPIB_NRAILS];
  int32_t tag;
  uint32_t nreqs;
  uint64_t seq;                              /* request sequence number + 1; 0 = never written */
  uint64_t check;                            /* mpib_cts_check of the fields above */
  uint32_t stripe_rkey[MPIB_MAX_STRIPE - 1]; /* the buffer's rkeys on lanes 2..: 0 without striping */
  uint8_t pad[4];
} __attribute__((aligned(64)));
_Static_assert(sizeof(struct mpib_cts) == 64, "CTS element is one cache line");

/* A NIC writes a 64-byte element in one piece, but a software RDMA device (rxe) copies it
 * with memcpy, whose stores another CPU may see in any order: the sequence number can be
 * visible before the fields it vouches for. The sender therefore trusts an element only when
 * this checksum of all its fields matches too. */
static inline uint64_t mpib_cts_mix(uint64_t h, uint64_t word) {
  h ^= word;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 31);
}
static inline uint64_t mpib_cts_check(const volatile struct mpib_cts *e) {
  uint64_t h = 0x9E3779B97F4A7C15ull;
  h = mpib_cts_mix(h, e->addr);
  h = mpib_cts_mix(h, e->size);
  h = mpib_cts_mix(h, (uint64_t)e->rkey[0] << 32 | e->rkey[1]);
  h = mpib_cts_mix(h, (uint64_t)(uint32_t)e->tag << 32 | e->nreqs);
  h = mpib_cts_mix(h, e->seq);
  /* Striped lanes' rkeys are mixed in only when present: an element without them checks as
   * before, so peers of one wire version agree whether or not they know of striping. Written
   * out word by word: every isend that posts and every irecv runs it. */
  uint64_t stripe0 = (uint64_t)e->stripe_rkey[0] << 32 | e->stripe_rkey[1], stripe1 = e->stripe_rkey[2];
  if (stripe0 | stripe1) h = mpib_cts_mix(mpib_cts_mix(h, stripe0), stripe1);
  return h;
}

/* The rkey a write on `lane` uses for the element's buffer. */
static inline uint32_t mpib_cts_rkey(const struct mpib_cts *e, int lane) {
  return lane < MPIB_NRAILS ? e->rkey[lane] : e->stripe_rkey[lane - MPIB_NRAILS];
}

/* Copies a CTS element out of the FIFO once, so that every decision is made on one set of
 * values: reading a field again later could see a newer store than the checksum did. Four
 * volatile 16-byte loads (one vector move each), not a load and a store per field; volatile,
 * so that the compiler never reads the FIFO again in place of the copy. */
typedef uint64_t mpib_cts_quarter __attribute__((vector_size(16), may_alias));
_Static_assert(sizeof(struct mpib_cts) == 4 * sizeof(mpib_cts_quarter), "a CTS element is four quarters");
static inline void mpib_cts_snapshot(const volatile struct mpib_cts *src, struct mpib_cts *dst) {
  const volatile mpib_cts_quarter *from = (const volatile mpib_cts_quarter *)src;
  mpib_cts_quarter *to = (mpib_cts_quarter *)dst;
  for (int i = 0; i < 4; i++) to[i] = from[i];
}

/* Whether a snapshot is the complete element for request sequence `want`. */
static inline int mpib_cts_landed(const struct mpib_cts *e, uint64_t want) {
  return e->seq == want && e->check == mpib_cts_check(e);
}

/* Whether receives need a flush (a loopback RDMA_READ ordering the NIC's writes before the
 * GPU reads the buffer). As net_ib: whenever the NIC can write GPU memory at all, through a
 * peer-memory module (nvidia_peermem) OR DMA-BUF, unless NCCL_GDR_FLUSH_DISABLE=1; NCCL then
 * decides per operation whether it calls iflush (GPUs before sm90). force_flush (mlx5 Data
 * Direct devices, or MPIB_FORCE_FLUSH for tests) wins over everything: on those devices
 * NCCL's own decision is not enough. */
static inline int mpib_flush_needed(int peermem, int dmabuf, int gdr_flush_disable, int force_flush) {
  if (force_flush) return 1;
  if (gdr_flush_disable) return 0;
  return peermem || dmabuf;
}

/* Whether an async event of a device concerns the port a NIC of MPIB uses. The kernel gives
 * every context of a device the events of all its ports, and two NICs may be two ports of one
 * device (SOUT on port 1, SUP on port 2): a port's event is that port's alone. Events of the
 * whole device (a fatal error, a QP's or a CQ's) concern every NIC. */
static inline int mpib_event_for_port(enum ibv_event_type t, int event_port, int nic_port) {
  switch (t) {
  case IBV_EVENT_PORT_ACTIVE:
  case IBV_EVENT_PORT_ERR:
  case IBV_EVENT_LID_CHANGE:
  case IBV_EVENT_PKEY_CHANGE:
  case IBV_EVENT_SM_CHANGE:
  case IBV_EVENT_CLIENT_REREGISTER:
  case IBV_EVENT_GID_CHANGE: return event_port == nic_port;
  default: return 1;
  }
}

/* The 16-bit FLID (routable LID) an InfiniBand router-aware GID carries in bytes 4..5 (big
 * endian), used as the DLID when the peer is in another IB subnet. */
static inline uint16_t mpib_gid_flid(const uint8_t gid[16]) { return (uint16_t)(gid[4] << 8 | gid[5]); }

/* The address vector towards a peer's port. RoCE routes by the GRH: the GID carries the
 * peer's IP address, the traffic class becomes the IP TOS byte, the DLID is unused. On
 * InfiniBand a peer in the same subnet (the GID's 16-bit local subnet prefix, bytes 6..7, as
 * net_ib compares it) is addressed by its LID with no GRH; one behind an IB router needs the
 * GRH and its FLID as DLID (the LID when the FLID is 0, as net_ib 2.28). Returns 0, or -1 when
 * the link layers differ or an IB peer has no LID to address. */
static inline int mpib_build_ah(struct ibv_ah_attr *ah, int local_link_layer, int remote_link_layer, uint8_t port,
                                uint8_t sgid_index, const uint8_t local_gid[16], const uint8_t remote_gid[16],
                                uint16_t remote_lid, uint8_t tc, uint8_t sl) {
  memset(ah, 0, sizeof *ah);
  if (local_link_layer != remote_link_layer) return -1;
  ah->port_num = port;
  ah->sl = sl;
  int grh = 1;
  if (local_link_layer == IBV_LINK_LAYER_INFINIBAND) {
    grh = memcmp(local_gid + 6, remote_gid + 6, 2) != 0; /* another subnet: through a router */
    uint16_t flid = mpib_gid_flid(remote_gid);
    ah->dlid = grh && flid ? flid : remote_lid;
    if (ah->dlid == 0) return -1;
  }
  ah->is_global = (uint8_t)grh;
  if (grh) {
    memcpy(ah->grh.dgid.raw, remote_gid, 16);
    ah->grh.sgid_index = sgid_index;
    ah->grh.hop_limit = 255;
    ah->grh.traffic_class = local_link_layer == IBV_LINK_LAYER_INFINIBAND ? 0 : tc;
  }
  return 0;
}

/* ---- Rail failover (mpib_failover.c; design and timeline in docs/failover.md) ----
 * A rail's life per connection: UP -> FENCING (failed: its QPs forced to the error state so
 * nothing more of it lands) -> DOWN (the receiver told the sender what it has; the sender
 * replayed the rest on the other rail) -> RECOVERING (QPs reset and reconnected, generation
 * + 1) -> PROBING (a zero-byte write per QP) -> UP. DEAD: the device is gone for good. */
enum { MPIB_RAIL_UP = 0, MPIB_RAIL_FENCING, MPIB_RAIL_DOWN, MPIB_RAIL_RECOVERING, MPIB_RAIL_PROBING, MPIB_RAIL_DEAD };

/* A rail state's name in log lines. */
static inline const char *mpib_rail_state_name(int st) {
  static const char *const names[] = {"up", "fencing", "down", "recovering", "probing", "dead"};
  return st >= 0 && st <= MPIB_RAIL_DEAD ? names[st] : "?";
}

/* Sender: which byte ranges of a slot must be replayed after the rail that last carried
 * `lost` (the ranges whose latest chain, original or replay, went out on it) failed. After
 * fencing the rail the receiver reports, per FIFO slot, the sequence number + 1 of its
 * still-open receive (open_seq1, 0 = none) and the ranges it has confirmed (have), and
 * next_seq, the sequence number of the first receive it had not posted yet.
 *   - A receive no longer open completed, which it does only with every range confirmed:
 *     nothing to replay (only acknowledgements were lost).
 *   - An open one needs the lost ranges it has not confirmed: the rail is fenced, so they can
 *     no longer arrive by it, and no other chain carries them.
 *   - One posted after the report (the sender may have used the rail before it learned of the
 *     fence) needs every lost range.
 * A replay therefore only goes to a receive that cannot complete without it, never into a
 * buffer the receiver has handed back to NCCL, and works however many times carriers fail:
 * each range has at most one live carrier, and a new one only after the old is fenced. */
static inline uint32_t mpib_replay_ranges(uint64_t open_seq1, uint32_t have, uint64_t next_seq, uint64_t slot_seq,
                                          uint32_t lost) {
  if (slot_seq >= next_seq) return lost;
  if (open_seq1 != slot_seq + 1) return 0;
  return lost & ~have;
}

/* Delay before the next attempt to bring a failed rail back: initial_ms doubled per failed
 * attempt, capped at max_ms. Never gives up: a flapping link is retried at most every max_ms. */
static inline uint64_t mpib_recovery_backoff_ms(uint32_t failed_attempts, uint64_t initial_ms, uint64_t max_ms) {
  uint64_t d = initial_ms;
  for (uint32_t i = 0; i < failed_attempts && d < max_ms; i++) d *= 2;
  return d < max_ms ? d : max_ms;
}

/* Idle-rail keepalives (mpib_failover.c probe_idle_rails): a rail with nothing pending counts as
 * idle from the first check that finds it so; once it has been idle for period_ns a probe is
 * due and the count restarts. Any pending work (the probe itself included) resets it. */
static inline int mpib_idle_probe_due(uint64_t *idle_since_ns, int idle, uint64_t now_ns, uint64_t period_ns) {
  if (!idle) {
    *idle_since_ns = 0;
    return 0;
  }
  if (!*idle_since_ns) {
    *idle_since_ns = now_ns;
    return 0;
  }
  if (now_ns - *idle_since_ns < period_ns) return 0;
  *idle_since_ns = 0;
  return 1;
}

/* The starting packet sequence number of a rail's QPs in generation `gen`: each rebuild starts
 * far from the previous one, so a stray packet of an old generation is outside the window. */
static inline uint32_t mpib_gen_psn(uint32_t gen) { return (gen * 0x00A5A5A5u) & 0xFFFFFFu; }

/* Notices the sender RDMA-writes into the receiver's notice word of a rail (one 8-byte store):
 * generation << 8 | command. */
enum { MPIB_NOTICE_FAIL = 1, MPIB_NOTICE_RECOVER = 2, MPIB_NOTICE_UP = 3 };
static inline uint64_t mpib_notice_encode(uint32_t gen, uint32_t cmd) { return (uint64_t)gen << 8 | (cmd & 0xFFu); }
static inline int mpib_notice_decode(uint64_t word, uint32_t *gen, uint32_t *cmd) {
  *gen = (uint32_t)(word >> 8);
  *cmd = (uint32_t)(word & 0xFFu);
  return (word >> 40) == 0 && *gen != 0 && *cmd >= MPIB_NOTICE_FAIL && *cmd <= MPIB_NOTICE_UP ? 0 : -1;
}

/* Notices come by two paths (an RDMA write, which may queue behind megabytes of data on the
 * surviving rail's QP, and the TCP control socket), so the receiver acts on whichever is
 * newer. A rail's notices only move forward: RECOVER(g), UP(g), FAIL(g), RECOVER(g + 1), ...
 * This is their order (0 for a word that is no notice). */
static inline uint64_t mpib_notice_order(uint64_t word) {
  uint32_t gen, cmd;
  if (mpib_notice_decode(word, &gen, &cmd) != 0) return 0;
  static const uint32_t rank[] = {0, 3, 1, 2}; /* FAIL after RECOVER and UP of the same generation */
  return (uint64_t)gen * 4 + rank[cmd];
}

/* The receiver's answer for one rail, RDMA-written into the sender's memory after the CTS FIFO:
 * the generation it fenced (with what it had then), the generation it rebuilt its QPs for, and
 * the generation it could not rebuild (its RTR failed: on RoCE the peer's MAC did not resolve),
 * so the sender retries after its back-off instead of waiting out MPIB_FAILOVER_TIMEOUT_MS. */
#define MPIB_FENCE_SLOTS 32
struct mpib_fence_rec {
  uint64_t fence_gen;
  uint64_t ready_gen;
  uint64_t open_seq1[MPIB_FENCE_SLOTS];
  uint8_t have[MPIB_FENCE_SLOTS]; /* the open receive's confirmed ranges (mpib_recv_ranges_arrived) */
  uint64_t next_seq;
  uint64_t check;
  uint64_t refused_gen;
  uint8_t refused_dead; /* with refused_gen: the receiver's device under the rail died; never retry */
  uint8_t pad[39];
} __attribute__((aligned(64)));
_Static_assert(sizeof(struct mpib_fence_rec) == 384, "fence record layout");

/* As the CTS, a record is trusted only when its checksum matches (rxe copies it with memcpy). */
static inline uint64_t mpib_fence_check(const volatile struct mpib_fence_rec *r) {
  uint64_t h = 0x2545F4914F6CDD1Dull ^ r->fence_gen;
  h = (h ^ r->ready_gen) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ r->next_seq) * 0xBF58476D1CE4E5B9ull;
  for (int i = 0; i < MPIB_FENCE_SLOTS; i++) {
    h ^= r->open_seq1[i] + ((uint64_t)r->have[i] << 56);
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
  }
  /* only when set: older records check as before */
  if (r->refused_gen) h = (h ^ r->refused_gen) * 0xBF58476D1CE4E5B9ull;
  if (r->refused_dead) h = (h ^ r->refused_dead) * 0x94D049BB133111EBull;
  return h;
}

/* The sender's answer to a fence record: the byte ranges of open receives that the record
 * lacks although their carrier on the fenced rail was acknowledged. The sender's RC
 * acknowledgement is the delivery authority (the responder acknowledges an RDMA write once its
 * bytes are placed): a receive completion the receiver had not polled when the rail was fenced
 * (its NIC died with the completion queued, or it arrived after the fence and was dropped) is
 * confirmed here, and the receiver counts those ranges as arrived. RDMA-written into the
 * receiver's memory after the notice words and sent over the control socket ('C'). */
struct mpib_confirm_rec {
  uint64_t gen;                        /* the fenced rail's generation it answers */
  uint64_t seq1[MPIB_FENCE_SLOTS];     /* the confirmed receive's seq + 1, 0 = nothing for the slot */
  uint8_t ranges[MPIB_FENCE_SLOTS];    /* its ranges confirmed */
  uint8_t full[MPIB_FENCE_SLOTS];      /* the slot's full range mask */
  uint32_t imm_size[MPIB_FENCE_SLOTS]; /* the size its immediate carried, or MPIB_IMM_NO_SIZE */
  uint64_t check;
} __attribute__((aligned(64)));
_Static_assert(sizeof(struct mpib_confirm_rec) == 512, "confirm record layout");

static inline uint64_t mpib_confirm_check(const volatile struct mpib_confirm_rec *r) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ r->gen;
  for (int i = 0; i < MPIB_FENCE_SLOTS; i++) {
    h ^= r->seq1[i] + ((uint64_t)r->ranges[i] << 56) + ((uint64_t)r->full[i] << 48) + ((uint64_t)r->imm_size[i] << 16);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

/* The registration cache (mpib_device.c): a buffer [data, data + size) is registered over the
 * pages that hold it, [*start, *start + *len), so a later regMr of any range inside them (NCCL
 * registers a user buffer per operation, and per peer, as net_ib's cache expects) is served by
 * the same registration. page is a power of two. */
static inline void mpib_mr_span(uintptr_t data, size_t size, size_t page, uintptr_t *start, size_t *len) {
  *start = data & ~(uintptr_t)(page - 1);
  *len = (data + size - *start + page - 1) & ~(page - 1);
  if (*len == 0) *len = page; /* a 0-byte registration still names its page */
}
/* Whether a registration of [start, start + len) serves [data, data + size). */
static inline int mpib_mr_serves(uintptr_t start, size_t len, uintptr_t data, size_t size) {
  return data >= start && size <= len && data - start <= len - size;
}

/* Sender: one slot's latest post and its acknowledgements on one rail, in one word the control
 * plane's thread can read while the data path writes it: seq + 1 (bits 24..63), the slot's full
 * range mask (20..21), the ranges acknowledged on the rail (18..19), whether the immediate
 * carried the size (16) and that size (0..15). */
static inline uint64_t mpib_ack_word(uint64_t seq1, uint32_t full, uint32_t acked, uint32_t imm_size) {
  uint64_t w = seq1 << 24 | (uint64_t)(full & 3u) << 20 | (uint64_t)(acked & 3u) << 18;
  if (imm_size <= 0xFFFFu) w |= 1ull << 16 | imm_size;
  return w;
}
static inline uint64_t mpib_ack_seq1(uint64_t w) { return w >> 24; }
/* The whole seq + 1 of an ack word `w`, which keeps its low 40 bits: the one nearest `near`
 * (the receiver's next_seq + 1, within MPIB_MAX_REQUESTS of every slot its record can name).
 * A comm passes 2^40 slots after 13 days at a million messages a second. 0 for a slot never
 * posted (its word is 0: a posted slot's full mask is never 0). */
static inline uint64_t mpib_ack_seq1_near(uint64_t w, uint64_t near) {
  const uint64_t span = 1ull << 40, mask = span - 1;
  if (w == 0) return 0;
  uint64_t x = (near & ~mask) | mpib_ack_seq1(w);
  if (x < near && near - x > span / 2) return x + span;
  if (x > near && x - near > span / 2 && x >= span) return x - span;
  return x;
}
static inline uint32_t mpib_ack_full(uint64_t w) { return (uint32_t)(w >> 20) & 3u; }
static inline uint32_t mpib_ack_ranges(uint64_t w) { return (uint32_t)(w >> 18) & 3u; }
static inline uint32_t mpib_ack_imm_size(uint64_t w) { return (w >> 16) & 1u ? (uint32_t)(w & 0xFFFFu) : 0xFFFFFFFFu; }

/* Sender: which ranges of its slot seq slot_seq the confirm record names, given `acked`, the
 * ranges whose carriers on the fenced rail were acknowledged, and the receiver's record of the
 * slot (open_seq1, have, next_seq, as for mpib_replay_ranges):
 *   - a receive the record shows open: the acknowledged ranges it has not confirmed;
 *   - one posted after the report: every acknowledged range. The receiver drops what the
 *     fenced rail delivers after its report, yet a write the sender posted there before it read
 *     the record can still be placed and acknowledged (a dying device's responder goes on for a
 *     while; the sender's send then completes and is never replayed);
 *   - a receive no longer open completed: nothing.
 * Only the fenced rail's acknowledgements: a range still on its way over a working rail
 * arrives there, and confirming it too would make it arrive twice. */
static inline uint32_t mpib_confirm_ranges(uint64_t open_seq1, uint32_t have, uint64_t next_seq, uint64_t slot_seq,
                                           uint32_t acked) {
  if (slot_seq >= next_seq) return acked;
  if (open_seq1 != slot_seq + 1) return 0;
  return acked & ~have;
}

/* Whether a slot's chain of `need` work requests may go on a send queue of `depth` places
 * that has `used` taken, leaving `reserve` places to control writes. */
static inline int mpib_sq_admits(uint32_t used, uint32_t need, uint32_t depth, uint32_t reserve) {
  return used + need + reserve <= depth;
}

/* QPs on lane i of a rail whose nqps QPs go round-robin over nlanes lanes (QP q on lane
 * q mod nlanes, mpib_comm.c's rail_setup). */
static inline uint32_t mpib_qps_on_lane(uint32_t nqps, uint32_t nlanes, uint32_t i) {
  return nqps / nlanes + (i < nqps % nlanes);
}

/* A lane's CQ depth: what every QP on it can complete at once. A QP that fails completes its
 * whole send queue in error, signalled or not, so each QP beyond the first adds its send queue
 * (send_wr) to base, the depth one QP needs with the lane's other completions. A CQ that
 * overflows loses completions: the comm would wait for them forever. */
static inline uint32_t mpib_lane_cq_depth(uint32_t base, uint32_t send_wr, uint32_t qps_on_lane) {
  return base + (qps_on_lane > 1 ? (qps_on_lane - 1) * send_wr : 0);
}

#endif
