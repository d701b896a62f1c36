/*
 * Path progress: one word per (local NIC, peer GID) holding when an acknowledgement of our own
 * writes last came back on that path, for any comm of the process. Called by mpib_comm.c at
 * connect (lookup, under a lock) and read and written by mpib_failover.c's no-progress watch
 * with relaxed atomics. Congestion delays every comm's acknowledgements on a path but some keep
 * arriving; a dead path stops all of them. Receive completions are not progress of a path: they
 * show the peer's direction works, not ours.
 */
#include <pthread.h>
#include <string.h>

#include "mpib_progress.h"

#define MPIB_PATHS 4096 /* (NIC, peer) pairs per process: 8 NICs x 512 peers */

struct mpib_path {
  const void *nic;
  uint8_t gid[16];
  uint64_t ack_ns;
};

static struct mpib_path paths[MPIB_PATHS];
static int npaths;
static pthread_mutex_t paths_mu = PTHREAD_MUTEX_INITIALIZER;

uint64_t *mpib_path_progress(const void *nic, const uint8_t gid[16]) {
  uint64_t *word = NULL;
  pthread_mutex_lock(&paths_mu);
  for (int i = 0; i < npaths && !word; i++)
    if (paths[i].nic == nic && memcmp(paths[i].gid, gid, 16) == 0) word = &paths[i].ack_ns;
  if (!word && npaths < MPIB_PATHS) {
    paths[npaths].nic = nic;
    memcpy(paths[npaths].gid, gid, 16);
    word = &paths[npaths++].ack_ns;
  }
  pthread_mutex_unlock(&paths_mu);
  return word;
}
