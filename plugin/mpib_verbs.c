/* Optional verbs resolved by version node at run time (see mpib_verbs.h for why and which),
 * and the GID and neighbour helpers built on them. Called by the NICs (mpib_device.c), comm
 * setup (mpib_comm.c), rail rebuild (mpib_rebuild.c) and the Go control plane (plugin.go loads
 * them at init); offers what mpib_verbs.h declares. */
#define _GNU_SOURCE /* dlvsym, RTLD_DEFAULT */
#include "mpib_verbs.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* One optional verb: the symbol and node to ask for, what the user loses without it, and the
 * address found (NULL when absent). Indices are the VERB_* values below. */
struct optional_verb {
  const char *name, *node, *feature;
  void *addr;
};

enum {
  VERB_REG_MR_IOVA2,
  VERB_REG_DMABUF_MR,
  VERB_QUERY_GID_EX,
  VERB_QUERY_GID_TABLE,
  VERB_QUERY_ECE,
  VERB_SET_ECE,
  NVERBS
};

static struct optional_verb verbs[NVERBS] = {
    [VERB_REG_MR_IOVA2] = {"ibv_reg_mr_iova2", "IBVERBS_1.8", "relaxed ordering", NULL},
    [VERB_REG_DMABUF_MR] = {"ibv_reg_dmabuf_mr", "IBVERBS_1.12", "DMA-BUF", NULL},
    /* ibv_query_gid_ex is a header inline; the library exports the sized form. */
    [VERB_QUERY_GID_EX] = {"_ibv_query_gid_ex", "IBVERBS_1.11", "GID type from verbs", NULL},
    [VERB_QUERY_GID_TABLE] = {"_ibv_query_gid_table", "IBVERBS_1.11", "GID table in one call", NULL},
    [VERB_QUERY_ECE] = {"ibv_query_ece", "IBVERBS_1.10", "ECE", NULL},
    [VERB_SET_ECE] = {"ibv_set_ece", "IBVERBS_1.10", "ECE", NULL},
};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static mpib_verbs_lookup_fn test_lookup;
static char missing[512];

typedef struct ibv_mr *(*reg_mr_iova2_fn)(struct ibv_pd *, void *, size_t, uint64_t, unsigned int);
typedef struct ibv_mr *(*reg_dmabuf_mr_fn)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
typedef int (*query_gid_ex_fn)(struct ibv_context *, uint32_t, uint32_t, struct ibv_gid_entry *, uint32_t, size_t);
typedef ssize_t (*query_gid_table_fn)(struct ibv_context *, struct ibv_gid_entry *, size_t, uint32_t, size_t);
typedef int (*ece_fn)(struct ibv_qp *, struct ibv_ece *);

/* Looks in the libibverbs our own NEEDED entry already mapped: NCCL dlopens the plugin
 * RTLD_LOCAL, so that copy may be outside the global scope RTLD_DEFAULT searches. RTLD_DEFAULT
 * is the fallback for a process that linked libibverbs itself under another name. */
static void resolve_from_libibverbs(void) {
  void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
  for (int i = 0; i < NVERBS; i++) {
    verbs[i].addr = h ? dlvsym(h, verbs[i].name, verbs[i].node) : NULL;
    if (!verbs[i].addr) verbs[i].addr = dlvsym(RTLD_DEFAULT, verbs[i].name, verbs[i].node);
  }
  /* The addresses stay valid after dlclose: our own NEEDED entry keeps the library mapped. */
  if (h) dlclose(h);
}

/* Builds the "name@NODE (feature), ..." list once, so the accessor never allocates. */
static void describe_missing(void) {
  size_t len = 0;
  missing[0] = '\0';
  for (int i = 0; i < NVERBS && len < sizeof missing; i++) {
    if (verbs[i].addr) continue;
    int n = snprintf(missing + len, sizeof missing - len, "%s%s@%s (%s)", len ? ", " : "", verbs[i].name, verbs[i].node,
                     verbs[i].feature);
    if (n < 0) break;
    len += (size_t)n;
  }
}

static void load(void) {
  if (test_lookup) {
    for (int i = 0; i < NVERBS; i++) verbs[i].addr = test_lookup(verbs[i].name, verbs[i].node);
  } else {
    resolve_from_libibverbs();
  }
  describe_missing();
}

void mpib_verbs_load(void) { pthread_once(&load_once, load); }

void mpib_verbs_use_lookup(mpib_verbs_lookup_fn lookup) { test_lookup = lookup; }

const char *mpib_verbs_missing(void) {
  mpib_verbs_load();
  return missing;
}

/* The address of verb i, or NULL with errno = EOPNOTSUPP so callers' errno checks see why. */
static void *verb(int i) {
  mpib_verbs_load();
  if (!verbs[i].addr) errno = EOPNOTSUPP;
  return verbs[i].addr;
}

struct ibv_mr *mpib_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access) {
  reg_mr_iova2_fn f = (reg_mr_iova2_fn)verb(VERB_REG_MR_IOVA2);
  return f ? f(pd, addr, length, iova, access) : NULL;
}

struct ibv_mr *mpib_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                      int access) {
  reg_dmabuf_mr_fn f = (reg_dmabuf_mr_fn)verb(VERB_REG_DMABUF_MR);
  return f ? f(pd, offset, length, iova, fd, access) : NULL;
}

int mpib_ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                          struct ibv_gid_entry *entry, uint32_t flags) {
  query_gid_ex_fn f = (query_gid_ex_fn)verb(VERB_QUERY_GID_EX);
  /* Passing our sizeof lets a newer library fill only the fields this build knows. */
  return f ? f(context, port_num, gid_index, entry, flags, sizeof *entry) : EOPNOTSUPP;
}

size_t mpib_gid_table_room(int tbl_len) {
  size_t most = UINT16_MAX / sizeof(struct ibv_gid_entry);
  size_t want = tbl_len > 0 ? 2 * (size_t)tbl_len : 0;
  return want < most ? want : most;
}

ssize_t mpib_ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries, size_t max_entries,
                                 uint32_t flags) {
  query_gid_table_fn f = (query_gid_table_fn)verb(VERB_QUERY_GID_TABLE);
  return f ? f(context, entries, max_entries, flags, sizeof *entries) : -EOPNOTSUPP;
}

int mpib_ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece) {
  ece_fn f = (ece_fn)verb(VERB_QUERY_ECE);
  return f ? f(qp, ece) : EOPNOTSUPP;
}

int mpib_ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece) {
  ece_fn f = (ece_fn)verb(VERB_SET_ECE);
  return f ? f(qp, ece) : EOPNOTSUPP;
}

struct ibv_mr *mpib_ibv_reg_mr_compat(struct ibv_pd *pd, void *addr, size_t length, int access) {
  mpib_verbs_load();
  if (verbs[VERB_REG_MR_IOVA2].addr)
    return mpib_ibv_reg_mr_iova2(pd, addr, length, (uint64_t)(uintptr_t)addr, (unsigned)access);
  /* The parentheses call the IBVERBS_1.1 function itself, not verbs.h's macro, which would
   * route a non-constant access through ibv_reg_mr_iova2 and bring back the 1.8 dependency. */
  return (ibv_reg_mr)(pd, addr, length, access & ~IBV_ACCESS_OPTIONAL_RANGE);
}

/* Reads a small sysfs attribute into buf (NUL-terminated); -1 when absent or unreadable
 * (the kernel fails the read of an empty GID entry's type). */
static int read_attr(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n < 0) return -1;
  buf[n] = '\0';
  return 0;
}

/* Compares sysfs text with want, ignoring the trailing newline/space the kernel appends. */
static int attr_is(const char *text, const char *want) {
  size_t n = strlen(want);
  if (strncmp(text, want, n) != 0) return 0;
  for (const char *p = text + n; *p; p++) {
    if (*p != '\n' && *p != ' ' && *p != '\t') return 0;
  }
  return 1;
}

int mpib_gid_type_parse(const char *text, int ethernet) {
  if (attr_is(text, "RoCE v2")) return IBV_GID_TYPE_ROCE_V2;
  /* The kernel names one type for both: it is RoCE v1 on Ethernet ports, IB otherwise. */
  if (attr_is(text, "IB/RoCE v1")) return ethernet ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_IB;
  return -1;
}

int mpib_gid_type_sysfs_at(const char *root, const char *devname, int port, int index) {
  /* A device name is one path component; anything else cannot be a real device. */
  if (!devname || !*devname || strchr(devname, '/') || strcmp(devname, "..") == 0) return -1;
  if (port < 0 || index < 0) return -1;
  char path[PATH_MAX], type[64], link[64];
  int n = snprintf(path, sizeof path, "%s/%s/ports/%d/gid_attrs/types/%d", root, devname, port, index);
  if (n < 0 || (size_t)n >= sizeof path || read_attr(path, type, sizeof type) != 0) return -1;
  n = snprintf(path, sizeof path, "%s/%s/ports/%d/link_layer", root, devname, port);
  int ethernet =
      n > 0 && (size_t)n < sizeof path && read_attr(path, link, sizeof link) == 0 && attr_is(link, "Ethernet");
  return mpib_gid_type_parse(type, ethernet);
}

int mpib_gid_type_sysfs(const char *devname, int port, int index) {
  return mpib_gid_type_sysfs_at("/sys/class/infiniband", devname, port, index);
}

/* Why warm the neighbour: the kernel resolves a RoCE peer's MAC inside ibv_modify_qp(RTR) and,
 * when the entry is not valid yet, waits for it; on rxe that wait lasts its whole 1 s timeout
 * (the ARP reply comes back before the wait is queued, so its wake-up is lost): 1 s on a first
 * connect to a peer and on every recovery after a link flap (which flushes the entry), spent
 * inside NCCL's progress thread for a recovery. */
int mpib_gid_peer_addr(const uint8_t gid[16], struct sockaddr_storage *out) {
  static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static const uint8_t zero[16];
  memset(out, 0, sizeof *out);
  if (memcmp(gid, v4_mapped, 12) == 0) {
    struct sockaddr_in *in = (struct sockaddr_in *)out;
    in->sin_family = AF_INET;
    in->sin_port = htons(9);
    memcpy(&in->sin_addr, gid + 12, 4);
    uint8_t first = gid[12];
    if (first == 0 || first >= 224) return 0; /* 0.x.x.x, multicast, reserved: nothing to resolve */
    return (int)sizeof *in;
  }
  if (memcmp(gid, zero, 16) == 0) return 0;
  if (gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80) return 0; /* link-local: the MAC is in the GID */
  if (gid[0] == 0xff) return 0;                            /* multicast */
  struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)out;
  in6->sin6_family = AF_INET6;
  in6->sin6_port = htons(9);
  memcpy(&in6->sin6_addr, gid, 16);
  return (int)sizeof *in6;
}

int mpib_neigh_warm(const uint8_t gid[16]) {
  struct sockaddr_storage addr;
  int len = mpib_gid_peer_addr(gid, &addr);
  if (len == 0) return 1;
  int fd = socket(addr.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int rc = sendto(fd, "", 0, MSG_DONTWAIT, (const struct sockaddr *)&addr, (socklen_t)len) < 0 ? -errno : 0;
  close(fd);
  return rc;
}
