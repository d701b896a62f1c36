/* Failover (mpib_failover.c): what the message path (mpib_p2p.c) calls, each returning
 * ncclSuccess while the connection goes on or the error NCCL gets (with a message logged); and
 * the answers the Go control plane's thread (lifecycle.go) gives for a comm NCCL is not
 * calling. */
#ifndef MPIB_FAILOVER_H
#define MPIB_FAILOVER_H

#include "mpib.h"
#include "mpib_slots.h"

/* Takes rail r out of service: fenced and failed over to the other rail, or ridden through
 * when none is left, or the connection fails (MPIB_FAILOVER=0, or nothing to ride through on). */
ncclResult_t mpib_failover_rail_fail(struct mpib_comm *c, int r, const char *reason, const char *detail);
/* A completion of rail `rail` that came back in error. */
ncclResult_t mpib_failover_completion_error(struct mpib_comm *c, int rail, const struct ibv_wc *wc);
/* A probe write of a rebuilt rail completed. */
ncclResult_t mpib_failover_probe_done(struct mpib_comm *c, int r);
/* Each progress call, after the completions: the peer's records and notices, port and device
 * state, the recovery attempts, replays and control messages waiting for room. On a quiet
 * sender (mpib_failover_quiet) every 16th call is enough. */
ncclResult_t mpib_failover_tick(struct mpib_comm *c);

/* Whether a sender's tick has nothing to move, only a new fault to notice: every rail with
 * QPs in service, no control write or replay waiting, and, when `records` (the call polled a
 * completion), no fence record of a rail's generation arrived (either copy). Then noticing a
 * fault the completions do not report (a port going down) waits at most 15 progress calls,
 * microseconds while NCCL polls; the no-progress watch and the port events take milliseconds.
 * So does a record that arrived while the calls polled nothing: NCCL calls again while a
 * request is open. One that arrived by a call that polled a completion is never left for
 * later: a write of the fenced rail acknowledged after the control plane answered the record (a
 * dying device's responder places writes for a while) is confirmed only by the data path's
 * answer, and the call that polled its acknowledgement may be NCCL's last. A sender NCCL stops
 * calling needs no tick: a record that arrives then is answered by the control plane
 * (mpib_comm_answer_record) from acknowledgements that are all in. A receiver is never quiet: a
 * notice that arrives while a receive is open is the data path's to answer (the control plane
 * answers only an idle receiver), and the call that completes the last open receive may be the
 * last call NCCL makes. */
static inline int mpib_failover_quiet(struct mpib_comm *c, int records) {
  if (!c->is_send) return 0;
  for (int r = 0; r < MPIB_NRAILS; r++) {
    if (!c->nqps[r]) continue;
    if (c->rail[r].state != MPIB_RAIL_UP) return 0;
    if (!records) continue;
    const volatile struct mpib_fence_rec *rdma = mpib_fence_area(c, r), *tcp = &c->tcp_rec[r];
    uint32_t gen = c->rail[r].gen;
    if (rdma->fence_gen == gen || tcp->fence_gen == gen) return 0;
  }
  return !__atomic_load_n(&c->ctrl_out_n, __ATOMIC_RELAXED) && !c->ctrl_rdma_due && !c->replays_waiting;
}
/* Every 256th progress call: keepalives on idle rails of a comm NCCL keeps polling. */
ncclResult_t mpib_failover_keepalive_tick(struct mpib_comm *c);
/* Why a comm NCCL waits on can make no more progress (a dead device under a rail, a peer gone,
 * a stall past MPIB_STALL_TIMEOUT_MS), or ncclSuccess; mpib_p2p.c checks three loads in line
 * first (comm_health). */
ncclResult_t mpib_failover_health_check(struct mpib_comm *c);

/* Sender: a fence record that arrived over the control socket, answered from the control
 * plane's thread with the confirm of what this side's acknowledgements show delivered (the
 * data path answers too, when NCCL calls it; a receiver applies either). */
void mpib_comm_answer_record(struct mpib_comm *c, int rail, const void *rec);
/* The control plane's own message on the control socket (a standby rail's join), queued whole
 * behind what the data path queued and sent before it returns (up to about 2 s each for room
 * and for the send): 0, -ENOTCONN without a socket, -ENOBUFS when the queue could not take it
 * whole (nothing of it is sent), -EAGAIN when it could not all be sent. */
int mpib_comm_ctrl_send(struct mpib_comm *c, const void *msg, size_t len);
/* Receiver: a notice that arrived over the control socket. A FAIL while no receive is open is
 * answered from the control plane's thread with a fence record that says so (nothing of the
 * rail can be missing), so a sender waiting for it is not held until NCCL posts a receive. */
void mpib_comm_answer_notice(struct mpib_comm *c, int rail, uint64_t word);

#endif
