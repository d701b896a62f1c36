/* Receiver flush (mpib_flush.c): the message path's test() calls it for a flush request. */
#ifndef MPIB_FLUSH_H
#define MPIB_FLUSH_H

#include "mpib.h"

/* Polls the comm's flush completions and posts again what failed; sets req->done once every
 * read of the request completed successfully. ncclSuccess, or an error (with a message) when
 * the request can never order its bytes. */
ncclResult_t mpib_flush_test(struct mpib_comm *c, struct mpib_request *req);

#endif
