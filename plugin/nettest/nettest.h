/*
 * mpib-nettest: an NCCL-like driver for a net plugin (ncclNet_v8..v12), loaded with dlopen
 * exactly as NCCL's proxy does. Two processes (server, client) exchange NCCL handles over an
 * out-of-band TCP socket the driver owns, then drive isend/irecv/test/iflush like NCCL.
 *
 * Files: main.c (options, setup, teardown), net.c (dlopen, ABI adapters, logger, profiler check),
 * oob.c (TCP side channel), xfer.c (schedules, patterns, windowed transfer engine),
 * modes.c (verify, bw, lat), badinput.c (badhandle, garbage-peer).
 */
#ifndef MPIB_NETTEST_H
#define MPIB_NETTEST_H

#include <stddef.h>
#include <stdint.h>

#include "nccl_abi.h"

/* Exit codes. */
#define NT_EXIT_OK 0
#define NT_EXIT_FAIL 1  /* test failure: mismatch, plugin error, timeout, bad input accepted */
#define NT_EXIT_USAGE 2 /* bad arguments, plugin not loadable, OOB socket failure */
#define NT_EXIT_INIT 3  /* plugin init/devices failed or reported no device */

#define NT_MAX_MULTI 8  /* net_ib's maximum number of receives grouped in one irecv */
#define NT_MAX_WINDOW 8 /* NCCL_STEPS: outstanding requests per connection */
#define NT_MAX_SIZES 64
#define NT_MAX_COUNTERS 8
#define NT_MAX_MSG_SIZE ((size_t)1 << 30) /* test() reports sizes as int */
#define NT_MAX_DEVS 16                    /* --devs: devices driven at once by one process */
#define NT_MAX_RUNS 64                    /* runs in threads at once: --devs, or --parallel on one device */

enum nt_role { NT_SERVER = 0, NT_CLIENT = 1 };
enum nt_mode {
  NT_VERIFY,
  NT_BW,
  NT_LAT,
  NT_BADHANDLE,
  NT_GARBAGE,
  /* lifecycle.c: finalize-during-handshake, ... */
  NT_FINALIZE_HS,
  NT_ABORT,
  NT_STRAY,
  /* hostile.c: listener-flood, forged-handle */
  NT_FLOOD,
  NT_FORGED,
  /* silent.c: silent-hold, evict-race */
  NT_SILENT_HOLD,
  NT_EVICT_RACE,
  /* scale.c */
  NT_CONNECT,
  NT_RESOURCES
};

struct nt_counter {
  const char *name;
  const char *path;
  uint64_t before;
  int have_before;
};

struct nt_opts {
  const char *plugin;
  int abi;
  int dev;
  /* --devs: run the per-connection flow on each listed device at once, one thread each (main.c).
   * ndevs == 0: one device (--dev). In a device's run, dev is its device and dev_pos its
   * position in the list (its side channel is the given port + dev_pos). */
  int devs[NT_MAX_RUNS];
  int ndevs;
  int parallel; /* --parallel N: N runs of --dev at once (ndevs = N, every entry dev), as NCCL's
                 * channels drive many connections of one device through one plugin instance */
  int dev_pos;
  enum nt_role role;
  enum nt_mode mode;
  const char *oob_addr;
  int timeout_s;
  uint64_t seed;
  size_t min_size, max_size;
  int max_size_set;
  size_t sizes[NT_MAX_SIZES];
  int nsizes;
  uint64_t count, bytes;
  int count_set, bytes_set;
  int window, multi;
  uint64_t iters, warmup;
  int iters_set, warmup_set;
  double seconds;
  int verify;      /* bw/lat: sampled verification on (default) or off */
  int full_canary; /* verify: check the whole canary area after every message */
  size_t mem_limit;
  const char *stats_file;
  struct nt_counter counters[NT_MAX_COUNTERS];
  int ncounters;
  /* lifecycle.c */
  int traffic_class; /* --traffic-class: per-communicator traffic class, -1 = unset */
  int fork_ms;       /* --fork-every-ms: fork children this often while the mode runs */
  int abort_sender;  /* --abort-side: abort-mid-transfer aborts the sender (else the receiver) */
  int profiler;      /* --profiler (net.c) */
  /* scale.c, modes.c */
  int comms;              /* --comms: connections per direction in the scale modes */
  int prepost;            /* --prepost: lat keeps --window receives posted ahead, the next one before each send */
  int rounds;             /* --rounds: scale modes repeat the whole cycle (leak check across rounds) */
  int report_every;       /* --report-every: scale modes print the per-round lines every K rounds */
  int rdma_res;           /* --rdma-res: scale modes count this process's QPs and MRs (rdma res) per report */
  const char *round_gate; /* --round-gate: scale modes wait for this file before each later round */
};

/* ---- net.c: the plugin behind one version-independent interface ---- */
struct nt_props {
  char name[128];
  char pci_path[256];
  uint64_t guid;
  int ptr_support, reg_is_global, force_flush, speed, port;
  float latency;
  int max_comms, max_recvs;
  int vndevs, vdevs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
  size_t max_p2p_bytes, max_coll_bytes;
  int max_multi_request_size;
  int has_rail_plane, rail_id, plane_id; /* v12 */
};

#define NT_ABI_MIN 8
#define NT_ABI_MAX 12
#define NT_ABI_DEFAULT 11 /* what NCCL 2.28..2.29 load */

struct nt_net {
  int abi;
  const char *name;
  union {
    const ncclNet_v8_t *v8;
    const ncclNet_v9_t *v9;
    const ncclNet_v10_t *v10;
    const ncclNet_v11_t *v11;
    const ncclNet_v12_t *v12;
  } t;
  void *ctx;         /* v11+ per-communicator context */
  int traffic_class; /* ncclNetCommConfig_t.trafficClass for init (v11+) / connect (v10); -1 = undefined */
  int profiler;      /* --profiler: pass init a checking profiler callback (v10+) */
};

void nt_log_setup(void);
void nt_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int nt_net_load(struct nt_net *n, const char *path, int abi, char *err, size_t errlen);
ncclResult_t nt_net_init(struct nt_net *n, uint64_t comm_id);
ncclResult_t nt_net_devices(struct nt_net *n, int *ndev);
ncclResult_t nt_net_props(struct nt_net *n, int dev, struct nt_props *p);
void nt_props_format(const struct nt_props *p, char *buf, size_t len);
ncclResult_t nt_net_listen(struct nt_net *n, int dev, void *handle, void **lcomm);
ncclResult_t nt_net_connect(struct nt_net *n, int dev, void *handle, void **scomm);
ncclResult_t nt_net_accept(struct nt_net *n, void *lcomm, void **rcomm);
ncclResult_t nt_net_regmr(struct nt_net *n, void *comm, void *data, size_t size, void **mh);
ncclResult_t nt_net_deregmr(struct nt_net *n, void *comm, void *mh);
ncclResult_t nt_net_isend(struct nt_net *n, void *scomm, void *data, size_t size, int tag, void *mh, void **req);
ncclResult_t nt_net_irecv(struct nt_net *n, void *rcomm, int cnt, void **data, size_t *sizes, int *tags, void **mhs,
                          void **req);
int nt_net_has_iflush(const struct nt_net *n);
ncclResult_t nt_net_iflush(struct nt_net *n, void *rcomm, int cnt, void **data, int *sizes, void **mhs, void **req);
ncclResult_t nt_net_test(struct nt_net *n, void *req, int *done, int *sizes);
ncclResult_t nt_net_close_send(struct nt_net *n, void *c);
ncclResult_t nt_net_close_recv(struct nt_net *n, void *c);
ncclResult_t nt_net_close_listen(struct nt_net *n, void *c);
ncclResult_t nt_net_finalize(struct nt_net *n);

/* ---- oob.c: framed messages over one TCP socket ---- */
enum nt_msg {
  NT_MSG_HELLO = 1,  /* text: parameters that both sides must agree on */
  NT_MSG_HANDLE = 2, /* NCCL_NET_HANDLE_MAXSIZE bytes */
  NT_MSG_SYNC = 3,   /* text label: barrier */
  NT_MSG_STOP = 4,   /* u64 (big-endian): number of groups the receiver posted */
  NT_MSG_RESULT = 5, /* text: key=value results */
  NT_MSG_ABORT = 6,  /* text: why the peer gave up */
};

struct nt_oob {
  int fd;
  char peer_ip[64];
  int aborted; /* the peer sent ABORT or closed the socket */
};

int nt_oob_server(struct nt_oob *o, const char *addr, int timeout_s);
int nt_oob_client(struct nt_oob *o, const char *addr, int timeout_s);
int nt_oob_send(struct nt_oob *o, uint32_t type, const void *buf, uint32_t len);
int nt_oob_recv(struct nt_oob *o, uint32_t type, void *buf, uint32_t cap, uint32_t *len, int timeout_s);
int nt_oob_peek(struct nt_oob *o);
int nt_oob_sync(struct nt_oob *o, const char *label, int timeout_s);
void nt_oob_abort(struct nt_oob *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nt_oob_close(struct nt_oob *o);
int nt_parse_hostport(const char *addr, char *host, size_t hostlen, char *port, size_t portlen);

/* ---- main.c: shared helpers ---- */
/* The driver's own threads (main, watchdog) before it loads the plugin: what a thread count
 * minus this is, the plugin added. */
extern int nt_threads_driver;
int nt_thread_count(void);
double nt_now(void);
/* The watchdog's heartbeat and phase are per run: with --devs each device's thread has its
 * own (a hung plugin call on one device is not hidden by another device's progress). */
void nt_heartbeat(void);
void nt_phase(const char *phase);
/* Result line (stdout and --stats-file), one whole line at a time; in a --devs run the line
 * ends with " dev=N" (the calling thread's device). */
void nt_out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "mpib-nettest: ..." on stderr; in a --devs run "mpib-nettest: [dev=N] ...". */
void nt_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *nt_role_name(enum nt_role r);
const char *nt_mode_name(enum nt_mode m);

/* ---- xfer.c: schedules, payload patterns and the windowed engine ---- */
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
uint64_t nt_mix64(uint64_t x);

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
double nt_wall_ms(void); /* CLOCK_REALTIME in milliseconds (comparable with `date +%s%3N`) */

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

/* ---- modes.c, badinput.c ---- */
struct nt_conn {
  void *lcomm, *scomm, *rcomm;
  uint8_t local_handle[NCCL_NET_HANDLE_MAXSIZE];
  uint8_t peer_handle[NCCL_NET_HANDLE_MAXSIZE];
};
int nt_setup_give_up(const struct nt_opts *o, struct nt_oob *oob, const struct nt_conn *c, double deadline, int *spins);

int nt_mode_verify(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_bw(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_lat(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_badhandle(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_garbage(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);

void *nt_alloc_region(size_t len);
void nt_free_region(void *p, size_t len);

/* ---- lifecycle.c: lifecycle modes (docs/nettest.md) ---- */
extern int nt_finalized; /* a mode already called finalize: main must not call it again */
int nt_lifecycle_parse_mode(const char *name, enum nt_mode *m);
const char *nt_lifecycle_mode_name(enum nt_mode m);
int nt_mode_is_lifecycle(enum nt_mode m);
int nt_mode_lifecycle(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
/* connect/accept like main's loop; accept errors counted in *accept_errors (NULL: fatal). */
int nt_lc_establish(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c, int *accept_errors);
int nt_mode_flood(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_forged(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
/* hostile.c: a handle's listener address; one TCP client of it (-1 when it did not connect in
 * 200 ms). */
struct sockaddr_in;
void nt_handle_addr(const uint8_t *handle, struct sockaddr_in *sa);
int nt_flood_connect(const struct sockaddr_in *sa);
/* silent.c: silent-hold, evict-race */
int nt_mode_silent_hold(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_evict_race(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
void nt_forker_start(const struct nt_opts *o);
void nt_forker_stop(const struct nt_opts *o);

/* ---- scale.c: many connections (connect, resources) ---- */
#define NT_MAX_COMMS 4096

/* MPIB's hello on its control socket (plugin/internal/wire/hello.go, version 5): "MPIL",
 * version u16, zeros, the listener's nonce (handle bytes 16..23) at 8, flags (bit 0: the
 * connector's MPIB_SUP_RELAY, which must equal the handle's byte 41 bit 0) at 16, the SUP pair
 * kind at 17 (0: none), zeros to the end (the pair count at 19 and the pairs). The hostile
 * modes send it as a peer would. */
#define NT_MPIB_HELLO_SIZE 64
int nt_scale_parse_mode(const char *name, enum nt_mode *m);
const char *nt_scale_mode_name(enum nt_mode m);
int nt_mode_is_scale(enum nt_mode m);
int nt_mode_scale(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob);

/* ---- sniff.c: RoCE v2 TOS sniffer (--mode sniff, no plugin) ---- */
int nt_sniff_wanted(int argc, char **argv);
int nt_sniff_main(int argc, char **argv);

#endif
