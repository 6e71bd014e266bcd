/*
 * The SQLite live read's page walk (src/sources/sqlite-worker.ts, scanStale / pageCells /
 * record / text), in native code: the same walk, step for step, so that its answers and its
 * counts are the JS walk's (test/sources/sqlite-walk.test.ts compares them on many databases).
 *
 * JS reads the file in chunks of pages (as before) and calls walk() on each chunk. For every
 * page walk() tests the stale regions (not all zero: counted, then the pre-filter scan and the
 * token-run test) and copies the TEXT values of every record into the cell batch (a JS Buffer),
 * following overflow chains with pread. It decides only "no": it returns to JS
 *  - at a stale region that the pre-filter scan does not clear or that holds a token run
 *    (JS runs the exact finders on the latin1 view, then resumes at the next region), and
 *  - at the end of a page after which a batch of cell text (or a value of its own) was not
 *    cleared: a copy of each value of that batch that the pre-filter does not clear on its own
 *    is in `pend`, after a byte that says TEXT (0) or BLOB (1): JS runs the finders on its UTF-8
 *    text and collects the candidates for the host's redactor, as the SQL scan that collects
 *    would (version 3; before, one uncleared batch sent the database to that SQL scan).
 * A page or record it cannot read sets the cell state to "unparsed", as the JS walk does (the
 * SQL scan decides then). So this file changes only how fast the answer comes, never what it is.
 *
 * Why: on the bench's databases the JS walk costs ~0.15 CPU-s to run and ~0.2 CPU-s of TurboFan
 * compiling (scanStale, record and pageCells, in each worker isolate); see src/sources/sqlite-worker.ts.
 */
#define NAPI_VERSION 8
#include <node_api.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "prefilter.h"

/* S: the Float64Array shared with JS (the same indices as WALK_* in sqlite-worker.ts) */
enum {
  S_PS, S_USABLE, S_PAGE_COUNT, S_CELLS, S_BATCH_N,
  S_STALE_BYTES, S_FREE_PAGES, S_TEXT_BYTES, S_CELLS_SCANNED, S_PEND_BYTES,
  S_AT_PO, S_AT_REGION, S_REGION_A, S_REGION_E, S_REGION_TOKEN, S_REGION_MAYBE, S_AT_PAGE, S_ERRNO,
  S_BATCH_VALS, S_LEN
};
enum { CELLS_SCAN = 0, CELLS_HIT = 1, CELLS_UNPARSED = 2, CELLS_OFF = 3 };
enum { WALK_DONE = 0, WALK_REGION = 1, WALK_PEND = 2, WALK_ERROR = -1 };

#define TEXT_BATCH (1 << 16)
#define TEXT_VALUE_MAX (32 << 20)
/* Pending bytes past which the cells go to the SQL scan instead (one value of the largest size fits) */
#define PEND_MAX (TEXT_VALUE_MAX + 2 * TEXT_BATCH)
/* Values in one batch: each of at least one byte, after a separator (but the first) */
#define BATCH_VALS_MAX (TEXT_BATCH / 2 + 1)

static const int SERIAL_FIXED[10] = {0, 1, 2, 3, 4, 6, 8, 8, 0, 0};

typedef struct {
  napi_env env;
  double *S;
  const uint8_t *free_pages; /* 1 for a page on the freelist, indexed by page number */
  size_t free_len;
  uint8_t *batch; /* TEXT_BATCH bytes */
  uint8_t *ob;    /* one page: the overflow page in hand */
  uint32_t *vals; /* the batch's values: [start, len << 1 | blob] each, S_BATCH_VALS of them */
  int fd;
  long ps, usable;
  double page_count;
  napi_value pend;
  uint32_t pend_n;
  int err;
} walk_t;

/* An SQLite varint at p (no further than end), as the JS varint(): a double, or -1; *next past it. */
static double varint(const uint8_t *b, long p, long end, long *next) {
  double v = 0;
  for (int i = 0; i < 8; i++) {
    if (p >= end) return -1;
    uint8_t x = b[p++];
    v = v * 128 + (x & 0x7f);
    if (x < 0x80) { *next = p; return v; }
  }
  if (p >= end) return -1;
  v = v * 256 + b[p++];
  *next = p;
  return v;
}

static inline unsigned u16(const uint8_t *b, long p) { return ((unsigned)b[p] << 8) | b[p + 1]; }
static inline uint32_t u32(const uint8_t *b, long p) {
  return ((uint32_t)b[p] << 24) | ((uint32_t)b[p + 1] << 16) | ((uint32_t)b[p + 2] << 8) | b[p + 3];
}

static int all_zero(const uint8_t *b, long a, long e) {
  for (; a < e && (a & 7); a++) if (b[a]) return 0;
  for (; a + 8 <= e; a += 8) { uint64_t w; memcpy(&w, b + a, 8); if (w) return 0; }
  for (; a < e; a++) if (b[a]) return 0;
  return 1;
}

/* The JS tokenRun(): a maximal run of [A-Za-z0-9+/_=-] of 24 or more with a letter and a digit. */
static int token_run(const uint8_t *b, long a, long e) {
  long run = 0;
  int letter = 0, digit = 0;
  for (long i = a; i <= e; i++) {
    int c = i < e ? b[i] : 0;
    int isl = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
    int isd = c >= '0' && c <= '9';
    if (isl || isd || c == '+' || c == '/' || c == '_' || c == '=' || c == '-') {
      run++;
      letter |= isl;
      digit |= isd;
    } else {
      if (run >= 24 && letter && digit) return 1;
      run = 0;
      letter = digit = 0;
    }
  }
  return 0;
}

static inline int maybe(const uint8_t *b, long a, long e) {
  return memsnap_scan(b, a, a, e) != -1 || memsnap_hiding_escape(b, a, e, e) != -1;
}

/* A value that the pre-filter does not clear: a copy goes to `pend` for JS, after its kind byte
   (or, past PEND_MAX, the SQL scan decides). */
static void pend_value(walk_t *w, const uint8_t *b, long a, long e, int blob) {
  if (w->S[S_PEND_BYTES] + (double)(e - a) > PEND_MAX) {
    w->S[S_CELLS] = CELLS_UNPARSED;
    return;
  }
  napi_value buf;
  void *data;
  if (napi_create_buffer(w->env, (size_t)(e - a) + 1, &data, &buf) != napi_ok) {
    w->S[S_CELLS] = CELLS_UNPARSED;
    return;
  }
  ((uint8_t *)data)[0] = (uint8_t)blob;
  memcpy((uint8_t *)data + 1, b + a, (size_t)(e - a));
  if (napi_set_element(w->env, w->pend, w->pend_n, buf) != napi_ok) {
    w->S[S_CELLS] = CELLS_UNPARSED;
    return;
  }
  w->pend_n++;
  w->S[S_PEND_BYTES] += (double)(e - a);
}

/* The JS testText() of a value of its own in b[a, e): count it and test it (a JSON escape that can hide a secret is a "maybe" too). */
static void test_value(walk_t *w, const uint8_t *b, long a, long e, int blob) {
  w->S[S_TEXT_BYTES] += (double)(e - a);
  if (w->S[S_CELLS] == CELLS_SCAN && maybe(b, a, e)) pend_value(w, b, a, e, blob);
}

/* The JS flushCells(): the batch at once, and only when it is not cleared each of its values. */
static void flush_cells(walk_t *w) {
  long n = (long)w->S[S_BATCH_N];
  if (n == 0) return;
  w->S[S_TEXT_BYTES] += (double)n;
  if (w->S[S_CELLS] == CELLS_SCAN && maybe(w->batch, 0, n)) {
    long nv = (long)w->S[S_BATCH_VALS];
    for (long i = 0; i < nv && w->S[S_CELLS] == CELLS_SCAN; i++) {
      long a = (long)w->vals[2 * i], len = (long)(w->vals[2 * i + 1] >> 1);
      if (maybe(w->batch, a, a + len)) pend_value(w, w->batch, a, a + len, (int)(w->vals[2 * i + 1] & 1));
    }
  }
  w->S[S_BATCH_N] = 0;
  w->S[S_BATCH_VALS] = 0;
}

/* Note a value appended to the batch at [a, a + len). */
static inline void batch_value(walk_t *w, long a, long len, int blob) {
  long nv = (long)w->S[S_BATCH_VALS];
  w->vals[2 * nv] = (uint32_t)a;
  w->vals[2 * nv + 1] = (uint32_t)len << 1 | (uint32_t)blob;
  w->S[S_BATCH_VALS] = nv + 1;
}

typedef struct { double next, start; long page, count; } chain_t;

/* The JS text(): payload bytes [off, off + len) into the batch, or a buffer of their own tested at once. 0 when the walk of the cells stops. */
static int text(walk_t *w, const uint8_t *b, long c, long local, chain_t *ov, double off, double len, int blob) {
  if (len > TEXT_VALUE_MAX) { w->S[S_CELLS] = CELLS_UNPARSED; return 0; }
  /* room() */
  uint8_t *dst;
  long at = 0;
  if (w->S[S_BATCH_N] + len + 1 > TEXT_BATCH) flush_cells(w);
  int own = len + 1 > TEXT_BATCH;
  if (own) {
    dst = malloc((size_t)len);
    if (!dst) { w->S[S_CELLS] = CELLS_UNPARSED; return 0; }
  } else {
    dst = w->batch;
    at = (long)w->S[S_BATCH_N];
    if (at > 0) dst[at++] = 10;
  }
  long at0 = at;
  double need = off, end = off + len;
  if (need < local) {
    double e = end < local ? end : local;
    memcpy(dst + at, b + c + (long)need, (size_t)(e - need));
    at += (long)(e - need);
    need = e;
  }
  long span = w->usable - 4;
  int ok = 1;
  while (ok && need < end) {
    while (ov->page == 0 || need >= ov->start + span) {
      if (ov->page != 0) ov->start += span;
      double pn = ov->next;
      if (pn < 2 || pn > w->page_count || (size_t)pn >= w->free_len || w->free_pages[(size_t)pn] || ++ov->count > w->page_count) { ok = 0; break; }
      ssize_t got = pread(w->fd, w->ob, (size_t)w->ps, (off_t)(pn - 1) * w->ps);
      if (got < 0) { w->err = errno; ok = 0; break; }
      if (got != w->ps) { ok = 0; break; }
      ov->page = (long)pn;
      ov->next = u32(w->ob, 0);
    }
    if (!ok) break;
    double e = end < ov->start + span ? end : ov->start + span;
    memcpy(dst + at, w->ob + 4 + (long)(need - ov->start), (size_t)(e - need));
    at += (long)(e - need);
    need = e;
  }
  if (!ok) {
    if (own) free(dst);
    w->S[S_CELLS] = CELLS_UNPARSED;
    return 0;
  }
  if (!own) {
    w->S[S_BATCH_N] = at;
    batch_value(w, at0, at - at0, blob);
  } else {
    test_value(w, dst, at0, at, blob);
    free(dst);
  }
  return w->S[S_CELLS] == CELLS_SCAN;
}

/* The JS record(): the TEXT values of one record, payload [0, local) at b[c...], the rest on overflow pages from ovfl. */
static void record(walk_t *w, const uint8_t *b, long c, long local, double P, double ovfl) {
  long p;
  double hs = varint(b, c, c + local, &p);
  if (hs < 1 || hs > local || hs > P) { w->S[S_CELLS] = CELLS_UNPARSED; return; }
  double off = hs;
  chain_t ov = {ovfl, (double)local, 0, 0};
  long he = c + (long)hs;
  while (p < he) {
    double t = b[p];
    if (t < 0x80) p++;
    else t = varint(b, p, he, &p);
    if (t < 0 || t == 10 || t == 11) { w->S[S_CELLS] = CELLS_UNPARSED; return; }
    double len = t < 12 ? SERIAL_FIXED[(int)t] : floor((t - 12) / 2);
    if (off + len > P) { w->S[S_CELLS] = CELLS_UNPARSED; return; }
    if (t >= 12) { /* TEXT (odd) and BLOB (even) */
      w->S[S_CELLS_SCANNED]++;
      if (len > 0) {
        long n = (long)w->S[S_BATCH_N];
        if (off + len <= local && n + len + 1 <= TEXT_BATCH) {
          if (n > 0) w->batch[n++] = 10;
          memcpy(w->batch + n, b + c + (long)off, (size_t)len);
          w->S[S_BATCH_N] = n + (long)len;
          batch_value(w, n, (long)len, !((long)t & 1));
        } else if (!text(w, b, c, local, &ov, off, len, !((long)t & 1))) return;
      }
    }
    off += len;
  }
  if (off != P) w->S[S_CELLS] = CELLS_UNPARSED;
}

/* The JS pageCells(). */
static void page_cells(walk_t *w, const uint8_t *b, long ho, int type, long n_cell, long c_start) {
  long usable = w->usable;
  long ptrs = ho + (type == 2 ? 12 : 8);
  long max_local = type == 13 ? usable - 35 : (long)floor((double)(usable - 12) * 64 / 255) - 23;
  long min_local = (long)floor((double)(usable - 12) * 32 / 255) - 23;
  for (long i = 0; i < n_cell && w->S[S_CELLS] == CELLS_SCAN; i++) {
    long c = u16(b, ptrs + 2 * i);
    if (c < c_start || c >= usable) { w->S[S_CELLS] = CELLS_UNPARSED; return; }
    if (type == 2) c += 4;
    long next;
    double P = varint(b, c, usable, &next);
    if (P < 0) { w->S[S_CELLS] = CELLS_UNPARSED; return; }
    c = next;
    if (type == 13) {
      if (varint(b, c, usable, &next) < 0) { w->S[S_CELLS] = CELLS_UNPARSED; return; }
      c = next;
    }
    double local = P;
    if (P > max_local) {
      double k = min_local + fmod(P - min_local, (double)(usable - 4));
      local = k <= max_local ? k : min_local;
    }
    if (c + local + (local < P ? 4 : 0) > usable) { w->S[S_CELLS] = CELLS_UNPARSED; return; }
    record(w, b, c, (long)local, P, local < P ? u32(b, c + (long)local) : 0);
  }
}

/*
 * walk(buf, got, firstPage, po, region, S, free, batch, ob, fd, pend, others, vals): walk the pages of
 * buf[0, got) (page firstPage at offset 0) from offset po, region index `region` of that page.
 * Returns WALK_DONE (the chunk is walked), WALK_REGION (S_REGION_*: a region for JS to decide;
 * resume at S_AT_PO, S_AT_REGION + 1), WALK_PEND (`pend` holds text for JS; resume at S_AT_PO, 0)
 * or WALK_ERROR (S_ERRNO: a read failed).
 */
static napi_value Walk(napi_env env, napi_callback_info info) {
  size_t argc = 13;
  napi_value argv[13];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc < 13) { napi_throw_type_error(env, NULL, "walk: 13 arguments are required"); return NULL; }
  walk_t w = {0};
  w.env = env;
  uint8_t *buf;
  size_t buf_len, s_len, batch_len, ob_len;
  napi_typedarray_type tt;
  napi_value ab;
  size_t byte_off;
  void *data;
  int64_t got, first_page, po0, region0, fd;
  if (napi_get_typedarray_info(env, argv[0], &tt, &buf_len, &data, &ab, &byte_off) != napi_ok || tt != napi_uint8_array) goto bad;
  buf = data;
  napi_get_value_int64(env, argv[1], &got);
  napi_get_value_int64(env, argv[2], &first_page);
  napi_get_value_int64(env, argv[3], &po0);
  napi_get_value_int64(env, argv[4], &region0);
  if (napi_get_typedarray_info(env, argv[5], &tt, &s_len, &data, &ab, &byte_off) != napi_ok || tt != napi_float64_array || s_len < S_LEN) goto bad;
  w.S = data;
  if (napi_get_typedarray_info(env, argv[6], &tt, &w.free_len, &data, &ab, &byte_off) != napi_ok || tt != napi_uint8_array) goto bad;
  w.free_pages = data;
  if (napi_get_typedarray_info(env, argv[7], &tt, &batch_len, &data, &ab, &byte_off) != napi_ok || tt != napi_uint8_array || batch_len < TEXT_BATCH) goto bad;
  w.batch = data;
  w.ps = (long)w.S[S_PS];
  w.usable = (long)w.S[S_USABLE];
  w.page_count = w.S[S_PAGE_COUNT];
  if (napi_get_typedarray_info(env, argv[8], &tt, &ob_len, &data, &ab, &byte_off) != napi_ok || tt != napi_uint8_array || (long)ob_len < w.ps) goto bad;
  w.ob = data;
  napi_get_value_int64(env, argv[9], &fd);
  w.fd = (int)fd;
  w.pend = argv[10];
  napi_get_array_length(env, w.pend, &w.pend_n);
  napi_value others = argv[11];
  size_t vals_len;
  if (napi_get_typedarray_info(env, argv[12], &tt, &vals_len, &data, &ab, &byte_off) != napi_ok || tt != napi_uint32_array || vals_len < 2 * BATCH_VALS_MAX) goto bad;
  w.vals = data;
  if (w.S[S_BATCH_VALS] < 0 || w.S[S_BATCH_VALS] > BATCH_VALS_MAX) goto bad;
  uint32_t others_n;
  napi_get_array_length(env, others, &others_n);
  if (got < 0 || (size_t)got > buf_len || w.ps < 512 || w.ps > 65536 || w.usable < 480 || w.usable > w.ps) goto bad;

  long ps = w.ps, usable = w.usable;
  /* The regions of one page: the pointer gap, the freed blocks (strictly increasing offsets, at
     most ps + 1 of them: the JS walk's guard), the reserved tail; two entries each. */
  const long cap = 2 * (ps + 4);
  long *blocks = malloc(sizeof(long) * (size_t)cap);
  if (!blocks) { napi_throw_error(env, NULL, "walk: out of memory"); return NULL; }
  int ret = WALK_DONE;
  long region = region0;
  for (long po = po0; po < got; po += ps, region = 0) {
    double p = (double)(first_page + po / ps);
    long end = po + ps < got ? po + ps : (long)got;
    const uint8_t *b = buf + po;
    long len = end - po;
    /* the page's stale regions, in the JS order */
    long nreg = 0;
    int cells_after = 0;
    int type = 0;
    long ho = 0, n_cell = 0, c_start = 0;
    int whole = p > w.page_count || len < ps || ((size_t)p < w.free_len && w.free_pages[(size_t)p]);
    if (whole) {
      if (region == 0) w.S[S_FREE_PAGES]++;
      blocks[nreg++] = 0;
      blocks[nreg++] = len;
    } else {
      ho = p == 1 ? 100 : 0;
      type = b[ho];
      int ok = 0;
      if (type == 2 || type == 5 || type == 10 || type == 13) {
        n_cell = u16(b, ho + 3);
        c_start = u16(b, ho + 5);
        if (c_start == 0) c_start = 65536;
        long ptr_end = ho + (type == 2 || type == 5 ? 12 : 8) + 2 * n_cell;
        ok = ptr_end <= c_start && c_start <= usable;
        if (ok) { blocks[nreg++] = ptr_end; blocks[nreg++] = c_start; }
        long guard = 0;
        for (long fb = u16(b, ho + 1), prev = 0; ok && fb; guard++) {
          if (fb <= prev || fb < c_start || fb + 4 > usable || guard > ps || nreg + 4 > cap) { ok = 0; break; }
          long sz = u16(b, fb + 2);
          if (sz < 4 || fb + sz > usable) { ok = 0; break; }
          blocks[nreg++] = fb + 4;
          blocks[nreg++] = fb + sz;
          prev = fb;
          fb = u16(b, fb);
        }
        if (ok && usable < ps) { blocks[nreg++] = usable; blocks[nreg++] = ps; }
        if (!ok && w.S[S_CELLS] != CELLS_OFF) w.S[S_CELLS] = CELLS_UNPARSED;
      }
      if (!ok) {
        /* an overflow page, or a page we cannot read as a b-tree page: JS reads its tail later */
        if (region == 0) {
          napi_value v;
          napi_create_double(env, p, &v);
          napi_set_element(env, others, others_n++, v);
        }
        nreg = 0;
      } else {
        cells_after = w.S[S_CELLS] == CELLS_SCAN && type != 5;
      }
    }
    for (long r = region; r < nreg / 2; r++) {
      long a = blocks[2 * r], e = blocks[2 * r + 1];
      if (e <= a || all_zero(b, a, e)) continue;
      w.S[S_STALE_BYTES] += (double)(e - a);
      int maybe = memsnap_scan(b, a, a, e) != -1 || memsnap_hiding_escape(b, a, e, e) != -1;
      int token = token_run(b, a, e);
      if (maybe || token) {
        w.S[S_AT_PO] = (double)po;
        w.S[S_AT_REGION] = (double)r;
        w.S[S_AT_PAGE] = p;
        w.S[S_REGION_A] = (double)(po + a);
        w.S[S_REGION_E] = (double)(po + e);
        w.S[S_REGION_TOKEN] = token;
        w.S[S_REGION_MAYBE] = maybe;
        ret = WALK_REGION;
        goto out;
      }
    }
    if (cells_after && w.S[S_CELLS] == CELLS_SCAN) page_cells(&w, b, ho, type, n_cell, c_start);
    if (w.err) {
      w.S[S_ERRNO] = w.err;
      ret = WALK_ERROR;
      goto out;
    }
    if (w.pend_n > 0) {
      w.S[S_AT_PO] = (double)(po + ps);
      w.S[S_AT_PAGE] = p;
      ret = WALK_PEND;
      goto out;
    }
  }
out:
  free(blocks);
  napi_value rv;
  napi_create_int32(env, ret, &rv);
  return rv;
bad:
  napi_throw_type_error(env, NULL, "walk: bad arguments");
  return NULL;
}

void memsnap_register_sqlite_walk(napi_env env, napi_value exports) {
  napi_value fn;
  napi_create_function(env, "sqliteWalk", NAPI_AUTO_LENGTH, Walk, NULL, &fn);
  napi_set_named_property(env, exports, "sqliteWalk", fn);
  /* 2: BLOB values are tested with the TEXT ones, and a JSON escape that can hide a secret is a "maybe";
     3: the values of a batch not cleared are tested one by one and pended with their kind (JS uses no older walk) */
  napi_value version;
  napi_create_int32(env, 3, &version);
  napi_set_named_property(env, exports, "sqliteWalkVersion", version);
}
