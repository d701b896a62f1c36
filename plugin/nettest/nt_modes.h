/*
 * The modes (layer 5, nettest.h): main.c calls them once the side channel is up and, except
 * for the scale modes, this side listened and the two handles were swapped (c->lcomm,
 * c->local_handle, c->peer_handle). Each returns the process's exit code (NT_EXIT_*) and
 * leaves what c still holds to main's teardown. docs/nettest.md describes each mode.
 */
#ifndef MPIB_NT_MODES_H
#define MPIB_NT_MODES_H

#include "nettest.h"
#include "nt_conn.h"
#include "nt_net.h"
#include "nt_oob.h"

/* modes.c: on the connection main established. */
int nt_mode_verify(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_bw(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_lat(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);

/* badinput.c: badhandle, garbage-peer. */
int nt_mode_badhandle(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_garbage(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);

/* lifecycle.c: finalize-during-handshake, abort-mid-transfer (both need --abi 11 or later:
 * finalize(ctx)), stray-client. A mode that calls finalize leaves n->finalized set. */
int nt_mode_finalize_hs(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_abort(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_stray(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);

/* hostile.c: listener-flood, forged-handle. */
int nt_mode_flood(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_forged(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);

/* silent.c: silent-hold, evict-race. */
int nt_mode_silent_hold(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);
int nt_mode_evict_race(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob, struct nt_conn *c);

/* scale.c: connect, resources; their own listeners, no main connection. */
int nt_mode_scale(struct nt_opts *o, struct nt_net *n, struct nt_oob *oob);

/* sniff.c: RoCE v2 TOS sniffer (--mode sniff, no plugin): whether the command line asks for
 * it, and its whole run (its own options; returns the exit code). */
int nt_sniff_wanted(int argc, char **argv);
int nt_sniff_main(int argc, char **argv);

#endif
