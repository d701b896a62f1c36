/* Failover (mpib_failover.c): what the message path (mpib_p2p.c) calls. Each returns
 * ncclSuccess while the connection goes on, or the error NCCL gets (with a message logged). */
#ifndef MPIB_FAILOVER_H
#define MPIB_FAILOVER_H

#include "mpib.h"

/* Takes rail r out of service: fenced and failed over to the other rail, or ridden through
 * when none is left, or the connection fails (MPIB_FAILOVER=0, or nothing to ride through on). */
ncclResult_t mpib_failover_rail_fail(struct mpib_comm *c, int r, const char *reason, const char *detail);
/* A completion of rail `rail` that came back in error. */
ncclResult_t mpib_failover_completion_error(struct mpib_comm *c, int rail, const struct ibv_wc *wc);
/* A probe write of a rebuilt rail completed. */
ncclResult_t mpib_failover_probe_done(struct mpib_comm *c, int r);
/* Each progress call, after the completions: the peer's records and notices, port and device
 * state, the recovery attempts, replays and control messages waiting for room. */
ncclResult_t mpib_failover_tick(struct mpib_comm *c);
/* Every 256th progress call: keepalives on idle rails of a comm NCCL keeps polling. */
ncclResult_t mpib_failover_keepalive_tick(struct mpib_comm *c);
/* Every 16th progress call: a rail with signalled writes outstanding whose path has returned
 * no acknowledgement for MPIB_DETECT_MS (widened on a slow path) fails over. */
ncclResult_t mpib_failover_watch_tick(struct mpib_comm *c);
/* Why a comm NCCL waits on can make no more progress (a dead device under a rail, a peer gone,
 * a stall past MPIB_STALL_TIMEOUT_MS), or ncclSuccess; mpib_p2p.c checks three loads in line
 * first (comm_health). */
ncclResult_t mpib_failover_health_check(struct mpib_comm *c);

#endif
