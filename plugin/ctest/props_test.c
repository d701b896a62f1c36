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
  static const struct {
    const char *text;
    int want;
  } rates[] = {
      {"800 Gb/sec (4X XDR)", 800000},
      {"400 Gb/sec (4X NDR)", 400000},
      {"2.5 Gb/sec (1X SDR)", 2500},
      {"53.125 Gb/sec (2X HDR)", 53125},
      {"10 Gb/sec (1X QDR)", 10000},
      {"", 0},
      {"Gb/sec", 0},
      {"800 Mb/sec", 0},
      {"99999999999 Gb/sec", 0},
  };
  for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
    int got = mpib_rate_text_mbps(rates[i].text);
    CHECK(got == rates[i].want, "rate \"%s\": got %d Mbps, want %d", rates[i].text, got, rates[i].want);
  }
  static const struct {
    int port, sharers, want;
  } shares[] = {{400000, 1, 400000}, {400000, 2, 200000}, {400000, 0, 400000},
                {0, 2, 0},           {-1, 2, -1},         {200000, 3, 66666}};
  for (size_t i = 0; i < sizeof shares / sizeof shares[0]; i++) {
    int got = mpib_sup_share_mbps(shares[i].port, shares[i].sharers);
    CHECK(got == shares[i].want, "a %d Mbps SUP port shared by %d devices: got %d, want %d", shares[i].port,
          shares[i].sharers, got, shares[i].want);
  }
  /* An 8-device node, SUP 400G NICs each shared by two devices (200G shares), one of them down
   * at init (its two devices know no SUP speed): they report the node's 200G, not SOUT's. */
  static const int node[8] = {200000, 200000, 0, 0, 200000, 200000, 200000, 200000};
  static const struct {
    const char *what;
    int own, n, want;
  } fallback[] = {
      {"a known SUP speed: its own", 100000, 8, 100000},
      {"SUP down at init: the node's slowest known", 0, 8, 200000},
      {"unknown (-1): the node's slowest known", -1, 8, 200000},
      {"nothing known on the node: unknown", 0, 2, 0},
  };
  for (size_t i = 0; i < sizeof fallback / sizeof fallback[0]; i++) {
    int got = mpib_sup_speed_or_node_mbps(fallback[i].own, fallback[i].n == 2 ? node + 2 : node, fallback[i].n);
    CHECK(got == fallback[i].want, "%s: got %d Mbps, want %d", fallback[i].what, got, fallback[i].want);
  }
  int reported[8];
  for (int d = 0; d < 8; d++)
    reported[d] = mpib_fused_speed_mbps(0, 0, 400000, mpib_sup_speed_or_node_mbps(node[d], node, 8));
  for (int d = 0; d < 8; d++)
    CHECK(reported[d] == 200000,
          "device %d of the 8 (SOUT 400G, SUP shares 200G, two SUP down) reports %d, want 200000", d, reported[d]);
  if (failures == 0) printf("props: %zu cases passed\n", sizeof cases / sizeof cases[0]);
  return failures != 0;
}
