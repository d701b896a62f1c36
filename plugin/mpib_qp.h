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

#endif
