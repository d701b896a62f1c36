/* What the fused device tells NCCL about itself: pure decisions, table-tested in
 * plugin/ctest/props_test.c. */
#ifndef MPIB_PROPS_H
#define MPIB_PROPS_H

#include <string.h>

/* mpib_fused_speed_mbps is the speed getProperties advertises for the fused device (dev 0),
 * in Mbps, from the two rails' port speeds (<= 0: unknown). NCCL reads it as the NIC's
 * bandwidth: the graph search fits its channels into it and the tuner predicts every
 * collective's bus bandwidth from those channels (docs/topology.md, "Advertised speed"). NCCL
 * has one figure for every connection of the device and asks before any peer is known, so
 * the figure is the slowest kind of connection this configuration makes, never one that some
 * connection cannot reach:
 *   - vanilla: an intra-island connection runs on SUP alone and an inter-island one on SOUT
 *     alone: the slower rail (a ring that crosses islands has hops of both kinds);
 *   - advanced with MPIB_SUP_RELAY=1: every connection may split over both rails: the sum;
 *   - advanced without a relay: intra-island connections may split over both, inter-island
 *     ones have SOUT only: SOUT.
 * An unknown rail counts as absent; both unknown gives 0, which NCCL reads as 10 Gbps. */
static inline int mpib_fused_speed_mbps(int advanced, int sup_relay, int sout_mbps, int sup_mbps) {
  int sout = sout_mbps > 0 ? sout_mbps : 0, sup = sup_mbps > 0 ? sup_mbps : 0;
  if (advanced && sup_relay) return sout + sup;
  if (advanced) return sout > 0 ? sout : sup;
  if (sout == 0 || sup == 0) return sout + sup; /* the known one */
  return sout < sup ? sout : sup;
}

/* A SUP port's speed as one of the fused devices naming it sees it: the devices' connections
 * share the port (a SUP NIC named for two GPUs carries both GPUs' island traffic at once), so
 * each gets its share. */
static inline int mpib_sup_share_mbps(int port_mbps, int sharers) {
  return port_mbps > 0 && sharers > 1 ? port_mbps / sharers : port_mbps;
}

/* The SUP speed a device reports (Mbps) from its own (own: its slowest known SUP port's share,
 * <= 0 when none is known: its ports were down at init) and every device's of the node
 * (node[0..n)): its own, else the slowest the node knows. Taking SOUT's alone for such a
 * device would make it the node's fastest wherever SUP is slower than SOUT, and NCCL, which
 * ranks a GPU's NICs by bandwidth before distance (and reaches other GPUs' NICs over NVLink:
 * PXN), would then send every GPU's traffic to that one device. Nothing known on the node:
 * <= 0, and mpib_fused_speed_mbps takes SOUT's. */
static inline int mpib_sup_speed_or_node_mbps(int own, const int *node, int n) {
  if (own > 0) return own;
  int slowest = 0;
  for (int i = 0; i < n; i++)
    if (node[i] > 0 && (slowest == 0 || node[i] < slowest)) slowest = node[i];
  return slowest;
}

/* Mbps from a port's sysfs rate ("800 Gb/sec (4X XDR)", "2.5 Gb/sec (1X SDR)"), 0 when the
 * text does not read as one. The kernel caps the rate ibv_query_port reports at NDR, so an
 * XDR port's true rate is only there (net_ib 2.30 asks ibv_query_port_speed instead). */
static inline int mpib_rate_text_mbps(const char *t) {
  long whole = 0, frac = 0, scale = 1;
  int digits = 0;
  for (; *t >= '0' && *t <= '9'; t++, digits++) {
    whole = whole * 10 + (*t - '0');
    if (whole > 2000000) return 0; /* beyond any link, and beyond an int of Mbps */
  }
  if (*t == '.')
    for (t++; *t >= '0' && *t <= '9'; t++)
      if (scale < 1000) frac = frac * 10 + (*t - '0'), scale *= 10;
  if (digits == 0 || strncmp(t, " Gb/sec", 7) != 0) return 0;
  return (int)(whole * 1000 + frac * 1000 / scale);
}

#endif
