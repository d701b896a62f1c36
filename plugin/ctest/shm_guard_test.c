//go:build ignore

// link: ../mpib_shm_*.c shm_agent.c shm_decode.c
/*
 * The plugin's handle against an agent that misbehaves (docs/shm-format.md, 5.8 and 5.9):
 *   - the segment truncated (`: > file`) while data-path threads read hints and add
 *     telemetry: no crash (the SIGBUS guard swaps in zero pages), no hint, the poll detaches;
 *   - a segment re-created at the path (create --force): the poll re-attaches and every live
 *     connection moves to it (new slot, new lease); the old file's slots are freed;
 *   - a garbage file or a symbolic link at the path: refused once, the attachment stays;
 *   - a SIGBUS outside our mappings still takes the process's previous disposition.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../mpib_shm.h"
#include "shm_agent.h"
#include "shm_decode.h"

#define SLOT 384 /* slot size (spec 4.3): a slot's lease is the lock on its first byte */

#include "check.h"

/* AddressSanitizer handles SIGBUS itself unless told to leave it to the program. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allow_user_segv_handler=1"; }

static mpib_shm *plug; /* the plugin process's handle */
static uint32_t conns[2];
static atomic_int stop;
static atomic_ulong reads, applied;

static void *data_path(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    for (int i = 0; i < 2; i++) {
      uint32_t bw;
      if (mpib_shm_read_hint(plug, conns[i], 1000000000ull, &bw)) {
        atomic_fetch_add(&applied, 1);
      }
      mpib_shm_add_telemetry(plug, conns[i], i, 4096);
      mpib_shm_hint h;
      mpib_shm_resolve(plug, 0, mpib_shm_now_ns(), 1000000000ull, &h);
      atomic_fetch_add(&reads, 1);
    }
  }
  return NULL;
}

static int lock_held(const char *path, off_t off) {
  int fd = open(path, O_RDONLY);
  struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = off, .l_len = 1};
  int held = fd >= 0 && fcntl(fd, F_OFD_GETLK, &lk) == 0 && lk.l_type != F_UNLCK;
  if (fd >= 0) {
    close(fd);
  }
  return held;
}

/* An agent: its own handle on the file now at path, beating and setting a class default. */
static mpib_shm *agent_on(const char *path, uint32_t class_bw) {
  mpib_shm *a = NULL;
  char err[512];
  CHECK(mpib_shm_open(path, &a, err, sizeof(err)) == 0, "agent open: %s", err);
  if (a != NULL) {
    mpib_shm_heartbeat(a, mpib_shm_now_ns());
    mpib_shm_set_class_hint(a, 1, 1, class_bw);
  }
  return a;
}

static int poll_says(const char *want_text, int want) {
  char msg[512];
  int rc = mpib_shm_poll(plug, msg, sizeof(msg));
  CHECK(rc == want && strstr(msg, want_text) != NULL, "poll: expected %d \"%s\" but got %d \"%s\"", want, want_text, rc,
        msg);
  return rc;
}

static void wait_applied(uint32_t conn, uint32_t want) {
  uint32_t bw = 0;
  for (int i = 0; i < 200; i++) {
    if (mpib_shm_read_hint(plug, conn, 1000000000ull, &bw) && bw == want) {
      return;
    }
    usleep(5000);
  }
  CHECK(0, "connection %u: expected hint %u but got %u", conn, want, bw);
}

static void truncate_under_readers(const char *path, off_t to) {
  pthread_t t[3];
  atomic_store(&stop, 0);
  for (int i = 0; i < 3; i++) {
    pthread_create(&t[i], NULL, data_path, NULL);
  }
  usleep(50000);
  unsigned long before = atomic_load(&reads);
  int fd = open(path, O_WRONLY | (to == 0 ? O_TRUNC : 0)); /* `: > file` */
  CHECK(fd >= 0 && (to == 0 || ftruncate(fd, to) == 0), "truncate %s", path);
  close(fd);
  usleep(100000);
  unsigned long after = atomic_load(&reads);
  CHECK(after > before, "the data path stopped after the truncation");
  uint32_t bw;
  /* Emptied: every access faults, the guard gives zeros (no agent). A partial truncation
   * leaves the first page's bytes readable until the poll detaches. */
  CHECK(to != 0 || mpib_shm_read_hint(plug, conns[0], 1000000000ull, &bw) == 0,
        "a truncated segment still gives a hint (%u)", bw);
  atomic_store(&stop, 1);
  for (int i = 0; i < 3; i++) {
    pthread_join(t[i], NULL);
  }
  poll_says("truncated", MPIB_SHM_POLL_DETACHED);
  CHECK(mpib_shm_poll(plug, NULL, 0) == MPIB_SHM_POLL_NONE, "the truncated file is refused once");
  CHECK(mpib_shm_read_hint(plug, conns[0], 1000000000ull, &bw) == 0, "a hint after detach");
  CHECK(mpib_shm_conn_slot(plug, conns[0], NULL, NULL) == -ENOENT, "still bound after detach");
  CHECK(!mpib_shm_attached(plug), "attached after detach");
}

/* A SIGBUS outside the segment keeps the process's disposition (here: the default, death). */
static void test_foreign_sigbus(void) {
  pid_t pid = fork();
  if (pid == 0) {
    freopen("/dev/null", "w", stderr); /* a sanitizer's report of the fault is expected */
    char tmp[] = "/tmp/mpib-shm-busXXXXXX";
    int fd = mkstemp(tmp);
    unlink(tmp);
    if (fd < 0 || ftruncate(fd, 8192) != 0) {
      _exit(3);
    }
    volatile uint8_t *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ftruncate(fd, 0) != 0) {
      _exit(3);
    }
    p[4096] = 1; /* SIGBUS: not ours */
    _exit(0);    /* survived: the guard swallowed a foreign fault */
  }
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0), "a foreign SIGBUS was swallowed");
  CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 3), "foreign SIGBUS: setup failed");
}

int main(void) {
  char dir[] = "/tmp/mpib-shm-guardXXXXXX", path[256], err[512];
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path, sizeof(path), "%s/hints", dir);

  /* The plugin starts before any agent: connections wait, unbound. */
  CHECK(mpib_shm_handle_new(path, &plug) == 0, "handle");
  poll_says("No such file", MPIB_SHM_POLL_FAILED);
  CHECK(mpib_shm_poll(plug, NULL, 0) == MPIB_SHM_POLL_NONE, "a failure is said once");
  mpib_conn_desc d = {.peer_sout_ip = 0x0A000207, .path_class = 1, .is_send = 1, .nqps_sout = 1};
  for (int i = 0; i < 2; i++) {
    d.conn_id = (uint64_t)i + 1;
    CHECK(mpib_shm_register(plug, &d, &conns[i]) == 0, "register %d", i);
  }
  CHECK(mpib_shm_create(path, 8, 4, err, sizeof(err)) == 0, "create: %s", err);
  poll_says("attached: 2 connection(s)", MPIB_SHM_POLL_ATTACHED);
  CHECK(mpib_shm_poll(plug, NULL, 0) == MPIB_SHM_POLL_NONE, "nothing changed");
  mpib_shm *agent = agent_on(path, 300);
  wait_applied(conns[0], 300);

  /* Truncated to nothing, then to a partial size: no crash, no hint, detached. */
  truncate_under_readers(path, 0);
  CHECK(atomic_load(&applied) > 0, "no hint applied before the truncation");
  mpib_shm_close(agent);
  CHECK(mpib_shm_create(path, 8, 4, err, sizeof(err)) == 0, "re-create: %s", err);
  poll_says("attached: 2 connection(s)", MPIB_SHM_POLL_ATTACHED);
  agent = agent_on(path, 400);
  wait_applied(conns[1], 400);
  truncate_under_readers(path, 300);
  mpib_shm_close(agent);

  /* Replaced while attached (create --force): connections move, the old slots are freed. */
  CHECK(mpib_shm_create(path, 8, 4, err, sizeof(err)) == 0, "create: %s", err);
  poll_says("attached", MPIB_SHM_POLL_ATTACHED);
  char old[300];
  snprintf(old, sizeof(old), "%s/old", dir);
  CHECK(link(path, old) == 0, "keep the old file");
  mpib_shm *old_agent = agent_on(path, 500);
  uint32_t old_slot;
  CHECK(mpib_shm_conn_slot(plug, conns[0], &old_slot, NULL) == 0, "bound");
  CHECK(lock_held(path, 256 + (off_t)old_slot * SLOT), "lease in the first segment");
  CHECK(mpib_shm_create(path, 16, 4, err, sizeof(err)) == 0, "replace: %s", err);
  mpib_shm *new_agent = agent_on(path, 600);
  poll_says("replaced: re-attached: 2 connection(s)", MPIB_SHM_POLL_ATTACHED);
  wait_applied(conns[0], 600);
  mpib_shm_slot_info si;
  CHECK(mpib_shm_decode_slot(old_agent, old_slot, &si) == 0 && si.state == 0,
        "the old segment's slot %u is still owned (state %u)", old_slot, si.state);
  mpib_shm_close(old_agent);
  CHECK(!lock_held(old, 256 + (off_t)old_slot * SLOT) && !lock_held(old, 0),
        "the plugin still holds locks on the old segment");
  uint32_t new_slot;
  CHECK(mpib_shm_conn_slot(plug, conns[0], &new_slot, NULL) == 0 && lock_held(path, 256 + (off_t)new_slot * SLOT) &&
            lock_held(path, 0),
        "no lease in the new segment");

  /* Garbage or a symbolic link at the path: refused once, the attachment stays. */
  char junk[300];
  snprintf(junk, sizeof(junk), "%s/junk", dir);
  int fd = open(junk, O_CREAT | O_WRONLY, 0600);
  CHECK(fd >= 0 && write(fd, "garbage garbage garbage", 23) == 23, "junk");
  close(fd);
  CHECK(rename(junk, path) == 0, "rename junk");
  poll_says("too_small", MPIB_SHM_POLL_FAILED);
  CHECK(mpib_shm_poll(plug, NULL, 0) == MPIB_SHM_POLL_NONE, "a failure is said once");
  wait_applied(conns[0], 600);
  unlink(path);
  CHECK(symlink(old, path) == 0, "symlink");
  poll_says("not_regular", MPIB_SHM_POLL_FAILED);
  wait_applied(conns[0], 600);
  mpib_shm_close(new_agent);

  test_foreign_sigbus();

  /* Release after everything: no lease left anywhere. */
  mpib_shm_release(plug, conns[0]);
  mpib_shm_release(plug, conns[1]);
  mpib_shm_close(plug);
  unlink(path);
  unlink(old);
  rmdir(dir);
  printf("guard: %lu data-path reads, %lu applied\n", atomic_load(&reads), atomic_load(&applied));
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
