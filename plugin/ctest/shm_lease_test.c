//go:build ignore

// link: ../mpib_shm_*.c shm_agent.c shm_decode.c
/*
 * Hostile segment files at the path (docs/shm-format.md 2, 5.8 and 6):
 *   - a file another process holds a write lease on (fcntl F_SETLEASE): a blocking open would
 *     wait for the lease break (45 s by default), and every registration and close waiting
 *     for the handle with it. The poll must come back at once (open with O_NONBLOCK:
 *     EWOULDBLOCK) with no segment attached (vanilla policy, no hint), say why once, and
 *     attach the file at a later poll once the lease is gone;
 *   - a segment that grants its group or others any access (0644) is refused: bad_mode.
 * Prints "segment-lease: open_ms=N ..." for integration/hostile_segment_test.go.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../mpib_shm.h"
#include "shm_agent.h"
#include "shm_decode.h"

#include "check.h"

#define LIMIT_MS 100.0 /* the longest a poll of a leased file may take */

static double now_ms(void) { return (double)mpib_shm_now_ns() / 1e6; }

/* A directory for the segment: tmpfs when there is one (where segments live), else /tmp. */
static void make_dir(char *dir, size_t len) {
  snprintf(dir, len, "/dev/shm/mpib-lease-XXXXXX");
  if (mkdtemp(dir) == NULL) {
    snprintf(dir, len, "/tmp/mpib-lease-XXXXXX");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
  }
}

/* Forks a process that takes a write lease on path and keeps it until it is killed. The
 * child's pid, or -errno when the lease cannot be taken here (the file system refuses). */
static pid_t hold_lease(const char *path) {
  int ready[2];
  if (pipe(ready) != 0) {
    return -errno;
  }
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGIO, SIG_IGN); /* the lease break notice: keep the lease, as a hostile holder does */
    int fd = open(path, O_RDONLY);
    int rc = fd >= 0 && fcntl(fd, F_SETLEASE, F_WRLCK) == 0 ? 0 : errno;
    if (write(ready[1], &rc, sizeof(rc)) != (ssize_t)sizeof(rc)) {
      _exit(1);
    }
    for (;;) {
      pause();
    }
  }
  close(ready[1]);
  int rc = EIO;
  if (pid < 0 || read(ready[0], &rc, sizeof(rc)) != (ssize_t)sizeof(rc)) {
    rc = pid < 0 ? errno : EIO;
  }
  close(ready[0]);
  if (rc != 0 && pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  return rc != 0 ? -rc : pid;
}

static void test_lease(const char *path) {
  mpib_shm *shm = NULL;
  CHECK(mpib_shm_handle_new(path, &shm) == 0, "handle");
  mpib_conn_desc d = {.peer_sout_ip = 0x0A000207, .is_send = 1, .nqps_sout = 1, .conn_id = 1};
  uint32_t id = 0;
  CHECK(mpib_shm_register(shm, &d, &id) == 0, "register");
  pid_t holder = hold_lease(path);
  if (holder < 0) {
    printf("segment-lease: skipped: no write lease on %s here: %s\n", path, strerror(-holder));
    mpib_shm_close(shm);
    return;
  }
  char msg[512] = "";
  double t0 = now_ms();
  int rc = mpib_shm_poll(shm, msg, sizeof(msg));
  double poll_ms = now_ms() - t0;
  CHECK(rc == MPIB_SHM_POLL_FAILED && strstr(msg, "lease") != NULL,
        "a leased segment: expected a failed poll naming the lease but got %d: %s", rc, msg);
  uint32_t bw = 0;
  int fallback = !mpib_shm_attached(shm) && mpib_shm_read_hint(shm, id, UINT64_MAX, &bw) == 0;
  CHECK(fallback, "a leased segment must leave the plugin on its vanilla policy");
  /* Registrations and closes do not wait either, and the next poll says nothing new. */
  uint32_t id2 = 0;
  t0 = now_ms();
  CHECK(mpib_shm_register(shm, &d, &id2) == 0, "register beside the lease");
  mpib_shm_release(shm, id2);
  rc = mpib_shm_poll(shm, msg, sizeof(msg));
  double again_ms = now_ms() - t0;
  CHECK(rc == MPIB_SHM_POLL_NONE, "the lease said twice: %d %s", rc, msg);
  mpib_shm *direct = NULL;
  char err[512] = "";
  t0 = now_ms();
  rc = mpib_shm_open(path, &direct, err, sizeof(err));
  double open_ms = now_ms() - t0;
  CHECK(rc == -EWOULDBLOCK && direct == NULL && strstr(err, ": io: open:") != NULL,
        "mpib_shm_open of a leased file: %d %s", rc, err);
  CHECK(poll_ms < LIMIT_MS && again_ms < LIMIT_MS && open_ms < LIMIT_MS,
        "a leased segment blocked: poll %.1f ms, register and poll %.1f ms, open %.1f ms (limit %.0f)", poll_ms,
        again_ms, open_ms, LIMIT_MS);
  printf("segment-lease: open_ms=%.3f advanced_fallback=%s poll_again_ms=%.3f direct_open_ms=%.3f\n", poll_ms,
         fallback ? "true" : "false", again_ms, open_ms);
  /* The lease goes with its holder; the same file is attached at the next poll. */
  kill(holder, SIGKILL);
  waitpid(holder, NULL, 0);
  rc = mpib_shm_poll(shm, msg, sizeof(msg));
  CHECK(rc == MPIB_SHM_POLL_ATTACHED && mpib_shm_conn_slot(shm, id, NULL, NULL) == 0,
        "after the lease: expected the segment attached but got %d: %s", rc, msg);
  mpib_shm_close(shm);
}

/* A segment other users may read shows them every peer and rate: refused by the poll too. */
static void test_mode(const char *path) {
  CHECK(chmod(path, 0644) == 0, "chmod");
  mpib_shm *shm = NULL;
  CHECK(mpib_shm_handle_new(path, &shm) == 0, "handle");
  char msg[512] = "";
  int rc = mpib_shm_poll(shm, msg, sizeof(msg));
  CHECK(rc == MPIB_SHM_POLL_FAILED && strstr(msg, ": bad_mode:") != NULL && !mpib_shm_attached(shm),
        "mode 0644: expected bad_mode but got %d: %s", rc, msg);
  printf("segment-mode: mode=0644 refused=%s\n", rc == MPIB_SHM_POLL_FAILED ? "true" : "false");
  mpib_shm_close(shm);
}

int main(void) {
  char dir[64], path[128], err[512];
  make_dir(dir, sizeof(dir));
  snprintf(path, sizeof(path), "%s/hints", dir);
  CHECK(mpib_shm_create(path, 4, 0, err, sizeof(err)) == 0, "create: %s", err);
  test_lease(path);
  test_mode(path);
  unlink(path);
  rmdir(dir);
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
