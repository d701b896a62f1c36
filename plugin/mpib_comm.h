/* Comm setup and teardown (mpib_comm.c): a connection's verbs resources built, brought up
 * against the peer's, given a path, a rail dropped, and the comm's end. Called by the Go
 * control plane: conn.go builds and connects comms, lifecycle.go hands them what arrived on
 * the control socket and closes them, listen.go closes the ones accept never took, sup.go
 * drops a rail the peer cannot reach, plugin.go sizes them. Comm setup's QP helpers, which
 * rail rebuild reuses, are mpib_qp.h's. Return 0 or -errno where they return int. */
#ifndef MPIB_COMM_H
#define MPIB_COMM_H

#include "mpib.h"
#include "mpib_slots.h"

/* Host memory one comm allocates (the verbs provider's queues come on top). */
size_t mpib_comm_host_bytes(int is_send);
/* A comm with its CQs, SRQs, QPs and buffers, not connected yet (NULL on failure, logged). */
struct mpib_comm *mpib_comm_create(const struct mpib_conn_params *p);
/* A receiver built before its peer was known (a listener's spare, SOUT only): its path sets
 * the CTS rail, and SUP's lanes and QPs are built now when the path wants them (p->nqps[SUP]
 * > 0; p's path, SUP port(s) and GID indexes). 0 or a negative errno; on failure the comm has
 * no SUP QPs, as before the call (its SUP lane fields may name the ports it tried: unused). */
int mpib_comm_set_path(struct mpib_comm *c, const struct mpib_conn_params *p);
/* What this side tells the peer in the handshake. */
void mpib_comm_local_info(struct mpib_comm *c, struct mpib_conn_info *info);
/* Brings the QPs up against the peer's (with failover, a rail that cannot come up while the
 * other did starts out of service instead of failing the connection). A standby rail either end
 * defers (params' defer_rails, the peer's info's deferred) stays DOWN until it joins. Returns 0,
 * a negative errno, or MPIB_CONNECT_JOIN_NOW: no rail came up but a standby rail waits, which
 * the handshake joins at once (mpib_comm_join_now on both ends). */
#define MPIB_CONNECT_JOIN_NOW 1
int mpib_comm_connect(struct mpib_comm *c, const struct mpib_conn_info *remote);

/* The standby rail's join (docs/failover.md, "The standby rail"). The sender builds the rail's
 * lanes and QPs (on failure nothing of them is left and the rail keeps waiting), sends their
 * mpib_join_info ('J'); the receiver stages it (mpib_comm_join_peer) and answers ('K'), which
 * the sender records (mpib_comm_join_peer with NULL). From then on the sender's recovery brings
 * the rail up like any rail out of service; or, in the handshake, mpib_comm_join_now on both
 * ends brings it up at once. The first three run on the control plane's threads while the data
 * path runs: they touch only the waiting rail, and publish with release (mpib_join_take). */
int mpib_comm_build_deferred(struct mpib_comm *c, int r);
void mpib_comm_join_info(const struct mpib_comm *c, int r, struct mpib_join_info *out);
int mpib_comm_join_peer(struct mpib_comm *c, int r, const struct mpib_join_info *in);
int mpib_comm_join_now(struct mpib_comm *c, int r);
/* Removes a rail the peer cannot reach (its QPs never leave INIT). */
void mpib_comm_drop_rail(struct mpib_comm *c, int rail);

/* The control socket (owned by Go), and what arrives on it for the data path: a notice word,
 * a fence record (sizeof(struct mpib_fence_rec) bytes) or a confirm record
 * (sizeof(struct mpib_confirm_rec) bytes) about a rail. Failover's answers from the control
 * plane's thread are mpib_failover.h's. */
void mpib_comm_set_ctrl_fd(struct mpib_comm *c, int fd);
void mpib_comm_tcp_notice(struct mpib_comm *c, int rail, uint64_t word);
void mpib_comm_tcp_record(struct mpib_comm *c, int rail, const void *rec);
void mpib_comm_tcp_confirm(struct mpib_comm *c, int rail, const void *rec);
/* The peer's control socket closed: waiting requests fail after a grace period. */
void mpib_comm_peer_gone(struct mpib_comm *c);
/* The peer said over the control socket that its side failed: waiting requests fail now. */
void mpib_comm_peer_failed(struct mpib_comm *c);

/* Frees everything the comm holds but its agent slot. */
void mpib_comm_destroy(struct mpib_comm *c);
/* How many comms exist (created, not destroyed yet), on any thread: the devices close only
 * when none does (lifecycle.go, closeDevicesIfUnused). */
int mpib_comms_alive(void);
/* The comm's end, and every close of a comm the control plane built goes here: its last
 * telemetry published and its agent slot released, then mpib_comm_destroy. Inline so that the
 * message path's tests and model checker, which link no verbs and bring their own
 * mpib_comm_destroy, close comms the same way. */
static inline void mpib_comm_close(struct mpib_comm *c) {
  if (!c) return;
  mpib_shm *shm = __atomic_load_n(&mpib_g.shm, __ATOMIC_ACQUIRE);
  if (c->shm_slot >= 0 && shm) {
    mpib_telemetry_flush(c);
    mpib_shm_release(shm, (uint32_t)c->shm_slot);
  }
  mpib_comm_destroy(c);
}

#endif
