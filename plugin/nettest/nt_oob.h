/*
 * oob.c: the side channel, framed messages over one TCP socket (layer 2, nettest.h).
 */
#ifndef MPIB_NT_OOB_H
#define MPIB_NT_OOB_H

#include <stddef.h>
#include <stdint.h>

enum nt_msg {
  NT_MSG_HELLO = 1,  /* text: parameters that both sides must agree on */
  NT_MSG_HANDLE = 2, /* NCCL_NET_HANDLE_MAXSIZE bytes */
  NT_MSG_SYNC = 3,   /* text label: barrier */
  NT_MSG_STOP = 4,   /* u64 (big-endian): number of groups the receiver posted */
  NT_MSG_RESULT = 5, /* text: key=value results */
  NT_MSG_ABORT = 6,  /* text: why the peer gave up */
};

struct nt_oob {
  int fd;
  char peer_ip[64];
  int aborted; /* the peer sent ABORT or closed the socket */
};

int nt_oob_server(struct nt_oob *o, const char *addr, int timeout_s);
int nt_oob_client(struct nt_oob *o, const char *addr, int timeout_s);
int nt_oob_send(struct nt_oob *o, uint32_t type, const void *buf, uint32_t len);
int nt_oob_recv(struct nt_oob *o, uint32_t type, void *buf, uint32_t cap, uint32_t *len, int timeout_s);
int nt_oob_peek(struct nt_oob *o);
int nt_oob_sync(struct nt_oob *o, const char *label, int timeout_s);
void nt_oob_abort(struct nt_oob *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void nt_oob_close(struct nt_oob *o);
int nt_parse_hostport(const char *addr, char *host, size_t hostlen, char *port, size_t portlen);

#endif
