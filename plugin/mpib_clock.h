/* The data path's clock (mpib_clock.c). Called by every file that keeps time: the message
 * path, failover, the slots' telemetry, the flush, comm setup, the async-event thread, the
 * handoff and the hostile test build. The message path's tests define their own instead of
 * linking mpib_clock.c, so that they run on a fake clock. */
#ifndef MPIB_CLOCK_H
#define MPIB_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in ns. */
uint64_t mpib_now_ns(void);

#endif
