/* NICs and the device table (mpib_device.c, which defines mpib_g): called by the Go control
 * plane (plugin.go at init, finalize, regMr and deregMr; conn.go for GID tables; sup.go for a
 * SUP port's state; agent.go for the segment), by comm setup and rail rebuild (GID entries).
 * NICs are named by their index in mpib_g.nic, fused devices by theirs in mpib_g.fdev. Return
 * 0 or -errno where they return int, unless said otherwise. */
#ifndef MPIB_DEVICE_H
#define MPIB_DEVICE_H

#include "mpib.h"

/* Opens a NIC's port (and has the async-event thread watch it) as mpib_g.nic[nic], serving `role`. */
int mpib_nic_open(int nic, int role, const char *name, int port, int pkey, int may_be_down);
/* Closes every open NIC (the event thread stopped first). */
void mpib_nic_close_all(void);
/* Whether an open NIC's verbs provider takes DMA-BUF registrations (1) or not (0). A fused
 * device registers a buffer on each of its NICs (mpib_reg_mr): it can take DMA-BUF only when
 * all of them can (props.go). */
int mpib_nic_dmabuf_supported(int nic);
/* How many connections a fused device can hold (for NCCL's maxComms), given QPs per connection. */
int mpib_max_comms(int dev, const uint32_t nqps[MPIB_NRAILS]);
/* Whether a NIC is an mlx5 Data Direct device (net_ib then forces flushes). */
int mpib_data_direct(int nic);
/* Whether a NIC's port is down (IBV_EVENT_PORT_ERR until IBV_EVENT_PORT_ACTIVE): sup.go leaves
 * a down SUP port out of a mesh's choice. */
int mpib_sup_port_down(int nic);
/* Whether the NIC's device died (IBV_EVENT_DEVICE_FATAL, or its event channel closed). */
int mpib_nic_dead(int nic);

/* One GID table entry of a NIC's port for the control plane's GID choice: 0, or -1 when the
 * entry is empty or unreadable. type is IBV_GID_TYPE_*. */
int mpib_gid_entry(int nic, int index, uint8_t gid[16], int *type);
/* The same for a NIC named by its struct (rail rebuild looks a lane's GID up again). */
int mpib_nic_gid_entry(const struct mpib_nic *d, int index, uint8_t gid[16], int *type);
int mpib_gid_table_len(int nic);
/* How many GID table changes the NIC has reported (IBV_EVENT_GID_CHANGE). */
uint32_t mpib_gid_gen(int nic);
/* The NIC's port's whole GID table, n = mpib_gid_table_len entries: gids[16*i], types[i]
 * (-1: empty or unreadable). One verbs call where the library has ibv_query_gid_table (a
 * connection burst at job start reads it once per NIC; rxe has 1024 entries, mostly empty). */
void mpib_gid_table_read(int nic, uint8_t *gids, int *types, int n);

/* Publishes the agent segment to the data path (NULL withdraws it). */
void mpib_set_shm(void *shm);

/* Memory registration on every NIC of fused device `dev` (fd >= 0: a DMA-BUF at offset). */
int mpib_reg_mr(int dev, void *data, size_t size, int fd, uint64_t offset, struct mpib_mr **out);
int mpib_dereg_mr(struct mpib_mr *mh);

#endif
