/* The message path (mpib_p2p.c): NCCL's isend, irecv and test, which every ABI
 * table (abi_v8.c .. abi_v12.c, through mpib_api.h) hands NCCL directly or through a shim that
 * converts sizes. NCCL's iflush is mpib_flush.h's. */
#ifndef MPIB_P2P_H
#define MPIB_P2P_H

#include "mpib.h"

/* phandle(s): NCCL's profiler handles (v10+), NULL from older ABIs. */
ncclResult_t mpib_isend(void *sendComm, void *data, size_t size, int tag, void *mhandle, void *phandle, void **request);
ncclResult_t mpib_irecv(void *recvComm, int n, void **data, size_t *sizes, int *tags, void **mhandles, void **phandles,
                        void **request);
ncclResult_t mpib_test(void *request, int *done, int *sizes);

#endif
