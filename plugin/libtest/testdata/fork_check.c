/* A child forked after the plugin loaded: its Go runtime's threads stayed in the parent, so a
 * call that enters Go would wait for ever. Each control entry point the child calls must come
 * back, at once, with ncclSystemError and a warning that names the fork; the parent's own calls
 * keep working after the fork. Runs without an RDMA device (init may find none). */
#include <dlfcn.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plugin/nccl_abi.h"

static char warned[4096];

static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (level != NCCL_LOG_WARN) return;
  size_t used = strlen(warned);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(warned + used, sizeof warned - used, fmt, ap);
  va_end(ap);
  used = strlen(warned);
  if (used + 1 < sizeof warned) strcat(warned, "\n");
}

#define EXPECT_REFUSED(call, what)                                                               \
  do {                                                                                           \
    ncclResult_t rc_ = (call);                                                                   \
    if (rc_ != ncclSystemError) {                                                                \
      fprintf(stderr, "FAIL child: %s returned %d, want ncclSystemError (%d)\n", what, (int)rc_, \
              (int)ncclSystemError);                                                             \
      _exit(1);                                                                                  \
    }                                                                                            \
  } while (0)

static void child(const ncclNet_v12_t *v12, const ncclNet_v8_t *v8, void *parent_ctx) {
  alarm(20); /* a hang ends the child with SIGALRM, which the parent reports */
  warned[0] = '\0';
  void *ctx = NULL;
  int ndev = -1;
  char handle[NCCL_NET_HANDLE_MAXSIZE];
  void *comm = NULL;
  ncclNetProperties_v12_t props;
  EXPECT_REFUSED(v12->init(&ctx, 1, NULL, logger, NULL), "v12 init");
  EXPECT_REFUSED(v8->init(logger), "v8 init");
  EXPECT_REFUSED(v12->devices(&ndev), "devices");
  EXPECT_REFUSED(v12->getProperties(0, &props), "getProperties");
  EXPECT_REFUSED(v12->listen(parent_ctx, 0, handle, &comm), "listen");
  EXPECT_REFUSED(v12->connect(parent_ctx, 0, handle, &comm, NULL), "connect");
  EXPECT_REFUSED(v12->regMr(&handle, handle, sizeof handle, NCCL_PTR_HOST, &comm), "regMr");
  EXPECT_REFUSED(v12->closeSend(&handle), "closeSend of a comm the parent made");
  EXPECT_REFUSED(v12->closeRecv(&handle), "closeRecv of a comm the parent made");
  EXPECT_REFUSED(v12->closeListen(&handle), "closeListen of a comm the parent made");
  EXPECT_REFUSED(v12->finalize(parent_ctx), "finalize");
  if (strstr(warned, "fork") == NULL) {
    fprintf(stderr, "FAIL child: no warning names the fork; warnings:\n%s", warned);
    _exit(1);
  }
  printf("fork_check child: every call refused; first warning: %.*s\n", (int)strcspn(warned, "\n"), warned);
  fflush(stdout);
  _exit(0);
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "FAIL dlopen: %s\n", dlerror());
    return 1;
  }
  const ncclNet_v12_t *v12 = dlsym(h, "ncclNetPlugin_v12");
  const ncclNet_v8_t *v8 = dlsym(h, "ncclNetPlugin_v8");
  if (v12 == NULL || v8 == NULL) {
    fprintf(stderr, "FAIL dlsym\n");
    return 1;
  }
  void *ctx = NULL;
  ncclResult_t first = v12->init(&ctx, 1, NULL, logger, NULL);
  printf("fork_check parent: init returned %d\n", (int)first);
  fflush(stdout);

  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) child(v12, v8, ctx != NULL ? ctx : calloc(1, 256)); /* a context when init found no device */
  int st = 0;
  while (waitpid(pid, &st, 0) < 0) {}
  if (WIFSIGNALED(st)) {
    fprintf(stderr, "FAIL child ended by signal %d%s\n", WTERMSIG(st),
            WTERMSIG(st) == SIGALRM ? " (it hung: a call did not come back in 20 s)" : "");
    return 1;
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;

  /* The parent's plugin is untouched by the child's calls. */
  void *ctx2 = NULL;
  ncclResult_t again = v12->init(&ctx2, 2, NULL, logger, NULL);
  if (again != first) {
    fprintf(stderr, "FAIL parent: init after the fork returned %d, before it %d\n", (int)again, (int)first);
    return 1;
  }
  if (first == ncclSuccess) {
    int ndev = -1;
    if (v12->devices(&ndev) != ncclSuccess || ndev < 0) {
      fprintf(stderr, "FAIL parent: devices after the fork\n");
      return 1;
    }
    v12->finalize(ctx2);
    v12->finalize(ctx);
  }
  printf("fork_check: ok\n");
  return 0;
}
