/* The receive queue refill shared by comm setup (a new rail's SRQ) and the message path (after
 * receives were consumed): inline, so each caller has it without calling the other. */
#ifndef MPIB_SRQ_H
#define MPIB_SRQ_H

#include <string.h>

#include "mpib.h"

/* Keeps the lane's SRQ full, posting the missing receives as one chain (one call). At most
 * MPIB_MAX_REQUESTS slots are in flight, each consuming one receive per rail, so refilling
 * once MPIB_SRQ_REFILL are gone keeps MPIB_SRQ_DEPTH - MPIB_SRQ_REFILL > MPIB_MAX_REQUESTS
 * posted: the sender never meets an empty queue (RNR). */
static inline int mpib_srq_refill(struct mpib_comm *c, int lane) {
  int missing = MPIB_SRQ_DEPTH - c->srq_posted[lane];
  if (missing < MPIB_SRQ_REFILL) return 0;
  if (missing > MPIB_SRQ_DEPTH) missing = MPIB_SRQ_DEPTH; /* a miscount must never overrun wrs */
  struct ibv_recv_wr wrs[MPIB_SRQ_DEPTH];
  for (int i = 0; i < missing; i++) {
    wrs[i] = (struct ibv_recv_wr){.wr_id = MPIB_WRID_RECV, .num_sge = 0, .next = i + 1 < missing ? &wrs[i + 1] : NULL};
  }
  struct ibv_recv_wr *bad = NULL;
  int rc = ibv_post_srq_recv(c->srq[lane], &wrs[0], &bad);
  for (struct ibv_recv_wr *w = &wrs[0]; w != NULL && w != bad; w = w->next) c->srq_posted[lane]++;
  if (rc) {
    MPIB_WARN("%s rail: ibv_post_srq_recv failed: %s", mpib_rail_name(mpib_lane_rail(lane)), strerror(rc));
    return -rc;
  }
  return 0;
}

#endif
