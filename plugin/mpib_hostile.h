/* The lab's attacking sender (mpib_hostile.c): the message path (mpib_p2p.c) calls it before it
 * posts a slot, in the hostile test build only (MPIB_HOSTILE_TEST); the plugin users load
 * declares and calls nothing of it. */
#ifndef MPIB_HOSTILE_H
#define MPIB_HOSTILE_H

#include "mpib.h"

#ifdef MPIB_HOSTILE_TEST
void mpib_hostile_before_post(struct mpib_comm *c, int slot, int nreqs, int size_in_imm);
#endif

#endif
