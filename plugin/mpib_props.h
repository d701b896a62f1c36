/* What the fused device tells NCCL about itself: pure decisions, table-tested in
 * plugin/ctest/props_test.c. */
#ifndef MPIB_PROPS_H
#define MPIB_PROPS_H

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

#endif
