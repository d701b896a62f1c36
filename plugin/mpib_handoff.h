/* Handshake results on their way to NCCL's calls (mpib_handoff.c; the types are mpib.h's,
 * with why connect() and accept() never wait for Go). The pending connect attempts: conn.go
 * arms, finishes and collects them, connect() (abi_common.c) polls them. The connect queue:
 * connect() enqueues, conn.go's dispatcher dequeues. A listen comm's finished handshakes:
 * listen.go creates, fills, closes and frees it, accept() (abi_common.c) pops them. */
#ifndef MPIB_HANDOFF_H
#define MPIB_HANDOFF_H

#include "mpib.h"

/* A free entry armed for a new attempt to the listener `handle` names: its index + 1 (0 when
 * the table is full) and, in *gen, its generation. */
uint32_t mpib_pending_acquire(const void *handle, uint32_t *gen);
/* The handshake of the attempt ended: comm (or NULL) and its ncclResult_t. */
void mpib_pending_finish(uint32_t idx1, uint32_t gen, struct mpib_comm *comm, int result);
/* Takes a finished attempt's result and frees its entry: 1, or 0 when it is still running,
 * was taken already or the entry moved on. */
int mpib_pending_take(uint32_t idx1, uint32_t gen, struct mpib_comm **comm, int *result);
/* connect()'s look at the handle: 1 while its handshake runs, 2 with the result taken (in
 * *comm and *result), 0 when the control plane must answer (no entry, a stale one, or one
 * armed for another listener's handle). */
int mpib_pending_poll(const void *handle, struct mpib_comm **comm, int *result);
/* 1 when a finished attempt's result was taken (the entry was freed or moved on). */
int mpib_pending_collected(uint32_t idx1, uint32_t gen);

/* The eventfd the dispatcher reads (created once; -1 when none could be). */
int mpib_connect_queue_open(void);
/* 1 when queued (the handle then names its pending entry), 0 when the control plane must be
 * called (no queue, or the pending table is full). */
int mpib_connect_enqueue(uint64_t ctx, int dev, int traffic_class, void *handle);
/* The oldest queued request: 1, or 0 when none. */
int mpib_connect_dequeue(struct mpib_connect_req *out);

/* A listen comm for the control plane's listener `id` (NULL when out of memory). */
struct mpib_listen_comm *mpib_listen_comm_new(uint64_t id);
void mpib_listen_comm_free(struct mpib_listen_comm *lc);
/* Queues a finished handshake (Go). 0, or -ENOMEM (the caller then closes the comm). */
int mpib_listen_push(struct mpib_listen_comm *lc, struct mpib_comm *comm, int result);
/* The control plane closed the listener: accept() fails from now on. */
void mpib_listen_close(struct mpib_listen_comm *lc);
/* Takes the oldest finished handshake: 1, or 0 when none is queued. */
int mpib_listen_pop(struct mpib_listen_comm *lc, struct mpib_comm **comm, int *result);
/* mpib_listen_pop for accept(): 0 also while another taker holds the queue (NCCL calls again). */
int mpib_listen_try_pop(struct mpib_listen_comm *lc, struct mpib_comm **comm, int *result);

#endif
