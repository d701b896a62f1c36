/*
 * NCCL profiler events for MPIB's rails. v10+ hand init a profiler callback and isend/irecv a
 * profiler handle per request; MPIB then reports one event per (request, rail that carries a
 * part of it), described with net_ib's IB QP descriptor so that existing profilers decode it:
 * device = the rail (0 SOUT, 1 SUP). docs/nccl-loading.md "Profiler events" has the details.
 *
 * Cost without a profiler: every hook in the data path is one predictable branch on
 * mpib_prof_fn; the per-request state is zeroed with the rest of the request.
 */
#ifndef MPIB_PROFILER_H
#define MPIB_PROFILER_H

#include "mpib.h"

/* What MPIB passes as pluginId: the IB type with descriptor version 1 (see the docs for why
 * not an MPIB-specific id). */
#define MPIB_PROF_PLUGIN_ID ((int64_t)(NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER))

/* Set by the first init that passes a profiler and never cleared: NCCL hands every init the
 * same function, which lives in libnccl and so outlives any communicator. */
extern ncclProfilerCallback_t mpib_prof_fn;
void mpib_prof_set(ncclProfilerCallback_t fn);

static inline int mpib_profiling(void) {
  return __builtin_expect(__atomic_load_n(&mpib_prof_fn, __ATOMIC_RELAXED) != NULL, 0);
}

/* Sender, just before the slot's chain is posted on rail: start an event for every matched
 * request with bytes on that rail (a zero-byte request: on the rail carrying the sizes). */
void mpib_prof_send_posting(struct mpib_comm *c, int slot, int rail, uint32_t rail_mask, const size_t *sout_bytes);
/* Sender: the rail's signalled write of the slot completed, so did its part of every request. */
void mpib_prof_send_rail_done(struct mpib_comm *c, int slot, int rail);
/* Receiver, after the CTS went out: start an event per grouped receive per rail the comm has
 * (which rails carry data is the sender's choice, learnt from the first immediate). */
void mpib_prof_recv_posted(struct mpib_comm *c, struct mpib_request *req, void **phandles, const size_t *sizes);
/* Receiver: rail's immediate for req arrived. Once all expected rails reported, the events of
 * rails the sender left unused are stopped too. */
void mpib_prof_recv_rail_done(struct mpib_request *req, int rail);

#endif
