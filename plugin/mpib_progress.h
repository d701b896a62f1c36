/* Path progress (mpib_progress.c): when an acknowledgement last came back from one peer over
 * one local NIC, shared by every comm of the process on that path. mpib_comm.c looks a comm's
 * paths up at connect; mpib_failover.c's no-progress watch reads and writes them. */
#ifndef MPIB_PROGRESS_H
#define MPIB_PROGRESS_H

#include <stdint.h>

/* The shared word of the path from `nic` to the peer's `gid` (created on first use), or NULL
 * when the table is full (the watch then sees the comm's own acknowledgements only). */
uint64_t *mpib_path_progress(const void *nic, const uint8_t gid[16]);

#endif
