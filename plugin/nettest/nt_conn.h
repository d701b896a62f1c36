/*
 * conn.c: connection setup and teardown, and MPIB's handle as a TCP peer sees it (layer 3,
 * nettest.h).
 */
#ifndef MPIB_NT_CONN_H
#define MPIB_NT_CONN_H

#include <stdint.h>

#include "nettest.h"
#include "nt_net.h"
#include "nt_oob.h"

/* One connection pair: this side's listen comm and handle, the peer's handle, and the send
 * and recv comms once connect and accept returned them. */
struct nt_conn {
  void *lcomm, *scomm, *rcomm;
  uint8_t local_handle[NCCL_NET_HANDLE_MAXSIZE];
  uint8_t peer_handle[NCCL_NET_HANDLE_MAXSIZE];
};

int nt_setup_give_up(const struct nt_opts *o, struct nt_oob *oob, const struct nt_conn *c, double deadline, int *spins);
/* connect and accept, interleaved, until both returned a comm (--timeout-s, or the peer gave
 * up): 0, or -1 after saying why on stderr. An error of either call is fatal; after giving up
 * it still collects what the handshakes end with for half a second. Many runs at once
 * (--devs, --parallel) poll less often. */
int nt_establish(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
/* The same loop for the lifecycle and hostile modes: accept errors are counted in
 * *accept_errors and accept is called again (up to 64; NULL: the first is fatal); nothing is
 * collected after giving up, and the loop polls every 50 us. */
int nt_establish_counting(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c,
                          int *accept_errors);
/* closeSend, closeRecv, closeListen of what c holds (NCCL's order); -1 when one failed. */
int nt_teardown(struct nt_net *n, struct nt_conn *c);

/* ---- MPIB's handle: the listener's IPv4 address at bytes 8..11, its port at 12..13, its
 * nonce at 16..23; connect()'s own state at 24..39; the listener's MPIB_SUP_RELAY at byte 41,
 * bit 0 ---- */

/* MPIB's hello on its control socket (plugin/internal/wire/hello.go, version 5): "MPIL",
 * version u16, zeros, the listener's nonce (handle bytes 16..23) at 8, flags (bit 0: the
 * connector's MPIB_SUP_RELAY, which must equal the handle's byte 41 bit 0) at 16, the SUP pair
 * kind at 17 (0: none), zeros to the end (the pair count at 19 and the pairs). The hostile
 * modes send it as a peer would. */
#define NT_MPIB_HELLO_SIZE 64

struct sockaddr_in;
/* The listener address a handle names. */
void nt_handle_addr(const uint8_t *handle, struct sockaddr_in *sa);
/* One TCP client of a listener: a non-blocking connect given 200 ms (the listener's backlog
 * may be full); the fd, or -1. */
int nt_raw_connect(const struct sockaddr_in *sa);

#endif
