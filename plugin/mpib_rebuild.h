/* Rail rebuild (mpib_rebuild.c), called by failover: the QP transitions of a failed rail.
 * Return 0 or -errno. */
#ifndef MPIB_REBUILD_H
#define MPIB_REBUILD_H

#include "mpib.h"

/* Forces the rail's QPs into the error state: their outstanding work completes in error. Each
 * QP on a live lane is moved, whatever the rail's other lanes' devices (a dead one's are left). */
int mpib_rail_to_error(struct mpib_comm *c, int rail);
/* Resets the rail's QPs and reconnects them to the peer's same QPs, starting at psn. */
int mpib_rail_reconnect(struct mpib_comm *c, int rail, uint32_t psn);
/* mpib_rail_reconnect on a thread of its own (-errno when none could be started), and 1 once
 * it finished (its result in *err), 0 while it runs. */
int mpib_rail_rebuild_start(struct mpib_comm *c, int rail, uint32_t psn);
int mpib_rail_rebuild_poll(struct mpib_comm *c, int rail, int *err);

#endif
