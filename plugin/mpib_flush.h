/* Receiver flush (mpib_flush.c): NCCL's iflush, which every ABI table (abi_v8.c .. abi_v12.c)
 * hands NCCL, and the message path's test() of a flush request. */
#ifndef MPIB_FLUSH_H
#define MPIB_FLUSH_H

#include "mpib.h"

/* iflush of the receives data[0..n): a flush request in *request, or NULL when none is needed
 * (flushes are off, or no rail wrote bytes of a receive completed since the last flush). */
ncclResult_t mpib_iflush(void *recvComm, int n, void **data, int *sizes, void **mhandles, void **request);
/* Polls the comm's flush completions and posts again what failed; sets req->done once every
 * read of the request completed successfully. ncclSuccess, or an error (with a message) when
 * the request can never order its bytes. */
ncclResult_t mpib_flush_test(struct mpib_comm *c, struct mpib_request *req);

#endif
