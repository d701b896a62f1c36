/*
 * OFD lock bytes (spec 5.7) and the SIGBUS guard (spec 5.9) of the hint segment.
 * Callers: mpib_shm_map.c (the attach lock, a guard per mapped file), mpib_shm_conn.c (slot
 * leases) and mpib_shm_watch.c (whether a mapping faulted). Offers what mpib_shm_guard.h
 * declares. The guard is process-wide state: one SIGBUS handler for every handle.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "mpib_shm_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SHM_MAX_GUARDS 256

/* ---- OFD locks (spec 5.7) ---- */

int shm_lock_byte(int fd, off_t off, short type) {
  if (fd < 0) {
    return 0;
  }
  struct flock lk;
  memset(&lk, 0, sizeof(lk));
  lk.l_type = type;
  lk.l_whence = SEEK_SET;
  lk.l_start = off;
  lk.l_len = 1;
  if (fcntl(fd, F_OFD_SETLK, &lk) != 0) {
    return errno == EACCES ? -EAGAIN : -errno;
  }
  return 0;
}

/* ---- SIGBUS guard (spec 5.9) ---- */

/* The guarded address ranges. The handler reads only this table, never a struct shm_map, so
 * that a handle closing on another thread cannot free what it reads. base 0: a free entry. */
static struct shm_guard {
  _Atomic uintptr_t base;
  _Atomic size_t size;
  _Atomic int faulted; /* the handler replaced the pages (the file was truncated) */
} g_guard[SHM_MAX_GUARDS];
static _Atomic int g_guard_running; /* handlers between their first and last table access */
static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_guard_installed;
static struct sigaction g_prev_bus;

static void shm_sigbus_chain(int sig, siginfo_t *si, void *uctx) {
  const struct sigaction *p = &g_prev_bus;
  if (p->sa_flags & SA_SIGINFO) {
    if (p->sa_sigaction != NULL) {
      p->sa_sigaction(sig, si, uctx);
      return;
    }
  } else if (p->sa_handler == SIG_IGN && si->si_code <= 0) {
    return; /* a sent SIGBUS the process ignores */
  } else if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN) {
    p->sa_handler(sig);
    return;
  }
  /* Default action: restore it; a fault then re-executes and takes it, a sent signal is
   * sent again. */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  if (si->si_code <= 0) {
    raise(sig);
  }
}

/* A truncated segment makes loads and stores beyond its new end raise SIGBUS. When the
 * faulting address is inside a mapping of ours, replace the whole mapping with anonymous zero
 * pages and return: the instruction re-executes on zeros (heartbeat 0: no hint). mmap is a
 * plain system call (async-signal-safe in practice on Linux/glibc). */
static void shm_sigbus(int sig, siginfo_t *si, void *uctx) {
  int saved = errno;
  int handled = 0;
  atomic_fetch_add(&g_guard_running, 1); /* seq_cst: shm_guard_remove waits for it */
  if (si != NULL && si->si_code > 0) {
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < SHM_MAX_GUARDS && !handled; i++) {
      struct shm_guard *g = &g_guard[i];
      uintptr_t base = atomic_load(&g->base);
      size_t size = atomic_load(&g->size);
      if (base == 0 || a - base >= size) {
        continue;
      }
      if (mmap((void *)base, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
          MAP_FAILED) {
        atomic_store_explicit(&g->faulted, 1, memory_order_release);
        handled = 1;
      }
    }
  }
  atomic_fetch_sub(&g_guard_running, 1);
  errno = saved;
  if (!handled) {
    shm_sigbus_chain(sig, si, uctx);
  }
}

int shm_guard_faulted(int guard) {
  return guard >= 0 && atomic_load_explicit(&g_guard[guard].faulted, memory_order_acquire);
}

int shm_guard_add(void *base, size_t size) {
  int idx = -1;
  pthread_mutex_lock(&g_guard_mu);
  if (!g_guard_installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = shm_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART; /* SA_ONSTACK: required beside Go */
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_prev_bus) == 0) {
      g_guard_installed = 1;
    }
  }
  for (int i = 0; i < SHM_MAX_GUARDS; i++) {
    struct shm_guard *g = &g_guard[i];
    if (atomic_load(&g->base) == 0) {
      atomic_store(&g->faulted, 0);
      atomic_store(&g->size, size);
      atomic_store(&g->base, (uintptr_t)base); /* last: publishes the entry */
      idx = i;
      break;
    }
  }
  pthread_mutex_unlock(&g_guard_mu);
  return idx;
}

void shm_guard_remove(int *guard) {
  if (*guard < 0) {
    return;
  }
  pthread_mutex_lock(&g_guard_mu);
  atomic_store(&g_guard[*guard].base, 0);
  while (atomic_load(&g_guard_running) != 0) {
    sched_yield(); /* a handler of another thread is between its loads and its mmap */
  }
  *guard = -1;
  pthread_mutex_unlock(&g_guard_mu);
}
