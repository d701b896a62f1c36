//go:build ignore
// link: ../mpib_verbs.c -libverbs -ldl

/* The optional-verbs loader (mpib_verbs.c): the real look-up against this host's libibverbs
 * (no RDMA device needed: the library loads without one), the degraded path when every verb is
 * absent (in a forked child, since the look-up runs once per process), and the sysfs GID-type
 * fallback against a fake sysfs tree. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../mpib_verbs.h"

static int failures;

#define EXPECT(cond, ...)                                  \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fputc('\n', stderr);                                 \
      failures++;                                          \
    }                                                      \
  } while (0)

/* The nodes the loader must ask for: the contract with old rdma-core (see mpib_verbs.h). */
static const char *const wanted[][2] = {
    {"ibv_reg_mr_iova2", "IBVERBS_1.8"}, {"ibv_reg_dmabuf_mr", "IBVERBS_1.12"}, {"_ibv_query_gid_ex", "IBVERBS_1.11"},
    {"ibv_query_ece", "IBVERBS_1.10"},   {"ibv_set_ece", "IBVERBS_1.10"},
};
#define NWANTED (sizeof wanted / sizeof wanted[0])

/* rdma-core 44 (Debian 12) has every node; an older host names what it lacks instead. */
static void test_real_lookup(void) {
  mpib_verbs_load();
  mpib_verbs_load(); /* idempotent */
  const char *missing = mpib_verbs_missing();
  EXPECT(missing != NULL, "mpib_verbs_missing returned NULL");
  printf("libibverbs lacks: \"%s\"\n", missing ? missing : "(null)");
  void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
  EXPECT(h != NULL, "libibverbs.so.1 is not loaded: %s", dlerror());
  for (size_t i = 0; h && i < NWANTED; i++) {
    int here = dlvsym(h, wanted[i][0], wanted[i][1]) != NULL;
    int reported = missing && strstr(missing, wanted[i][0]) != NULL;
    EXPECT(here != reported, "%s@%s: in library %d, reported missing %d", wanted[i][0], wanted[i][1], here, reported);
  }
  if (h) dlclose(h);
}

static int asked[NWANTED];

/* Records each request and finds nothing, as on an rdma-core older than every node. */
static void *lookup_nothing(const char *name, const char *version) {
  for (size_t i = 0; i < NWANTED; i++) {
    if (strcmp(name, wanted[i][0]) == 0 && strcmp(version, wanted[i][1]) == 0) asked[i]++;
  }
  return NULL;
}

static void expect_unsupported(const char *what, int ret, int want_ret) {
  EXPECT(ret == want_ret && errno == EOPNOTSUPP, "%s: ret %d errno %d", what, ret, errno);
}

/* Runs in a child: the wrappers must fail cleanly without touching their arguments. */
static int absent_child(void) {
  mpib_verbs_use_lookup(lookup_nothing);
  mpib_verbs_load();
  for (size_t i = 0; i < NWANTED; i++) {
    EXPECT(asked[i] == 1, "%s@%s asked %d times", wanted[i][0], wanted[i][1], asked[i]);
    char needle[64];
    snprintf(needle, sizeof needle, "%s@%s", wanted[i][0], wanted[i][1]);
    EXPECT(strstr(mpib_verbs_missing(), needle), "missing list lacks %s", needle);
  }
  errno = 0;
  expect_unsupported("reg_mr_iova2", mpib_ibv_reg_mr_iova2(NULL, NULL, 0, 0, 0) != NULL, 0);
  errno = 0;
  expect_unsupported("reg_dmabuf_mr", mpib_ibv_reg_dmabuf_mr(NULL, 0, 0, 0, -1, 0) != NULL, 0);
  errno = 0;
  expect_unsupported("query_gid_ex", mpib_ibv_query_gid_ex(NULL, 1, 0, NULL, 0), EOPNOTSUPP);
  errno = 0;
  expect_unsupported("query_ece", mpib_ibv_query_ece(NULL, NULL), EOPNOTSUPP);
  errno = 0;
  expect_unsupported("set_ece", mpib_ibv_set_ece(NULL, NULL), EOPNOTSUPP);
  printf("with no optional verbs: \"%s\"\n", mpib_verbs_missing());
  fflush(stdout);
  return failures ? 1 : 0;
}

static void test_absent(void) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(absent_child());
  int st = 0;
  EXPECT(pid > 0 && waitpid(pid, &st, 0) == pid, "fork/wait failed");
  EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "absent-verbs child failed (status %d)", st);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
}

/* One device of a fake /sys/class/infiniband: port 1 with the given link layer, GID types
 * 0 "IB/RoCE v1", 1 "RoCE v2" and 2 a text no kernel writes. */
static void make_port(const char *root, const char *dev, const char *link_layer) {
  char p[512];
  const char *dirs[] = {"", "/ports", "/ports/1", "/ports/1/gid_attrs", "/ports/1/gid_attrs/types"};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    snprintf(p, sizeof p, "%s/%s%s", root, dev, dirs[i]);
    mkdir(p, 0755);
  }
  snprintf(p, sizeof p, "%s/%s/ports/1/link_layer", root, dev);
  write_file(p, link_layer);
  snprintf(p, sizeof p, "%s/%s/ports/1/gid_attrs/types/0", root, dev);
  write_file(p, "IB/RoCE v1\n");
  snprintf(p, sizeof p, "%s/%s/ports/1/gid_attrs/types/1", root, dev);
  write_file(p, "RoCE v2\n");
  snprintf(p, sizeof p, "%s/%s/ports/1/gid_attrs/types/2", root, dev);
  write_file(p, "RoCE v3\n");
}

static void test_sysfs(void) {
  char root[] = "/tmp/mpib-sysfs-XXXXXX";
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    exit(2);
  }
  make_port(root, "roce0", "Ethernet\n");
  make_port(root, "ib0", "InfiniBand\n");
  EXPECT(mpib_gid_type_sysfs_at(root, "roce0", 1, 1) == IBV_GID_TYPE_ROCE_V2, "roce0 gid 1");
  EXPECT(mpib_gid_type_sysfs_at(root, "roce0", 1, 0) == IBV_GID_TYPE_ROCE_V1, "roce0 gid 0");
  EXPECT(mpib_gid_type_sysfs_at(root, "ib0", 1, 0) == IBV_GID_TYPE_IB, "ib0 gid 0");
  EXPECT(mpib_gid_type_sysfs_at(root, "roce0", 1, 2) == -1, "unknown type text");
  EXPECT(mpib_gid_type_sysfs_at(root, "roce0", 1, 7) == -1, "missing types file");
  EXPECT(mpib_gid_type_sysfs_at(root, "nodev", 1, 0) == -1, "missing device");
  EXPECT(mpib_gid_type_sysfs_at(root, "../roce0", 1, 1) == -1, "path in device name");
  EXPECT(mpib_gid_type_sysfs_at(root, "roce0", -1, 1) == -1, "negative port");
  EXPECT(mpib_gid_type_sysfs("mpib-no-such-device", 1, 0) == -1, "real sysfs, no device");
  EXPECT(mpib_gid_type_parse("RoCE v2", 1) == IBV_GID_TYPE_ROCE_V2, "no newline");
  EXPECT(mpib_gid_type_parse("RoCE v2x\n", 1) == -1, "suffix");
  EXPECT(mpib_gid_type_parse("", 0) == -1, "empty");
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", root);
}

/* The address whose neighbour entry the kernel resolves at RTR, per GID kind; and a datagram
 * to a real one (loopback) goes out without blocking. */
static void test_gid_peer_addr(void) {
  static const struct {
    const char *name;
    uint8_t gid[16];
    int family; /* 0: nothing to resolve */
    uint8_t addr[16];
  } cases[] = {
      {"RoCE v2 IPv4", {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 11}, AF_INET, {10, 0, 2, 11}},
      {"RoCE v2 IPv6 global",
       {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7},
       AF_INET6,
       {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7}},
      {"RoCE v1 link-local", {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55}, 0, {0}},
      {"zero", {0}, 0, {0}},
      {"IPv6 multicast", {0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 0, {0}},
      {"IPv4 0.0.0.0", {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0}, 0, {0}},
      {"IPv4 multicast", {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 1, 1}, 0, {0}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct sockaddr_storage ss;
    int len = mpib_gid_peer_addr(cases[i].gid, &ss);
    if (cases[i].family == 0) {
      EXPECT(len == 0, "%s: got an address (len %d), want none", cases[i].name, len);
      continue;
    }
    EXPECT(ss.ss_family == cases[i].family, "%s: family %d, want %d", cases[i].name, ss.ss_family, cases[i].family);
    if (cases[i].family == AF_INET) {
      struct sockaddr_in *in = (struct sockaddr_in *)&ss;
      EXPECT(len == (int)sizeof *in && memcmp(&in->sin_addr, cases[i].addr, 4) == 0 && ntohs(in->sin_port) == 9,
             "%s: wrong IPv4 address or port (len %d)", cases[i].name, len);
    } else {
      struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
      EXPECT(len == (int)sizeof *in6 && memcmp(&in6->sin6_addr, cases[i].addr, 16) == 0 && ntohs(in6->sin6_port) == 9,
             "%s: wrong IPv6 address or port (len %d)", cases[i].name, len);
    }
  }
  const uint8_t loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  EXPECT(mpib_neigh_warm(loopback) == 0, "a datagram to 127.0.0.1 was not sent");
  const uint8_t link_local[16] = {0xfe, 0x80};
  EXPECT(mpib_neigh_warm(link_local) == 1, "a link-local GID must send nothing");
}

/* The one-call GID table query's room: twice a port's table, within the 16-bit length of the
 * command's output attribute (2047 entries of 32 bytes). 2048 entries (rxe's 1024-entry table
 * doubled) make libibverbs refuse the call with EINVAL, leaving the entry-by-entry walk. */
static void test_gid_table_room(void) {
  EXPECT(sizeof(struct ibv_gid_entry) == 32, "ibv_gid_entry is %zu bytes", sizeof(struct ibv_gid_entry));
  static const struct {
    int tbl_len;
    size_t want;
  } cases[] = {{0, 0}, {-1, 0}, {1, 2}, {128, 256}, {255, 510}, {1023, 2046}, {1024, 2047}, {4096, 2047}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t got = mpib_gid_table_room(cases[i].tbl_len);
    EXPECT(got == cases[i].want, "room for a %d-entry table: %zu, want %zu", cases[i].tbl_len, got, cases[i].want);
    EXPECT(got * sizeof(struct ibv_gid_entry) <= UINT16_MAX, "room %zu overflows the attribute length", got);
  }
}

int main(void) {
  /* A direct use keeps libibverbs a real dependency even under --as-needed, as in the plugin. */
  printf("linked against libibverbs: %s\n", ibv_wc_status_str(IBV_WC_SUCCESS));
  test_absent(); /* first: the child must fork before this process has done its own look-up */
  test_real_lookup();
  test_sysfs();
  test_gid_peer_addr();
  test_gid_table_room();
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("verbs: all passed\n");
  return 0;
}
