/*
 * The watcher of the hint segment's path (spec 5.8): mpib_shm_poll attaches the segment when
 * it appears, moves every connection to a file that replaces it, detaches a truncated one,
 * and gives slots to connections that wait for one, within a bounded budget per poll.
 * Caller: agent.go's watcher goroutine, every MPIB_SHM_POLL_MS (never the data path); the C
 * tests. Offers mpib_shm_poll (declared in mpib_shm.h). A file is opened and mapped without
 * the handle's locks held, so registrations and closes never wait for it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "mpib_shm_conn.h"
#include "mpib_shm_map.h"

__attribute__((format(printf, 4, 5))) static void shm_say(mpib_shm *shm, char *msg, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(shm->last_msg, sizeof(shm->last_msg), fmt, ap);
  va_end(ap);
  if (msg != NULL && len > 0) {
    snprintf(msg, len, "%s", shm->last_msg);
  }
}

static int shm_same_bad(const mpib_shm *shm, const struct stat *st) {
  return shm->bad_errno != 0 && !shm->bad_retry && st->st_dev == shm->bad_dev && st->st_ino == shm->bad_ino &&
         st->st_size == shm->bad_size && st->st_mtim.tv_sec == shm->bad_mtime.tv_sec &&
         st->st_mtim.tv_nsec == shm->bad_mtime.tv_nsec;
}

/* A segment truncated under us: the SIGBUS guard saw it, or the file is now shorter than
 * the mapping (no access faulted yet). */
static int shm_map_truncated(struct shm_map *m) {
  struct stat st;
  return m != NULL && m->fd >= 0 &&
         (shm_map_faulted(m) || (fstat(m->fd, &st) == 0 && (uint64_t)st.st_size < m->map_size));
}

/* Remembers the file st as refused (with err) until it changes (shm_same_bad). */
static void shm_refuse(mpib_shm *shm, int err, const struct stat *st) {
  shm->bad_retry = 0;
  shm->bad_errno = err;
  shm->bad_dev = st->st_dev;
  shm->bad_ino = st->st_ino;
  shm->bad_size = st->st_size;
  shm->bad_mtime = st->st_mtim;
}

/* Drops the truncated segment cur (under mu): every connection waits for the next one. */
static void shm_detach(mpib_shm *shm, struct shm_map *cur, char *msg, size_t msglen) {
  atomic_store_explicit(&shm->cur, 0, memory_order_release);
  for (uint32_t id = 0; id < shm->conn_hi; id++) {
    if (shm->conns[id].used && atomic_load_explicit(&shm->bind[id], memory_order_relaxed) != 0) {
      shm_unbind(shm, id);
      shm->unbound++;
    }
  }
  /* The truncated file stays at the path: remember it as refused until it changes. A file
   * that kept its size faulted for want of memory in its file system (a sparse file in a
   * full /dev/shm): said so, since "truncated" would send the operator looking for a writer. */
  struct stat tst;
  int full = fstat(cur->fd, &tst) == 0 && (uint64_t)tst.st_size >= cur->map_size;
  if (fstatat(AT_FDCWD, shm->path, &tst, AT_SYMLINK_NOFOLLOW) == 0 && tst.st_dev == cur->dev &&
      tst.st_ino == cur->ino) {
    shm_refuse(shm, EINVAL, &tst);
  }
  shm_map_retire(cur);
  shm_say(shm, msg, msglen, "agent segment %s %s: detached, vanilla policy until a valid segment appears", shm->path,
          full ? "could not be read although it kept its size (is its file system full? /dev/shm in a container is "
                 "64 MiB by default)"
               : "was truncated");
}

/* Gives slots of map index mi (the current one) to waiting connections within one budget,
 * taking the connections in turns from where the previous pass stopped (under claim_mu,
 * without mu). */
static void shm_bind_waiting(mpib_shm *shm, int mi, struct shm_budget *b) {
  uint32_t visited = 0;
  for (;;) {
    uint32_t ids[SHM_WAIT_BATCH], n = 0;
    pthread_mutex_lock(&shm->mu);
    uint32_t hi = shm->conn_hi;
    while (n < SHM_WAIT_BATCH && visited < hi && shm->unbound > 0) {
      uint32_t id = shm->wait_cursor < hi ? shm->wait_cursor : 0;
      shm->wait_cursor = id + 1;
      visited++;
      if (shm_waiting(shm, id)) {
        ids[n++] = id;
      }
    }
    pthread_mutex_unlock(&shm->mu);
    if (n == 0) {
      return;
    }
    for (uint32_t j = 0; j < n; j++) {
      int rc = shm_search(shm, mi, ids[j], b);
      if (rc == -EAGAIN || rc == -ENOSPC) {
        shm->wait_cursor = ids[j]; /* the next pass starts with the first one not served */
        return;
      }
    }
  }
}

/* Attaches m, a new segment mapped outside the locks, in place of the current one (under
 * claim_mu): every connection waits for a slot of m, one budgeted pass gives slots to them
 * (each leaves its old slot as it takes a new one), the rest leave their old slots and wait
 * for the next polls, and the old segment is retired. 0; 1 when that file is attached
 * already (another poll did it meanwhile); or -errno with the file st refused until it
 * changes. */
static int shm_attach(mpib_shm *shm, struct shm_map *m, const struct stat *st, char *msg, size_t msglen) {
  pthread_mutex_lock(&shm->mu);
  struct shm_map *cur = shm_cur(shm);
  if (cur != NULL && cur->dev == m->dev && cur->ino == m->ino) {
    pthread_mutex_unlock(&shm->mu);
    shm_map_free(m);
    return 1;
  }
  if (shm->nmaps >= SHM_MAX_MAPS) {
    shm_refuse(shm, ENOSPC, st);
    shm_say(shm, msg, msglen,
            "mpib shm %.300s: io: attached %d segments already, no more in this process (the "
            "limit of docs/shm-format.md 5.8): vanilla policy until it restarts",
            shm->path, SHM_MAX_MAPS);
    pthread_mutex_unlock(&shm->mu);
    shm_map_free(m);
    return -ENOSPC;
  }
  int mi = shm_add_map(shm, m);
  atomic_store_explicit(&shm->cur, mi, memory_order_release);
  shm->unbound = 0;
  for (uint32_t id = 0; id < shm->conn_hi; id++) {
    shm->unbound += shm->conns[id].used != 0;
  }
  pthread_mutex_unlock(&shm->mu);
  struct shm_budget b = {SHM_PASS_PROBES, SHM_PASS_LOCKS_POLL};
  shm_bind_waiting(shm, mi, &b);
  pthread_mutex_lock(&shm->mu);
  uint32_t used = 0;
  for (uint32_t id = 0; id < shm->conn_hi; id++) {
    if (shm->conns[id].used) {
      used++;
      if (shm_waiting(shm, id)) {
        shm_unbind(shm, id); /* its slot in the old segment; it stays waiting */
      }
    }
  }
  if (cur != NULL) {
    shm_map_retire(cur);
  }
  shm->bad_errno = 0;
  shm_say(shm, msg, msglen, "agent segment %s %s: %u connection(s) registered%s", shm->path,
          cur != NULL ? "replaced: re-attached" : "attached", (unsigned)(used - shm->unbound),
          shm->unbound ? " (some wait for a free slot)" : "");
  pthread_mutex_unlock(&shm->mu);
  return 0;
}

/* Records a file at the path that could not be opened or mapped (under mu). A file another
 * process holds a lease on is tried again at every poll (the lease may go without the file
 * changing), and said once; any other refusal holds until the file changes. 1 when said. */
static int shm_open_failed(mpib_shm *shm, int rc, const struct stat *st, const char *err, char *msg, size_t msglen) {
  if (rc == -EWOULDBLOCK) {
    int said =
        shm->bad_retry && shm->bad_errno == EWOULDBLOCK && shm->bad_dev == st->st_dev && shm->bad_ino == st->st_ino;
    shm_refuse(shm, EWOULDBLOCK, st);
    shm->bad_retry = 1;
    if (said) {
      return 0;
    }
  } else {
    shm_refuse(shm, -rc, st);
  }
  shm_say(shm, msg, msglen, "%s", err);
  return 1;
}

/* Step 1 and 2 of the poll (under claim_mu and mu): detaches a truncated segment, then looks
 * at the path. 1 when the file there (st) must be opened and attached, else 0; *ret says what
 * happened. */
static int shm_poll_look(mpib_shm *shm, struct stat *st, int *ret, char *msg, size_t msglen) {
  int ci = atomic_load_explicit(&shm->cur, memory_order_relaxed);
  struct shm_map *cur = ci > 0 ? atomic_load_explicit(&shm->maps[ci - 1], memory_order_relaxed) : NULL;
  /* 1. A truncated segment (seen by the guard, or by its size): detach. */
  if (shm_map_truncated(cur)) {
    shm_detach(shm, cur, msg, msglen);
    cur = NULL;
    *ret = MPIB_SHM_POLL_DETACHED;
  }
  /* 2. A different file at the path (or the first one): attach it. */
  int have = fstatat(AT_FDCWD, shm->path, st, AT_SYMLINK_NOFOLLOW) == 0;
  if (!have && cur == NULL && *ret == MPIB_SHM_POLL_NONE && shm->bad_errno != errno) {
    shm->bad_errno = errno;
    shm->bad_retry = 0;
    shm->bad_ino = 0;
    shm_say(shm, msg, msglen, "mpib shm %s: io: %s", shm->path, strerror(errno));
    *ret = MPIB_SHM_POLL_FAILED;
  }
  return have && (cur == NULL || st->st_dev != cur->dev || st->st_ino != cur->ino) && !shm_same_bad(shm, st);
}

int mpib_shm_poll(mpib_shm *shm, char *msg, size_t msglen) {
  if (msg != NULL && msglen > 0) {
    msg[0] = '\0';
  }
  if (shm == NULL || shm->path[0] == '\0') {
    return MPIB_SHM_POLL_NONE;
  }
  int ret = MPIB_SHM_POLL_NONE;
  struct stat st;
  pthread_mutex_lock(&shm->claim_mu);
  pthread_mutex_lock(&shm->mu);
  int attach = shm_poll_look(shm, &st, &ret, msg, msglen);
  int ci = atomic_load_explicit(&shm->cur, memory_order_relaxed);
  int waiting = !attach && ci != 0 && shm->unbound > 0;
  pthread_mutex_unlock(&shm->mu);
  if (waiting) {
    /* 3. Connections that found the segment full, or whose search ran out of its budget. */
    struct shm_budget b = {SHM_PASS_PROBES, SHM_PASS_LOCKS_POLL};
    shm_bind_waiting(shm, ci, &b);
  }
  pthread_mutex_unlock(&shm->claim_mu);
  if (!attach) {
    return ret;
  }
  /* Open, check and map the new file without the lock, so that registrations and closes never
   * wait for it (spec 5.8); the open itself never blocks (shm_open_file). */
  char err[384] = "";
  struct shm_map *m = NULL;
  int rc = shm_map_file(shm->path, &m, NULL, err, sizeof(err));
  pthread_mutex_lock(&shm->claim_mu);
  int said = 1;
  if (rc == 0) {
    rc = shm_attach(shm, m, &st, msg, msglen);
  } else {
    pthread_mutex_lock(&shm->mu);
    said = shm_open_failed(shm, rc, &st, err, msg, msglen);
    pthread_mutex_unlock(&shm->mu);
  }
  pthread_mutex_unlock(&shm->claim_mu);
  if (rc >= 0) {
    return rc == 0 ? MPIB_SHM_POLL_ATTACHED : ret;
  }
  return ret == MPIB_SHM_POLL_NONE && said ? MPIB_SHM_POLL_FAILED : ret;
}
