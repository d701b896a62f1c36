/* Agent-side writers of the hint segment for the C tests (plugin/ctest/shm_agent.c defines
 * them): create a segment file, beat the heartbeat, set slot, class and peer hints, write a
 * raw slot record. Writers must be serialised by the caller (agents hold flock(LOCK_EX) on the
 * file; see the spec, section 5.5). Never in the plugin, which only reads hints. */
#ifndef MPIB_CTEST_SHM_AGENT_H
#define MPIB_CTEST_SHM_AGENT_H

#include <stddef.h>
#include <stdint.h>

#include "shm_decode.h"

/* A fresh segment at path (written beside it, then renamed over it): mode 0600, the header of
 * the geometry, everything else zero. 0 or -errno; err says why. */
int mpib_shm_create(const char *path, uint32_t nslots, uint32_t npeers, char *err, size_t errlen);
/* Stamps the heartbeat (CLOCK_MONOTONIC ns) and this process as the agent. */
void mpib_shm_heartbeat(mpib_shm *shm, uint64_t now_ns);
/* Clears every hint record (class, slot, peer) whose seq a dead writer left odd, then bumps
 * peers_epoch when a peer entry was one (spec 5.1, repair): how many, or -ERANGE. The peer
 * writer below repairs the entries its scan meets the same way. */
int mpib_shm_repair(mpib_shm *shm);
/* Writes r over the slot's hint record under the seqlock, as is: 0 or -ERANGE. */
int mpib_shm_write_slot_record(mpib_shm *shm, uint32_t slot, const mpib_shm_record *r);
/* valid = 0 clears. Values above 1024 are stored clamped; returns 1 when clamped, else 0,
 * or -errno (-ENOENT: slot not ACTIVE; -ESTALE: the slot's gen is not expect_gen;
 * -ERANGE: bad index; -ENOSPC: peer table full). */
int mpib_shm_set_slot_hint(mpib_shm *shm, uint32_t slot, uint32_t expect_gen, int valid, uint32_t sup_bw);
int mpib_shm_set_class_hint(mpib_shm *shm, int path_class, int valid, uint32_t sup_bw);
int mpib_shm_set_peer_hint(mpib_shm *shm, uint32_t peer_ip, uint8_t prefix_len, int valid, uint32_t sup_bw);

#endif
