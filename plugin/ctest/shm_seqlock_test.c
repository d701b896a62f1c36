//go:build ignore

// link: ../mpib_shm_*.c shm_agent.c shm_decode.c
/*
 * Seqlock under contention: one writer thread rewrites a slot's hint record with fields tied
 * together (sup_bw, set_ns, gen, peer_ip, prefix_len all derive from one counter) while reader
 * threads read it. A successful read must never mix two writes; readers never spin forever.
 * A second phase races read_hint (hot path) against a writer flipping the slot hint between
 * two values: every applied result must be one of them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../mpib_shm.h"
#include "shm_agent.h"
#include "shm_decode.h"

#define WRITES 2000000u
#define READERS 3

static mpib_shm *shm;
static uint32_t conn, slot, gen; /* the registered connection and its segment slot */
static atomic_int done;
static atomic_ulong torn, ok_reads, busy_reads, bad_values;

static mpib_shm_record make(uint64_t k) {
  mpib_shm_record r = {.sup_bw = (uint32_t)(k % 1025),
                       .flags = 1,
                       .gen = (uint32_t)(k * 7),
                       .set_ns = k,
                       .peer_ip = ~(uint32_t)k,
                       .prefix_len = (uint8_t)(k % 33)};
  return r;
}

static void *writer(void *arg) {
  (void)arg;
  for (uint64_t k = 1; k <= WRITES; k++) {
    mpib_shm_record r = make(k);
    mpib_shm_write_slot_record(shm, slot, &r);
  }
  atomic_store(&done, 1);
  return NULL;
}

static void *reader(void *arg) {
  (void)arg;
  while (!atomic_load(&done)) {
    mpib_shm_record r;
    int rc = mpib_shm_read_slot_record(shm, slot, &r);
    if (rc == -EBUSY) {
      atomic_fetch_add(&busy_reads, 1);
      continue;
    }
    if (rc == 0 && r.set_ns == 0 && r.sup_bw == 0 && r.peer_ip == 0) {
      continue; /* before the first write */
    }
    mpib_shm_record w = make(r.set_ns);
    if (rc != 0 || (r.seq & 1u) || r.sup_bw != w.sup_bw || r.gen != w.gen || r.peer_ip != w.peer_ip ||
        r.prefix_len != w.prefix_len) {
      atomic_fetch_add(&torn, 1);
    } else {
      atomic_fetch_add(&ok_reads, 1);
    }
  }
  return NULL;
}

static void *flipper(void *arg) {
  (void)arg;
  for (uint32_t k = 0; k < WRITES / 4; k++) {
    if (k % 1024 == 0) {
      mpib_shm_heartbeat(shm, mpib_shm_now_ns());
    }
    mpib_shm_set_slot_hint(shm, slot, gen, 1, (k & 1) ? 1024 : 256);
  }
  atomic_store(&done, 1);
  return NULL;
}

static void *hot_reader(void *arg) {
  (void)arg;
  uint64_t stale = 1000000000ull;
  while (!atomic_load(&done)) {
    uint32_t bw = 0;
    if (mpib_shm_read_hint(shm, conn, stale, &bw)) {
      atomic_fetch_add(&ok_reads, 1);
      if (bw != 256 && bw != 1024) {
        atomic_fetch_add(&bad_values, 1);
      }
    }
  }
  return NULL;
}

static int run(void *(*w)(void *), void *(*r)(void *)) {
  pthread_t wt, rt[READERS];
  atomic_store(&done, 0);
  for (int i = 0; i < READERS; i++) {
    pthread_create(&rt[i], NULL, r, NULL);
  }
  pthread_create(&wt, NULL, w, NULL);
  pthread_join(wt, NULL);
  for (int i = 0; i < READERS; i++) {
    pthread_join(rt[i], NULL);
  }
  return 0;
}

int main(void) {
  char dir[] = "/tmp/mpib-shm-seqXXXXXX", path[256], err[512];
  if (mkdtemp(dir) == NULL) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path, sizeof(path), "%s/hints", dir);
  if (mpib_shm_create(path, 8, 4, err, sizeof(err)) != 0 || mpib_shm_open(path, &shm, err, sizeof(err)) != 0) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  mpib_conn_desc d = {.path_class = 0, .is_send = 1, .nqps_sout = 1, .nqps_sup = 1};
  if (mpib_shm_register(shm, &d, &conn) != 0 || mpib_shm_conn_slot(shm, conn, &slot, &gen) != 0) {
    fprintf(stderr, "register failed\n");
    return 1;
  }
  run(writer, reader);
  printf("seqlock: %lu consistent reads, %lu busy, %lu torn\n", atomic_load(&ok_reads), atomic_load(&busy_reads),
         atomic_load(&torn));
  int fail = atomic_load(&torn) != 0 || atomic_load(&ok_reads) == 0;

  atomic_store(&ok_reads, 0);
  run(flipper, hot_reader);
  printf("read_hint: %lu applied reads, %lu bad values\n", atomic_load(&ok_reads), atomic_load(&bad_values));
  fail |= atomic_load(&bad_values) != 0 || atomic_load(&ok_reads) == 0;

  mpib_shm_close(shm);
  unlink(path);
  rmdir(dir);
  if (fail) {
    fprintf(stderr, "FAIL\n");
    return 1;
  }
  printf("ok\n");
  return 0;
}
