/*
 * The state the C data path and the Go control plane (through cgo) share: types, constants
 * and the one global, mpib_g (defined in mpib_device.c, filled by Go at init). Every object
 * handed to NCCL (comms, requests, memory handles) is C memory defined here. Included by the
 * C files that use these types and by the cgo preambles; the inline helpers below only work on
 * these types (a rail's name, lanes and fault state, a comm's request pool and MRs).
 *
 * Functions are declared by their own file's header: mpib_device.h (NICs, GID tables, memory
 * registration), mpib_events.h (the async-event thread), mpib_comm.h (comm setup and teardown),
 * mpib_qp.h (its QP helpers), mpib_p2p.h (isend, irecv, test), mpib_flush.h, mpib_slots.h,
 * mpib_failover.h, mpib_rebuild.h, mpib_progress.h, mpib_watch.h, mpib_handoff.h (handshake results for
 * connect and accept), mpib_clock.h, mpib_profiler.h, mpib_hostile.h, mpib_verbs.h,
 * mpib_log.h, mpib_shm.h (the agent segment) and mpib_api.h (what the ABI tables adapt to).
 */
#ifndef MPIB_H
#define MPIB_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "mpib_log.h"
#include "mpib_policy.h"
#include "mpib_shm.h"
#include "nccl_abi.h"

#define MPIB_MAX_REQUESTS NCCL_NET_MAX_REQUESTS /* CTS FIFO slots per comm */
#define MPIB_MAX_RECVS 8                        /* requests grouped in one irecv */
#define MPIB_MAX_QPS_PER_RAIL 16
#define MPIB_MAX_QPS (MPIB_NRAILS * MPIB_MAX_QPS_PER_RAIL)
/* Requests a comm can have alive: a sender one per grouped entry of every slot; a receiver
 * one irecv per slot plus one flush per completed irecv NCCL has not tested yet. */
#define MPIB_REQ_POOL_SEND (MPIB_MAX_REQUESTS * MPIB_MAX_RECVS)
#define MPIB_REQ_POOL_RECV (2 * MPIB_MAX_REQUESTS)
/* Sized from what a connection can have in flight: at most MPIB_MAX_REQUESTS slots, each
 * one signalled write (sender) or one receive (receiver) per rail. */
#define MPIB_SRQ_DEPTH (2 * MPIB_MAX_REQUESTS) /* receives posted per rail per recv comm */
#define MPIB_SRQ_REFILL 16                     /* refill once this many were consumed */
#define MPIB_CQ_DEPTH (MPIB_SRQ_DEPTH + MPIB_MAX_REQUESTS + 16)
/* Sender send queue: room for the chains of MPIB_SQ_SLOTS slots of MPIB_MAX_RECVS grouped
 * requests (a write each plus the final write with the immediate: 48 writes in flight, far
 * beyond any link's bandwidth-delay product at NCCL's chunk sizes) and MPIB_SQ_CTRL_RESERVE
 * places that only control writes (notices, probes, keepalives) may take. A slot whose chain
 * does not fit waits in isend until completions free the room (mpib_sq_admits); a slot of one
 * request takes at most two places, so 27 of them fit at once. The 61 entries make a ring of
 * 64 (rxe rounds to a power of two above the depth; mlx5 to a power of two of the bytes).
 * net_ib sizes its queue for every slot at once (2 x 256 entries); the send queues are most
 * of what a connection's rings cost (docs/benchmarks.md, "Memory per connection"). */
#define MPIB_SQ_SLOTS 6
#define MPIB_SQ_CTRL_RESERVE 7
#define MPIB_SEND_WR_SENDER (MPIB_SQ_SLOTS * (MPIB_MAX_RECVS + 1) + MPIB_SQ_CTRL_RESERVE)
_Static_assert(MPIB_SEND_WR_SENDER < 64, "the sender's send queue stays a 64-entry ring");
/* Receiver send queue: the CTS writes (one per slot, every MPIB_CTS_SIGNAL_EVERY-th
 * signalled) and the control writes; a CTS that does not fit waits in irecv. */
#define MPIB_CTS_SIGNAL_EVERY 8
#define MPIB_SEND_WR_RECEIVER (MPIB_MAX_REQUESTS - 1)
_Static_assert(MPIB_SEND_WR_RECEIVER < 256 && MPIB_MAX_RECVS + 1 < 256, "a batch fits a wr_id's 8 bits");
_Static_assert(MPIB_SEND_WR_RECEIVER >= 2 * MPIB_CTS_SIGNAL_EVERY + 8, "two signalling batches and control fit");
/* Sender CQ: its signalled writes and replays, or, once a rail failed, every write of a full
 * send queue completing in error (a provider rounds it up to a power of two less one). */
#define MPIB_CQ_DEPTH_SENDER (MPIB_SEND_WR_SENDER + MPIB_MAX_REQUESTS + 16)
#define MPIB_NO_OVERRIDE UINT32_MAX
#define MPIB_PAGE 4096
#define MPIB_CTS_BYTES (sizeof(mpib_cts_row) * MPIB_MAX_REQUESTS)
#define MPIB_SIZES_BYTES (sizeof(mpib_sizes_row) * MPIB_MAX_REQUESTS)
/* After the CTS FIFO: the receiver's fence records, one per rail (the sender's copy is written
 * by the receiver; the receiver's is its staging). After the size records: the sender's
 * notice word per rail, then its confirm record per rail (likewise). See mpib_policy.h. */
#define MPIB_CTS_AREA (MPIB_CTS_BYTES + MPIB_NRAILS * sizeof(struct mpib_fence_rec))
#define MPIB_NOTICE_BYTES 64 /* the notice words, padded to the confirm records' alignment */
#define MPIB_CONFIRM_OFFSET (MPIB_SIZES_BYTES + MPIB_NOTICE_BYTES) /* from the size records */
#define MPIB_SIZES_AREA (MPIB_CONFIRM_OFFSET + MPIB_NRAILS * sizeof(struct mpib_confirm_rec))
/* Both areas share one allocation and one memory registration per rail (the size records on
 * their own cache lines after the CTS area): one MR per rail instead of two makes connection
 * setup one kernel call shorter per rail and halves the MRs a connection holds. */
#define MPIB_SIZES_OFFSET ((MPIB_CTS_AREA + 63) & ~(size_t)63)
#define MPIB_NIC_AREA (MPIB_SIZES_OFFSET + MPIB_SIZES_AREA)
_Static_assert(MPIB_FENCE_SLOTS == MPIB_MAX_REQUESTS, "a fence record covers every FIFO slot");
/* Send completions: wr_id names what completed. Data writes carry the slot's sequence number
 * (bits 0..47), the rail's generation (56..61: a completion of an older generation is ignored)
 * and a replay bit; control writes carry a kind (0..7) and the generation (8..31) with bit 63
 * set, and their QP's index (40..47). A signalled one also carries the work requests it
 * retires from its QP's send queue (itself and the unsignalled ones posted before it: data
 * bits 48..55, control bits 32..39), for the send-queue accounting (sq_used). */
#define MPIB_WRID_SPECIAL (1ull << 63)
#define MPIB_WRID_REPLAY (1ull << 62)
#define MPIB_WRID_GEN_SHIFT 56
#define MPIB_WRID_BATCH_SHIFT 48
#define MPIB_WRID_SEQ_MASK ((1ull << MPIB_WRID_BATCH_SHIFT) - 1)
#define MPIB_WRID_SPECIAL_BATCH_SHIFT 32
#define MPIB_WRID_SPECIAL_QP_SHIFT 40
enum { MPIB_WR_UNSIGNALLED = 1, MPIB_WR_CTS, MPIB_WR_CTRL, MPIB_WR_PROBE, MPIB_WR_RECV, MPIB_WR_KEEPALIVE };
#define MPIB_WRID_RECV (MPIB_WRID_SPECIAL | MPIB_WR_RECV) /* SRQ receives outlive QP generations */

/* A rail's name in log lines (every C file names rails with it). */
static inline const char *mpib_rail_name(int rail) { return rail == MPIB_RAIL_SOUT ? "SOUT" : "SUP"; }

/* Fused devices NCCL sees (MPIB_HCA_SOUT and MPIB_HCA_SUP paired by position) and the NICs
 * they are made of: a SUP NIC may serve several fused devices (pairs of GPUs sharing one), and
 * a fused device may have several SUP ports (a direct-attach mesh: one per cable; each
 * connection uses one, the one its peer is cabled to). */
#define MPIB_MAX_DEVS 16
#define MPIB_MAX_SUP_PORTS 8
#define MPIB_MAX_NICS (MPIB_MAX_DEVS * (1 + MPIB_MAX_SUP_PORTS))

/* One physical NIC port (global, opened once at init by the Go control plane). */
struct mpib_nic {
  char name[64];
  int role; /* the rail it serves (MPIB_RAIL_SOUT or MPIB_RAIL_SUP), for messages */
  struct ibv_context *ctx;
  struct ibv_pd *pd;
  uint8_t port;
  int gid_tbl_len;
  enum ibv_mtu active_mtu;
  int speed_mbps;
  int link_layer;
  uint16_t lid; /* InfiniBand's; the event thread reads it again when it changes (mpib_events.c): atomic */
  uint16_t pkey_index;
  int max_qp, max_cq; /* device limits (ibv_query_device) */
  /* Set by the async-event thread (mpib_events.c), read by the data path. */
  int fatal;     /* IBV_EVENT_DEVICE_FATAL: nothing on this device will complete again */
  int port_down; /* IBV_EVENT_PORT_ERR until IBV_EVENT_PORT_ACTIVE */
  uint64_t port_change_ns;
  uint32_t gid_gen; /* counts IBV_EVENT_GID_CHANGE: the control plane's GID cache is stale when it moved */
};

/* One fused device: a SOUT NIC and a SUP NIC, and what getProperties reports for it. */
struct mpib_fdev {
  int sout_nic;                    /* index into mpib_g.nic */
  int sup_nic[MPIB_MAX_SUP_PORTS]; /* every SUP port's, in MPIB_HCA_SUP order */
  int nsup;
  int rail_id, plane_id; /* v12 railId / planeId (NCCL_NET_ID_UNDEF: none) */
  char prop_name[160];
  char prop_pci_path[256];
  int prop_has_pci_path;
  uint64_t prop_guid;
  int prop_ptr_support;
  int prop_force_flush; /* mlx5 Data Direct: NCCL must flush even where it would not */
  int prop_max_comms;
};

/* Process-wide configuration and devices, filled by Go in init before any comm exists. */
struct mpib_global {
  struct mpib_nic nic[MPIB_MAX_NICS];
  int nnics;
  struct mpib_fdev fdev[MPIB_MAX_DEVS];
  int nfdevs; /* fused devices ready (0 until init opened every NIC) */
  int mode;
  int sup_relay;
  uint32_t force_sup_bw; /* MPIB_FORCE_SUP_BW test override, or MPIB_NO_OVERRIDE */
  int flush_enabled;     /* loopback RDMA_READ flush QPs are built for recv comms */
  int relaxed_ordering;
  uint8_t ib_timeout, ib_retry_cnt, ib_sl;
  int ib_tc;              /* connection traffic class when NCCL's comm config sets none */
  int fifo_tc;            /* NCCL_IB_FIFO_TC: class of the receiver's CTS writes, -1 = the connection's */
  int use_inline;         /* NCCL_IB_USE_INLINE: CTS and size records sent inline */
  int ece_enable;         /* NCCL_IB_ECE_ENABLE */
  uint64_t whole_msg_max; /* MPIB_WHOLE_MSG_MAX */
  int failover;           /* MPIB_FAILOVER: a failed rail's traffic moves to the other rail */
  uint64_t recovery_backoff_ms, recovery_backoff_max_ms;
  uint64_t failover_timeout_ms; /* how long a sender waits for the receiver's fence record */
  /* MPIB_STALL_TIMEOUT_MS: how long a connection with no working rail waits for one (0: fail at once) */
  uint64_t stall_timeout_ms;
  /* MPIB_DETECT_MS: no acknowledgement on a busy rail's path for this long fails the rail (0: the RC budget alone) */
  uint64_t detect_ms;
  uint64_t agent_stale_ns;
  void *shm; /* struct mpib_shm *, or NULL when no agent segment is open */
};
extern struct mpib_global mpib_g;

/* Memory handle: one MR per NIC of one fused device, [0] on SOUT and [1 + i] on SUP port i
 * (NCCL registers a buffer once per net device, regIsGlobal, and uses it on every comm of the
 * device, whichever SUP port a comm's peer is cabled to: mpib_comm_mr picks the comm's). */
#define MPIB_MR_SLOTS (1 + MPIB_MAX_SUP_PORTS)
struct mpib_mr {
  struct ibv_mr *mr[MPIB_MR_SLOTS];
  int fdev;
  /* The registration cache (mpib_device.c, mpib_reg_mr): the span registered, whether by
   * DMA-BUF, how many regMr calls hold it, and its place in its device's cache (in_cache 0
   * once the devices closed under it: it is then only its holders'). */
  uintptr_t start;
  size_t len;
  int dmabuf;
  int refs;
  int in_cache;
  struct mpib_mr *next;
};

enum { MPIB_REQ_FREE = 0, MPIB_REQ_SEND, MPIB_REQ_RECV, MPIB_REQ_FLUSH };

struct mpib_comm;

struct mpib_request {
  struct mpib_comm *comm;
  int type;
  int done;
  uint64_t seq; /* FIFO sequence number of the slot it belongs to */
  int nreqs;
  /* send */
  void *data;
  size_t size;
  int tag;
  struct mpib_mr *mh;
  /* recv */
  uint32_t expected_mask; /* the slot's full range mask, from its first immediate (0: none yet) */
  uint32_t have_mask;     /* ranges confirmed by an immediate (mpib_recv_ranges_arrived) */
  uint32_t wrote_lanes;   /* lanes whose NIC placed bytes of it (each range's carrier QP's): what iflush orders */
  /* flush (mpib_flush.c) */
  uint32_t flush_lanes;     /* lanes with a flush read outstanding */
  uint32_t flush_redo;      /* lanes whose read failed or was lost with a QP reset: posted again */
  void *flush_addr;         /* the buffer the reads go to (with mh) */
  uint64_t flush_failed_ns; /* when its first read failed (0: none did): the retries' deadline */
  /* NCCL profiler (mpib_profiler.c): the isend's handle (events live in the comm, per slot). */
  void *prof_phandle;
  /* recv, entries [0, nreqs): irecv sets both (mpib_req_alloc leaves them as they were) */
  int sizes[MPIB_MAX_RECVS];
  size_t posted[MPIB_MAX_RECVS]; /* the sizes NCCL posted: the bound on what the peer reports,
                                  * kept where no peer can write (not the CTS copy: registered) */
};

/* A rail's QPs rebuilt on a thread of their own (mpib_rail_rebuild_start). */
struct mpib_rebuild {
  struct mpib_comm *comm;
  int rail;
  uint32_t psn;
  int running; /* a thread was started and is not joined yet (read by the comm's caller only) */
  int done;    /* the thread finished: set with release, read with acquire */
  int err;     /* its result: 0 or -errno, valid once done */
  pthread_t thread;
};

/* One rail's failover state in one comm (mpib_failover.c). */
struct mpib_rail_ctl {
  int state;              /* MPIB_RAIL_* */
  uint32_t gen;           /* generation of the rail's QPs, from 1; a rebuild adds one */
  uint64_t since_ns;      /* when the state was entered */
  uint64_t retry_at_ns;   /* DOWN: the next recovery attempt */
  uint32_t attempts;      /* recoveries that failed in a row (back-off) */
  uint32_t probes;        /* PROBING: probe writes not yet completed */
  int slow_reported;      /* FENCING: the wait for the receiver's record was logged */
  int keepalive_out;      /* keepalive writes outstanding on the rail (one per lane) */
  uint64_t idle_since_ns; /* UP with nothing pending since (0: busy); see probe_idle_rails */
  uint64_t notice_seen;   /* receiver: the last notice word handled */
  /* No-progress watch (mpib_watch.c): acknowledgements of our signalled writes
   * polled, the count the watch last saw, when the rail last made progress (or was idle), and
   * the longest recent wait for an acknowledgement (decaying), which widens the watch on a slow
   * path. */
  uint64_t acks, acks_seen, progress_ns, slow_ns;
  int watch_busy;              /* the last watch tick found signalled writes outstanding */
  struct mpib_rebuild rebuild; /* DOWN: the QPs being rebuilt for the next generation */
  /* A standby rail that joins after the handshake (docs/failover.md, "The standby rail"):
   * join_wait is the data path's (the rail is DOWN and never tried until it joins); the control
   * plane sets join_built (sender: its QPs exist) and join_arrived (sender: the receiver took
   * them; receiver: the sender's are in comm->join_peer) with release. */
  int join_wait;
  int join_built, join_arrived;
  uint64_t joining; /* sender: when the standby took its join, until it is UP (logged as a join) */
};

struct mpib_qp {
  struct ibv_qp *qp;
  int rail;
  int lane; /* the lane (NIC port) it lives on: its rail's index for a rail's first lane */
};

/* Local and remote connection facts exchanged over the TCP control socket. */
struct mpib_rail_info {
  uint8_t gid[16];
  uint32_t mtu;  /* enum ibv_mtu */
  uint32_t rkey; /* rkey of the advertised buffer on this rail */
  uint16_t lid;
  uint8_t link_layer;
  uint8_t ece_valid;
  struct ibv_ece ece;
  uint32_t qpn[MPIB_MAX_QPS_PER_RAIL];
};
/* What a standby rail's sender sends when its QPs exist ('J' on the control socket): the part
 * of its mpib_rail_info the handshake could not carry. */
struct mpib_join_info {
  uint32_t rkey;
  uint32_t nqps;
  uint8_t ece_valid;
  struct ibv_ece ece;
  uint32_t qpn[MPIB_MAX_QPS_PER_RAIL];
};
/* A striped SUP lane's facts (lanes 2..; the rail's QP numbers stay in its mpib_rail_info). */
struct mpib_lane_info {
  uint8_t gid[16];
  uint32_t mtu;  /* enum ibv_mtu */
  uint32_t rkey; /* the lane's registration of the advertised buffer */
  uint16_t lid;
  uint8_t link_layer;
};
struct mpib_conn_info {
  uint8_t tc, sl; /* the sending side's: both ends use them */
  uint32_t nqps[MPIB_NRAILS];
  struct mpib_rail_info rail[MPIB_NRAILS];
  uint64_t buf_addr;  /* sender: its CTS FIFO; receiver: its size records */
  uint32_t sup_lanes; /* 0 without SUP QPs, else 1 + the striped lanes */
  struct mpib_lane_info lane[MPIB_MAX_STRIPE - 1];
  uint32_t deferred; /* rails (bit r) whose QPs come after the handshake: rkey, ECE and QPNs are 0 */
};

/* Per-connection choices made by the control plane before the QPs exist. */
struct mpib_conn_params {
  int dev;      /* the fused device */
  int sup_port; /* its SUP port the connection uses (suppair's choice; 0 without SUP QPs) */
  int is_send, mode, path_class;
  uint32_t nqps[MPIB_NRAILS];
  int gid_index[MPIB_NRAILS]; /* chosen at connect time (the GID table may change after init) */
  int tc;                     /* this side's traffic class (the receiver adopts the sender's) */
  /* Striping (parallel cables to the peer): SUP lanes (0 or 1: none), and each further lane's
   * port and GID index; nqps[SUP] is at least sup_lanes. */
  int sup_lanes;
  int lane_port[MPIB_MAX_STRIPE - 1];
  int lane_gid_index[MPIB_MAX_STRIPE - 1];
  uint32_t defer_rails; /* sender: rails (bit r) built after the handshake (the standby rail) */
};

typedef struct mpib_cts mpib_cts_row[MPIB_MAX_RECVS];
typedef int32_t mpib_sizes_row[MPIB_MAX_RECVS];
_Static_assert(MPIB_NRAILS * sizeof(uint64_t) <= MPIB_NOTICE_BYTES && MPIB_SIZES_BYTES % 64 == 0, "notice words");

/* One direction of a connection: a send comm or a recv comm. */
struct mpib_comm {
  /* Buffers the NIC reads or writes live in their own page-aligned allocations, never on a
   * page with CPU-written fields: after fork() without copy-on-fork for pinned pages (kernels
   * < 5.13) the NIC and the parent would otherwise see different copies of the page. */
  /* CTS FIFO (sender: written by the peer) or CTS staging (receiver: written locally). */
  mpib_cts_row *cts; /* [MPIB_MAX_REQUESTS] */
  /* Size records (receiver: written by the peer; sender: staging). */
  mpib_sizes_row *sizes; /* [MPIB_MAX_REQUESTS] */
  /* The MPIB_NIC_AREA allocation at cts, registered in two parts per rail: what this side
   * posts from (stage_mr, local access only: the sender's size records and notice words, the
   * receiver's CTS elements and fence records) and what the peer writes (inbox_mr, the only
   * rkey the peer gets: the sender's CTS FIFO and fence records, the receiver's size records
   * and notice words). A peer can thus never write what this side sends, nor the CTS copy a
   * receiver keeps (its bounds live in the requests anyway: mpib_request.posted). */
  struct ibv_mr *stage_mr[MPIB_NLANES];
  struct ibv_mr *inbox_mr[MPIB_NLANES];

  int is_send;
  int fdev;                          /* the fused device it belongs to */
  struct mpib_nic *nic[MPIB_NLANES]; /* that device's NICs, per lane: SUP's first is port sup_port's */
  int sup_port;
  int sup_lanes;              /* SUP lanes (1 + ports striped over; 1 without striping) */
  int lane_port[MPIB_NLANES]; /* a SUP lane's port of the fused device */
  int mode, path_class, sup_relay, cts_rail;
  int gid_index[MPIB_NLANES];
  union ibv_gid gid[MPIB_NLANES];
  /* Each lane's GID type (IBV_GID_TYPE_*) at the index it was set up with, -1 when unknown
   * (InfiniBand, or a library that cannot tell): after a port flap moves the address the lane
   * looks for it again with this RoCE version (mpib_lane_gid_refresh). */
  int8_t gid_type[MPIB_NLANES];
  uint8_t tc, sl; /* of this connection's data QPs (the sender's) */
  uint32_t nqps[MPIB_NRAILS];
  struct mpib_qp qps[MPIB_MAX_QPS];
  struct ibv_cq *cq[MPIB_NLANES];
  struct ibv_srq *srq[MPIB_NLANES]; /* receiver only */
  int srq_posted[MPIB_NLANES];
  uint64_t fifo_head; /* sequence number of the next request */
  uint32_t force_sup_bw;
  struct mpib_rail_ctl rail[MPIB_NRAILS];
  struct mpib_rail_info rem_rail[MPIB_NLANES];  /* the peer's QPs per lane, kept to rebuild a rail */
  struct mpib_join_info join_peer[MPIB_NRAILS]; /* receiver: a standby rail's sender QPs, staged */
  enum ibv_mtu rail_mtu[MPIB_NLANES];
  int ctrl_fd; /* the TCP control socket (owned by Go): tells the peer this side failed */

  /* Peer's buffer for our RDMA writes (sender: size records; receiver: CTS FIFO). */
  uint64_t rem_addr;
  uint32_t rem_rkey[MPIB_NLANES];

  /* Sender: the isends matched to each slot; receiver: the irecv owning each slot. */
  struct mpib_request *slot_reqs[MPIB_MAX_REQUESTS][MPIB_MAX_RECVS];
  int slot_matched[MPIB_MAX_REQUESTS];
  /* Sender, per slot: where each byte range (mpib_policy.h, imm layout) stands until it is
   * confirmed. A range is confirmed by its carrier's successful completion or by the
   * receiver's fence record; it has at most one live carrier at a time. */
  uint32_t slot_rails[MPIB_MAX_REQUESTS];                 /* original chains pending: bit r = range r on rail r */
  uint8_t slot_replay_on[MPIB_MAX_REQUESTS][MPIB_NRAILS]; /* ranges on a pending replay chain on each rail */
  uint8_t slot_replay_wait[MPIB_MAX_REQUESTS];            /* ranges lost, waiting for a replay to be posted */
  uint8_t slot_full[MPIB_MAX_REQUESTS];                   /* the slot's full range mask */
  uint64_t slot_posted_seq1[MPIB_MAX_REQUESTS];           /* sender: seq + 1 of the posted slot, 0 = none */
  uint32_t slot_sout[MPIB_MAX_REQUESTS][MPIB_MAX_RECVS];  /* sender: each request's SOUT bytes */
  uint64_t tcp_notice[MPIB_NRAILS];                       /* receiver: the last notice per rail that came over TCP */
  /* Sender: the receiver's records that came over the control socket (sent there when no
   * rail can carry them; the checksum rejects a copy torn by the control plane's write). */
  struct mpib_fence_rec tcp_rec[MPIB_NRAILS];
  /* Receiver: the sender's confirm records that came over the control socket, and the
   * checksum of the last one applied from each copy (RDMA, control socket), per rail: the two
   * copies may hold two different records for good, each applied once. */
  struct mpib_confirm_rec tcp_confirm[MPIB_NRAILS];
  uint64_t confirm_seen[MPIB_NRAILS][2];
  /* Sender, per slot and rail: what its latest post was acknowledged for (mpib_ack_word; kept
   * after the slot completed). Written by the data path's thread with atomic stores, read by
   * the control plane's thread too: it answers a fence record that arrives while NCCL has no
   * send of this comm to test (mpib_comm_answer_record). */
  uint64_t slot_ack[MPIB_MAX_REQUESTS][MPIB_NRAILS];
  /* Control messages: RDMA copies a full send queue refused, posted again on a later progress
   * call (bit kind * MPIB_NRAILS + rail), and the bytes for the control socket that a short
   * write left, sent before anything newer (whole messages only; ctrl_mu: the control plane's
   * thread writes there too). */
  uint32_t ctrl_rdma_due;
  uint32_t ctrl_out_n;
  pthread_mutex_t ctrl_mu;
  uint8_t ctrl_out[2048];
  uint64_t stall_since_ns; /* no rail of the connection works since (0: one does); see ride_through */
  int cts_repost_due;      /* receiver: open slots' CTS to write again once a rail works */
  int cts_repost_from;     /* receiver: the first slot of a due repost (0 but after a full queue) */
  int replays_waiting;     /* sender: slots with slot_replay_wait != 0 */

  /* Receiver flush: a loopback QP per lane reading 1 byte back through its NIC. */
  struct ibv_qp *flush_qp[MPIB_NLANES];
  struct ibv_cq *flush_cq[MPIB_NLANES];
  struct ibv_mr *flush_mr[MPIB_NLANES];
  uint8_t *flush_buf;                /* one page, NIC-read */
  uint32_t flush_due;                /* lanes that placed bytes of the receive test() returned last, until iflush */
  int flushes_open;                  /* flush requests posted and not done yet */
  uint8_t flush_broken[MPIB_NLANES]; /* a read failed on the lane's flush QP: reset before its next use */

  uint64_t peer_gone_ns; /* set by the control plane when the peer's control socket closed */
  int failure_reported;  /* the reason this comm cannot progress was logged (log once) */
  uint32_t max_inline;   /* bytes a CTS write may carry inline (0: never) */

  uint64_t cts_torn_since_ns; /* sender: when a CTS with our sequence but a bad checksum appeared */
  /* Sender: each slot's CTS elements, copied out of the FIFO and checked once. */
  struct mpib_cts cts_snap[MPIB_MAX_REQUESTS][MPIB_MAX_RECVS];
  uint64_t cts_snap_seq[MPIB_MAX_REQUESTS];

  uint32_t pending[MPIB_NRAILS];      /* signalled sends not yet completed, per rail */
  uint64_t *path_ack_ns[MPIB_NRAILS]; /* the rail's path's shared progress word (mpib_progress.h), or NULL */
  /* Send-queue accounting per QP (mpib_slots.c mpib_qp_post): work requests posted and not yet
   * retired by a signalled completion, and those posted since the last signalled one. A post
   * that does not fit the depth is refused whole (ENOMEM) before the provider sees it, so a
   * chain is never taken in part. */
  uint16_t sq_used[MPIB_MAX_QPS], sq_batch[MPIB_MAX_QPS];
  uint16_t sq_depth; /* what each data QP was created with (MPIB_SEND_WR_SENDER or _RECEIVER) */
  int recvs_open;    /* receiver: irecvs not yet completed */
  /* Receiver: fifo_head + 1 while no receive is open, 0 while one is: written by the data path
   * with atomic stores, read by the control plane's thread, which answers a FAIL notice for a
   * receiver NCCL is not calling (mpib_comm_answer_notice). */
  uint64_t recv_idle_seq1;
  /* Keepalive (mpib_failover_keepalive_tick): a comm NCCL keeps polling that has made no progress
   * for a second writes zero bytes on each rail, so a dead path errors even with nothing else
   * in flight (the control socket may share the dead network). idle_polls counts progress
   * calls (the keepalive, the watch and a quiet sender's failover tick run on every 16th);
   * cts_waits counts isend calls that found no CTS (every 16th polls). */
  uint32_t idle_polls, cts_waits;
  uint64_t progress_count, progress_seen, idle_since_ns;
  uint64_t stuck_seen, stuck_since_ns; /* the stuck report (mpib_watch_stuck_tick) */
  int stuck_reported;
  uint64_t watch_tick_ns; /* the no-progress watch's last tick (0: none yet) */
  uint64_t whole_msg_max; /* slots of at most this many bytes go whole to one rail */
  int64_t sup_owed;       /* whole-message deficit counter (mpib_whole_message_rail) */
  uint32_t hint_bw;       /* advanced mode: the cached agent hint */
  int hint_due;           /* read the hint (set at creation, and when a telemetry batch was posted) */
  /* Sender's agent telemetry (docs/shm-format.md 4.3), kept here and published to the segment
   * in batches (mpib_telemetry_flush), never per message: counters since the last flush, and
   * the bytes in flight per rail at the last flush (the gauge now: mpib_tele_inflight). */
  mpib_shm_tele_batch tele;
  uint32_t tele_slots;                      /* slots posted since the last flush */
  uint32_t tele_done;                       /* slots completed since the last flush */
  uint64_t tele_lost_bytes[MPIB_NRAILS];    /* bytes lost per rail since the last flush (mpib_tele_inflight) */
  uint64_t tele_now_ns;                     /* the completion clock of this progress call, 0 = not read yet */
  uint64_t slot_post_ns[MPIB_MAX_REQUESTS]; /* sender: when each slot was posted */
  uint64_t slot_rail_bytes[MPIB_MAX_REQUESTS][MPIB_NRAILS]; /* sender: each slot's bytes per rail */
  uint8_t slot_rail_reqs[MPIB_MAX_REQUESTS][MPIB_NRAILS];   /* sender: its requests with bytes there */
  uint32_t rail_parts[MPIB_NRAILS];                         /* sender: slot parts in flight per rail (active time) */
  uint64_t rail_active_since[MPIB_NRAILS]; /* when the active time not yet in the batch began, 0 unknown */

  int shm_slot;              /* agent segment slot, -1 when none */
  struct mpib_request *reqs; /* the pool: MPIB_REQ_POOL_SEND or MPIB_REQ_POOL_RECV entries */
  int nreqs_pool;
  /* The pool's free entries, a stack (mpib_req_alloc/mpib_req_free): the last one freed is the
   * next one taken, so a comm touches only as many entries as it has had alive at once, and a
   * pool of whole pages that NCCL never fills stays mostly unbacked. req_free_ready is 0 until
   * the first allocation fills the stack. */
  uint16_t req_free[MPIB_REQ_POOL_SEND];
  int req_free_n, req_free_ready;
  /* NCCL profiler events open per slot, grouped entry and rail (mpib_profiler.c). */
  void *prof_event[MPIB_MAX_REQUESTS][MPIB_MAX_RECVS][MPIB_NRAILS];
};

/* NCCL's proxy thread calls connect() and accept() over and over while it drives every other
 * connection's transfers, so neither call waits for the Go control plane once a handshake is
 * under way: a goroutine runs each handshake and leaves its result in C memory, and the calls
 * read it there. A call into Go waits for the Go scheduler, and with hundreds of handshakes
 * running that wait reaches hundreds of ms (docs/benchmarks.md, connect). */

/* A finished handshake waiting for accept(). */
struct mpib_ready {
  struct mpib_comm *comm; /* NULL when it failed */
  int result;             /* ncclResult_t */
  struct mpib_ready *next;
};

/* Listen comm: an id into the Go control plane's table of listeners, and the handshakes that
 * finished for it, oldest first. */
struct mpib_listen_comm {
  uint64_t id;
  int ready;                 /* queued handshakes: accept tries the lock only when this is not 0 */
  int closed;                /* the control plane closed the listener (finalize): accept then fails */
  struct mpib_ready *pushed; /* newest first: the control plane pushes without a lock */
  pthread_mutex_t mu;        /* the takers' (accept tries it, the listener's close drains under it) */
  struct mpib_ready *taken;  /* taken from pushed, oldest first (mu) */
};

/* Connect attempts in flight, one entry each. The handle NCCL keeps between connect() calls
 * names the entry by index + 1 and generation (handle bytes 32..39); a stale or forged handle
 * fails the generation check and goes to Go, which refuses it. An entry's word holds its
 * generation (high half) and state (low half), so that taking a result is one compare-and-
 * swap that cannot take another attempt's. Entries are freed when their result is taken: by
 * connect() (NCCL collected the comm) or by the control plane (NCCL never came back). */
#define MPIB_PENDING_MAX 65536
/* Where connect() keeps its state in NCCL's copy of the handle (plugin/internal/wire mirrors
 * them): the control plane's attempt id (8 bytes), and the pending entry's index + 1 and
 * generation (4 + 4). A handle as the peer's listen made it has zeros in both. */
#define MPIB_HANDLE_ATTEMPT_OFFSET 24
#define MPIB_HANDLE_PENDING_OFFSET 32
enum { MPIB_PENDING_RUNNING = 0, MPIB_PENDING_DONE = 1, MPIB_PENDING_FREE = 2 };
/* A handle's first bytes (magic, version, listener address and nonce): what names the listener
 * an attempt connects to. An entry keeps its attempt's, and a poll must present the same: a
 * handle that copies or guesses another attempt's entry and generation (a forged handle from a
 * peer rank) still names another listener and is refused. */
#define MPIB_HANDLE_KEY_WORDS 3
struct mpib_pending {
  uint64_t word;                       /* generation << 32 | MPIB_PENDING_* */
  struct mpib_comm *comm;              /* the result, valid once DONE */
  int result;                          /* ncclResult_t */
  uint64_t key[MPIB_HANDLE_KEY_WORDS]; /* the attempt's handle bytes [0, 24), set before RUNNING is published */
};

/* A connect() with a fresh handle: queued here for the control plane, which starts the
 * handshake (mpib_connect_enqueue, then the control plane's dispatcher reads the eventfd and
 * mpib_connect_dequeue). */
struct mpib_connect_req {
  uint64_t ctx;
  int dev, traffic_class;
  uint32_t idx1, gen;  /* its pending entry */
  uint8_t handle[128]; /* NCCL_NET_HANDLE_MAXSIZE: the peer's listen handle, copied */
  struct mpib_connect_req *next;
};

/* A free request of the comm's pool, zeroed and typed; NULL when all are in use. */
static inline struct mpib_request *mpib_req_alloc(struct mpib_comm *c, int type) {
  if (!c->req_free_ready) {
    for (int i = c->nreqs_pool - 1; i >= 0; i--) /* entry 0 on top */
      if (c->reqs[i].type == MPIB_REQ_FREE) c->req_free[c->req_free_n++] = (uint16_t)i;
    c->req_free_ready = 1;
  }
  if (c->req_free_n == 0) return NULL;
  struct mpib_request *r = &c->reqs[c->req_free[--c->req_free_n]];
  /* Every field before the arrays (irecv's to set), one store each: the callers' own stores
   * then replace most of them, where a memset of the whole head would stay. */
  r->comm = c;
  r->type = type;
  r->done = 0;
  r->seq = 0;
  r->nreqs = 0;
  r->data = NULL;
  r->size = 0;
  r->tag = 0;
  r->mh = NULL;
  r->expected_mask = r->have_mask = r->wrote_lanes = 0;
  r->flush_lanes = r->flush_redo = 0;
  r->flush_addr = NULL;
  r->flush_failed_ns = 0;
  r->prof_phandle = NULL;
  return r;
}
_Static_assert(offsetof(struct mpib_request, sizes) == 112,
               "a field was added to struct mpib_request: mpib_req_alloc must set it");

/* Gives a request back to its comm's pool; freeing a free one does nothing. */
static inline void mpib_req_free(struct mpib_request *r) {
  struct mpib_comm *c = r->comm;
  if (r->type == MPIB_REQ_FREE) return;
  r->type = MPIB_REQ_FREE;
  if (c->req_free_ready) c->req_free[c->req_free_n++] = (uint16_t)(r - c->reqs);
}

/* Lanes (MPIB_NLANES, mpib_policy.h): each NIC port a comm's rails use has its own CQ, SRQ and
 * registrations (a verbs object belongs to one device context); failover, replay and the split
 * stay per rail. How many lanes a rail has, the i-th of a rail, and a lane's rail. */
static inline int mpib_lane_count(const struct mpib_comm *c, int rail) {
  return rail == MPIB_RAIL_SOUT ? 1 : c->sup_lanes;
}
static inline int mpib_lane(int rail, int i) { return i == 0 ? rail : MPIB_NRAILS + i - 1; }
static inline int mpib_lane_rail(int lane) { return lane == MPIB_RAIL_SOUT ? MPIB_RAIL_SOUT : MPIB_RAIL_SUP; }

/* A standby rail waiting for its join (join_wait): 1 once it may be brought up. Called on the
 * thread that owns the data path (or by the handshake, before NCCL has the comm): the receiver
 * installs the sender's QPs, rkey and ECE the control plane staged ('J'); the sender needs its
 * own QPs built and the receiver's word that it took them ('K'). The rail stays DOWN: the
 * sender's recovery brings it up like any rail out of service. */
static inline int mpib_join_take(struct mpib_comm *c, int r) {
  struct mpib_rail_ctl *rc = &c->rail[r];
  if (!rc->join_wait) return 1;
  if (!__atomic_load_n(&rc->join_arrived, __ATOMIC_ACQUIRE)) return 0;
  if (c->is_send && !__atomic_load_n(&rc->join_built, __ATOMIC_ACQUIRE)) return 0;
  if (!c->is_send) { /* a standby rail has one lane: its first, whose index is the rail's */
    const struct mpib_join_info *j = &c->join_peer[r];
    c->rem_rail[r].rkey = c->rem_rkey[r] = j->rkey;
    c->rem_rail[r].ece_valid = j->ece_valid;
    c->rem_rail[r].ece = j->ece;
    memcpy(c->rem_rail[r].qpn, j->qpn, sizeof j->qpn);
  }
  rc->join_wait = 0;
  return 1;
}

/* Whether a device under any of the rail's lanes died (IBV_EVENT_DEVICE_FATAL), or reported
 * its port down (async events; set by mpib_events.c, read without a lock). Both run several
 * times per test() call: the rail's first lane is checked in line, the loop is only for
 * striped lanes, so an unstriped rail costs one load. */
static inline int mpib_rail_fatal(const struct mpib_comm *c, int rail) {
  if (__atomic_load_n(&c->nic[rail]->fatal, __ATOMIC_ACQUIRE)) return 1;
  for (int i = 1; i < mpib_lane_count(c, rail); i++)
    if (__atomic_load_n(&c->nic[mpib_lane(rail, i)]->fatal, __ATOMIC_ACQUIRE)) return 1;
  return 0;
}
static inline int mpib_rail_port_down(const struct mpib_comm *c, int rail) {
  if (__atomic_load_n(&c->nic[rail]->port_down, __ATOMIC_RELAXED)) return 1;
  for (int i = 1; i < mpib_lane_count(c, rail); i++)
    if (__atomic_load_n(&c->nic[mpib_lane(rail, i)]->port_down, __ATOMIC_RELAXED)) return 1;
  return 0;
}

/* The NIC to name when the rail fails for its device or port: the first lane's that is dead
 * or down (a striped lane's own name), else the rail's first lane's. */
static inline const char *mpib_rail_fault_nic(const struct mpib_comm *c, int rail) {
  for (int i = 0; i < mpib_lane_count(c, rail); i++) {
    const struct mpib_nic *n = c->nic[mpib_lane(rail, i)];
    if (__atomic_load_n(&n->fatal, __ATOMIC_ACQUIRE) || __atomic_load_n(&n->port_down, __ATOMIC_RELAXED))
      return n->name;
  }
  return c->nic[rail]->name;
}

/* The MR of a device-wide memory handle on this comm's NIC of one lane (NULL: none there). */
static inline struct ibv_mr *mpib_comm_mr(const struct mpib_comm *c, const struct mpib_mr *mh, int lane) {
  return mh->mr[lane == MPIB_RAIL_SOUT ? 0 : 1 + c->lane_port[lane]];
}

/* The check of NCCL's memory handle that every call naming a buffer of `size` bytes makes
 * (`call`: isend, irecv, iflush): bytes need a handle, registered on this comm's fused device.
 * ncclSuccess, or ncclInvalidArgument after a warning. */
static inline ncclResult_t mpib_check_mhandle(const struct mpib_comm *c, const struct mpib_mr *mh, size_t size,
                                              const char *call) {
  if (size > 0 && mh == NULL) {
    MPIB_WARN("%s of %zu bytes without a memory handle", call, size);
    return ncclInvalidArgument;
  }
  if (mh != NULL && mh->fdev != c->fdev) {
    MPIB_WARN("%s with a memory handle registered on device %d, on a connection of device %d", call, mh->fdev, c->fdev);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

#endif
