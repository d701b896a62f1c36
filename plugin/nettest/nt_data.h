/*
 * data.c: what the data modes share (layer 4, nettest.h).
 */
#ifndef MPIB_NT_DATA_H
#define MPIB_NT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "nettest.h"
#include "nt_conn.h"
#include "nt_net.h"
#include "nt_oob.h"
#include "nt_xfer.h"

#define NT_PAGE 4096

static inline size_t nt_round_page(size_t n) { return (n + NT_PAGE - 1) / NT_PAGE * NT_PAGE; }

/* Page-aligned host memory registered (regMr, NCCL_PTR_HOST) on the comm that uses it. */
struct nt_region {
  uint8_t *p;
  size_t len;
  void *comm;
  void *mh;
};

/* len rounded up to a page (at least one): 0, or -1 after saying why (nothing is left held). */
int nt_region_setup(struct nt_net *n, void *comm, size_t len, struct nt_region *r);
/* deregMr and unmap; -1 when deregMr failed. */
int nt_region_free(struct nt_net *n, struct nt_region *r);
/* The window that fits in --mem-limit (at least 1). Both sides compute the same value. */
int nt_plan_window(const struct nt_opts *o, size_t stride);
double nt_mbps(uint64_t bytes, double s); /* payload megabits (1e6 bits) per second */
/* The nettest-result line with mode=nt_mode_name(o->mode); extra ("" for none) ends it.
 * Returns the exit code the verdict gives. */
int nt_result_line(struct nt_opts *o, uint64_t msgs, uint64_t bytes, int verified, double secs, const char *extra);

/* The receiver tells the sender how the run looked from its side. */
struct nt_peer_result {
  int verified;
  uint64_t msgs, bytes, iters, mismatches;
  double seconds;
};
int nt_send_result(struct nt_oob *oob, const struct nt_peer_result *r);
int nt_recv_result(struct nt_oob *oob, int timeout_s, struct nt_peer_result *r);

/* verify on an established connection: the client sends --count or --bytes of random sizes,
 * the server receives and checks every byte; both print the nettest-result line. Returns the
 * exit code. */
int nt_verify_run(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
/* A mode's verified transfer on the connection it made: nt_verify_run with --count defaulting
 * to default_count and the line saying mode=verify, then the "done" barrier. */
int nt_verify_follow(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c,
                     uint64_t default_count);

#endif
