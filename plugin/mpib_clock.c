/* The data path's clock: on its own so that the message path's tests link theirs instead. */
#include <time.h>

#include "mpib.h"

uint64_t mpib_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
