//go:build ignore

/* Table test for the fused device's advertised speed (mpib_props.h). */
#include <stdio.h>

#include "../mpib_props.h"
#include "check.h"

int main(void) {
  static const struct {
    const char *what;
    int advanced, relay, sout, sup, want;
  } cases[] = {
      {"vanilla, SUP slower: SUP", 0, 0, 400000, 200000, 200000},
      {"vanilla, SOUT slower: SOUT", 0, 0, 100000, 400000, 100000},
      {"vanilla, equal rails", 0, 0, 200000, 200000, 200000},
      {"vanilla, the relay changes nothing", 0, 1, 400000, 200000, 200000},
      {"vanilla, SUP unknown: SOUT", 0, 0, 100000, 0, 100000},
      {"vanilla, SOUT unknown (-1): SUP", 0, 0, -1, 200000, 200000},
      {"vanilla, both unknown: 0 (NCCL takes 10 Gbps)", 0, 0, 0, -1, 0},
      {"advanced with a relay: the sum", 1, 1, 400000, 200000, 600000},
      {"advanced with a relay, SUP unknown", 1, 1, 400000, 0, 400000},
      {"advanced without a relay: SOUT", 1, 0, 400000, 200000, 400000},
      {"advanced without a relay, SOUT slower: SOUT", 1, 0, 100000, 400000, 100000},
      {"advanced without a relay, SOUT unknown: SUP", 1, 0, 0, 200000, 200000},
      {"the lab's rxe rails (10 Gbps each), vanilla", 0, 0, 10000, 10000, 10000},
      {"the lab's rxe rails, advanced with a relay", 1, 1, 10000, 10000, 20000},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int got = mpib_fused_speed_mbps(cases[i].advanced, cases[i].relay, cases[i].sout, cases[i].sup);
    CHECK(got == cases[i].want, "%s: got %d Mbps, want %d", cases[i].what, got, cases[i].want);
  }
  if (failures == 0) printf("props: %zu cases passed\n", sizeof cases / sizeof cases[0]);
  return failures != 0;
}
