//go:build ignore

// link: ../mpib_shm_*.c shm_agent.c shm_decode.c
/*
 * A slot this process holds reads free when its owner word is cleared under it (an agent's
 * reclaim racing a re-registration, or the file rewritten in place): the process's own lease
 * never stops its own search, so only its private record of held slots keeps a second
 * connection of the process off that slot. Otherwise the two share it, the first one's
 * release frees the slot and drops the lease the second still relies on, and another
 * process's connection claimed there gives its hint to the second (and takes its telemetry).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../mpib_shm.h"
#include "shm_agent.h"
#include "shm_decode.h"

#include "check.h"

#define HDR 256u
#define SLOT 384u
#define NSLOTS 4u

static mpib_conn_desc desc(uint64_t conn_id, uint32_t pid) {
  return (mpib_conn_desc){
      .local_sout_ip = 0x0A000101, .peer_sout_ip = 0x0A000207, .is_send = 1, .conn_id = conn_id, .pid = pid};
}

static uint32_t slot_of(mpib_shm *h, uint32_t id) {
  uint32_t slot = UINT32_MAX;
  return mpib_shm_conn_slot(h, id, &slot, NULL) == 0 ? slot : UINT32_MAX;
}

int main(void) {
  char path[64], err[256];
  snprintf(path, sizeof path, "/dev/shm/mpib-ctest-own-%d", (int)getpid());
  if (mpib_shm_create(path, NSLOTS, 0, err, sizeof err) != 0) {
    fprintf(stderr, "create: %s\n", err);
    return 1;
  }
  /* Two handles, two open file descriptions: their leases conflict as two processes' do. */
  mpib_shm *p = NULL, *q = NULL;
  CHECK(mpib_shm_handle_new(path, &p) == 0 && mpib_shm_handle_new(path, &q) == 0, "handles");
  CHECK(mpib_shm_poll(p, NULL, 0) == MPIB_SHM_POLL_ATTACHED && mpib_shm_poll(q, NULL, 0) == MPIB_SHM_POLL_ATTACHED,
        "attach");
  int fd = open(path, O_RDWR | O_CLOEXEC);
  size_t size = HDR + (size_t)NSLOTS * SLOT;
  uint8_t *seg = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == NULL || q == NULL || seg == MAP_FAILED) return 1;

  uint32_t a, others[NSLOTS];
  mpib_conn_desc d = desc(1, 4101);
  CHECK(mpib_shm_register(p, &d, &a) == 0, "register A");
  uint32_t sa = slot_of(p, a);
  CHECK(sa < NSLOTS, "A is bound");
  atomic_store((_Atomic uint64_t *)(seg + HDR + (size_t)sa * SLOT), 0); /* A's owner word cleared under it */
  /* As many more connections as there are slots: the searches go round to A's slot. */
  for (uint32_t k = 0; k < NSLOTS; k++) {
    d = desc(10 + k, 4101);
    CHECK(mpib_shm_register(p, &d, &others[k]) == 0, "register %u", k);
    CHECK(slot_of(p, others[k]) != sa, "connection %u of the process took slot %u, which its connection A holds", k,
          sa);
  }
  /* A closes; another process registers and sets its hint: none of the first process's
   * connections may read it. */
  mpib_shm_release(p, a);
  d = desc(99, 4202);
  uint32_t c;
  CHECK(mpib_shm_register(q, &d, &c) == 0, "register C");
  uint32_t sc = UINT32_MAX, gc = 0;
  CHECK(mpib_shm_conn_slot(q, c, &sc, &gc) == 0, "C is bound");
  mpib_shm_heartbeat(q, mpib_shm_now_ns());
  CHECK(mpib_shm_set_slot_hint(q, sc, gc, 1, 1000) == 0, "C's hint");
  for (uint32_t k = 0; k < NSLOTS; k++) {
    uint32_t bw = 0;
    int applies = mpib_shm_read_hint(p, others[k], 500000000ull, &bw);
    CHECK(!applies, "connection %u of the first process (slot %u) reads the other process's hint (slot %u): %u", k,
          slot_of(p, others[k]), sc, bw);
  }
  munmap(seg, size);
  close(fd);
  mpib_shm_close(p);
  mpib_shm_close(q);
  unlink(path);
  if (failures == 0) printf("shm_own_slots: ok\n");
  return failures != 0;
}
