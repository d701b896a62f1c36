/*
 * mpib-nettest: an NCCL-like driver for a net plugin (ncclNet_v8..v12), loaded with dlopen
 * exactly as NCCL's proxy does. Two processes (server, client) exchange NCCL handles over an
 * out-of-band TCP socket the driver owns, then drive isend/irecv/test/iflush like NCCL.
 *
 * This header holds the options and their limits. The files are layered, lowest first; a file
 * uses only its own functions and those of lower layers, so the files of one layer never use
 * each other (plugin/nettest/layers checks this; docs/nettest.md, "Sources"):
 *   1. util.c (nt_util.h): time, output lines, the watchdog, parsing, mode names, buffers, forks.
 *   2. net.c (nt_net.h): dlopen, ABI adapters, logger, profiler check;
 *      oob.c (nt_oob.h): the TCP side channel.
 *   3. conn.c (nt_conn.h): connection setup and teardown, MPIB's handle as a TCP peer sees it;
 *      xfer.c (nt_xfer.h): schedules, payload patterns, the windowed transfer engine.
 *   4. data.c (nt_data.h): buffers, results and the verified transfer the modes share.
 *   5. the modes (nt_modes.h): modes.c (verify, bw, lat), badinput.c, lifecycle.c, hostile.c,
 *      silent.c, scale.c, sniff.c.
 *   6. main.c: options, plugin init, dispatch, the --devs and --parallel threads.
 */
#ifndef MPIB_NETTEST_H
#define MPIB_NETTEST_H

#include <stddef.h>
#include <stdint.h>

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
#define NT_MAX_COMMS 4096                 /* --comms: connections per direction in the scale modes */

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
  int verify;         /* bw/lat: sampled verification on (default) or off */
  int full_canary;    /* verify: check the whole canary area after every message */
  int mr_cache_check; /* verify: register the buffer again and a range inside it first (nettest-mr) */
  size_t mem_limit;
  const char *stats_file;
  struct nt_counter counters[NT_MAX_COUNTERS];
  int ncounters;
  /* lifecycle.c */
  int traffic_class; /* --traffic-class: per-communicator traffic class, -1 = unset */
  int fork_ms;       /* --fork-every-ms: fork children this often while the mode runs */
  int fork_calls;    /* --fork-calls-plugin: every third child calls the plugin, which must refuse */
  int abort_sender;  /* --abort-side: abort-mid-transfer aborts the sender (else the receiver) */
  int profiler;      /* --profiler (net.c) */
  /* scale.c, modes.c */
  int comms;              /* --comms: connections per direction in the scale modes */
  int prepost;            /* --prepost: lat keeps --window receives posted ahead, the next one before each send */
  int rounds;             /* --rounds: scale modes repeat the whole cycle (leak check across rounds) */
  int report_every;       /* --report-every: scale modes print the per-round lines every K rounds */
  int rdma_res;           /* --rdma-res: scale modes count this process's QPs and MRs (rdma res) per report */
  int call_stats;         /* --call-stats: scale modes sample the calling thread's rusage around each call */
  const char *round_gate; /* --round-gate: scale modes wait for this file before each later round */
};

#endif
