/* The C unit tests' shared check: a failed CHECK prints where and why, counts, and the test
 * goes on; main returns failures != 0. Each test is its own program, so the counter is each
 * program's own. */
#ifndef MPIB_CTEST_CHECK_H
#define MPIB_CTEST_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      failures++;                                          \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fputc('\n', stderr);                                 \
    }                                                      \
  } while (0)

#endif
