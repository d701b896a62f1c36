//go:build ignore

// link: ../mpib_shm_*.c shm_agent.c shm_decode.c -Wl,--wrap=calloc
/*
 * The segment truncated (`: > file`) while the plugin attaches it: after the header was read
 * and the file mapped, before the mapping was first touched. The attach must survive (the
 * SIGBUS guard covers the mapping from its first access) and the next poll detach. The
 * truncation is made at the attach's first allocation after the mapping (shm_map_new's), by
 * wrapping calloc.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../mpib_shm.h"
#include "shm_agent.h"

#include "check.h"

/* AddressSanitizer handles SIGBUS itself unless told to leave it to the program. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allow_user_segv_handler=1"; }

static char path[64];
static int armed; /* the next calloc of a map's size truncates the file */

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size) {
  if (armed && n == 1 && size > 64) { /* struct shm_map, allocated just after the mmap */
    armed = 0;
    CHECK(truncate(path, 0) == 0, "truncate %s", path);
  }
  return __real_calloc(n, size);
}

/* In a child: the attach with the truncation in its window, then a poll. Exits 0 when the
 * attach reported the segment attached and the next poll detached it. */
static int attach_while_truncated(void) {
  mpib_shm *h;
  if (mpib_shm_handle_new(path, &h) != 0) return 2;
  char msg[512];
  armed = 1;
  int first = mpib_shm_poll(h, msg, sizeof msg);
  CHECK(armed == 0, "the attach made no map-sized allocation: the truncation was not placed in its window");
  int second = mpib_shm_poll(h, msg, sizeof msg);
  CHECK(first == MPIB_SHM_POLL_ATTACHED, "attach: poll %d, want attached (%d)", first, MPIB_SHM_POLL_ATTACHED);
  CHECK(second == MPIB_SHM_POLL_DETACHED, "after the truncation: poll %d (%s), want detached (%d)", second, msg,
        MPIB_SHM_POLL_DETACHED);
  mpib_shm_close(h);
  return failures != 0;
}

int main(void) {
  snprintf(path, sizeof path, "/dev/shm/mpib-ctest-attach-%d", (int)getpid());
  char err[256];
  if (mpib_shm_create(path, 64, 16, err, sizeof err) != 0) {
    fprintf(stderr, "create %s: %s\n", path, err);
    return 1;
  }
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) _exit(attach_while_truncated());
  int st = 0;
  CHECK(waitpid(child, &st, 0) == child, "waitpid");
  CHECK(!WIFSIGNALED(st), "the attach died of signal %d (%s): the mapping was touched before it was guarded",
        WTERMSIG(st), strsignal(WTERMSIG(st)));
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the attaching child exited %d", WEXITSTATUS(st));
  unlink(path);
  if (failures == 0) printf("shm_attach_truncate: ok\n");
  return failures != 0;
}
