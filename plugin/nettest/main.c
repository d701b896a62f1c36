/*
 * mpib-nettest main, the top layer (nettest.h): options, plugin init, side channel, the
 * interleaved connect/accept, dispatch to the mode, and teardown in NCCL's order (deregMr,
 * closeSend/closeRecv, closeListen, finalize); --devs and --parallel run it in threads.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nettest.h"
#include "nt_conn.h"
#include "nt_modes.h"
#include "nt_net.h"
#include "nt_oob.h"
#include "nt_util.h"
#include "nt_xfer.h"

/* rxe and real HCAs pin registered memory: use whatever locked-memory allowance we have. */
static void nt_raise_memlock(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_MEMLOCK, &rl);
  }
}

static void nt_usage(FILE *f) {
  fprintf(f, "usage: mpib-nettest --role server --oob-listen IP:PORT [options]\n"
             "       mpib-nettest --role client --oob-connect HOST:PORT [options]\n"
             "\n"
             "Loads an NCCL net plugin with dlopen as NCCL's proxy does and drives it between two\n"
             "processes. The client sends, the server receives (lat: ping-pong).\n"
             "\n"
             "  --plugin PATH         plugin to dlopen (default libnccl-net-mpib.so)\n"
             "  --abi N               ncclNetPlugin_vN to use: 7..12 (default 11)\n"
             "  --profiler            v10+: pass a profiler callback that checks the plugin's events\n"
             "  --dev N               plugin device (default 0)\n"
             "  --parallel N          N connection pairs of --dev at once, one thread each, side channels\n"
             "                        at port .. port+N-1, seeds seed .. seed+N-1 (1..64; verify, bw, lat)\n"
             "  --devs LIST           run on several devices at once, one thread each, e.g. 0,1 (not with\n"
             "                        --dev): device at list position i uses the side-channel port + i\n"
             "                        (give both sides the same LIST); lines end with dev=N; exit is\n"
             "                        the worst of the runs; position i uses --seed + i; modes verify,\n"
             "                        bw, lat, badhandle, garbage-peer\n"
             "  --mode M              verify (default), bw, lat, badhandle, garbage-peer\n"
             "  --timeout-s N         connection setup and no-progress limit (default 60)\n"
             "  --seed N              schedule and payload seed (default 1)\n"
             "  --count N             verify: messages (default 200 unless --bytes)\n"
             "  --bytes SIZE          verify: send messages until this many payload bytes\n"
             "  --max-size SIZE       verify: largest random size, posted receive size (default 64M);\n"
             "                        bw: top of the power-of-two sweep (default 64M)\n"
             "  --min-size SIZE       bw: bottom of the power-of-two sweep (default 64K)\n"
             "  --sizes A,B,...       bw/lat: explicit sizes (lat default 8)\n"
             "  --window N            outstanding requests per connection, 1..8 (default 8)\n"
             "  --multi K             messages per irecv (multi-recv), 1..8 (default 1)\n"
             "  --iters N             bw: iterations per size (default 20); lat: (default 1000)\n"
             "  --seconds S           bw: run each size for S seconds instead of --iters\n"
             "  --warmup N            bw: (default 4), lat: (default 100) untimed iterations\n"
             "  --verify on|off       bw/lat: sampled payload checks (default on)\n"
             "  --full-canary         verify: check the whole buffer tail after every message\n"
             "  --mr-cache-check      verify: register the buffer again, and a range inside it, and\n"
             "                        deregister both before the transfer (nettest-mr line)\n"
             "  --mem-limit SIZE      buffer memory per side; lowers the window (default 1G)\n"
             "  --stats-file PATH     also write the result lines to PATH\n"
             "  --counter NAME=PATH   print a counter file's delta over the run (repeatable)\n"
             "  --traffic-class N     per-communicator traffic class passed to the plugin (0..255)\n"
             "  --fork-every-ms N     fork children (_exit / execv /bin/true) every N ms after connect\n"
             "  --fork-calls-plugin   with --fork-every-ms: every third child calls the plugin (init, listen,\n"
             "                        the closes of the parent's comms), each of which must fail within 10 s\n"
             "  --abort-side S        abort-mid-transfer: sender or receiver (default) aborts\n"
             "  --comms N             connect, resources: connections per direction (default 8)\n"
             "  --rounds R            connect, resources: repeat the whole cycle R times (default 1)\n"
             "  --report-every K      connect, resources: print the per-round lines every K rounds\n"
             "  --rdma-res            connect, resources: count this process's QPs/MRs (rdma res) per report\n"
             "  --call-stats          connect, resources: the calling thread's CPU and context switches in each\n"
             "                        connect/accept call (two syscalls more per call)\n"
             "  --round-gate F        connect, resources: before each round after the first, create F.ready\n"
             "                        and wait until F exists (a test changes the node meanwhile)\n"
             "  --prepost             lat: keep --window receives posted, the next before each send\n"
             "  --gap-ms N            verify: print each gap of N ms or more between completions\n"
             "  --stop-file PATH      verify: the receiver stops posting once PATH exists\n"
             "  --ignore-peer-abort   verify: only the plugin or the stall limit ends the data loop\n"
             "  --idle-us N           verify, bw: sleep N us after a data-loop turn that moved nothing\n"
             "lifecycle modes: finalize-during-handshake, abort-mid-transfer, stray-client;\n"
             "hostile modes (MPIB's handle layout): listener-flood, forged-handle (hostile.c);\n"
             "  silent-hold [--seconds S], evict-race [--rounds R] (silent.c);\n"
             "scale modes: connect, resources (--comms N);\n"
             "  --mode sniff --iface IF [--seconds S] [--max-packets N]: RoCE v2 TOS histogram\n"
             "  --help\n"
             "\n"
             "SIZE accepts K, M, G suffixes (powers of 1024). NCCL_DEBUG=WARN|INFO|TRACE sets the\n"
             "plugin log level (default WARN). Exit: 0 pass, 1 test failure, 2 usage or setup\n"
             "error, 3 plugin init failure (nettest-init line).\n");
}

/* --devs: comma-separated device indexes, no empty entry, no duplicate. */
static int nt_parse_devs(const char *s, struct nt_opts *o, char *why, size_t whylen) {
  o->ndevs = 0;
  snprintf(why, whylen, "want a comma-separated list of device indexes, e.g. 0,1");
  if (*s == '\0') {
    return -1;
  }
  for (const char *p = s;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char tok[16];
    int d;
    if (len == 0 || len >= sizeof(tok)) {
      return -1;
    }
    memcpy(tok, p, len);
    tok[len] = '\0';
    if (nt_parse_int(tok, 0, 1024, &d) != 0) {
      return -1;
    }
    for (int i = 0; i < o->ndevs; i++) {
      if (o->devs[i] == d) {
        snprintf(why, whylen, "device %d is listed twice", d);
        return -1;
      }
    }
    if (o->ndevs == NT_MAX_DEVS) {
      snprintf(why, whylen, "at most %d devices", NT_MAX_DEVS);
      return -1;
    }
    o->devs[o->ndevs++] = d;
    if (comma == NULL) {
      return 0;
    }
    p = comma + 1;
  }
}

static int nt_parse_sizes(const char *s, struct nt_opts *o) {
  char buf[1024];
  snprintf(buf, sizeof(buf), "%s", s);
  o->nsizes = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    uint64_t v;
    if (o->nsizes == NT_MAX_SIZES || nt_parse_size(tok, &v) != 0 || v > NT_MAX_MSG_SIZE) {
      return -1;
    }
    o->sizes[o->nsizes++] = (size_t)v;
  }
  return o->nsizes > 0 ? 0 : -1;
}

#define NT_BAD(...)                                           \
  do {                                                        \
    nt_err(__VA_ARGS__);                                      \
    fprintf(stderr, "run 'mpib-nettest --help' for usage\n"); \
    return -1;                                                \
  } while (0)

enum {
  OPT_ROLE = 256,
  OPT_LISTEN,
  OPT_CONNECT,
  OPT_PLUGIN,
  OPT_ABI,
  OPT_DEV,
  OPT_MODE,
  OPT_TIMEOUT,
  OPT_SEED,
  OPT_COUNT,
  OPT_BYTES,
  OPT_MAX,
  OPT_MIN,
  OPT_SIZES,
  OPT_WINDOW,
  OPT_MULTI,
  OPT_ITERS,
  OPT_SECONDS,
  OPT_WARMUP,
  OPT_VERIFY,
  OPT_FULLCAN,
  OPT_MRCACHE,
  OPT_MEM,
  OPT_STATS,
  OPT_COUNTER,
  OPT_HELP,
  OPT_PROFILER,
  OPT_TCLASS,
  OPT_FORKMS,
  OPT_FORKCALLS,
  OPT_ABORTSIDE, /* lifecycle.c */
  OPT_COMMS,
  OPT_PREPOST,
  OPT_ROUNDS, /* scale.c, lat */
  OPT_GAPMS,
  OPT_STOPFILE,
  OPT_IGNPEER,
  OPT_IDLEUS, /* fault watch (xfer.c) */
  OPT_REPORTEVERY,
  OPT_RDMARES,
  OPT_CALLSTATS,
  OPT_ROUNDGATE, /* scale.c leak checks, address changes */
  OPT_DEVS,      /* several devices in one process */
  OPT_PARALLEL   /* several connections of one device */
};

static const struct option nt_long_opts[] = {{"role", required_argument, 0, OPT_ROLE},
                                             {"oob-listen", required_argument, 0, OPT_LISTEN},
                                             {"oob-connect", required_argument, 0, OPT_CONNECT},
                                             {"plugin", required_argument, 0, OPT_PLUGIN},
                                             {"abi", required_argument, 0, OPT_ABI},
                                             {"dev", required_argument, 0, OPT_DEV},
                                             {"mode", required_argument, 0, OPT_MODE},
                                             {"timeout-s", required_argument, 0, OPT_TIMEOUT},
                                             {"seed", required_argument, 0, OPT_SEED},
                                             {"count", required_argument, 0, OPT_COUNT},
                                             {"bytes", required_argument, 0, OPT_BYTES},
                                             {"max-size", required_argument, 0, OPT_MAX},
                                             {"min-size", required_argument, 0, OPT_MIN},
                                             {"sizes", required_argument, 0, OPT_SIZES},
                                             {"window", required_argument, 0, OPT_WINDOW},
                                             {"multi", required_argument, 0, OPT_MULTI},
                                             {"iters", required_argument, 0, OPT_ITERS},
                                             {"seconds", required_argument, 0, OPT_SECONDS},
                                             {"warmup", required_argument, 0, OPT_WARMUP},
                                             {"verify", required_argument, 0, OPT_VERIFY},
                                             {"full-canary", no_argument, 0, OPT_FULLCAN},
                                             {"mr-cache-check", no_argument, 0, OPT_MRCACHE},
                                             {"mem-limit", required_argument, 0, OPT_MEM},
                                             {"stats-file", required_argument, 0, OPT_STATS},
                                             {"counter", required_argument, 0, OPT_COUNTER},
                                             {"help", no_argument, 0, OPT_HELP},
                                             {"profiler", no_argument, 0, OPT_PROFILER},
                                             {"traffic-class", required_argument, 0, OPT_TCLASS},
                                             {"fork-every-ms", required_argument, 0, OPT_FORKMS},
                                             {"fork-calls-plugin", no_argument, 0, OPT_FORKCALLS},
                                             {"abort-side", required_argument, 0, OPT_ABORTSIDE},
                                             {"comms", required_argument, 0, OPT_COMMS},
                                             {"prepost", no_argument, 0, OPT_PREPOST},
                                             {"rounds", required_argument, 0, OPT_ROUNDS},
                                             {"gap-ms", required_argument, 0, OPT_GAPMS},
                                             {"stop-file", required_argument, 0, OPT_STOPFILE},
                                             {"ignore-peer-abort", no_argument, 0, OPT_IGNPEER},
                                             {"report-every", required_argument, 0, OPT_REPORTEVERY},
                                             {"round-gate", required_argument, 0, OPT_ROUNDGATE},
                                             {"idle-us", required_argument, 0, OPT_IDLEUS},
                                             {"rdma-res", no_argument, 0, OPT_RDMARES},
                                             {"call-stats", no_argument, 0, OPT_CALLSTATS},
                                             {"devs", required_argument, 0, OPT_DEVS},
                                             {"parallel", required_argument, 0, OPT_PARALLEL},
                                             {0, 0, 0, 0}};

/* Returns 0, -1 on a usage error, 1 when --help was printed. */
static int nt_parse_opts(int argc, char **argv, struct nt_opts *o) {
  memset(o, 0, sizeof(*o));
  o->plugin = "libnccl-net-mpib.so";
  o->abi = NT_ABI_DEFAULT;
  o->role = -1;
  o->mode = NT_VERIFY;
  o->timeout_s = 60;
  o->seed = 1;
  o->window = 8;
  o->multi = 1;
  o->verify = 1;
  o->mem_limit = (size_t)1 << 30;
  o->min_size = 65536;
  o->max_size = (size_t)64 << 20;
  o->traffic_class = -1;
  const char *listen = NULL, *connect = NULL;
  uint64_t v;
  int c, dev_set = 0;
  char why[128];
  opterr = 0;
  while ((c = getopt_long(argc, argv, "", nt_long_opts, NULL)) != -1) {
    const char *a = optarg;
    switch (c) {
    case OPT_ROLE:
      if (strcmp(a, "server") == 0) {
        o->role = NT_SERVER;
      } else if (strcmp(a, "client") == 0) {
        o->role = NT_CLIENT;
      } else {
        NT_BAD("--role must be server or client, not '%s'", a);
      }
      break;
    case OPT_LISTEN: listen = a; break;
    case OPT_CONNECT: connect = a; break;
    case OPT_PLUGIN: o->plugin = a; break;
    case OPT_ABI:
      if (nt_parse_int(a, NT_ABI_MIN, NT_ABI_MAX, &o->abi) != 0) {
        NT_BAD("--abi must be %d..%d, not '%s'", NT_ABI_MIN, NT_ABI_MAX, a);
      }
      break;
    case OPT_DEV:
      if (nt_parse_int(a, 0, 1024, &o->dev) != 0) {
        NT_BAD("bad --dev '%s'", a);
      }
      dev_set = 1;
      break;
    case OPT_DEVS:
      if (nt_parse_devs(a, o, why, sizeof(why)) != 0) {
        NT_BAD("bad --devs '%s' (%s)", a, why);
      }
      break;
    case OPT_MODE:
      if (nt_mode_parse(a, &o->mode) != 0) {
        NT_BAD("unknown --mode '%s' (%s)", a, nt_mode_list());
      }
      break;
    case OPT_TIMEOUT:
      if (nt_parse_int(a, 1, 86400, &o->timeout_s) != 0) {
        NT_BAD("--timeout-s must be 1..86400, not '%s'", a);
      }
      break;
    case OPT_SEED:
      if (nt_parse_u64(a, &o->seed) != 0) {
        NT_BAD("bad --seed '%s'", a);
      }
      break;
    case OPT_COUNT:
      if (nt_parse_u64(a, &o->count) != 0) {
        NT_BAD("bad --count '%s'", a);
      }
      o->count_set = 1;
      break;
    case OPT_BYTES:
      if (nt_parse_size(a, &o->bytes) != 0 || o->bytes == 0) {
        NT_BAD("bad --bytes '%s'", a);
      }
      o->bytes_set = 1;
      break;
    case OPT_MAX:
      if (nt_parse_size(a, &v) != 0 || v > NT_MAX_MSG_SIZE) {
        NT_BAD("bad --max-size '%s' (at most 1G)", a);
      }
      o->max_size = (size_t)v;
      o->max_size_set = 1;
      break;
    case OPT_MIN:
      if (nt_parse_size(a, &v) != 0 || v > NT_MAX_MSG_SIZE) {
        NT_BAD("bad --min-size '%s'", a);
      }
      o->min_size = (size_t)v;
      break;
    case OPT_SIZES:
      if (nt_parse_sizes(a, o) != 0) {
        NT_BAD("bad --sizes '%s' (comma-separated, each at most 1G, at most %d)", a, NT_MAX_SIZES);
      }
      break;
    case OPT_WINDOW:
      if (nt_parse_int(a, 1, NT_MAX_WINDOW, &o->window) != 0) {
        NT_BAD("--window must be 1..%d, not '%s'", NT_MAX_WINDOW, a);
      }
      break;
    case OPT_MULTI:
      if (nt_parse_int(a, 1, NT_MAX_MULTI, &o->multi) != 0) {
        NT_BAD("--multi must be 1..%d, not '%s'", NT_MAX_MULTI, a);
      }
      break;
    case OPT_ITERS:
      if (nt_parse_u64(a, &o->iters) != 0 || o->iters == 0 || o->iters > ((uint64_t)1 << 32)) {
        NT_BAD("bad --iters '%s'", a);
      }
      o->iters_set = 1;
      break;
    case OPT_SECONDS: {
      char *end;
      o->seconds = strtod(a, &end);
      if (*end != '\0' || !(o->seconds > 0) || o->seconds > 86400) {
        NT_BAD("bad --seconds '%s'", a);
      }
      break;
    }
    case OPT_WARMUP:
      if (nt_parse_u64(a, &o->warmup) != 0 || o->warmup > ((uint64_t)1 << 32)) {
        NT_BAD("bad --warmup '%s'", a);
      }
      o->warmup_set = 1;
      break;
    case OPT_VERIFY:
      if (strcmp(a, "on") == 0 || strcmp(a, "1") == 0) {
        o->verify = 1;
      } else if (strcmp(a, "off") == 0 || strcmp(a, "0") == 0) {
        o->verify = 0;
      } else {
        NT_BAD("--verify must be on or off, not '%s'", a);
      }
      break;
    case OPT_FULLCAN: o->full_canary = 1; break;
    case OPT_MRCACHE: o->mr_cache_check = 1; break;
    case OPT_MEM:
      if (nt_parse_size(a, &v) != 0 || v < 4096) {
        NT_BAD("bad --mem-limit '%s'", a);
      }
      o->mem_limit = (size_t)v;
      break;
    case OPT_STATS: o->stats_file = a; break;
    case OPT_COUNTER: {
      const char *eq = strchr(a, '=');
      if (eq == NULL || eq == a || eq[1] == '\0' || o->ncounters == NT_MAX_COUNTERS) {
        NT_BAD("bad --counter '%s' (NAME=PATH, at most %d)", a, NT_MAX_COUNTERS);
      }
      struct nt_counter *ct = &o->counters[o->ncounters++];
      ct->name = strndup(a, (size_t)(eq - a));
      ct->path = eq + 1;
      break;
    }
    case OPT_TCLASS:
      if (nt_parse_int(a, 0, 255, &o->traffic_class) != 0) {
        NT_BAD("--traffic-class must be 0..255, not '%s'", a);
      }
      break;
    case OPT_FORKMS:
      if (nt_parse_int(a, 1, 60000, &o->fork_ms) != 0) {
        NT_BAD("--fork-every-ms must be 1..60000, not '%s'", a);
      }
      break;
    case OPT_FORKCALLS: o->fork_calls = 1; break;
    case OPT_ABORTSIDE:
      if (strcmp(a, "sender") != 0 && strcmp(a, "receiver") != 0) {
        NT_BAD("--abort-side must be sender or receiver, not '%s'", a);
      }
      o->abort_sender = strcmp(a, "sender") == 0;
      break;
    case OPT_PARALLEL:
      if (nt_parse_int(a, 1, NT_MAX_RUNS, &o->parallel) != 0) {
        NT_BAD("--parallel must be 1..%d, not '%s'", NT_MAX_RUNS, a);
      }
      break;
    case OPT_COMMS:
      if (nt_parse_int(a, 1, NT_MAX_COMMS, &o->comms) != 0) {
        NT_BAD("--comms must be 1..%d, not '%s'", NT_MAX_COMMS, a);
      }
      break;
    case OPT_PREPOST: o->prepost = 1; break;
    case OPT_ROUNDS:
      if (nt_parse_int(a, 1, 10000, &o->rounds) != 0) {
        NT_BAD("--rounds must be 1..10000, not '%s'", a);
      }
      break;
    case OPT_GAPMS:
      if (nt_parse_int(a, 1, 3600000, &nt_watch.gap_ms) != 0) {
        NT_BAD("--gap-ms must be 1..3600000, not '%s'", a);
      }
      nt_watch.enabled = 1;
      break;
    case OPT_STOPFILE:
      if (a[0] == '\0') {
        NT_BAD("--stop-file needs a path");
      }
      nt_watch.stop_file = a;
      nt_watch.enabled = 1;
      break;
    case OPT_IGNPEER:
      nt_watch.ignore_peer = 1;
      nt_watch.enabled = 1;
      break;
    case OPT_IDLEUS:
      if (nt_parse_int(a, 1, 100000, &nt_watch.idle_us) != 0) {
        NT_BAD("--idle-us must be 1..100000, not '%s'", a);
      }
      break;
    case OPT_REPORTEVERY:
      if (nt_parse_int(a, 1, 10000, &o->report_every) != 0) {
        NT_BAD("--report-every must be 1..10000, not '%s'", a);
      }
      break;
    case OPT_RDMARES: o->rdma_res = 1; break;
    case OPT_CALLSTATS: o->call_stats = 1; break;
    case OPT_ROUNDGATE: o->round_gate = a; break;
    case OPT_HELP: nt_usage(stdout); return 1;
    case OPT_PROFILER: o->profiler = 1; break;
    default:
      if (optopt != 0 && optopt < 256) {
        NT_BAD("unknown option '-%c'", optopt);
      }
      NT_BAD("unknown option or missing argument: '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) {
    NT_BAD("unexpected argument '%s'", argv[optind]);
  }
  if ((int)o->role == -1) {
    NT_BAD("--role server|client is required");
  }
  if (o->role == NT_SERVER) {
    if (listen == NULL || connect != NULL) {
      NT_BAD("the server takes --oob-listen IP:PORT (and no --oob-connect)");
    }
    o->oob_addr = listen;
  } else {
    if (connect == NULL || listen != NULL) {
      NT_BAD("the client takes --oob-connect HOST:PORT (and no --oob-listen)");
    }
    o->oob_addr = connect;
  }
  char h[256], p[16];
  if (nt_parse_hostport(o->oob_addr, h, sizeof(h), p, sizeof(p)) != 0 || (o->role == NT_CLIENT && h[0] == '\0')) {
    NT_BAD("bad side-channel address '%s' (want IP:PORT)", o->oob_addr);
  }
  /* Mode defaults. */
  if (o->mode == NT_VERIFY && !o->count_set && !o->bytes_set) {
    o->count = 200;
  }
  if (o->mode == NT_BW && o->nsizes == 0) {
    if (o->min_size > o->max_size) {
      NT_BAD("--min-size %zu is above --max-size %zu", o->min_size, o->max_size);
    }
    size_t s = o->min_size;
    if (s == 0) {
      o->sizes[o->nsizes++] = 0;
      s = 1;
    }
    for (; s <= o->max_size && o->nsizes < NT_MAX_SIZES; s *= 2) {
      o->sizes[o->nsizes++] = s;
    }
  }
  if (o->mode == NT_LAT && o->nsizes == 0) {
    o->sizes[o->nsizes++] = 8;
  }
  if (!o->iters_set) {
    o->iters = o->mode == NT_LAT ? 1000 : 20;
  }
  if (!o->warmup_set) {
    o->warmup = o->mode == NT_LAT ? 100 : 4;
  }
  if (o->profiler && o->abi < 10) {
    NT_BAD("--profiler needs --abi 10 or newer (older ABIs pass no profiler)");
  }
  if (o->mode != NT_BW && o->mode != NT_SILENT_HOLD && o->seconds > 0) {
    NT_BAD("--seconds applies to bw and silent-hold only");
  }
  if (o->comms == 0) {
    o->comms = 8;
  } else if (!nt_mode_is_scale(o->mode)) {
    NT_BAD("--comms applies to the connect and resources modes only");
  }
  if (o->rounds == 0) {
    o->rounds = 1;
  } else if (!nt_mode_is_scale(o->mode) && o->mode != NT_EVICT_RACE) {
    NT_BAD("--rounds applies to the connect, resources and evict-race modes only");
  }
  if (nt_watch.enabled && o->mode != NT_VERIFY) {
    NT_BAD("--gap-ms, --stop-file and --ignore-peer-abort apply to verify only");
  }
  /* bw too: a 4 MiB message over a shaped lab link takes a second, and two spinning drivers
   * take the emulated CPUs that soft-RoCE moves the packets with. */
  if (nt_watch.idle_us > 0 && o->mode != NT_VERIFY && o->mode != NT_BW) {
    NT_BAD("--idle-us applies to verify and bw only");
  }
  if ((o->report_every || o->rdma_res || o->round_gate || o->call_stats) && !nt_mode_is_scale(o->mode)) {
    NT_BAD("--report-every, --rdma-res, --round-gate and --call-stats apply to the connect and resources modes only");
  }
  if (o->prepost && o->mode != NT_LAT) {
    NT_BAD("--prepost applies to lat only");
  }
  if (o->mode == NT_LAT && o->multi != 1) {
    NT_BAD("--multi applies to verify and bw only");
  }
  if (o->parallel > 0) { /* N runs of --dev, each its own connection pair and side channel */
    if (o->ndevs > 0) {
      NT_BAD("--parallel runs --dev N times: not with --devs");
    }
    for (int i = 0; i < o->parallel; i++) o->devs[i] = o->dev;
    o->ndevs = o->parallel;
    dev_set = 0;
  }
  if (o->ndevs > 0) {
    if (dev_set) {
      NT_BAD("--dev and --devs are mutually exclusive (--devs 0,1 runs devices 0 and 1 in one process)");
    }
    if (nt_mode_is_lifecycle(o->mode) || nt_mode_is_scale(o->mode)) {
      NT_BAD("--mode %s drives the whole plugin (finalize, many connections, the process's resources): "
             "not with --devs, which takes verify, bw, lat, badhandle or garbage-peer; run it with --dev",
             nt_mode_name(o->mode));
    }
    if (o->fork_ms > 0) {
      NT_BAD("--fork-every-ms forks for the whole process: not with --devs");
    }
  }
  if (o->fork_calls && o->fork_ms <= 0) {
    NT_BAD("--fork-calls-plugin says what some forked children do: it needs --fork-every-ms");
  }
  if (o->ndevs > 0) {
    long port = strtol(p, NULL, 10);
    if (port < 1 || port + o->ndevs - 1 > 65535) {
      NT_BAD("--devs: device i's side channel is port + i: '%s' leaves no room for %d ports", o->oob_addr, o->ndevs);
    }
  }
  return 0;
}

/* Parameters both sides must share, compared once over the side channel. */
static void nt_hello(const struct nt_opts *o, char *buf, size_t len) {
  int off = snprintf(buf, len,
                     "nettest-1 mode=%s seed=%" PRIu64 " multi=%d window=%d max=%zu count=%" PRIu64 " bytes=%" PRIu64
                     " iters=%" PRIu64 " warmup=%" PRIu64
                     " seconds=%g verify=%d mem=%zu comms=%d rounds=%d prepost=%d sizes=",
                     nt_mode_name(o->mode), o->seed, o->multi, o->window, o->max_size, o->count, o->bytes, o->iters,
                     o->warmup, o->seconds, o->verify, o->mem_limit, o->comms, o->rounds, o->prepost);
  for (int i = 0; i < o->nsizes && off < (int)len - 24; i++) {
    off += snprintf(buf + off, len - (size_t)off, "%s%zu", i ? "," : "", o->sizes[i]);
  }
  if (o->ndevs > 0 && off < (int)len - 16) { /* --devs: both sides list the same devices */
    off += snprintf(buf + off, len - (size_t)off, " dev=%d devs=", o->dev);
    for (int i = 0; i < o->ndevs && off < (int)len - 8; i++) {
      off += snprintf(buf + off, len - (size_t)off, "%s%d", i ? "," : "", o->devs[i]);
    }
  }
}

static int nt_read_counter(const char *path, uint64_t *v) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    nt_err("counter %s: %s", path, strerror(errno));
    return -1;
  }
  unsigned long long x;
  int ok = fscanf(f, "%llu", &x) == 1;
  fclose(f);
  if (!ok) {
    nt_err("counter %s: not a number", path);
    return -1;
  }
  *v = x;
  return 0;
}

static void nt_counters(struct nt_opts *o, int after) {
  for (int i = 0; i < o->ncounters; i++) {
    struct nt_counter *c = &o->counters[i];
    uint64_t v;
    if (nt_read_counter(c->path, &v) != 0) {
      continue;
    }
    if (!after) {
      c->before = v;
      c->have_before = 1;
    } else if (c->have_before) {
      nt_out("nettest-counter: role=%s name=%s before=%" PRIu64 " after=%" PRIu64 " delta=%" PRIu64,
             nt_role_name(o->role), c->name, c->before, v, v - c->before);
    }
  }
}

/* The lifecycle and hostile modes make their own connections from the listen comm and the
 * handles swapped. */
static int nt_run_lifecycle(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c) {
  nt_phase(nt_mode_name(o->mode));
  switch (o->mode) {
  case NT_FINALIZE_HS: return nt_mode_finalize_hs(o, n, oob, c);
  case NT_ABORT: return nt_mode_abort(o, n, oob, c);
  case NT_FLOOD: return nt_mode_flood(o, n, oob, c);
  case NT_FORGED: return nt_mode_forged(o, n, oob, c);
  case NT_SILENT_HOLD: return nt_mode_silent_hold(o, n, oob, c);
  case NT_EVICT_RACE: return nt_mode_evict_race(o, n, oob, c);
  default: return nt_mode_stray(o, n, oob, c);
  }
}

/* --fork-calls-plugin: a child forked while the plugin works calls it as NCCL in that child
 * would (its own init and listen, the closes of the parent's comms). A plugin cannot serve a
 * process forked after it loaded, so each call must fail, not hang (alarm: 10 s) nor touch the
 * parent's comms, whose transfer goes on. Exits 0 when every call failed, else 3. */
struct nt_fork_calls {
  const struct nt_net *n;
  const struct nt_conn *c;
  int dev;
};

static int nt_fork_child_calls(void *arg) {
  const struct nt_fork_calls *fc = arg;
  struct nt_net n = *fc->n;
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
  void *lcomm = NULL;
  int succeeded = 0;
  alarm(10);
  succeeded += nt_net_init(&n, 1) == ncclSuccess;
  succeeded += nt_net_listen(&n, fc->dev, handle, &lcomm) == ncclSuccess;
  if (fc->c->scomm != NULL) succeeded += nt_net_close_send(&n, fc->c->scomm) == ncclSuccess;
  if (fc->c->rcomm != NULL) succeeded += nt_net_close_recv(&n, fc->c->rcomm) == ncclSuccess;
  if (fc->c->lcomm != NULL) succeeded += nt_net_close_listen(&n, fc->c->lcomm) == ncclSuccess;
  return succeeded == 0 ? 0 : 3;
}

static int nt_run(struct nt_opts *o, struct nt_net *n) {
  struct nt_oob oob;
  struct nt_conn conn;
  memset(&conn, 0, sizeof(conn));
  struct nt_fork_calls fork_calls = {.n = n, .c = &conn, .dev = o->dev};
  int ret = NT_EXIT_USAGE;
  nt_phase("side-channel");
  int rc = o->role == NT_SERVER ? nt_oob_server(&oob, o->oob_addr, o->timeout_s)
                                : nt_oob_client(&oob, o->oob_addr, o->timeout_s);
  if (rc != 0) {
    return NT_EXIT_USAGE;
  }
  char mine[1024], theirs[1024];
  uint32_t len = 0;
  nt_hello(o, mine, sizeof(mine));
  if (nt_oob_send(&oob, NT_MSG_HELLO, mine, (uint32_t)strlen(mine)) != 0 ||
      nt_oob_recv(&oob, NT_MSG_HELLO, theirs, sizeof(theirs) - 1, &len, o->timeout_s) != 0) {
    goto out;
  }
  theirs[len] = '\0';
  if (strcmp(mine, theirs) != 0) {
    nt_err("the two sides disagree on parameters:\n  here: %s\n  peer: %s", mine, theirs);
    goto out;
  }
  ret = NT_EXIT_FAIL;
  if (nt_mode_is_scale(o->mode)) {
    ret = nt_mode_scale(o, n, &oob); /* scale.c: its own listeners, no main connection */
    goto out;
  }
  nt_phase("listen");
  ncclResult_t nrc = nt_net_listen(n, o->dev, conn.local_handle, &conn.lcomm);
  if (nrc != ncclSuccess || conn.lcomm == NULL) {
    nt_err("listen(dev=%d) failed: rc=%d", o->dev, nrc);
    nt_oob_abort(&oob, "%s: listen failed rc=%d", nt_role_name(o->role), nrc);
    goto out;
  }
  if (nt_oob_send(&oob, NT_MSG_HANDLE, conn.local_handle, NCCL_NET_HANDLE_MAXSIZE) != 0 ||
      nt_oob_recv(&oob, NT_MSG_HANDLE, conn.peer_handle, NCCL_NET_HANDLE_MAXSIZE, &len, o->timeout_s) != 0) {
    goto out;
  }
  if (len != NCCL_NET_HANDLE_MAXSIZE) {
    nt_err("peer handle has %u bytes, expected %d", len, NCCL_NET_HANDLE_MAXSIZE);
    goto out;
  }
  if (o->mode == NT_BADHANDLE) {
    ret = nt_mode_badhandle(o, n, &oob, &conn);
    goto out;
  }
  if (o->mode == NT_GARBAGE) {
    ret = nt_mode_garbage(o, n, &oob, &conn);
    goto out;
  }
  if (nt_mode_is_lifecycle(o->mode)) {
    nt_forker_start(o, nt_fork_child_calls, &fork_calls);
    ret = nt_run_lifecycle(o, n, &oob, &conn);
    nt_forker_stop(o);
    goto out;
  }
  nt_phase(nt_mode_name(o->mode));
  if (nt_establish(o, n, &oob, &conn) != 0) {
    nt_oob_abort(&oob, "%s: connection setup failed", nt_role_name(o->role));
    goto out;
  }
  if (nt_oob_sync(&oob, "connected", o->timeout_s) != 0) {
    goto out;
  }
  nt_counters(o, 0);
  nt_forker_start(o, nt_fork_child_calls, &fork_calls);
  switch (o->mode) {
  case NT_VERIFY: ret = nt_mode_verify(o, n, &oob, &conn); break;
  case NT_BW: ret = nt_mode_bw(o, n, &oob, &conn); break;
  default: ret = nt_mode_lat(o, n, &oob, &conn); break;
  }
  nt_forker_stop(o);
  nt_counters(o, 1);
  /* Close only when both sides are done with the data path. */
  if (ret == NT_EXIT_OK && nt_oob_sync(&oob, "done", o->timeout_s) != 0) {
    ret = NT_EXIT_FAIL;
  }
out:
  nt_phase("teardown");
  if (nt_teardown(n, &conn) != 0 && ret == NT_EXIT_OK) {
    ret = NT_EXIT_FAIL;
  }
  nt_oob_close(&oob);
  return ret;
}

/* --devs: one device's run in its own thread, as one NCCL process drives several net devices
 * (one per GPU) through one plugin instance. */
struct nt_devrun {
  pthread_t thread;
  struct nt_opts o; /* a copy: dev, dev_pos and oob_addr are this run's */
  struct nt_net *net;
  char oob_addr[300];
  int slot;
  int started;
  int ret;
};

static void *nt_devrun_main(void *arg) {
  struct nt_devrun *r = arg;
  nt_run_thread_init(r->slot, r->o.dev);
  nt_wd_watch(1);
  r->ret = nt_run(&r->o, r->net);
  nt_phase("done");
  nt_wd_watch(0);
  return NULL;
}

/* Runs nt_run on every listed device at once; the exit code is the worst (highest) of theirs.
 * Device at list position i uses the side channel at the given port + i. */
static int nt_run_devs(const struct nt_opts *o, struct nt_net *n) {
  char host[256], port[16];
  if (nt_parse_hostport(o->oob_addr, host, sizeof(host), port, sizeof(port)) != 0) {
    nt_err("bad side-channel address '%s' (want IP:PORT)", o->oob_addr);
    return NT_EXIT_USAGE;
  }
  long port0 = strtol(port, NULL, 10);
  struct nt_devrun *runs = calloc((size_t)o->ndevs, sizeof(*runs));
  if (runs == NULL) {
    nt_err("out of memory for %d device runs", o->ndevs);
    return NT_EXIT_FAIL;
  }
  for (int i = 0; i < o->ndevs; i++) {
    struct nt_devrun *r = &runs[i];
    r->o = *o;
    r->o.dev = o->devs[i];
    r->o.dev_pos = i;
    r->o.seed = o->seed + (uint64_t)i; /* each device its own sizes and payloads: a message that
                                           reached another device's comm fails verification */
    snprintf(r->oob_addr, sizeof(r->oob_addr), strchr(host, ':') ? "[%s]:%ld" : "%s:%ld", host, port0 + i);
    r->o.oob_addr = r->oob_addr;
    r->net = n;
    r->slot = 1 + i;
    r->ret = NT_EXIT_FAIL;
  }
  nt_phase("devs");
  nt_wd_watch(0); /* the runs' slots are watched while the main thread waits */
  for (int i = 0; i < o->ndevs; i++) {
    int e = pthread_create(&runs[i].thread, NULL, nt_devrun_main, &runs[i]);
    if (e != 0) {
      nt_err("--devs: cannot start the thread of dev %d: %s", runs[i].o.dev, strerror(e));
      continue;
    }
    runs[i].started = 1;
  }
  for (int i = 0; i < o->ndevs; i++) {
    if (runs[i].started) {
      pthread_join(runs[i].thread, NULL);
    }
  }
  nt_wd_watch(1);
  int worst = NT_EXIT_OK;
  char devs[NT_MAX_RUNS * 6 + 1] = "", codes[NT_MAX_RUNS * 4 + 1] = "";
  size_t dl = 0, cl = 0;
  for (int i = 0; i < o->ndevs; i++) {
    worst = runs[i].ret > worst ? runs[i].ret : worst;
    dl += (size_t)snprintf(devs + dl, sizeof(devs) - dl, "%s%d", i ? "," : "", runs[i].o.dev);
    cl += (size_t)snprintf(codes + cl, sizeof(codes) - cl, "%s%d", i ? "," : "", runs[i].ret);
  }
  nt_out("nettest-devs: role=%s devs=%s exit=%s worst=%d", nt_role_name(o->role), devs, codes, worst);
  free(runs);
  return worst;
}

int main(int argc, char **argv) {
  struct nt_opts o;
  signal(SIGPIPE, SIG_IGN);
  nt_log_setup();
  if (nt_sniff_wanted(argc, argv)) {
    return nt_sniff_main(argc, argv); /* sniff.c: no plugin */
  }
  int p = nt_parse_opts(argc, argv, &o);
  if (p != 0) {
    return p > 0 ? NT_EXIT_OK : NT_EXIT_USAGE;
  }
  if (o.report_every > 0 && prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) {
    /* The leak series reads RSS every few rounds: with transparent huge pages the heap's
     * RSS moves in 2 MiB steps whenever a fresh 2 MiB range is touched, which says nothing
     * about what was allocated. Without them RSS follows the pages really used. */
    nt_err("prctl(PR_SET_THP_DISABLE): %s (RSS may move in 2 MiB steps)", strerror(errno));
  }
  nt_raise_memlock();
  nt_watchdog_start(o.timeout_s);
  if (o.stats_file != NULL && nt_out_open(o.stats_file) != 0) {
    nt_err("cannot open --stats-file %s: %s", o.stats_file, strerror(errno));
    return NT_EXIT_USAGE;
  }
  struct nt_net net;
  char err[1024];
  nt_threads_driver = nt_thread_count(); /* main and the watchdog: the plugin is not loaded yet */
  if (nt_net_load(&net, o.plugin, o.abi, err, sizeof(err)) != 0) {
    nt_err("cannot load the plugin: %s", err);
    return NT_EXIT_USAGE;
  }
  net.traffic_class = o.traffic_class; /* --traffic-class, -1 unless given */
  net.profiler = o.profiler;
  nt_err("loaded %s: ncclNetPlugin_v%d name=%s", o.plugin, o.abi, net.name);
  nt_phase("init");
  ncclResult_t rc = nt_net_init(&net, nt_mix64(o.seed));
  int ndev = 0;
  /* The devices the run uses: --dev's, or --devs' in list order. */
  int nrun = o.ndevs > 0 ? o.ndevs : 1;
  const int *run_devs = o.ndevs > 0 ? o.devs : &o.dev;
  struct nt_props props[NT_MAX_RUNS];
  memset(props, 0, sizeof(props));
  int bad_dev = -1; /* a device the plugin does not have */
  if (rc == ncclSuccess) {
    rc = nt_net_devices(&net, &ndev);
    for (int i = 0; rc == ncclSuccess && i < nrun; i++) {
      if (run_devs[i] >= ndev) {
        bad_dev = run_devs[i];
        break;
      }
      rc = nt_net_props(&net, run_devs[i], &props[i]);
    }
  }
  nt_out("nettest-init: rc=%d ndev=%d", (int)rc, ndev);
  if (rc != ncclSuccess || ndev <= 0 || bad_dev >= 0) {
    int code = NT_EXIT_INIT;
    if (rc == ncclSuccess && ndev <= 0) {
      nt_err("plugin init succeeded but reports no device");
    } else if (rc == ncclSuccess && o.ndevs > 0) {
      nt_err("--devs lists device %d but the plugin has %d device(s)", bad_dev, ndev);
      fprintf(stderr, "run 'mpib-nettest --help' for usage\n");
      code = NT_EXIT_USAGE;
    } else if (rc == ncclSuccess) {
      nt_err("--dev %d but the plugin has %d device(s)", o.dev, ndev);
    } else {
      nt_err("plugin init failed: rc=%d (the plugin logged why above; NCCL_DEBUG=INFO shows more)", rc);
    }
    nt_phase("finalize");
    nt_net_finalize(&net);
    return code;
  }
  char line[1024];
  for (int i = 0; i < nrun; i++) {
    if (i > 0 && run_devs[i] == run_devs[i - 1]) continue; /* --parallel: one line for the device */
    nt_props_format(&props[i], line, sizeof(line));
    nt_out("nettest-props: dev=%d %s", run_devs[i], line);
  }
  for (int d = 0; d < ndev; d++) { /* the other devices after the ones the run uses */
    struct nt_props other;
    memset(&other, 0, sizeof(other));
    int used = 0;
    for (int i = 0; i < nrun; i++) {
      used |= run_devs[i] == d;
    }
    if (used) continue;
    if (nt_net_props(&net, d, &other) != ncclSuccess) {
      nt_err("getProperties(%d) failed with %d devices", d, ndev);
      continue;
    }
    nt_props_format(&other, line, sizeof(line));
    nt_out("nettest-props: dev=%d %s", d, line);
  }
  int ret = NT_EXIT_OK;
  for (int i = 0; i < nrun && ret == NT_EXIT_OK; i++) {
    char of[32] = ""; /* --devs: which device */
    if (o.ndevs > 0) {
      snprintf(of, sizeof(of), " (dev %d)", run_devs[i]);
    }
    if (props[i].max_recvs > 0 && o.multi > props[i].max_recvs) {
      nt_err("--multi %d exceeds the plugin's maxRecvs %d%s", o.multi, props[i].max_recvs, of);
      ret = NT_EXIT_USAGE;
    } else if ((props[i].ptr_support & NCCL_PTR_HOST) == 0) {
      nt_err("the plugin does not support host memory (ptrSupport=0x%x)%s", (unsigned)props[i].ptr_support, of);
      ret = NT_EXIT_FAIL;
    }
  }
  if (ret == NT_EXIT_OK) {
    ret = o.ndevs > 0 ? nt_run_devs(&o, &net) : nt_run(&o, &net);
  }
  nt_phase("finalize");
  rc = net.finalized ? ncclSuccess : nt_net_finalize(&net); /* a lifecycle mode may have finalized */
  if (rc != ncclSuccess) {
    nt_err("finalize failed: rc=%d", rc);
    if (ret == NT_EXIT_OK) {
      ret = NT_EXIT_FAIL;
    }
  }
  nt_out_close();
  for (int i = 0; i < o.ncounters; i++) {
    free((void *)o.counters[i].name);
  }
  return ret;
}
