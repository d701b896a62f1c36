//go:build ignore

// link: ../mpib_shm_*.c shm_agent.c shm_decode.c
/*
 * The C reader against testdata/shm (the vectors the Go and Python agents also read).
 * Expected values come from the vector files only: a small JSON parser reads NAME.json.
 *   - open/validate codes (file and in-memory image);
 *   - every decoded field (header, class defaults, peer entries, slots with descriptor, hint
 *     and telemetry) through the reader's decoders, and every entry the JSON does not list is
 *     all zero in the image;
 *   - the bytes: the JSON's values encoded by this file's own encoder (the spec's offsets)
 *     give NAME.bin byte for byte;
 *   - every expected resolution.
 * Then the file checks (mode, owner, type, symlink) and the register/read/telemetry/lease API
 * on a fresh segment.
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
#include "shm_agent.h"
#include "shm_decode.h"

#define SLOT 384 /* slot size (spec 4.3) */

#include "check.h"

static const char *source_names[] = {"no_hint", "slot", "peer", "class", "stale", "inactive", "busy", "bad_slot"};

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

/* ---- a small JSON parser (objects, arrays, strings without escapes beyond \" \\ \/, ----
 * ---- non-negative integers, true/false/null): enough for the generator's output     ---- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jv {
  jtype t;
  int b;        /* J_BOOL */
  uint64_t u;   /* J_NUM */
  char *s;      /* J_STR */
  size_t n;     /* J_ARR, J_OBJ: entries */
  char **keys;  /* J_OBJ */
  struct jv *v; /* J_ARR, J_OBJ */
} jv;

typedef struct {
  const char *p, *end;
  int err;
} jparser;

static void jskip(jparser *jp) {
  while (jp->p < jp->end && (*jp->p == ' ' || *jp->p == '\n' || *jp->p == '\r' || *jp->p == '\t')) {
    jp->p++;
  }
}

static char *jstring(jparser *jp) {
  if (jp->p >= jp->end || *jp->p != '"') {
    jp->err = 1;
    return NULL;
  }
  jp->p++;
  char *out = malloc((size_t)(jp->end - jp->p) + 1);
  size_t n = 0;
  while (jp->p < jp->end && *jp->p != '"') {
    if (*jp->p == '\\' && jp->p + 1 < jp->end) {
      jp->p++;
    }
    out[n++] = *jp->p++;
  }
  if (jp->p >= jp->end) {
    jp->err = 1;
  }
  jp->p++;
  out[n] = '\0';
  return out;
}

static void jparse(jparser *jp, jv *o) {
  memset(o, 0, sizeof(*o));
  jskip(jp);
  if (jp->p >= jp->end) {
    jp->err = 1;
    return;
  }
  char c = *jp->p;
  if (c == '{' || c == '[') {
    o->t = c == '{' ? J_OBJ : J_ARR;
    jp->p++;
    size_t cap = 0;
    for (;;) {
      jskip(jp);
      if (jp->p < jp->end && *jp->p == (c == '{' ? '}' : ']')) {
        jp->p++;
        return;
      }
      if (o->n == cap) {
        cap = cap ? 2 * cap : 8;
        o->v = realloc(o->v, cap * sizeof(jv));
        o->keys = realloc(o->keys, cap * sizeof(char *));
      }
      o->keys[o->n] = NULL;
      if (c == '{') {
        o->keys[o->n] = jstring(jp);
        jskip(jp);
        if (jp->p >= jp->end || *jp->p != ':') {
          jp->err = 1;
          o->n++;
          return;
        }
        jp->p++;
      }
      jparse(jp, &o->v[o->n++]);
      jskip(jp);
      if (jp->err || jp->p >= jp->end) {
        jp->err = 1;
        return;
      }
      if (*jp->p == ',') {
        jp->p++;
      }
    }
  }
  if (c == '"') {
    o->t = J_STR;
    o->s = jstring(jp);
  } else if (c >= '0' && c <= '9') {
    o->t = J_NUM;
    char *e;
    errno = 0;
    o->u = strtoull(jp->p, &e, 10);
    if (errno != 0 || *e == '.' || *e == 'e' || *e == 'E') {
      jp->err = 1; /* the vectors hold only integers that fit 64 bits */
    }
    jp->p = e;
  } else if (strncmp(jp->p, "true", 4) == 0 || strncmp(jp->p, "false", 5) == 0) {
    o->t = J_BOOL;
    o->b = c == 't';
    jp->p += o->b ? 4 : 5;
  } else if (strncmp(jp->p, "null", 4) == 0) {
    o->t = J_NULL;
    jp->p += 4;
  } else {
    jp->err = 1;
  }
}

static void jfree(jv *o) {
  for (size_t i = 0; i < o->n; i++) {
    jfree(&o->v[i]);
    if (o->keys != NULL) {
      free(o->keys[i]);
    }
  }
  free(o->v);
  free(o->keys);
  free(o->s);
}

static const jv *jget(const jv *o, const char *key) {
  if (o == NULL || o->t != J_OBJ) {
    return NULL;
  }
  for (size_t i = 0; i < o->n; i++) {
    if (strcmp(o->keys[i], key) == 0) {
      return &o->v[i];
    }
  }
  return NULL;
}

static int jmissing;

static uint64_t ju(const jv *o, const char *key) {
  const jv *v = jget(o, key);
  if (v == NULL || (v->t != J_NUM && v->t != J_BOOL)) {
    jmissing++;
    fprintf(stderr, "vector: no number \"%s\"\n", key);
    return UINT64_MAX;
  }
  return v->t == J_BOOL ? (uint64_t)v->b : v->u;
}

static const char *js(const jv *o, const char *key) {
  const jv *v = jget(o, key);
  if (v == NULL || v->t != J_STR) {
    jmissing++;
    fprintf(stderr, "vector: no string \"%s\"\n", key);
    return "";
  }
  return v->s;
}

/* "10.0.2.7" -> 0x0A000207 (host order value, as the segment stores it). */
static uint32_t jip(const jv *o, const char *key) {
  unsigned a, b, c, d;
  if (sscanf(js(o, key), "%u.%u.%u.%u", &a, &b, &c, &d) != 4 || a > 255 || b > 255 || c > 255 || d > 255) {
    jmissing++;
    return 0;
  }
  return a << 24 | b << 16 | c << 8 | d;
}

/* "up", "down", "failed", "unknown(N)" -> the slot's u8 rail state (spec 4.3). */
static uint8_t jrail(const jv *o, const char *key) {
  const char *s = js(o, key);
  unsigned n;
  char tail;
  if (strcmp(s, "up") == 0) {
    return 0;
  }
  if (strcmp(s, "down") == 0) {
    return 1;
  }
  if (strcmp(s, "failed") == 0) {
    return 2;
  }
  if (sscanf(s, "unknown(%u%c", &n, &tail) == 2 && tail == ')' && n > 2 && n <= 255) {
    return (uint8_t)n;
  }
  jmissing++;
  return 0;
}

/* ---- this file's own encoder: the spec's offsets (docs/shm-format.md, section 4) ---- */

static void put(uint8_t *img, size_t off, uint64_t v, int size) {
  for (int i = 0; i < size; i++) {
    img[off + (size_t)i] = (uint8_t)(v >> (8 * i));
  }
}

static void enc_record(uint8_t *img, size_t off, const jv *r) {
  put(img, off + 0, ju(r, "seq"), 4);
  put(img, off + 4, ju(r, "sup_bw"), 4);
  put(img, off + 8, ju(r, "flags"), 4);
  put(img, off + 12, ju(r, "gen"), 4);
  put(img, off + 16, ju(r, "set_ns"), 8);
  put(img, off + 24, jip(r, "peer_ip"), 4);
  put(img, off + 28, ju(r, "prefix_len"), 1);
}

/* A NIC name field (spec 4.3): the name cut to 23 bytes, NUL-padded to 24. */
static void enc_nic_name(uint8_t *img, size_t off, const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i < MPIB_SHM_NIC_NAME; i++) {
    img[off + i] = i < n && i < MPIB_SHM_NIC_NAME - 1 ? (uint8_t)name[i] : 0;
  }
}

/* Whether a decoded NIC name field holds name the way the spec writes it. */
static int nic_name_is(const char field[MPIB_SHM_NIC_NAME], const char *name) {
  uint8_t want[MPIB_SHM_NIC_NAME];
  enc_nic_name(want, 0, name);
  return memcmp(field, want, MPIB_SHM_NIC_NAME) == 0;
}

static uint8_t *encode(const jv *seg, size_t *len) {
  const jv *h = jget(seg, "header");
  uint64_t nslots = ju(h, "nslots"), npeers = ju(h, "npeers");
  size_t size = 256 + (size_t)nslots * SLOT + (size_t)npeers * 64;
  uint8_t *img = calloc(1, size);
  memcpy(img, "MPIBHINT", 8);
  put(img, 8, ju(h, "version"), 4);
  put(img, 12, 256, 4);
  put(img, 16, ju(h, "total_size"), 8);
  put(img, 24, nslots, 4);
  put(img, 28, SLOT, 4);
  put(img, 32, npeers, 4);
  put(img, 36, 64, 4);
  put(img, 40, ju(h, "flags"), 4);
  put(img, 64, ju(h, "heartbeat_ns"), 8);
  put(img, 72, ju(h, "agent_pid"), 4);
  put(img, 76, ju(h, "peers_epoch"), 4);
  put(img, 80, ju(h, "created_ns"), 8);
  const jv *cls = jget(seg, "class_defaults");
  for (size_t c = 0; cls != NULL && c < cls->n && c < 2; c++) {
    enc_record(img, 128 + c * 64, &cls->v[c]);
  }
  const jv *peers = jget(seg, "peers");
  for (size_t i = 0; peers != NULL && i < peers->n; i++) {
    enc_record(img, 256 + (size_t)nslots * SLOT + ju(&peers->v[i], "index") * 64, jget(&peers->v[i], "record"));
  }
  const jv *slots = jget(seg, "slots");
  for (size_t i = 0; slots != NULL && i < slots->n; i++) {
    const jv *s = &slots->v[i], *t = jget(s, "telemetry");
    size_t off = 256 + ju(s, "index") * SLOT;
    put(img, off + 0, ju(s, "state") | ju(s, "owner_pid") << 32, 8);
    put(img, off + 8, ju(s, "gen"), 4);
    put(img, off + 16, ju(s, "conn_id"), 8);
    put(img, off + 24, jip(s, "local_sout_ip"), 4);
    put(img, off + 28, jip(s, "peer_sout_ip"), 4);
    put(img, off + 32, jip(s, "peer_island"), 4);
    put(img, off + 36, ju(s, "path_class"), 1);
    put(img, off + 37, ju(s, "is_send"), 1);
    put(img, off + 38, ju(s, "nqps_sout"), 2);
    put(img, off + 40, ju(s, "nqps_sup"), 2);
    put(img, off + 44, ju(s, "pid"), 4);
    put(img, off + 48, ju(s, "registered_ns"), 8);
    put(img, off + 42, ju(s, "dev"), 2);
    put(img, off + 56, ju(s, "sout_port"), 1);
    put(img, off + 57, ju(s, "sup_port"), 1);
    put(img, off + 58, ju(s, "sup_path"), 1);
    enc_nic_name(img, off + 336, js(s, "sout_nic"));
    enc_nic_name(img, off + 360, js(s, "sup_nic"));
    enc_record(img, off + 64, jget(s, "hint"));
    static const struct {
      const char *name;
      unsigned off, size;
    } tel[] = {{"sout_bytes", 128, 8},
               {"sout_requests", 136, 8},
               {"sup_bytes", 144, 8},
               {"sup_requests", 152, 8},
               {"reads_applied", 160, 8},
               {"reads_fallback", 168, 8},
               {"reads_stale", 176, 8},
               {"clamped", 184, 8},
               {"last_sup_bw", 192, 4},
               {"last_source", 196, 4},
               {"last_read_ns", 200, 8},
               {"failovers", 212, 4},
               {"sout_state_ns", 216, 8},
               {"sup_state_ns", 224, 8},
               {"applied_sup_bw", 232, 4},
               {"recoveries", 236, 4},
               {"flush_wall_ns", 240, 8},
               {"sout_completed_bytes", 256, 8},
               {"sout_completed_requests", 264, 8},
               {"sout_inflight_bytes", 272, 8},
               {"sout_busy_ns", 280, 8},
               {"sup_completed_bytes", 288, 8},
               {"sup_completed_requests", 296, 8},
               {"sup_inflight_bytes", 304, 8},
               {"sup_busy_ns", 312, 8},
               {"sout_active_ns", 320, 8},
               {"sup_active_ns", 328, 8}};
    for (size_t k = 0; k < sizeof(tel) / sizeof(tel[0]); k++) {
      put(img, off + tel[k].off, ju(t, tel[k].name), (int)tel[k].size);
    }
    put(img, off + 208, jrail(t, "sout_state"), 1);
    put(img, off + 209, jrail(t, "sup_state"), 1);
  }
  *len = size;
  return img;
}

/* ---- decoded fields against the JSON ---- */

static void check_record(const mpib_shm_record *r, const jv *want, const char *what, const char *name) {
  CHECK(r->seq == ju(want, "seq") && r->sup_bw == ju(want, "sup_bw") && r->flags == ju(want, "flags") &&
            r->gen == ju(want, "gen") && r->set_ns == ju(want, "set_ns") && r->peer_ip == jip(want, "peer_ip") &&
            r->prefix_len == ju(want, "prefix_len"),
        "%s %s: decoded seq=%u sup_bw=%u flags=%#x gen=%u set_ns=%" PRIu64
        " peer_ip=%#x prefix_len=%u differ from the vector",
        name, what, r->seq, r->sup_bw, r->flags, r->gen, r->set_ns, r->peer_ip, r->prefix_len);
}

static int all_zero(const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (b[i] != 0) {
      return 0;
    }
  }
  return 1;
}

/* The rail states and the version 3 completion telemetry of a decoded slot. */
static void check_rails(const mpib_shm_slot_info *s, const jv *t, const char *name, uint32_t i) {
  static const char *rail[2] = {"sout", "sup"};
  char k[64];
  for (int r = 0; r < 2; r++) {
#define TEL(field) (snprintf(k, sizeof k, "%s_" field, rail[r]), ju(t, k))
    CHECK(s->completed_bytes[r] == TEL("completed_bytes") && s->completed_requests[r] == TEL("completed_requests") &&
              s->inflight_bytes[r] == TEL("inflight_bytes") && s->busy_ns[r] == TEL("busy_ns") &&
              s->active_ns[r] == TEL("active_ns") && s->rail_state_ns[r] == TEL("state_ns"),
          "%s: slot %u %s completion telemetry differs from the vector", name, i, rail[r]);
#undef TEL
  }
  CHECK(s->rail_state[0] == jrail(t, "sout_state") && s->rail_state[1] == jrail(t, "sup_state") &&
            s->failovers == ju(t, "failovers") && s->recoveries == ju(t, "recoveries") &&
            s->applied_sup_bw == ju(t, "applied_sup_bw") && s->flush_wall_ns == ju(t, "flush_wall_ns"),
        "%s: slot %u rail states, applied split or flush time differ from the vector", name, i);
}

static void check_fields(mpib_shm *shm, const uint8_t *img, const jv *seg, const char *name) {
  mpib_shm_header_info h;
  const jv *wh = jget(seg, "header");
  CHECK(mpib_shm_decode_header(shm, &h) == 0, "%s: decode header", name);
  CHECK(h.version == ju(wh, "version") && h.total_size == ju(wh, "total_size") && h.nslots == ju(wh, "nslots") &&
            h.npeers == ju(wh, "npeers") && h.flags == ju(wh, "flags") && h.heartbeat_ns == ju(wh, "heartbeat_ns") &&
            h.agent_pid == ju(wh, "agent_pid") && h.peers_epoch == ju(wh, "peers_epoch") &&
            h.created_ns == ju(wh, "created_ns"),
        "%s: header fields differ from the vector", name);
  CHECK(mpib_shm_nslots(shm) == h.nslots, "%s: nslots", name);
  const jv *cls = jget(seg, "class_defaults");
  CHECK(cls != NULL && cls->t == J_ARR && cls->n == 2, "%s: class_defaults", name);
  for (uint32_t c = 0; cls != NULL && c < 2 && c < cls->n; c++) {
    mpib_shm_record r;
    CHECK(mpib_shm_raw_record(shm, MPIB_SHM_REC_CLASS, c, &r) == 0, "%s: class %u", name, c);
    char what[32];
    snprintf(what, sizeof(what), "class[%u]", c);
    check_record(&r, &cls->v[c], what, name);
  }
  const jv *peers = jget(seg, "peers");
  size_t listed = 0;
  for (uint32_t j = 0; j < h.npeers; j++) {
    const jv *want = NULL;
    for (size_t k = 0; peers != NULL && k < peers->n; k++) {
      if (ju(&peers->v[k], "index") == j) {
        want = jget(&peers->v[k], "record");
      }
    }
    if (want == NULL) {
      CHECK(all_zero(img + 256 + (size_t)h.nslots * SLOT + (size_t)j * 64, 64),
            "%s: peer %u is not listed but not zero", name, j);
      continue;
    }
    listed++;
    mpib_shm_record r;
    CHECK(mpib_shm_raw_record(shm, MPIB_SHM_REC_PEER, j, &r) == 0, "%s: peer %u", name, j);
    char what[32];
    snprintf(what, sizeof(what), "peer[%u]", j);
    check_record(&r, want, what, name);
  }
  CHECK(peers != NULL && listed == peers->n, "%s: peers listed beyond npeers", name);
  const jv *slots = jget(seg, "slots");
  listed = 0;
  for (uint32_t i = 0; i < h.nslots; i++) {
    const jv *w = NULL;
    for (size_t k = 0; slots != NULL && k < slots->n; k++) {
      if (ju(&slots->v[k], "index") == i) {
        w = &slots->v[k];
      }
    }
    if (w == NULL) {
      CHECK(all_zero(img + 256 + (size_t)i * SLOT, SLOT), "%s: slot %u is not listed but not zero", name, i);
      continue;
    }
    listed++;
    mpib_shm_slot_info s;
    CHECK(mpib_shm_decode_slot(shm, i, &s) == 0, "%s: decode slot %u", name, i);
    const jv *t = jget(w, "telemetry");
    CHECK(s.state == ju(w, "state") && s.owner_pid == ju(w, "owner_pid") && s.gen == ju(w, "gen") &&
              s.conn_id == ju(w, "conn_id") && s.local_sout_ip == jip(w, "local_sout_ip") &&
              s.peer_sout_ip == jip(w, "peer_sout_ip") && s.peer_island == jip(w, "peer_island") &&
              s.path_class == ju(w, "path_class") && s.is_send == ju(w, "is_send") &&
              s.nqps_sout == ju(w, "nqps_sout") && s.nqps_sup == ju(w, "nqps_sup") && s.pid == ju(w, "pid") &&
              s.registered_ns == ju(w, "registered_ns") && s.dev == ju(w, "dev") && s.port[0] == ju(w, "sout_port") &&
              s.port[1] == ju(w, "sup_port") && s.sup_path == ju(w, "sup_path") &&
              nic_name_is(s.nic[0], js(w, "sout_nic")) && nic_name_is(s.nic[1], js(w, "sup_nic")),
          "%s: slot %u descriptor differs from the vector", name, i);
    char what[32];
    snprintf(what, sizeof(what), "slot[%u].hint", i);
    check_record(&s.hint, jget(w, "hint"), what, name);
    CHECK(s.sout_bytes == ju(t, "sout_bytes") && s.sout_requests == ju(t, "sout_requests") &&
              s.sup_bytes == ju(t, "sup_bytes") && s.sup_requests == ju(t, "sup_requests") &&
              s.reads_applied == ju(t, "reads_applied") && s.reads_fallback == ju(t, "reads_fallback") &&
              s.reads_stale == ju(t, "reads_stale") && s.clamped == ju(t, "clamped") &&
              s.last_sup_bw == ju(t, "last_sup_bw") && s.last_source == ju(t, "last_source") &&
              s.last_read_ns == ju(t, "last_read_ns"),
          "%s: slot %u telemetry differs from the vector", name, i);
    check_rails(&s, t, name, i);
  }
  CHECK(slots != NULL && listed == slots->n, "%s: slots listed beyond nslots", name);
  CHECK(mpib_shm_decode_slot(shm, h.nslots, &(mpib_shm_slot_info){0}) == -ERANGE,
        "%s: slot index out of range must be refused", name);
}

static void check_reads(mpib_shm *shm, const jv *reads, const char *name, const char *how) {
  for (size_t n = 0; reads != NULL && n < reads->n; n++) {
    const jv *r = &reads->v[n];
    uint64_t slot = ju(r, "slot"), now = ju(r, "now_ns"), stale = ju(r, "stale_ns");
    mpib_shm_hint h;
    int got = mpib_shm_resolve(shm, (uint32_t)slot, now, stale, &h);
    const char *gs = h.source < 8 ? source_names[h.source] : "invalid";
    const char *src = js(r, "source");
    CHECK(got == (int)ju(r, "applies") && h.sup_bw == ju(r, "sup_bw") && strcmp(gs, src) == 0 &&
              h.clamped == ju(r, "clamped"),
          "%s (%s) read %zu (slot %" PRIu64 " now %" PRIu64 "): expected applies=%d sup_bw=%" PRIu64
          " source=%s but got applies=%d sup_bw=%u source=%s clamped=%d",
          name, how, n, slot, now, (int)ju(r, "applies"), ju(r, "sup_bw"), src, got, h.sup_bw, gs, h.clamped);
  }
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

static void check_vector(const char *dir, const char *json_name) {
  char path[4096], bin[4096], name[256];
  snprintf(name, sizeof(name), "%.*s", (int)(strlen(json_name) - 5), json_name);
  snprintf(path, sizeof(path), "%s/%s", dir, json_name);
  snprintf(bin, sizeof(bin), "%s/%s.bin", dir, name);
  size_t jlen = 0, blen = 0;
  char *text = read_all(path, &jlen);
  char *img = read_all(bin, &blen);
  CHECK(text != NULL && img != NULL, "%s: cannot read vector files", name);
  if (text == NULL || img == NULL) {
    free(text);
    free(img);
    return;
  }
  jparser jp = {text, text + jlen, 0};
  jv vec;
  jparse(&jp, &vec);
  CHECK(!jp.err && vec.t == J_OBJ, "%s: %s is not JSON this parser reads", name, json_name);
  const char *want = js(&vec, "error");
  char err[512] = "";
  CHECK(blen == ju(&vec, "file_size"), "%s: file_size", name);

  int vrc = mpib_shm_validate(img, blen, err, sizeof(err));
  char tmp[] = "/tmp/mpib-shm-vecXXXXXX";
  CHECK(copy_private(bin, tmp) == 0, "%s: copy", name);
  mpib_shm *shm = NULL, *ishm = NULL;
  int rc = mpib_shm_open(tmp, &shm, err, sizeof(err));
  void *buf = malloc(blen + 8); /* malloc: aligned for the 8-byte atomics */
  memcpy(buf, img, blen);
  int irc = mpib_shm_attach_image(buf, blen, &ishm, err, sizeof(err));
  if (want[0] == '\0') {
    CHECK(vrc == 0 && rc == 0 && irc == 0, "%s: expected a valid segment but got %d/%d/%d: %s", name, vrc, rc, irc,
          err);
  } else {
    char code[80];
    snprintf(code, sizeof(code), ": %s:", want);
    CHECK(vrc < 0 && rc < 0 && irc < 0 && strstr(err, code) != NULL, "%s: expected error %s but got %d/%d/%d: %s", name,
          want, vrc, rc, irc, err);
    CHECK(jget(&vec, "segment") == NULL || jget(&vec, "segment")->t == J_NULL, "%s: an invalid vector has no segment",
          name);
    /* A segment of another version says which side is older. */
    uint32_t ver = (uint32_t)(uint8_t)img[8] | (uint32_t)(uint8_t)img[9] << 8;
    char implements[32];
    snprintf(implements, sizeof(implements), "implements %u", MPIB_SHM_VERSION);
    if (strcmp(want, "bad_version") == 0)
      CHECK(strstr(err, ver < MPIB_SHM_VERSION ? "older agent" : "newer agent") != NULL &&
                strstr(err, implements) != NULL,
            "%s: version %u: the message must say which side is older: %s", name, ver, err);
  }
  if (shm != NULL && ishm != NULL) {
    const jv *seg = jget(&vec, "segment");
    check_fields(ishm, (const uint8_t *)img, seg, name);
    check_fields(shm, (const uint8_t *)img, seg, name);
    size_t elen = 0;
    uint8_t *enc = encode(seg, &elen);
    CHECK(elen == blen && memcmp(enc, img, blen) == 0,
          "%s: the JSON's values encoded at the spec's offsets differ from %s.bin", name, name);
    free(enc);
    check_reads(shm, jget(&vec, "reads"), name, "file");
    check_reads(ishm, jget(&vec, "reads"), name, "image");
  }
  mpib_shm_close(shm);
  mpib_shm_close(ishm);
  free(buf);
  unlink(tmp);
  jfree(&vec);
  free(text);
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
  CHECK(jmissing == 0, "%d expected values missing from the vectors", jmissing);
  printf("vectors: %d checked (fields, bytes, reads)\n", n);
}

static void expect_open_error(const char *path, int want_rc, const char *code) {
  mpib_shm *shm = NULL;
  char err[512] = "";
  int rc = mpib_shm_open(path, &shm, err, sizeof(err));
  CHECK(rc == want_rc && shm == NULL && strstr(err, code) != NULL, "open %s: expected %d (%s) but got %d: %s", path,
        want_rc, code, rc, err);
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
  chmod(tmp, 0644); /* readable by others: their users would see peers and rates */
  expect_open_error(tmp, -EPERM, ": bad_mode:");
  chmod(tmp, 0640);
  expect_open_error(tmp, -EPERM, ": bad_mode:");
  chmod(tmp, 0601);
  expect_open_error(tmp, -EPERM, ": bad_mode:");
  chmod(tmp, 0600);
  mpib_shm *shm = NULL;
  char err[512];
  CHECK(mpib_shm_open(tmp, &shm, err, sizeof(err)) == 0, "0600: %s", err);
  mpib_shm_close(shm);
  char link[] = "/tmp/mpib-shm-linkXXXXXX";
  int lfd = mkstemp(link);
  close(lfd);
  unlink(link);
  CHECK(symlink(tmp, link) == 0, "symlink");
  expect_open_error(link, -ELOOP, ": not_regular:"); /* O_NOFOLLOW */
  unlink(link);
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
  expect_open_error("/tmp", -EINVAL, ": not_regular:"); /* refused before any open */
  expect_open_error("/nonexistent/mpib-hints", -ENOENT, ": io:");
}

static uint64_t slot_u64(const char *path, uint32_t slot, unsigned off) {
  uint64_t v = 0;
  int fd = open(path, O_RDONLY);
  if (pread(fd, &v, sizeof(v), 256 + (off_t)slot * SLOT + off) != (ssize_t)sizeof(v)) {
    v = UINT64_MAX;
  }
  close(fd);
  return v;
}

/* Whether another open file description holds a lock on byte off of path (an agent's view). */
static int lock_held(const char *path, off_t off) {
  int fd = open(path, O_RDONLY);
  struct flock lk = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = off, .l_len = 1};
  int held = fcntl(fd, F_OFD_GETLK, &lk) == 0 && lk.l_type != F_UNLCK;
  close(fd);
  return held;
}

static uint32_t slot_of(mpib_shm *shm, uint32_t id, uint32_t *gen) {
  uint32_t s = UINT32_MAX, g = 0;
  CHECK(mpib_shm_conn_slot(shm, id, &s, &g) == 0, "connection %u is not bound", id);
  if (gen != NULL) {
    *gen = g;
  }
  return s;
}

/* A telemetry batch lands at the spec's offsets: counters add up, gauges are replaced. */
static void test_flush(mpib_shm *shm, uint32_t id, const char *path, uint32_t s) {
  mpib_shm_tele_batch b = {.applied_sup_bw = 700, .wall_ns = 1763856000000000001ull};
  b.rail[0] = (mpib_shm_rail_batch){.posted_bytes = 10,
                                    .posted_requests = 2,
                                    .completed_bytes = 6,
                                    .completed_requests = 1,
                                    .busy_ns = 900,
                                    .inflight_bytes = 4,
                                    .active_ns = 700};
  b.rail[1] = (mpib_shm_rail_batch){
      .completed_bytes = 30, .completed_requests = 3, .busy_ns = 5000, .inflight_bytes = 8, .active_ns = 3};
  mpib_shm_flush_telemetry(shm, id, &b);
  b.rail[0].inflight_bytes = 0;
  b.applied_sup_bw = 512;
  b.wall_ns++;
  mpib_shm_flush_telemetry(shm, id, &b);
  mpib_shm_flush_telemetry(shm, 99, &b); /* unused id: ignored */
  mpib_shm_flush_telemetry(shm, id, NULL);
  CHECK(slot_u64(path, s, 128) == 1020 && slot_u64(path, s, 136) == 5, "posted sout: %" PRIu64, slot_u64(path, s, 128));
  CHECK(slot_u64(path, s, 144) == 8000 && slot_u64(path, s, 152) == 2, "posted sup");
  CHECK((uint32_t)slot_u64(path, s, 232) == 512 && slot_u64(path, s, 240) == 1763856000000000002ull,
        "applied split and flush time");
  CHECK(slot_u64(path, s, 256) == 12 && slot_u64(path, s, 264) == 2 && slot_u64(path, s, 272) == 0 &&
            slot_u64(path, s, 280) == 1800,
        "sout completion telemetry");
  CHECK(slot_u64(path, s, 288) == 60 && slot_u64(path, s, 296) == 6 && slot_u64(path, s, 304) == 8 &&
            slot_u64(path, s, 312) == 10000,
        "sup completion telemetry");
  CHECK(slot_u64(path, s, 320) == 1400 && slot_u64(path, s, 328) == 6, "active time: sout %" PRIu64 " sup %" PRIu64,
        slot_u64(path, s, 320), slot_u64(path, s, 328));
  mpib_shm_slot_info si;
  CHECK(mpib_shm_decode_slot(shm, s, &si) == 0 && si.completed_bytes[1] == 60 && si.busy_ns[0] == 1800 &&
            si.inflight_bytes[1] == 8 && si.applied_sup_bw == 512,
        "decoded completion telemetry");
}

/* failovers counts a rail leaving service, recoveries its return (spec 4.3); a state set
 * again to the value it has counts nothing. */
static void test_rail_states(mpib_shm *shm, uint32_t id, const char *path, uint32_t s) {
  mpib_shm_set_rail_state(shm, id, 1, MPIB_SHM_RAIL_DOWN, 11);
  mpib_shm_set_rail_state(shm, id, 1, MPIB_SHM_RAIL_DOWN, 12);
  mpib_shm_set_rail_state(shm, id, 1, MPIB_SHM_RAIL_UP, 13);
  mpib_shm_set_rail_state(shm, id, 1, MPIB_SHM_RAIL_UP, 14);
  mpib_shm_set_rail_state(shm, id, 0, MPIB_SHM_RAIL_FAILED, 15);
  mpib_shm_set_rail_state(shm, id, 0, MPIB_SHM_RAIL_UP, 16);
  mpib_shm_set_rail_state(shm, id, 1, MPIB_SHM_RAIL_DOWN, 17);
  mpib_shm_slot_info si;
  CHECK(mpib_shm_decode_slot(shm, s, &si) == 0 && si.failovers == 3 && si.recoveries == 2 &&
            si.rail_state[0] == MPIB_SHM_RAIL_UP && si.rail_state[1] == MPIB_SHM_RAIL_DOWN && si.rail_state_ns[1] == 17,
        "rail states: failovers %u recoveries %u", si.failovers, si.recoveries);
  CHECK((uint32_t)(slot_u64(path, s, 232) >> 32) == 2, "recoveries at +236"); /* little-endian */
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
  CHECK(lock_held(path, 0), "an attached plugin holds the attach lock (byte 0)");
  mpib_conn_desc d = {.local_sout_ip = 0x0A000101,
                      .peer_sout_ip = 0x0A000207,
                      .peer_island = 0x0A000200,
                      .path_class = 1,
                      .is_send = 1,
                      .nqps_sout = 2,
                      .nqps_sup = 4,
                      .conn_id = 1,
                      .dev = 3,
                      .port = {1, 2},
                      .nic = {"mlx5_3", "a_sup_nic_name_23_bytes"}, /* 23 + NUL: the longest */
                      .sup_path = MPIB_SHM_SUP_PATH_ROUTED};
  uint32_t ids[4], extra, slots[4];
  for (int i = 0; i < 4; i++) {
    d.conn_id = (uint64_t)i;
    CHECK(mpib_shm_register(shm, &d, &ids[i]) == 0, "register %d", i);
    slots[i] = slot_of(shm, ids[i], NULL);
    CHECK(lock_held(path, 256 + (off_t)slots[i] * SLOT), "slot %u: no lease", slots[i]);
  }
  mpib_shm_slot_info info;
  CHECK(mpib_shm_decode_slot(shm, slots[0], &info) == 0 && info.dev == 3 && info.port[0] == 1 && info.port[1] == 2 &&
            nic_name_is(info.nic[0], "mlx5_3") && nic_name_is(info.nic[1], "a_sup_nic_name_23_bytes") &&
            info.sup_path == MPIB_SHM_SUP_PATH_ROUTED,
        "registration writes the device, its ports, NIC names and SUP path");
  mpib_conn_desc longer = d; /* a name filling the descriptor's field: cut, NUL-ended */
  memset(longer.nic[0], 'x', sizeof(longer.nic[0]));
  longer.conn_id = 99;
  uint32_t lid;
  CHECK(mpib_shm_register(shm, &longer, &lid) == 0 && mpib_shm_conn_slot(shm, lid, NULL, NULL) == -ENOENT,
        "a fifth registration waits for a slot");
  mpib_shm_release(shm, ids[1]);
  mpib_shm_poll(shm, NULL, 0);
  CHECK(mpib_shm_decode_slot(shm, slots[1], &info) == 0 && info.nic[0][MPIB_SHM_NIC_NAME - 1] == 0 &&
            info.nic[0][MPIB_SHM_NIC_NAME - 2] == 'x',
        "a 24-byte name is written as its first 23 bytes and a NUL");
  mpib_shm_release(shm, lid);
  CHECK(mpib_shm_register(shm, &d, &ids[1]) == 0 && slot_of(shm, ids[1], NULL) == slots[1], "register 1 again");
  /* Full: the connection gets an id, no slot; it gets one when a slot frees (poll). */
  CHECK(mpib_shm_register(shm, &d, &extra) == 0, "register into a full segment");
  CHECK(mpib_shm_conn_slot(shm, extra, NULL, NULL) == -ENOENT, "a full segment binds nothing");
  uint32_t bw = 77;
  CHECK(mpib_shm_read_hint(shm, extra, 1000000000ull, &bw) == 0 && bw == 77, "unbound: no hint");
  mpib_shm_release(shm, ids[3]);
  CHECK(!lock_held(path, 256 + (off_t)slots[3] * SLOT), "release keeps the lease");
  CHECK(slot_u64(path, slots[3], 0) == 0, "release: owner word not zero");
  mpib_shm_poll(shm, NULL, 0);
  CHECK(slot_of(shm, extra, NULL) == slots[3], "the waiting connection takes the freed slot");
  mpib_shm_release(shm, extra);

  uint32_t s = slots[0], gen;
  slot_of(shm, ids[0], &gen);
  const uint64_t stale = 500000000ull; /* MPIB_AGENT_STALE_MS's default, in ns */
  CHECK(mpib_shm_read_hint(shm, ids[0], stale, &bw) == 0 && bw == 77, "no agent: no hint");
  mpib_shm_heartbeat(shm, mpib_shm_now_ns());
  CHECK(mpib_shm_read_hint(shm, ids[0], stale, &bw) == 0, "agent, no hint set");
  CHECK(mpib_shm_set_class_hint(shm, 1, 1, 300) == 0, "class hint");
  CHECK(mpib_shm_read_hint(shm, ids[0], stale, &bw) == 1 && bw == 300, "class: got %u", bw);
  CHECK(mpib_shm_set_peer_hint(shm, 0x0A000200, 24, 1, 400) == 0, "peer hint");
  CHECK(mpib_shm_read_hint(shm, ids[0], stale, &bw) == 1 && bw == 400, "peer: got %u", bw);
  CHECK(mpib_shm_set_peer_hint(shm, 0x0A000207, 32, 1, 450) == 0, "peer hint /32");
  CHECK(mpib_shm_read_hint(shm, ids[0], stale, &bw) == 1 && bw == 450, "peer /32: got %u", bw);
  CHECK(mpib_shm_set_peer_hint(shm, 0x0A000208, 32, 1, 1) == -ENOSPC, "peer table full");
  CHECK(mpib_shm_set_slot_hint(shm, s, gen, 1, 5000) == 1, "slot hint clamped on write");
  CHECK(mpib_shm_read_hint(shm, ids[0], stale, &bw) == 1 && bw == 1024, "slot: got %u", bw);
  CHECK(mpib_shm_set_slot_hint(shm, s, gen, 1, 512) == 0, "slot hint");
  CHECK(mpib_shm_set_slot_hint(shm, s, gen + 1, 1, 9) == -ESTALE, "a hint for another gen");
  CHECK(mpib_shm_read_hint(shm, ids[0], stale, &bw) == 1 && bw == 512, "slot: got %u", bw);
  CHECK(mpib_shm_read_hint(shm, ids[1], stale, &bw) == 1 && bw == 450, "other slot: peer");
  CHECK(mpib_shm_read_hint(shm, MPIB_SHM_MAX_CONNS, stale, &bw) == 0, "id out of range");
  CHECK(mpib_shm_set_slot_hint(shm, 9, 1, 1, 1) == -ERANGE, "set out of range");

  /* A hint for an earlier registration never applies to the next one. */
  mpib_shm_release(shm, ids[0]);
  CHECK(mpib_shm_set_slot_hint(shm, s, gen, 1, 1) == -ENOENT, "set on a free slot");
  d.conn_id = 0;
  CHECK(mpib_shm_register(shm, &d, &ids[0]) == 0, "register again");
  uint32_t gen2;
  CHECK(slot_of(shm, ids[0], &gen2) == s && gen2 == gen + 1, "slot %u again, gen %u", s, gen2);
  CHECK(mpib_shm_read_hint(shm, ids[0], stale, &bw) == 1 && bw == 450, "old slot hint ignored: %u", bw);

  mpib_shm_add_telemetry(shm, ids[0], 0, 1000);
  mpib_shm_add_telemetry(shm, ids[0], 1, 3000);
  mpib_shm_add_telemetry(shm, ids[0], 1, 5000);
  mpib_shm_add_telemetry(shm, ids[0], 2, 1); /* bad rail: ignored */
  mpib_shm_add_telemetry(shm, 99, 0, 1);     /* unused id: ignored */
  CHECK(slot_u64(path, s, 128) == 1000 && slot_u64(path, s, 136) == 1, "sout telemetry");
  CHECK(slot_u64(path, s, 144) == 8000 && slot_u64(path, s, 152) == 2, "sup telemetry");
  CHECK(slot_u64(path, s, 160) == 1, "reads_applied %" PRIu64, slot_u64(path, s, 160));
  test_flush(shm, ids[0], path, s);
  test_rail_states(shm, ids[0], path, s);

  mpib_shm_heartbeat(shm, mpib_shm_now_ns() - 2 * stale);
  CHECK(mpib_shm_read_hint(shm, ids[0], stale, &bw) == 0, "stale agent");
  CHECK(slot_u64(path, s, 176) == 1, "reads_stale %" PRIu64, slot_u64(path, s, 176));

  /* The process dies (its handle closes): every lease and the attach lock go. */
  mpib_shm_close(shm);
  CHECK(!lock_held(path, 0) && !lock_held(path, 256 + (off_t)slots[1] * SLOT), "locks survive the handle");
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
