/* The data path's clock: CLOCK_MONOTONIC in ns, for every file that keeps time (declared in
 * mpib_clock.h). On its own so that the message path's tests link their fake clock instead. */
#include <time.h>

#include "mpib_clock.h"

uint64_t mpib_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
