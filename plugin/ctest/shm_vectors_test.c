//go:build ignore

// link: ../mpib_shm.c
/*
 * The C reader against testdata/shm (the vectors the Go and Python agents also read):
 * open/validate codes, geometry, every expected resolution; then the file checks
 * (mode, owner, type) and the register/read/telemetry API on a fresh segment.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../mpib_shm.h"

static int failures;

#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) {                                                \
      failures++;                                                 \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);        \
      fprintf(stderr, __VA_ARGS__);                               \
      fputc('\n', stderr);                                        \
    }                                                             \
  } while (0)

static const char *source_names[] = {"no_hint", "slot",     "peer", "class",
                                     "stale",   "inactive", "busy", "bad_slot"};

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf != NULL) {
    buf[n] = '\0';
    *len = (size_t)n;
  }
  return buf;
}

/* Minimal JSON field access for the generator's fixed layout: the value after "key": in
 * [s, end). Enough for flat objects; the vector files never nest the keys used here. */
static const char *json_val(const char *s, const char *end, const char *key) {
  char pat[64];
  snprintf(pat, sizeof(pat), "\"%s\":", key);
  const char *p = strstr(s, pat);
  if (p == NULL || p >= end) {
    return NULL;
  }
  p += strlen(pat);
  while (*p == ' ') {
    p++;
  }
  return p;
}

static uint64_t json_u64(const char *s, const char *end, const char *key) {
  const char *p = json_val(s, end, key);
  return p == NULL ? UINT64_MAX : strtoull(p, NULL, 10);
}

static int json_bool(const char *s, const char *end, const char *key) {
  const char *p = json_val(s, end, key);
  return p != NULL && strncmp(p, "true", 4) == 0;
}

static void json_str(const char *s, const char *end, const char *key, char *out, size_t n) {
  const char *p = json_val(s, end, key);
  out[0] = '\0';
  if (p == NULL || *p != '"') {
    return;
  }
  p++;
  size_t i = 0;
  while (*p != '"' && *p != '\0' && i + 1 < n) {
    out[i++] = *p++;
  }
  out[i] = '\0';
}

static int copy_private(const char *src, char *tmpl) {
  size_t len = 0;
  char *data = read_all(src, &len);
  int fd = mkstemp(tmpl);
  if (data == NULL || fd < 0) {
    free(data);
    return -1;
  }
  int ok = write(fd, data, len) == (ssize_t)len;
  close(fd);
  free(data);
  return ok ? 0 : -1;
}

static void check_reads(mpib_shm *shm, const char *js, const char *name) {
  const char *p = strstr(js, "\"reads\":");
  if (p == NULL) {
    return;
  }
  const char *stop = strchr(p, ']');
  int n = 0;
  while ((p = strchr(p, '{')) != NULL && p < stop) {
    const char *e = strchr(p, '}');
    uint64_t slot = json_u64(p, e, "slot");
    uint64_t now = json_u64(p, e, "now_ns");
    uint64_t stale = json_u64(p, e, "stale_ns");
    int applies = json_bool(p, e, "applies");
    uint64_t bw = json_u64(p, e, "sup_bw");
    int clamped = json_bool(p, e, "clamped");
    char src[32];
    json_str(p, e, "source", src, sizeof(src));
    mpib_shm_hint h;
    int got = mpib_shm_resolve(shm, (uint32_t)slot, now, stale, &h);
    const char *gs = h.source < 8 ? source_names[h.source] : "invalid";
    CHECK(got == applies && h.sup_bw == bw && strcmp(gs, src) == 0 && h.clamped == clamped,
          "%s read %d (slot %" PRIu64 " now %" PRIu64 "): expected applies=%d sup_bw=%" PRIu64
          " source=%s clamped=%d but got applies=%d sup_bw=%u source=%s clamped=%d",
          name, n, slot, now, applies, bw, src, clamped, got, h.sup_bw, gs, h.clamped);
    p = e;
    n++;
  }
}

static void check_vector(const char *dir, const char *json_name) {
  char path[4096], bin[4096], name[256];
  snprintf(name, sizeof(name), "%.*s", (int)(strlen(json_name) - 5), json_name);
  snprintf(path, sizeof(path), "%s/%s", dir, json_name);
  snprintf(bin, sizeof(bin), "%s/%s.bin", dir, name);
  size_t jlen = 0, blen = 0;
  char *js = read_all(path, &jlen);
  char *img = read_all(bin, &blen);
  CHECK(js != NULL && img != NULL, "%s: cannot read vector files", name);
  if (js == NULL || img == NULL) {
    free(js);
    free(img);
    return;
  }
  const char *end = js + jlen;
  char want[64], err[512];
  json_str(js, end, "error", want, sizeof(want));
  CHECK(blen == json_u64(js, end, "file_size"), "%s: file_size", name);

  int vrc = mpib_shm_validate(img, blen, err, sizeof(err));
  char tmp[] = "/tmp/mpib-shm-vecXXXXXX";
  CHECK(copy_private(bin, tmp) == 0, "%s: copy", name);
  mpib_shm *shm = NULL;
  int rc = mpib_shm_open(tmp, &shm, err, sizeof(err));
  if (want[0] == '\0') {
    CHECK(vrc == 0 && rc == 0, "%s: expected a valid segment but got %d/%d: %s", name, vrc, rc,
          err);
  } else {
    char code[80];
    snprintf(code, sizeof(code), ": %s:", want);
    CHECK(vrc < 0 && rc < 0 && strstr(err, code) != NULL,
          "%s: expected error %s but got %d/%d: %s", name, want, vrc, rc, err);
  }
  if (shm != NULL) {
    CHECK(mpib_shm_nslots(shm) == json_u64(js, end, "nslots"), "%s: nslots", name);
    check_reads(shm, js, name);
    mpib_shm_close(shm);
  }
  unlink(tmp);
  free(js);
  free(img);
}

static void test_vectors(const char *dir) {
  DIR *d = opendir(dir);
  CHECK(d != NULL, "open %s: %s", dir, strerror(errno));
  if (d == NULL) {
    return;
  }
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0) {
      check_vector(dir, e->d_name);
      n++;
    }
  }
  closedir(d);
  CHECK(n >= 10, "only %d vectors in %s", n, dir);
  printf("vectors: %d checked\n", n);
}

static void expect_open_error(const char *path, int want_rc, const char *code) {
  mpib_shm *shm = NULL;
  char err[512] = "";
  int rc = mpib_shm_open(path, &shm, err, sizeof(err));
  CHECK(rc == want_rc && shm == NULL && strstr(err, code) != NULL,
        "open %s: expected %d (%s) but got %d: %s", path, want_rc, code, rc, err);
  if (shm != NULL) {
    mpib_shm_close(shm);
  }
}

static void test_file_checks(const char *dir) {
  char bin[4096];
  snprintf(bin, sizeof(bin), "%s/basic.bin", dir);
  char tmp[] = "/tmp/mpib-shm-modeXXXXXX";
  CHECK(copy_private(bin, tmp) == 0, "copy basic.bin");
  chmod(tmp, 0666);
  expect_open_error(tmp, -EPERM, ": bad_mode:");
  chmod(tmp, 0620);
  expect_open_error(tmp, -EPERM, ": bad_mode:");
  chmod(tmp, 0644); /* group/world readable is fine */
  mpib_shm *shm = NULL;
  char err[512];
  CHECK(mpib_shm_open(tmp, &shm, err, sizeof(err)) == 0, "0644: %s", err);
  mpib_shm_close(shm);
  if (geteuid() == 0) {
    CHECK(chown(tmp, 65534, 65534) == 0, "chown");
    expect_open_error(tmp, -EPERM, ": bad_owner:");
  } else {
    printf("bad_owner: skipped (needs root to chown)\n");
  }
  unlink(tmp);
  char fifo[] = "/tmp/mpib-shm-fifoXXXXXX";
  int fd = mkstemp(fifo);
  close(fd);
  unlink(fifo);
  CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
  expect_open_error(fifo, -EINVAL, ": not_regular:");
  unlink(fifo);
  expect_open_error("/tmp", -EISDIR, ": io:");
  expect_open_error("/nonexistent/mpib-hints", -ENOENT, ": io:");
}

static uint64_t slot_u64(const char *path, uint32_t slot, unsigned off) {
  uint64_t v = 0;
  int fd = open(path, O_RDONLY);
  if (pread(fd, &v, sizeof(v), 256 + (off_t)slot * 256 + off) != (ssize_t)sizeof(v)) {
    v = UINT64_MAX;
  }
  close(fd);
  return v;
}

static void test_api(void) {
  char dir[] = "/tmp/mpib-shm-apiXXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char path[256], err[512];
  snprintf(path, sizeof(path), "%s/hints", dir);
  CHECK(mpib_shm_create(path, 4, 2, err, sizeof(err)) == 0, "create: %s", err);
  struct stat st;
  CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "created mode %o", st.st_mode);
  mpib_shm *shm = NULL;
  CHECK(mpib_shm_open(path, &shm, err, sizeof(err)) == 0, "open: %s", err);
  if (shm == NULL) {
    return;
  }
  mpib_conn_desc d = {.local_sout_ip = 0x0A000101, .peer_sout_ip = 0x0A000207,
                      .peer_island = 0x0A000200, .path_class = 1, .is_send = 1,
                      .nqps_sout = 2, .nqps_sup = 4, .conn_id = 1};
  uint32_t slots[4], extra;
  for (int i = 0; i < 4; i++) {
    d.conn_id = (uint64_t)i;
    CHECK(mpib_shm_register(shm, &d, &slots[i]) == 0, "register %d", i);
  }
  CHECK(mpib_shm_register(shm, &d, &extra) == -ENOSPC, "register into a full segment");
  mpib_shm_release(shm, slots[3]);
  CHECK(mpib_shm_register(shm, &d, &extra) == 0 && extra == slots[3], "re-register after release");

  uint32_t s = slots[0], bw = 77;
  uint64_t stale = mpib_shm_stale_ns_from_env();
  CHECK(stale == 500000000ull, "default stale %" PRIu64, stale);
  CHECK(mpib_shm_read_hint(shm, s, stale, &bw) == 0 && bw == 77, "no agent: no hint");
  mpib_shm_heartbeat(shm, mpib_shm_now_ns());
  CHECK(mpib_shm_read_hint(shm, s, stale, &bw) == 0, "agent, no hint set");
  CHECK(mpib_shm_set_class_hint(shm, 1, 1, 300) == 0, "class hint");
  CHECK(mpib_shm_read_hint(shm, s, stale, &bw) == 1 && bw == 300, "class: got %u", bw);
  CHECK(mpib_shm_set_peer_hint(shm, 0x0A000200, 24, 1, 400) == 0, "peer hint");
  CHECK(mpib_shm_read_hint(shm, s, stale, &bw) == 1 && bw == 400, "peer: got %u", bw);
  CHECK(mpib_shm_set_peer_hint(shm, 0x0A000207, 32, 1, 450) == 0, "peer hint /32");
  CHECK(mpib_shm_read_hint(shm, s, stale, &bw) == 1 && bw == 450, "peer /32: got %u", bw);
  CHECK(mpib_shm_set_peer_hint(shm, 0x0A000208, 32, 1, 1) == -ENOSPC, "peer table full");
  CHECK(mpib_shm_set_slot_hint(shm, s, 1, 5000) == 1, "slot hint clamped on write");
  CHECK(mpib_shm_read_hint(shm, s, stale, &bw) == 1 && bw == 1024, "slot: got %u", bw);
  CHECK(mpib_shm_set_slot_hint(shm, s, 1, 512) == 0, "slot hint");
  CHECK(mpib_shm_read_hint(shm, s, stale, &bw) == 1 && bw == 512, "slot: got %u", bw);
  CHECK(mpib_shm_read_hint(shm, slots[1], stale, &bw) == 1 && bw == 450, "other slot: peer");
  CHECK(mpib_shm_read_hint(shm, 4, stale, &bw) == 0, "slot out of range");
  CHECK(mpib_shm_set_slot_hint(shm, 9, 1, 1) == -ERANGE, "set out of range");

  /* A hint for an earlier registration never applies to the next one. */
  mpib_shm_release(shm, s);
  CHECK(mpib_shm_set_slot_hint(shm, s, 1, 1) == -ENOENT, "set on a free slot");
  uint32_t again;
  d.conn_id = 0;
  CHECK(mpib_shm_register(shm, &d, &again) == 0 && again == s, "re-register slot 0");
  CHECK(mpib_shm_read_hint(shm, s, stale, &bw) == 1 && bw == 450, "old slot hint ignored: %u", bw);

  mpib_shm_add_telemetry(shm, s, 0, 1000);
  mpib_shm_add_telemetry(shm, s, 1, 3000);
  mpib_shm_add_telemetry(shm, s, 1, 5000);
  mpib_shm_add_telemetry(shm, s, 2, 1);  /* bad rail: ignored */
  mpib_shm_add_telemetry(shm, 99, 0, 1); /* bad slot: ignored */
  CHECK(slot_u64(path, s, 128) == 1000 && slot_u64(path, s, 136) == 1, "sout telemetry");
  CHECK(slot_u64(path, s, 144) == 8000 && slot_u64(path, s, 152) == 2, "sup telemetry");
  CHECK(slot_u64(path, s, 160) == 1, "reads_applied %" PRIu64, slot_u64(path, s, 160));

  mpib_shm_heartbeat(shm, mpib_shm_now_ns() - 2 * stale);
  CHECK(mpib_shm_read_hint(shm, s, stale, &bw) == 0, "stale agent");
  CHECK(slot_u64(path, s, 176) == 1, "reads_stale %" PRIu64, slot_u64(path, s, 176));

  setenv("MPIB_AGENT_STALE_MS", "250", 1);
  CHECK(mpib_shm_stale_ns_from_env() == 250000000ull, "MPIB_AGENT_STALE_MS=250");
  setenv("MPIB_AGENT_STALE_MS", "bogus", 1);
  CHECK(mpib_shm_stale_ns_from_env() == 500000000ull, "bad MPIB_AGENT_STALE_MS");
  unsetenv("MPIB_SHM_PATH");
  CHECK(strcmp(mpib_shm_default_path(), "/dev/shm/mpib-hints") == 0, "default path");

  mpib_shm_close(shm);
  unlink(path);
  rmdir(dir);
}

int main(int argc, char **argv) {
  const char *dir = getenv("MPIB_SHM_VECTORS");
  if (dir == NULL) {
    dir = argc > 1 ? argv[1] : "../../testdata/shm";
  }
  test_vectors(dir);
  test_file_checks(dir);
  test_api();
  if (failures) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
