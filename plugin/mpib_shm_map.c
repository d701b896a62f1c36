/*
 * Validation (spec 6) and mapping of a hint segment file.
 * Callers: mpib_shm_watch.c maps each file that appears at the path; the C tests map files
 * and images (plugin/ctest/shm_decode.c). Offers what mpib_shm_map.h declares. A file is
 * checked before it is opened and again on the descriptor, and opened without ever waiting.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "mpib_shm_map.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void shm_err(char *err, size_t errlen, const char *fmt, ...) {
  if (err == NULL || errlen == 0) {
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ---- validation (spec 6) ---- */

int shm_check_image(const void *buf, size_t len, const char *what, char *err, size_t errlen) {
  if (len < SHM_HEADER_SIZE) {
    shm_err(err, errlen, "mpib shm %s: too_small: %zu bytes, a header needs %u", what, len, SHM_HEADER_SIZE);
    return -EINVAL;
  }
  struct shm_header h;
  memcpy(&h, buf, sizeof(h));
  if (memcmp(h.magic, SHM_MAGIC, 8) != 0) {
    shm_err(err, errlen, "mpib shm %s: bad_magic: not an MPIB hint segment", what);
    return -EPROTO;
  }
  if (h.version != MPIB_SHM_VERSION) {
    shm_err(err, errlen, "mpib shm %s: bad_version: format version %u, this reader implements %u%s", what, h.version,
            MPIB_SHM_VERSION,
            h.version < MPIB_SHM_VERSION ? " (a segment made by an older agent: re-create it with the current agent)"
                                         : " (a segment made by a newer agent: upgrade the plugin and agents)");
    return -EPROTONOSUPPORT;
  }
  if (h.header_size != SHM_HEADER_SIZE || h.slot_size != SHM_SLOT_SIZE || h.peer_size != SHM_PEER_SIZE ||
      h.nslots < 1 || h.nslots > SHM_MAX_SLOTS || h.npeers > SHM_MAX_PEERS ||
      h.total_size != shm_expected_size(h.nslots, h.npeers)) {
    shm_err(err, errlen,
            "mpib shm %s: bad_geometry: header_size=%u slot_size=%u peer_size=%u nslots=%u "
            "npeers=%u total_size=%llu",
            what, h.header_size, h.slot_size, h.peer_size, h.nslots, h.npeers, (unsigned long long)h.total_size);
    return -EINVAL;
  }
  if (len < h.total_size) {
    shm_err(err, errlen, "mpib shm %s: too_small: %zu bytes, the header declares %llu", what, len,
            (unsigned long long)h.total_size);
    return -EINVAL;
  }
  return 0;
}

/* Checks 2..4 on a file's status (from fstatat before the open, from fstat after it). */
static int shm_check_stat(const struct stat *st, const char *path, char *err, size_t errlen) {
  if (!S_ISREG(st->st_mode)) {
    shm_err(err, errlen, "mpib shm %s: not_regular: not a regular file", path);
    return -EINVAL;
  }
  if (st->st_uid != geteuid()) {
    shm_err(err, errlen, "mpib shm %s: bad_owner: owned by uid %u, this process runs as %u", path, (unsigned)st->st_uid,
            (unsigned)geteuid());
    return -EPERM;
  }
  /* Group or other access of any kind is refused: a readable segment shows every peer's
   * address and rates to other users, a writable one lets them steer the traffic. */
  if ((st->st_mode & 0077) != 0) {
    shm_err(err, errlen, "mpib shm %s: bad_mode: mode %04o grants group/other access (want 0600: chmod 600)", path,
            (unsigned)(st->st_mode & 07777));
    return -EPERM;
  }
  return 0;
}

/* Checks 1..4: the file itself. */
static int shm_check_file(int fd, const char *path, struct stat *st, char *err, size_t errlen) {
  if (fstat(fd, st) != 0) {
    int e = errno;
    shm_err(err, errlen, "mpib shm %s: io: fstat: %s", path, strerror(e));
    return -e;
  }
  return shm_check_stat(st, path, err, errlen);
}

/* Opens the segment file for reading and writing without ever waiting: O_NONBLOCK makes the
 * open of a file another process holds a lease on fail at once (EWOULDBLOCK) instead of
 * waiting up to the lease break time (45 s by default), and the file is checked (type, owner,
 * mode) before it is opened at all, so a device, a FIFO or another user's file is never
 * opened. The file checks run again on the descriptor (the path may change in between).
 * The descriptor or -errno. */
static int shm_open_file(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (fstatat(AT_FDCWD, path, &st, AT_SYMLINK_NOFOLLOW) != 0) {
    int e = errno;
    shm_err(err, errlen, "mpib shm %s: io: stat: %s", path, strerror(e));
    return -e;
  }
  if (S_ISLNK(st.st_mode)) {
    shm_err(err, errlen, "mpib shm %s: not_regular: a symbolic link (refused: O_NOFOLLOW)", path);
    return -ELOOP;
  }
  int rc = shm_check_stat(&st, path, err, errlen);
  if (rc != 0) {
    return rc;
  }
  int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP) {
      shm_err(err, errlen, "mpib shm %s: not_regular: a symbolic link (refused: O_NOFOLLOW)", path);
    } else if (e == EWOULDBLOCK) {
      shm_err(err, errlen,
              "mpib shm %s: io: open: another process holds a lease on the file (EWOULDBLOCK): "
              "not used (vanilla policy), tried again at every poll",
              path);
    } else {
      shm_err(err, errlen, "mpib shm %s: io: open: %s", path, strerror(e));
    }
    return -e;
  }
  return fd;
}

struct shm_map *shm_map_new(void *mem, size_t size, uint32_t nslots, uint32_t npeers) {
  struct shm_map *m = calloc(1, sizeof(*m));
  struct peer_cache *cache = calloc(nslots, sizeof(*cache));
  _Atomic uint64_t *held = calloc((nslots + 63) / 64, sizeof(*held));
  if (m == NULL || cache == NULL || held == NULL) {
    free(m);
    free(cache);
    free(held);
    return NULL;
  }
  m->held = held;
  m->hdr = mem;
  m->slots = (struct shm_slot *)((uint8_t *)mem + SHM_HEADER_SIZE);
  m->peers = (struct shm_rec *)((uint8_t *)mem + SHM_HEADER_SIZE + (size_t)nslots * SHM_SLOT_SIZE);
  m->map_size = size;
  m->nslots = nslots;
  m->npeers = npeers;
  m->cache = cache;
  m->fd = -1;
  for (uint32_t i = 0; i < nslots; i++) {
    atomic_init(&cache[i].tag, SHM_CACHE_UNPRIMED);
    atomic_init(&cache[i].idx, SHM_NO_PEER);
  }
  m->guard = -1;
  m->cursor = (uint32_t)(((uint64_t)getpid() * 31u) % nslots); /* spreads processes */
  atomic_init(&m->epoch_seen, atomic_load_explicit(&m->hdr->peers_epoch, memory_order_relaxed));
  atomic_init(&m->rescan_due, 0);
  return m;
}

int shm_map_file(const char *path, struct shm_map **out, struct stat *st_out, char *err, size_t errlen) {
  int fd = shm_open_file(path, err, errlen);
  if (fd < 0) {
    return fd;
  }
  struct stat st;
  int rc = shm_check_file(fd, path, &st, err, errlen);
  if (st_out != NULL) {
    *st_out = st;
  }
  if (rc != 0) {
    close(fd);
    return rc;
  }
  uint8_t head[SHM_HEADER_SIZE] = {0};
  size_t len = (size_t)st.st_size;
  if (len >= sizeof(head)) {
    ssize_t n = pread(fd, head, sizeof(head), 0);
    if (n < 0) {
      int e = errno;
      shm_err(err, errlen, "mpib shm %s: io: read: %s", path, strerror(e));
      close(fd);
      return -e;
    }
    len = (size_t)n < sizeof(head) ? (size_t)n : len; /* shrank under us: too_small */
  }
  rc = shm_check_image(head, len, path, err, errlen);
  if (rc != 0) {
    close(fd);
    return rc;
  }
  const struct shm_header *h = (const struct shm_header *)head;
  void *mem = mmap(NULL, (size_t)h->total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    int e = errno;
    shm_err(err, errlen, "mpib shm %s: io: mmap: %s", path, strerror(e));
    close(fd);
    return -e;
  }
  /* Guarded before its first access (shm_map_new reads the header): a file truncated from
   * here on faults into zero pages that the poll detaches, not into the process's death. */
  int guard = shm_guard_add(mem, (size_t)h->total_size);
  struct shm_map *m = shm_map_new(mem, (size_t)h->total_size, h->nslots, h->npeers);
  if (m == NULL) {
    shm_guard_remove(&guard);
    munmap(mem, (size_t)h->total_size);
    close(fd);
    shm_err(err, errlen, "mpib shm %s: io: out of memory", path);
    return -ENOMEM;
  }
  m->fd = fd;
  m->dev = st.st_dev;
  m->ino = st.st_ino;
  m->guard = guard;
  (void)shm_lock_byte(fd, SHM_LOCK_ATTACH, F_RDLCK); /* best effort: only agents' create reads it */
  *out = m;
  return 0;
}

void shm_map_free(struct shm_map *m) {
  shm_guard_remove(&m->guard);
  if (m->fd >= 0 || m->retired) {
    munmap(m->hdr, m->map_size);
  }
  if (m->fd >= 0) {
    close(m->fd);
  }
  free(m->cache);
  free(m->held);
  free(m);
}

void shm_map_retire(struct shm_map *m) {
  if (m->retired || m->fd < 0) {
    return;
  }
  mmap(m->hdr, m->map_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  close(m->fd); /* drops the attach lock and every slot lease of this handle */
  m->fd = -1;
  m->retired = 1;
}
