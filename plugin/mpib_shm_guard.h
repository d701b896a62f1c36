/* OFD lock bytes and the SIGBUS guard of the hint segment (mpib_shm_guard.c defines them; the
 * map, registration and watcher files call them). Return 0 or -errno where they return int. */
#ifndef MPIB_SHM_GUARD_H
#define MPIB_SHM_GUARD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mpib_shm_layout.h"

/* An OFD lock on one byte of fd (spec 5.7): type F_RDLCK/F_WRLCK takes it without waiting,
 * F_UNLCK drops it. -EAGAIN: another open file description holds it. fd < 0 (an image with
 * no file): 0, nothing done. */
MPIB_SHM_HIDDEN int shm_lock_byte(int fd, off_t off, short type);

/* The lock byte of a slot: its first byte in the file (spec 5.7). */
static inline off_t shm_slot_lock_off(uint32_t slot) { return (off_t)SHM_HEADER_SIZE + (off_t)slot * SHM_SLOT_SIZE; }

/* Guards [base, base + size), a MAP_SHARED mapping of a segment file (spec 5.9): a SIGBUS
 * inside it (the file was truncated) replaces the whole range with anonymous zero pages and
 * the faulting access re-executes on zeros. Installs the handler on first use, chaining to
 * the previous one for faults outside every guarded range. The guard's index, or -1 when the
 * table is full (the range then stays unguarded). */
MPIB_SHM_HIDDEN int shm_guard_add(void *base, size_t size);
/* Takes *guard's range out of the table before the caller unmaps it and sets *guard to -1:
 * once this returns, no handler still holds the range. *guard < 0: nothing. */
MPIB_SHM_HIDDEN void shm_guard_remove(int *guard);
/* 1 when the handler replaced guard's range (its file was truncated), else 0. */
MPIB_SHM_HIDDEN int shm_guard_faulted(int guard);

#endif
