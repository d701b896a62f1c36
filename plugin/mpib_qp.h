/* Comm setup's QP helpers that rail rebuild reuses (mpib_comm.c defines them). Return 0 or
 * -errno where they return int. */
#ifndef MPIB_QP_H
#define MPIB_QP_H

#include "mpib.h"

/* INIT -> RTR -> RTS against a remote QP of the QP's lane; tc is this QP's traffic class. */
int mpib_qp_connect(struct mpib_comm *c, struct ibv_qp *qp, int lane, uint32_t rem_qpn,
                    const struct mpib_rail_info *rem, enum ibv_mtu mtu, uint8_t tc, uint32_t psn);
/* Responder access: data QPs take RDMA writes only, so a peer holding an rkey cannot read our
 * memory through them; the loopback flush QP serves its own RDMA reads. net_ib 2.30 grants its
 * connect side's QPs REMOTE_WRITE only, but its accept side's REMOTE_WRITE | REMOTE_ATOMIC |
 * REMOTE_READ, for GIN's gets and atomics; MPIB has no GIN, so it grants neither on purpose. */
#define MPIB_DATA_QP_ACCESS IBV_ACCESS_REMOTE_WRITE
#define MPIB_FLUSH_QP_ACCESS IBV_ACCESS_REMOTE_READ

/* A QP back to INIT through RESET (what it had queued is discarded), granting `access` to the
 * peer (MPIB_DATA_QP_ACCESS or MPIB_FLUSH_QP_ACCESS: what the QP was created with). */
int mpib_qp_reset_to_init(const struct mpib_comm *c, struct ibv_qp *qp, int lane, int access);
/* The lane's GID index again after its GID moved in the table (RoCE, a port flap): 0, or
 * -EADDRNOTAVAIL while the address is not back. */
int mpib_lane_gid_refresh(struct mpib_comm *c, int lane);
/* This lane's own address, as the peer would see it (for the loopback flush QP). */
void mpib_local_rail_info(const struct mpib_comm *c, int lane, struct mpib_rail_info *ri);
/* The class of the comm's QPs' packets (the receiver's may follow NCCL_IB_FIFO_TC). */
uint8_t mpib_qp_traffic_class(const struct mpib_comm *c);
/* Index of the rail's first QP in c->qps. */
int mpib_rail_base(const struct mpib_comm *c, int r);

/* Forces rail r's QPs into the error state, lane by lane: the NIC stops sending on them and
 * drops what arrives for them, and their outstanding work requests complete in error. A QP
 * whose own lane's device died is skipped (a dead device takes no command); every QP on a lane
 * that works is moved, so a striped rail with one dead port still takes nothing more through
 * the others (the fence's promise that replays rest on, and a rail that starts DOWN never
 * takes the peer's writes). 0 or the first failure's -errno. In line: comm setup (a degraded
 * start) and rail rebuild (the fence) both use it. */
static inline int mpib_rail_qps_to_error(struct mpib_comm *c, int r) {
  int first = 0, base = mpib_rail_base(c, r);
  for (uint32_t i = 0; i < c->nqps[r]; i++) {
    const struct mpib_qp *q = &c->qps[base + (int)i];
    if (q->qp == NULL || __atomic_load_n(&c->nic[q->lane]->fatal, __ATOMIC_ACQUIRE)) continue;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    int rc = ibv_modify_qp(q->qp, &a, IBV_QP_STATE);
    if (rc && !first) first = rc;
  }
  return -first;
}

#endif
