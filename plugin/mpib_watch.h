/* The no-progress watch (mpib_watch.c): called by mpib_p2p.c's progress. */
#ifndef MPIB_WATCH_H
#define MPIB_WATCH_H

#include "mpib.h"

/* Fails over each rail of c with signalled writes outstanding whose path has acknowledged
 * nothing for the watch's limit (MPIB_DETECT_MS, widened on a slow path). Error: what the
 * failover returned (a comm with no rail left to continue on). */
ncclResult_t mpib_watch_tick(struct mpib_comm *c);
/* Every 256th progress call: a comm that has completed nothing for 10 s while NCCL kept
 * calling it logs, once per wait, what it is waiting for (the stuck report). */
void mpib_watch_stuck_tick(struct mpib_comm *c);

#endif
