/* Loads the built plugin the way NCCL does (RTLD_NOW catches unresolved symbols) and checks
 * every exported table: its name and the entry points NCCL calls unconditionally. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "plugin/nccl_abi.h"

#define CHECK(cond, what)                 \
  do {                                    \
    if (!(cond)) {                        \
      fprintf(stderr, "FAIL %s\n", what); \
      return 1;                           \
    }                                     \
  } while (0)

#define CHECK_COMMON(t)                                                                                             \
  CHECK(t->name &&strcmp(t->name, "MPIB") == 0, #t " name");                                                        \
  CHECK(t->init && t->devices && t->getProperties && t->listen && t->connect && t->accept,                          \
        #t " control entry points");                                                                                \
  CHECK(t->regMr && t->regMrDmaBuf && t->deregMr && t->isend && t->irecv && t->iflush && t->test && t->closeSend && \
            t->closeRecv && t->closeListen,                                                                         \
        #t " data entry points");                                                                                   \
  CHECK(t->getDeviceMr == NULL && t->irecvConsumed == NULL, #t " device offload entry points absent, as net_ib's")

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  CHECK(h != NULL, dlerror());
  const ncclNet_v7_t *v7 = dlsym(h, "ncclNetPlugin_v7");
  const ncclNet_v8_t *v8 = dlsym(h, "ncclNetPlugin_v8");
  const ncclNet_v9_t *v9 = dlsym(h, "ncclNetPlugin_v9");
  const ncclNet_v10_t *v10 = dlsym(h, "ncclNetPlugin_v10");
  const ncclNet_v11_t *v11 = dlsym(h, "ncclNetPlugin_v11");
  const ncclNet_v12_t *v12 = dlsym(h, "ncclNetPlugin_v12");
  CHECK(v7 && v8 && v9 && v10 && v11 && v12, "all of ncclNetPlugin_v7..v12 resolve");
  CHECK_COMMON(v7);
  CHECK_COMMON(v8);
  CHECK_COMMON(v9);
  CHECK_COMMON(v10);
  CHECK_COMMON(v11);
  CHECK_COMMON(v12);
  CHECK(v9->makeVDevice == NULL && v10->makeVDevice == NULL && v11->makeVDevice == NULL && v12->makeVDevice == NULL,
        "makeVDevice absent (MPIB fuses itself)");
  CHECK(v11->finalize && v11->setNetAttr && v12->finalize && v12->setNetAttr, "v11/v12 finalize and setNetAttr");
  /* v11 is a shim over v12: everything but getProperties is the same entry point. */
  CHECK(v11->init == v12->init && v11->isend == v12->isend && v11->irecv == v12->irecv &&
            (void *)v11->getProperties != (void *)v12->getProperties,
        "v11 shares v12's entry points except getProperties");
  /* v7 is v8 but for getProperties and regMr's int size. */
  CHECK(v7->init == v8->init && v7->isend == v8->isend && v7->irecv == v8->irecv &&
            (void *)v7->getProperties != (void *)v8->getProperties && (void *)v7->regMr != (void *)v8->regMr,
        "v7 shares v8's entry points except getProperties and regMr");
  CHECK(dlsym(h, "mpibGoInit") == NULL, "cgo exports stay hidden");
  printf("dlopen_check: ok\n");
  return 0;
}
