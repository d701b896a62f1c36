//go:build ignore

// link: ../mpib_shm_*.c shm_agent.c shm_decode.c
/*
 * A local agent (same user, docs/shm-format.md 5.4, 5.7) that stalls the plugin's control
 * plane. It holds one exclusive OFD lock over the whole slot area and leaves every owner word
 * 0, so every free-looking slot's lease attempt (fcntl F_OFD_SETLK) fails. The handle must
 *   - spend a bounded number of lease attempts per registration and per poll, whatever the
 *     number of slots and of connections waiting for one;
 *   - never make mpib_shm_release (NCCL's close path) wait for a search among foreign leases:
 *     a release returns while the poll is stopped inside one of those lease attempts;
 *   - bind every waiting connection within a few polls once the lock is gone.
 * And an agent whose peers_epoch changes before every read must cost a bounded number of
 * peer-table scans at one instant, while the latest table applies once time has passed.
 *
 * fcntl is interposed here (this program's definition binds the calls of mpib_shm_*.c, linked
 * into it) to count the lease attempts and to stop the poll inside one.
 * Prints "shm-contention: ..." lines.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../mpib_shm.h"
#include "shm_agent.h"
#include "shm_decode.h"

#include "check.h"

#define HDR 256u
#define SLOT 384u
#define PEER 64u
#define NSLOTS 16384u     /* a large segment: an unbounded search costs NSLOTS fcntl calls */
#define NCONN 64u         /* connections waiting for a slot */
#define REGISTER_BOUND 64 /* lease attempts one registration may make */
#define POLL_BOUND 512    /* lease attempts one poll may make */
#define RELEASE_WAIT_MS 2000.0
#define NPEERS 4096u
#define STORM_READS 1000u
#define STORM_BOUND 64 /* peer-table scans at one instant while peers_epoch changes per read */

/* ---- fcntl interposition ---- */

static _Atomic unsigned long g_setlk; /* F_OFD_SETLK calls (lease attempts, unlocks) */
static _Atomic int g_gate_armed;      /* stop the gate thread in its next refused lease attempt */
static _Atomic int g_in_gate;         /* the gate thread is stopped there */
static _Atomic int g_gate_open;
static pthread_t g_gate_thread;

int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void *arg = va_arg(ap, void *);
  va_end(ap);
  long rc = syscall(SYS_fcntl, fd, cmd, arg);
  if (cmd == F_OFD_SETLK) {
    int e = errno;
    atomic_fetch_add(&g_setlk, 1);
    const struct flock *lk = arg;
    if (rc != 0 && (e == EAGAIN || e == EACCES) && lk->l_type == F_WRLCK && atomic_load(&g_gate_armed) &&
        pthread_equal(pthread_self(), g_gate_thread)) {
      atomic_store(&g_gate_armed, 0);
      atomic_store(&g_in_gate, 1);
      while (!atomic_load(&g_gate_open)) {
        nanosleep(&(struct timespec){0, 1000000}, NULL);
      }
    }
    errno = e;
  }
  return (int)rc;
}

static double now_ms(void) { return (double)mpib_shm_now_ns() / 1e6; }

static void make_dir(char *dir, size_t len) {
  snprintf(dir, len, "/dev/shm/mpib-contention-XXXXXX");
  if (mkdtemp(dir) == NULL) {
    snprintf(dir, len, "/tmp/mpib-contention-XXXXXX");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
  }
}

static mpib_conn_desc desc(uint64_t conn_id) {
  return (mpib_conn_desc){.peer_sout_ip = 0x0A000207, .is_send = 1, .nqps_sout = 1, .nqps_sup = 1, .conn_id = conn_id};
}

/* ---- leases ---- */

struct poll_arg {
  mpib_shm *shm;
  int rc;
};

static void *poll_thread(void *p) {
  struct poll_arg *a = p;
  a->rc = mpib_shm_poll(a->shm, NULL, 0);
  return NULL;
}

struct release_arg {
  mpib_shm *shm;
  uint32_t id;
  _Atomic int done;
};

static void *release_thread(void *p) {
  struct release_arg *a = p;
  mpib_shm_release(a->shm, a->id);
  atomic_store(&a->done, 1);
  return NULL;
}

static int wait_flag(_Atomic int *flag, double ms) {
  double end = now_ms() + ms;
  while (!atomic_load(flag) && now_ms() < end) {
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  return atomic_load(flag);
}

static void test_leases(const char *path) {
  char err[512] = "";
  CHECK(mpib_shm_create(path, NSLOTS, 16, err, sizeof(err)) == 0, "create: %s", err);
  /* The agent: its own open file description, one write lock over every slot's lease byte. */
  int afd = open(path, O_RDWR | O_CLOEXEC);
  struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = HDR, .l_len = (off_t)NSLOTS * SLOT};
  CHECK(afd >= 0 && fcntl(afd, F_OFD_SETLK, &lk) == 0, "the agent's lock: %s", strerror(errno));

  mpib_shm *shm = NULL;
  CHECK(mpib_shm_handle_new(path, &shm) == 0, "handle");
  CHECK(mpib_shm_poll(shm, NULL, 0) == MPIB_SHM_POLL_ATTACHED, "attach");

  uint32_t ids[NCONN];
  unsigned long reg_max = 0;
  double t0 = now_ms();
  for (uint32_t i = 0; i < NCONN; i++) {
    mpib_conn_desc d = desc(i + 1);
    unsigned long before = atomic_load(&g_setlk);
    CHECK(mpib_shm_register(shm, &d, &ids[i]) == 0, "register %u", i);
    unsigned long n = atomic_load(&g_setlk) - before;
    reg_max = n > reg_max ? n : reg_max;
    CHECK(mpib_shm_conn_slot(shm, ids[i], NULL, NULL) == -ENOENT, "bound through the agent's lock");
  }
  double reg_ms = now_ms() - t0;
  CHECK(reg_max <= REGISTER_BOUND, "one registration made %lu lease attempts (bound %d, slots %u)", reg_max,
        REGISTER_BOUND, NSLOTS);

  unsigned long before = atomic_load(&g_setlk);
  t0 = now_ms();
  mpib_shm_poll(shm, NULL, 0);
  double poll_ms = now_ms() - t0;
  unsigned long poll_n = atomic_load(&g_setlk) - before;
  CHECK(poll_n <= POLL_BOUND, "one poll made %lu lease attempts for %u waiting connections (bound %d)", poll_n, NCONN,
        POLL_BOUND);

  /* The close path while the poll is stopped inside a refused lease attempt. */
  struct poll_arg pa = {shm, -1};
  atomic_store(&g_gate_open, 0);
  atomic_store(&g_in_gate, 0);
  atomic_store(&g_gate_armed, 1);
  pthread_create(&g_gate_thread, NULL, poll_thread, &pa);
  int stopped = wait_flag(&g_in_gate, 5000.0);
  CHECK(stopped, "the poll made no lease attempt for its waiting connections");
  struct release_arg ra = {.shm = shm, .id = ids[0]};
  pthread_t rt;
  t0 = now_ms();
  pthread_create(&rt, NULL, release_thread, &ra);
  int released = wait_flag(&ra.done, RELEASE_WAIT_MS);
  double release_ms = now_ms() - t0;
  CHECK(!stopped || released,
        "mpib_shm_release waited %.0f ms for the poll's search among foreign "
        "leases (it must not wait for it at all)",
        release_ms);
  atomic_store(&g_gate_armed, 0);
  atomic_store(&g_gate_open, 1);
  pthread_join(g_gate_thread, NULL);
  pthread_join(rt, NULL);

  /* The agent goes: every waiting connection gets a slot within a few polls. */
  close(afd);
  int polls = 0, bound = 0;
  while (polls < 8 && bound < (int)NCONN - 1) {
    mpib_shm_poll(shm, NULL, 0);
    polls++;
    bound = 0;
    for (uint32_t i = 1; i < NCONN; i++) {
      bound += mpib_shm_conn_slot(shm, ids[i], NULL, NULL) == 0;
    }
  }
  CHECK(bound == (int)NCONN - 1 && polls <= 2, "%d of %u connections bound after %d polls", bound, NCONN - 1, polls);
  uint32_t extra;
  mpib_conn_desc d = desc(1000);
  CHECK(mpib_shm_register(shm, &d, &extra) == 0 && mpib_shm_conn_slot(shm, extra, NULL, NULL) == 0,
        "a registration without the agent's lock binds at once");
  printf("shm-contention: case=whole-area-lock slots=%u conns=%u register_fcntl_max=%lu "
         "register_ms=%.1f poll_fcntl=%lu poll_ms=%.1f release_during_scan=%s release_ms=%.1f "
         "polls_to_bind=%d\n",
         NSLOTS, NCONN, reg_max, reg_ms, poll_n, poll_ms, released ? "true" : "false", release_ms, polls);
  mpib_shm_close(shm);
}

/* ---- peers_epoch ---- */

static void put_peer(uint8_t *seg, uint32_t nslots, uint32_t j, uint32_t ip, uint8_t len, uint32_t bw) {
  uint8_t *r = seg + HDR + (size_t)nslots * SLOT + (size_t)j * PEER;
  _Atomic uint32_t *seq = (_Atomic uint32_t *)r;
  uint32_t w = atomic_load(seq) | 1u;
  atomic_store(seq, w);
  memcpy(r + 4, &bw, 4);
  uint32_t flags = 1;
  memcpy(r + 8, &flags, 4);
  memcpy(r + 24, &ip, 4);
  r[28] = len;
  atomic_store(seq, w + 1);
}

/* The header's peers_epoch (spec 4.1). */
static _Atomic uint32_t *epoch_word(uint8_t *seg) { return (_Atomic uint32_t *)(seg + 76); }
static void bump_epoch(uint8_t *seg) { atomic_fetch_add(epoch_word(seg), 1); }

/* The best of 5 runs' time per data-path read of connection id's hint, 2000 reads a run; with
 * storm, the word it points to (peers_epoch, a slot's gen) changes before every read. */
static double reads_ns(mpib_shm *shm, uint32_t id, _Atomic uint32_t *storm) {
  double best = 1e18;
  for (int rep = 0; rep < 5; rep++) {
    uint64_t t0 = mpib_shm_now_ns();
    for (int i = 0; i < 2000; i++) {
      if (storm) {
        atomic_fetch_add(storm, 1);
      }
      uint32_t bw;
      (void)mpib_shm_read_hint(shm, id, 1000000000000ull, &bw);
    }
    double per = (double)(mpib_shm_now_ns() - t0) / 2000.0;
    best = per < best ? per : best;
  }
  return best;
}

/* A segment of 4 slots and NPEERS peer entries at path: the plugin's handle on it with one
 * registered connection (its id and slot), and the agent's mapping of the file (size bytes),
 * or 0 when something failed (checked). */
struct storm_seg {
  mpib_shm *shm;
  int fd;
  uint8_t *seg;
  size_t size;
  uint32_t nslots, id, slot;
};

static int storm_open(const char *path, struct storm_seg *g) {
  char err[512] = "";
  *g = (struct storm_seg){.nslots = 4, .fd = -1, .seg = MAP_FAILED};
  CHECK(mpib_shm_create(path, g->nslots, NPEERS, err, sizeof(err)) == 0, "create: %s", err);
  CHECK(mpib_shm_open(path, &g->shm, err, sizeof(err)) == 0, "open: %s", err);
  g->fd = open(path, O_RDWR | O_CLOEXEC);
  g->size = HDR + (size_t)g->nslots * SLOT + (size_t)NPEERS * PEER;
  if (g->fd >= 0) g->seg = mmap(NULL, g->size, PROT_READ | PROT_WRITE, MAP_SHARED, g->fd, 0);
  CHECK(g->seg != MAP_FAILED, "map: %s", strerror(errno));
  if (g->seg == MAP_FAILED || g->shm == NULL) return 0;
  mpib_conn_desc d = desc(1);
  CHECK(mpib_shm_register(g->shm, &d, &g->id) == 0 && mpib_shm_conn_slot(g->shm, g->id, &g->slot, NULL) == 0,
        "register");
  return 1;
}

static void storm_close(struct storm_seg *g) {
  munmap(g->seg, g->size);
  close(g->fd);
  mpib_shm_close(g->shm);
}

static void test_peers_epoch(const char *path) {
  struct storm_seg g;
  if (!storm_open(path, &g)) {
    return;
  }
  mpib_shm *shm = g.shm;
  uint8_t *seg = g.seg;
  const uint32_t nslots = g.nslots;
  uint32_t id = g.id, slot = g.slot;
  uint64_t t = mpib_shm_now_ns();
  mpib_shm_heartbeat(shm, t);
  const uint64_t stale = 1000000000000ull;
  put_peer(seg, nslots, NPEERS - 1, 0x0A000207, 32, 1010);
  bump_epoch(seg);
  mpib_shm_hint h;
  CHECK(mpib_shm_resolve(shm, slot, t, stale, &h) == 1 && h.sup_bw == 1010 && h.source == MPIB_SHM_SRC_PEER,
        "peer hint: %u source %u", h.sup_bw, h.source);
  /* Each change adds an equally long match at a lower index (it wins: ties go to the lowest
   * index) and keeps the one before valid, so only a scan of the table finds the new value:
   * a read that returns it scanned the table. */
  unsigned fresh = 0;
  for (uint32_t k = 1; k <= STORM_READS; k++) {
    put_peer(seg, nslots, NPEERS - 1 - k, 0x0A000207, 32, k);
    bump_epoch(seg);
    fresh += mpib_shm_resolve(shm, slot, t, stale, &h) == 1 && h.sup_bw == k;
  }
  CHECK(fresh <= STORM_BOUND, "the peer table was scanned for %u of %u reads at one instant (bound %d)", fresh,
        STORM_READS, STORM_BOUND);
  int later = mpib_shm_resolve(shm, slot, t + 1000000000ull, stale, &h) == 1 && h.sup_bw == STORM_READS;
  CHECK(later, "one second later the latest peer entry must apply: got %u source %u", h.sup_bw, h.source);
  /* The same storm on the data path, timed: an epoch bumped before every read against none. */
  mpib_shm_heartbeat(shm, mpib_shm_now_ns());
  double quiet = reads_ns(shm, id, NULL), storm = reads_ns(shm, id, epoch_word(seg));
  CHECK(storm < 10.0 * quiet + 5000.0,
        "a read costs %.0f ns while peers_epoch changes per read, "
        "%.0f ns otherwise (a full scan of %u peers each time)",
        storm, quiet, NPEERS);
  printf("shm-contention: case=peers-epoch-storm npeers=%u reads=%u scans_at_one_instant=%u "
         "latest_applies_later=%s read_ns_quiet=%.0f read_ns_storm=%.0f\n",
         NPEERS, STORM_READS, fresh, later ? "true" : "false", quiet, storm);
  storm_close(&g);
}

/* A writer that bumps the slot's gen before every read (the owner wrote it once, at the claim)
 * costs no more scans than a peers_epoch storm. */
static void test_gen_storm(const char *path) {
  struct storm_seg g;
  if (!storm_open(path, &g)) {
    return;
  }
  mpib_shm *shm = g.shm;
  uint8_t *seg = g.seg;
  const uint32_t nslots = g.nslots;
  uint32_t id = g.id, slot = g.slot;
  _Atomic uint32_t *gen = (_Atomic uint32_t *)(seg + HDR + (size_t)slot * SLOT + 8); /* spec 4.3: after owner */
  uint64_t t = mpib_shm_now_ns();
  mpib_shm_heartbeat(shm, t);
  const uint64_t stale = 1000000000000ull;
  put_peer(seg, nslots, NPEERS - 1, 0x0A000207, 32, 1010);
  mpib_shm_hint h;
  CHECK(mpib_shm_resolve(shm, slot, t, stale, &h) == 1 && h.sup_bw == 1010 && h.source == MPIB_SHM_SRC_PEER,
        "the claim's first read scans at once: %u source %u", h.sup_bw, h.source);
  unsigned fresh = 0;
  for (uint32_t k = 1; k <= STORM_READS; k++) {
    put_peer(seg, nslots, NPEERS - 1 - k, 0x0A000207, 32, k);
    atomic_fetch_add(gen, 1);
    fresh += mpib_shm_resolve(shm, slot, t, stale, &h) == 1 && h.sup_bw == k;
  }
  CHECK(fresh <= STORM_BOUND,
        "the peer table was scanned for %u of %u reads while the slot's gen changed per read (bound %d)", fresh,
        STORM_READS, STORM_BOUND);
  mpib_shm_heartbeat(shm, mpib_shm_now_ns());
  double quiet = reads_ns(shm, id, NULL), best = reads_ns(shm, id, gen);
  CHECK(best < 10.0 * quiet + 5000.0, "a read costs %.0f ns while the slot's gen changes per read, %.0f ns otherwise",
        best, quiet);
  printf("shm-contention: case=slot-gen-storm npeers=%u reads=%u scans_at_one_instant=%u read_ns_quiet=%.0f "
         "read_ns_storm=%.0f\n",
         NPEERS, STORM_READS, fresh, quiet, best);
  storm_close(&g);
}

int main(void) {
  char dir[64], path[160];
  make_dir(dir, sizeof(dir));
  snprintf(path, sizeof(path), "%s/leases", dir);
  test_leases(path);
  unlink(path);
  snprintf(path, sizeof(path), "%s/peers", dir);
  test_peers_epoch(path);
  unlink(path);
  snprintf(path, sizeof(path), "%s/gen", dir);
  test_gen_storm(path);
  unlink(path);
  rmdir(dir);
  return failures != 0;
}
