/*
 * memsnap's redaction pre-filter, negative test in native code: could any rule match in these
 * bytes?
 *
 * `scan(buf, start, end[, from])` returns the first offset in [from, end) where one of the
 * trigger tests below passes, or -1 (look-behinds reach back to `start`, look-aheads to `end`). It is a SUPERSET of the pre-filter's scanners
 * (src/redact/prefilter.ts, SCANNERS) on both views a caller may test with them:
 *  - the latin1 view of the bytes (what the stream redactor and the SQLite stale-byte scan read);
 *  - the JS string the bytes decode to as UTF-8 (the SQLite cell test).
 * Every anchor and every character next to one is ASCII, and ASCII bytes are the same
 * characters in both views. Two parts of the scanners read non-ASCII characters, and both are
 * widened here: whitespace between a key and its operator (every byte of the UTF-8 of a
 * non-ASCII JS space is skipped like a space; see skip_space), and the URL user-info
 * run (`[^\s/@]{0,600}`: here up to 2400 bytes, 600 characters of at most 4 bytes, stopping only
 * at ASCII spaces, '/' and '@').
 *
 * A hit here is not a finding: callers then run the exact pre-filter (JS) and the rules, so a
 * false positive costs time, never output. A miss (-1) must mean the scanners find nothing,
 * which test/redact/native.test.ts checks differentially against the JS finders.
 *
 * Speed: triggers are found 16 bytes at a time with SSE2 (10 byte compares), then each is
 * tested with a few loads. Measured on the bench machine: see src/redact/native.ts.
 */
#define NAPI_VERSION 8
#include <node_api.h>
#include <openssl/evp.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "prefilter.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef const uint8_t *bytes;

static inline int lower(int c) { return (c >= 'A' && c <= 'Z') ? c | 0x20 : c; }

/* Does `w` (length n) end at b[j] (inclusive), case-sensitively? */
static inline int ends_with(bytes b, long j, const char *w, long n) {
  return j + 1 >= n && memcmp(b + j + 1 - n, w, (size_t)n) == 0;
}
/* The same, ASCII case-insensitive (`w` lowercase). */
static inline int ends_with_ci(bytes b, long j, const char *w, long n) {
  if (j + 1 < n) return 0;
  for (long k = 0; k < n; k++)
    if (lower(b[j - k]) != w[n - 1 - k]) return 0;
  return 1;
}
/* Does `w` (length n) start at b[p], within [.., end)? */
static inline int starts_with(bytes b, long p, long end, const char *w, long n) {
  return p + n <= end && memcmp(b + p, w, (size_t)n) == 0;
}
#define ENDS(b, j, lit) ends_with(b, j, lit, (long)sizeof(lit) - 1)
#define ENDS_CI(b, j, lit) ends_with_ci(b, j, lit, (long)sizeof(lit) - 1)
#define STARTS(b, p, end, lit) starts_with(b, p, end, lit, (long)sizeof(lit) - 1)

/* The last two letters (lowercase) of every key word of the assignment alternative. */
static uint8_t KEY_END[256][256];
static const char *const KEY_WORDS[] = {"password", "passwd", "passphrase", "pwd", "secret", "token", "key",
                                        "credential", "credentials", "account", "account_id", "accountid"};

/*
 * What the assignment alternative may skip between a key and its operator (see the header): an
 * ASCII space, or a byte of the UTF-8 of a non-ASCII JS space: U+00A0 C2 A0, U+1680 E1 9A 80,
 * U+2000-U+200A E2 80 80-8A, U+2028/U+2029 E2 80 A8/A9, U+202F E2 80 AF, U+205F E2 81 9F,
 * U+3000 E3 80 80, U+FEFF EF BB BF (in a latin1 view U+00A0 is the byte A0 alone). Any byte
 * from 0x80 up was skipped until the realistic home's float32 embeddings (#38): their exponent
 * bytes 0x3D and 0xBD read as '=' after a run of "spaces" every few bytes.
 */
static inline int skip_space(int c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0d);
  return c <= 0x8a || c == 0x9a || c == 0x9f || c == 0xa0 || c == 0xa8 || c == 0xa9 || c == 0xaf || c == 0xbb ||
         c == 0xbf || c == 0xc2 || (c >= 0xe1 && c <= 0xe3) || c == 0xef;
}

/*
 * `(?<=(?:KEYS)(?:\\?["'])?\s*[:=])` at the operator at p: KEYS = passw(or)?d, passphrase,
 * pwd, secret, token, key, credentials?, account(_?id)?, in any ASCII case.
 */
static int key_before(bytes b, long lo, long p) {
  long j = p - 1;
  while (j >= lo && skip_space(b[j])) j--;
  if (j >= lo && (b[j] == '"' || b[j] == '\'')) j -= (j - 1 >= lo && b[j - 1] == '\\') ? 2 : 1;
  if (j < lo + 2) return 0;
  if (!KEY_END[lower(b[j - 1])][lower(b[j])]) return 0;
  bytes s = b + lo;
  long k = j - lo;
  switch (lower(b[j])) {
    case 'd': return ENDS_CI(s, k, "password") || ENDS_CI(s, k, "passwd") || ENDS_CI(s, k, "pwd") || ENDS_CI(s, k, "account_id") || ENDS_CI(s, k, "accountid");
    case 'e': return ENDS_CI(s, k, "passphrase");
    case 't': return ENDS_CI(s, k, "secret") || ENDS_CI(s, k, "account");
    case 'n': return ENDS_CI(s, k, "token");
    case 'y': return ENDS_CI(s, k, "key");
    case 'l': return ENDS_CI(s, k, "credential");
    case 's': return ENDS_CI(s, k, "credentials");
    default: return 0;
  }
}

/* `:\/\/[^\s\/@]{0,600}@`, widened (see the header). */
static int url_at(bytes b, long p, long end) {
  if (p + 3 > end || b[p + 1] != '/' || b[p + 2] != '/') return 0;
  long lim = p + 3 + 2400 + 1;
  if (lim > end) lim = end;
  for (long q = p + 3; q < lim; q++) {
    int c = b[q];
    if (c == '@') return 1;
    if (c == '/' || c == ' ' || (c >= 0x09 && c <= 0x0d)) return 0;
  }
  return 0;
}

static int is_upper_or_digit(int c) { return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

/* The trigger at p (its byte is b[p]): could a scanner match here? `lo` is the range start (look-behinds stop there). */
static int test_at(bytes b, long lo, long p, long end) {
  bytes s = b + lo;
  long k = p - lo; /* p as an offset into s, for the look-behinds */
  switch (b[p]) {
    case '_': {
      /* gh[pousr]|github_pat|hf|npm|[sr]k_(?:live|test)|shp(?:pa|ca|at|ss)|glc|glsa|ops|gsk|lin_api|ntn|vc[pirak]|dckr_pat|figd */
      if (k < 2) return 0;
      long j = k - 1;
      int c = s[j];
      switch (c) {
        case 'p': return ENDS(s, j, "ghp") || ENDS(s, j, "vcp");
        case 'o': return ENDS(s, j, "gho");
        case 'u': return ENDS(s, j, "ghu");
        case 's': return ENDS(s, j, "ghs") || ENDS(s, j, "ops") || ENDS(s, j, "shpss");
        case 'r': return ENDS(s, j, "ghr") || ENDS(s, j, "vcr");
        case 't': return ENDS(s, j, "github_pat") || ENDS(s, j, "sk_test") || ENDS(s, j, "rk_test") || ENDS(s, j, "shpat") || ENDS(s, j, "dckr_pat");
        case 'f': return ENDS(s, j, "hf");
        case 'm': return ENDS(s, j, "npm");
        case 'e': return ENDS(s, j, "sk_live") || ENDS(s, j, "rk_live");
        case 'a': return ENDS(s, j, "shppa") || ENDS(s, j, "shpca") || ENDS(s, j, "glsa") || ENDS(s, j, "vca");
        case 'c': return ENDS(s, j, "glc");
        case 'k': return ENDS(s, j, "gsk") || ENDS(s, j, "vck");
        case 'i': return ENDS(s, j, "lin_api") || ENDS(s, j, "vci");
        case 'n': return ENDS(s, j, "ntn");
        case 'd': return ENDS(s, j, "figd");
        default: return 0;
      }
    }
    case '-':
      /* -----BEGIN | x-oauth-basic | sk-… (widened: any "sk-") | (xox[bpaor]|xapp|glpat)- */
      if (STARTS(b, p, end, "-----BEGIN")) return 1;
      if (k >= 1 && s[k - 1] == 'x' && STARTS(b, p, end, "-oauth-basic")) return 1;
      if (k >= 2 && s[k - 2] == 's' && s[k - 1] == 'k') return 1;
      if (k >= 4 && (ENDS(s, k - 1, "xoxb") || ENDS(s, k - 1, "xoxp") || ENDS(s, k - 1, "xoxa") || ENDS(s, k - 1, "xoxo") ||
                     ENDS(s, k - 1, "xoxr") || ENDS(s, k - 1, "xapp"))) return 1;
      return ENDS(s, k - 1, "glpat");
    case '.':
      /* (?<=(?:SG|hv[sbr]|hooks)\.) */
      return ENDS(s, k - 1, "SG") || ENDS(s, k - 1, "hvs") || ENDS(s, k - 1, "hvb") || ENDS(s, k - 1, "hvr") || ENDS_CI(s, k - 1, "hooks");
    case ':':
      return url_at(b, p, end) || key_before(b, lo, p);
    case '=':
      return key_before(b, lo, p);
    case 'J':
      return k >= 2 && s[k - 2] == 'e' && s[k - 1] == 'y';
    case 'A': {
      /* A(?=KIA|SIA|3T[A-Z0-9]|GPA|IDA|ROA|IPA|NPA|NVA) */
      if (p + 4 > end) return 0;
      bytes t = b + p + 1;
      if (t[0] == '3' && t[1] == 'T') return is_upper_or_digit(t[2]);
      return !memcmp(t, "KIA", 3) || !memcmp(t, "SIA", 3) || !memcmp(t, "GPA", 3) || !memcmp(t, "IDA", 3) ||
             !memcmp(t, "ROA", 3) || !memcmp(t, "IPA", 3) || !memcmp(t, "NPA", 3) || !memcmp(t, "NVA", 3);
    }
    case 'd':
      return STARTS(b, p, end, "dapi");
    case 'B':
      return STARTS(b, p, end, "Bearer") || STARTS(b, p, end, "BEARER");
    case 'b':
      return STARTS(b, p, end, "bearer");
    default:
      return 0;
  }
}

static const uint8_t TRIGGERS[] = {'_', '-', '.', ':', '=', 'J', 'A', 'd', 'B', 'b'};
#define N_TRIGGERS (sizeof(TRIGGERS))

static uint8_t IS_TRIGGER[256];

#if defined(__SSE2__)
static __m128i c_us, c_dash, c_dot, c_col, c_eq, c_d, c_a, c_b, c_B, c_e, c_E, c_y, c_J, c_A, c_K, c_S, c_3, c_G, c_I, c_R,
    c_N, c_20, c_s, c_r, c_x, c_k, c_p, c_o, c_t, c_n, c_l, c_slash, c_dq, c_sq, c_09, c_4, c_80, c_10, c_9a, c_9f, c_a0,
    c_a8, c_a9, c_af, c_bb, c_bf, c_c2, c_e1, c_2, c_ef;

static void init_vectors(void) {
  c_us = _mm_set1_epi8('_'), c_dash = _mm_set1_epi8('-'), c_dot = _mm_set1_epi8('.'), c_col = _mm_set1_epi8(':');
  c_eq = _mm_set1_epi8('='), c_d = _mm_set1_epi8('d'), c_a = _mm_set1_epi8('a'), c_b = _mm_set1_epi8('b');
  c_B = _mm_set1_epi8('B'), c_e = _mm_set1_epi8('e'), c_E = _mm_set1_epi8('E'), c_y = _mm_set1_epi8('y');
  c_J = _mm_set1_epi8('J'), c_A = _mm_set1_epi8('A'), c_K = _mm_set1_epi8('K'), c_S = _mm_set1_epi8('S');
  c_3 = _mm_set1_epi8('3'), c_G = _mm_set1_epi8('G'), c_I = _mm_set1_epi8('I'), c_R = _mm_set1_epi8('R');
  c_N = _mm_set1_epi8('N'), c_20 = _mm_set1_epi8(0x20), c_s = _mm_set1_epi8('s'), c_r = _mm_set1_epi8('r');
  c_x = _mm_set1_epi8('x'), c_k = _mm_set1_epi8('k'), c_p = _mm_set1_epi8('p'), c_o = _mm_set1_epi8('o');
  c_t = _mm_set1_epi8('t');
  c_n = _mm_set1_epi8('n'), c_l = _mm_set1_epi8('l'), c_slash = _mm_set1_epi8('/'), c_dq = _mm_set1_epi8('"');
  c_sq = _mm_set1_epi8('\''), c_09 = _mm_set1_epi8(0x09), c_4 = _mm_set1_epi8(4), c_80 = _mm_set1_epi8((char)0x80);
  c_10 = _mm_set1_epi8(10), c_9a = _mm_set1_epi8((char)0x9a), c_9f = _mm_set1_epi8((char)0x9f);
  c_a0 = _mm_set1_epi8((char)0xa0), c_a8 = _mm_set1_epi8((char)0xa8), c_a9 = _mm_set1_epi8((char)0xa9);
  c_af = _mm_set1_epi8((char)0xaf), c_bb = _mm_set1_epi8((char)0xbb), c_bf = _mm_set1_epi8((char)0xbf);
  c_c2 = _mm_set1_epi8((char)0xc2), c_e1 = _mm_set1_epi8((char)0xe1), c_2 = _mm_set1_epi8(2);
  c_ef = _mm_set1_epi8((char)0xef);
}

#define EQ _mm_cmpeq_epi8
#define OR _mm_or_si128
#define AND _mm_and_si128

/*
 * The trigger positions of the 16 bytes at `at` (which reads at[-1] and at[16]), as a bit mask;
 * `*ce` gets those that are ':' or '='. Triggers whose test needs a neighbour are paired with
 * it here, so that common letters and punctuation do not each cost a test: 'd' + 'a' (dapi),
 * 'b' + 'e' and 'B' + 'e'/'E' (bearer), 'y' + 'J' (eyJ: flagged at its 'y'), 'A' + one of
 * K S 3 G I R N, '.' after G s S b r, '-' before '-' or after x k b p a o r t. '_', ':' and '='
 * go to their tests as they are.
 */
/* lo <= x <= lo + span, as unsigned bytes. */
static inline __attribute__((always_inline)) __m128i in_range(__m128i x, __m128i lo, __m128i span) {
  __m128i d = _mm_sub_epi8(x, lo);
  return _mm_cmpeq_epi8(_mm_min_epu8(d, span), d);
}

/*
 * Where the byte before a ':' or '=' lets key_before() pass: a space it skips (skip_space), a
 * quote, or the last letter of a key word (d e t n y l s, either case). Elsewhere key_before()
 * says no at once, so such an operator is no trigger unless it is a URL's ':' (then '/' follows).
 */
static inline __attribute__((always_inline)) __m128i key_prev(__m128i pv, __m128i pl) {
  __m128i ascii = OR(OR(EQ(pv, c_20), in_range(pv, c_09, c_4)), OR(EQ(pv, c_dq), EQ(pv, c_sq)));
  __m128i letters = OR(OR(OR(EQ(pl, c_d), EQ(pl, c_e)), OR(EQ(pl, c_t), EQ(pl, c_n))), OR(OR(EQ(pl, c_y), EQ(pl, c_l)), EQ(pl, c_s)));
  __m128i high = OR(OR(OR(in_range(pv, c_80, c_10), EQ(pv, c_9a)), OR(EQ(pv, c_9f), EQ(pv, c_a0))),
                    OR(OR(EQ(pv, c_a8), EQ(pv, c_a9)), OR(EQ(pv, c_af), EQ(pv, c_bb))));
  high = OR(high, OR(OR(EQ(pv, c_bf), EQ(pv, c_c2)), OR(in_range(pv, c_e1, c_2), EQ(pv, c_ef))));
  return OR(OR(ascii, letters), high);
}

static inline __attribute__((always_inline)) unsigned block(bytes at, unsigned *ce) {
  __m128i v = _mm_loadu_si128((const __m128i *)at);
  __m128i n = _mm_loadu_si128((const __m128i *)(at + 1));
  __m128i pv = _mm_loadu_si128((const __m128i *)(at - 1));
  __m128i pl = OR(pv, c_20); /* ASCII letters folded to lowercase */
  __m128i dot = AND(EQ(v, c_dot), OR(OR(EQ(pv, c_G), EQ(pl, c_s)), OR(EQ(pv, c_b), EQ(pv, c_r))));
  __m128i dpre = OR(OR(OR(EQ(pv, c_x), EQ(pv, c_k)), OR(EQ(pv, c_b), EQ(pv, c_p))),
                    OR(OR(EQ(pv, c_a), EQ(pv, c_o)), OR(EQ(pv, c_r), EQ(pv, c_t))));
  __m128i dash = AND(EQ(v, c_dash), OR(dpre, EQ(n, c_dash)));
  __m128i colon = OR(EQ(v, c_col), EQ(v, c_eq));
  if (_mm_movemask_epi8(colon)) colon = AND(colon, OR(key_prev(pv, pl), AND(EQ(v, c_col), EQ(n, c_slash))));
  __m128i m = OR(OR(EQ(v, c_us), dash), OR(dot, colon));
  m = OR(m, AND(EQ(v, c_d), EQ(n, c_a)));
  m = OR(m, AND(EQ(v, c_b), EQ(n, c_e)));
  m = OR(m, AND(EQ(v, c_B), OR(EQ(n, c_e), EQ(n, c_E))));
  m = OR(m, AND(EQ(v, c_y), EQ(n, c_J)));
  __m128i aw = OR(OR(OR(EQ(n, c_K), EQ(n, c_S)), OR(EQ(n, c_3), EQ(n, c_G))), OR(OR(EQ(n, c_I), EQ(n, c_R)), EQ(n, c_N)));
  m = OR(m, AND(EQ(v, c_A), aw));
  *ce = (unsigned)_mm_movemask_epi8(colon);
  return (unsigned)_mm_movemask_epi8(m);
}
#endif

/* The test of a trigger found by block(): ':' and '=' by their own tests, 'y' as the 'y' of "eyJ". */
static inline int test_found(bytes b, long lo, long q, long end, int colon) {
  if (colon) return (b[q] == ':' && url_at(b, q, end)) || key_before(b, lo, q);
  if (b[q] == 'y') return q - lo >= 1 && b[q - 1] == 'e';
  return test_at(b, lo, q, end);
}

static long scan(bytes b, long lo, long from, long end) {
  long p = from;
#if defined(__SSE2__)
  /* block() reads b[p - 1] and b[p + 16]: the first position goes through the scalar test */
  if (p < end && ((IS_TRIGGER[b[p]] && test_at(b, lo, p, end)) || (b[p] == 'y' && p + 1 < end && b[p + 1] == 'J' && test_found(b, lo, p, end, 0)))) return p;
  if (p < end) p++;
  /* 64 bytes at a time, so that the loop over the hits leaves (a mispredicted branch) once per 64 bytes */
  for (; p + 65 <= end; p += 64) {
    unsigned c0, c1, c2, c3;
    uint64_t m = (uint64_t)block(b + p, &c0) | (uint64_t)block(b + p + 16, &c1) << 16 |
                 (uint64_t)block(b + p + 32, &c2) << 32 | (uint64_t)block(b + p + 48, &c3) << 48;
    if (!m) continue;
    uint64_t ce = (uint64_t)c0 | (uint64_t)c1 << 16 | (uint64_t)c2 << 32 | (uint64_t)c3 << 48;
    do {
      int bit = __builtin_ctzll(m);
      long q = p + bit;
      if (test_found(b, lo, q, end, (int)((ce >> bit) & 1))) return q;
      m &= m - 1;
    } while (m);
  }
  for (; p + 17 <= end; p += 16) {
    unsigned c;
    unsigned m = block(b + p, &c);
    while (m) {
      int bit = __builtin_ctz(m);
      if (test_found(b, lo, p + bit, end, (int)((c >> bit) & 1))) return p + bit;
      m &= m - 1;
    }
  }
#endif
  for (; p < end; p++)
    if (IS_TRIGGER[b[p]] && test_at(b, lo, p, end)) return p;
  return -1;
}

long memsnap_scan(const uint8_t *b, long lo, long from, long end) { return from >= end ? -1 : scan(b, lo, from, end); }

/* scan(buf: Uint8Array, start?: number, end?: number, from?: number): number; look-behinds stop at start, the search begins at from */
static napi_value Scan(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value argv[4];
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  bool is_ta = false;
  if (argc < 1 || napi_is_typedarray(env, argv[0], &is_ta) != napi_ok || !is_ta) {
    napi_throw_type_error(env, NULL, "scan: a Uint8Array is required");
    return NULL;
  }
  napi_typedarray_type type;
  size_t length;
  void *data;
  napi_value ab;
  size_t offset;
  napi_get_typedarray_info(env, argv[0], &type, &length, &data, &ab, &offset);
  if (type != napi_uint8_array) {
    napi_throw_type_error(env, NULL, "scan: a Uint8Array is required");
    return NULL;
  }
  int64_t start = 0, end = (int64_t)length;
  if (argc >= 2) napi_get_value_int64(env, argv[1], &start);
  if (argc >= 3) napi_get_value_int64(env, argv[2], &end);
  if (start < 0) start = 0;
  if (end > (int64_t)length) end = (int64_t)length;
  int64_t from = start;
  if (argc >= 4) napi_get_value_int64(env, argv[3], &from);
  if (from < start) from = start;
  long r = from >= end ? -1 : scan((bytes)data, (long)start, (long)from, (long)end);
  napi_value out;
  napi_create_int64(env, r, &out);
  return out;
}

/* ------------------------------------------------------------------ scanFile */

/*
 * scanFile(fd, size, digest, callback[, json]): on a libuv pool thread, read the file's first `size`
 * bytes in order, SHA-256 them into `digest` (32 bytes), and scan them for a trigger as the
 * stream redactor would (with `json`, a JSON escape that can hide one is a trigger too): callback(errno, at, bytesRead), `at` -1 when nothing in the file could
 * match, else an offset at or before which the JS path must look (the digest is then not
 * written). bytesRead short of `size`: the file ended early (nothing is decided).
 *
 * The file is scanned in blocks of SF_BLOCK bytes, each with SF_MARGIN bytes of context on
 * either side (the file's own start and end where they are nearer). -1 here means -1 for the
 * whole file read as one range, and so for every piece the stream redactor scans (its pieces
 * are ranges of the file, and a range can only see less: every test below is "this context is
 * there", so truncating the context only removes hits). A test reaches at most 16 bytes back
 * and 2404 + 16 ahead, except the whitespace run between a key and its ':' or '=' (key_before),
 * which has no bound: when the SF_MARGIN - 16 bytes before a block are all such whitespace, the
 * run may go on past the margin, and the block is a hit ("maybe") without looking further.
 */
#define SF_BLOCK (1 << 20)
#define SF_MARGIN 4096

typedef struct {
  napi_async_work work;
  napi_ref refs[2]; /* digest, callback */
  int fd;
  int json; /* also stop at a JSON escape that can hide a secret (hiding_escape) */
  int64_t size;
  uint8_t *digest;
  int64_t got;
  int64_t at;
  int err;
} scan_file_t;

/* The ASCII characters a \uXXXX escape may hide (see hiding_escape): letters, digits, _ - . : = / @ \ " ' and JS whitespace. */
static uint8_t HIDES[128];

static int hex(int c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; }

/*
 * The first backslash in [from, to) that starts a JSON escape which can hide a secret from the
 * scan (src/redact/escapes.ts, hidingEscapeAt): `\/`, or `\uXXXX` for a letter, a digit, one of
 * `_ - . : = / @ \ " '` or a character JS counts as whitespace; -1 if none. An escape must end by `end`.
 */
long memsnap_hiding_escape(const uint8_t *b, long from, long to, long end) {
  for (long p = from; p < to; p++) {
    const uint8_t *q = memchr(b + p, '\\', (size_t)(to - p));
    if (!q) return -1;
    p = q - b;
    if (p + 1 < end && b[p + 1] == '/') return p;
    if (p + 6 > end || b[p + 1] != 'u') continue;
    int h0 = hex(b[p + 2]), h1 = hex(b[p + 3]), h2 = hex(b[p + 4]), h3 = hex(b[p + 5]);
    if (h0 < 0 || h1 < 0 || h2 < 0 || h3 < 0) continue;
    unsigned u = (unsigned)(h0 << 12 | h1 << 8 | h2 << 4 | h3);
    if (u < 0x80 ? HIDES[u] : u == 0xa0 || u == 0x1680 || (u >= 0x2000 && u <= 0x200a) ||
        u == 0x2028 || u == 0x2029 || u == 0x202f || u == 0x205f || u == 0x3000 || u == 0xfeff) return p;
  }
  return -1;
}

static void scan_file_execute(napi_env env, void *data) {
  (void)env;
  scan_file_t *w = (scan_file_t *)data;
  w->at = -1;
  uint8_t *buf = (uint8_t *)malloc(SF_MARGIN + SF_BLOCK + SF_MARGIN);
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  if (!buf || !md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
    w->err = ENOMEM;
    goto out;
  }
  int64_t base = 0, len = 0; /* buf[0, len) holds the file's bytes [base, base + len) */
  for (int64_t a = 0; a < w->size;) {
    int64_t b = a + SF_BLOCK < w->size ? a + SF_BLOCK : w->size;
    int64_t end = b + SF_MARGIN < w->size ? b + SF_MARGIN : w->size;
    while (base + len < end) {
      ssize_t r = pread(w->fd, buf + len, (size_t)(end - base - len), (off_t)(base + len));
      if (r < 0) {
        if (errno == EINTR) continue;
        w->err = errno;
        goto out;
      }
      if (r == 0) break; /* the file ended early */
      if (EVP_DigestUpdate(md, buf + len, (size_t)r) != 1) {
        w->err = EIO;
        goto out;
      }
      len += r;
      w->got = base + len;
    }
    if (base + len < end) goto out; /* shorter than size: the caller says so */
    int64_t lo = a > SF_MARGIN ? a - SF_MARGIN : 0;
    long hit = scan(buf, (long)(lo - base), (long)(a - base), (long)(end - base));
    if (hit < 0 && w->json) hit = memsnap_hiding_escape(buf, (long)(a - base), (long)(b - base), (long)(end - base));
    if (hit >= 0) {
      w->at = base + hit;
      goto out;
    }
    if (lo > 0) {
      /* a key's whitespace run that may reach past the margin (see above) */
      long i = (long)(a - base) - 1, stop = (long)(lo - base) + 16;
      while (i >= stop && skip_space(buf[i])) i--;
      if (i < stop) {
        w->at = a;
        goto out;
      }
    }
    int64_t keep = b > SF_MARGIN ? b - SF_MARGIN : 0;
    memmove(buf, buf + (keep - base), (size_t)(base + len - keep));
    len -= keep - base;
    base = keep;
    a = b;
  }
  if (w->got == w->size) {
    unsigned int outlen = 0;
    if (EVP_DigestFinal_ex(md, w->digest, &outlen) != 1 || outlen != 32) w->err = EIO;
  }
out:
  EVP_MD_CTX_free(md);
  free(buf);
}

static void scan_file_complete(napi_env env, napi_status status, void *data) {
  scan_file_t *w = (scan_file_t *)data;
  napi_value cb, undef, argv[3];
  int have_cb = napi_get_reference_value(env, w->refs[1], &cb) == napi_ok && cb != NULL;
  for (int i = 0; i < 2; i++) napi_delete_reference(env, w->refs[i]);
  napi_delete_async_work(env, w->work);
  int err = status == napi_ok ? w->err : ECANCELED;
  double at = (double)w->at, got = (double)w->got;
  free(w);
  if (!have_cb) return;
  napi_create_int32(env, err, &argv[0]);
  napi_create_double(env, at, &argv[1]);
  napi_create_double(env, got, &argv[2]);
  napi_get_undefined(env, &undef);
  napi_call_function(env, undef, cb, 3, argv, NULL);
}

static napi_value ScanFile(napi_env env, napi_callback_info info) {
  size_t argc = 5;
  napi_value argv[5];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 4) {
    napi_throw_type_error(env, NULL, "scanFile(fd, size, digest, callback): four arguments expected");
    return NULL;
  }
  int32_t fd;
  double size;
  if (napi_get_value_int32(env, argv[0], &fd) != napi_ok || fd < 0) {
    napi_throw_type_error(env, NULL, "scanFile: fd must be a file descriptor");
    return NULL;
  }
  if (napi_get_value_double(env, argv[1], &size) != napi_ok || !(size >= 0 && size < 9007199254740992.0) || size != (double)(int64_t)size) {
    napi_throw_type_error(env, NULL, "scanFile: size must be a non-negative integer");
    return NULL;
  }
  bool is_ta = false;
  napi_typedarray_type type;
  size_t dlen = 0;
  void *dp = NULL;
  if (napi_is_typedarray(env, argv[2], &is_ta) != napi_ok || !is_ta || napi_get_typedarray_info(env, argv[2], &type, &dlen, &dp, NULL, NULL) != napi_ok ||
      type != napi_uint8_array || dlen < 32) {
    napi_throw_type_error(env, NULL, "scanFile: digest must be a Uint8Array of 32 bytes");
    return NULL;
  }
  napi_valuetype t;
  if (napi_typeof(env, argv[3], &t) != napi_ok || t != napi_function) {
    napi_throw_type_error(env, NULL, "scanFile: callback must be a function");
    return NULL;
  }
  scan_file_t *w = (scan_file_t *)calloc(1, sizeof *w);
  if (!w) {
    napi_throw_error(env, "ENOMEM", "scanFile: out of memory");
    return NULL;
  }
  w->fd = fd;
  bool json = false;
  if (argc >= 5) napi_get_value_bool(env, argv[4], &json);
  w->json = json;
  w->size = (int64_t)size;
  w->digest = (uint8_t *)dp;
  napi_create_reference(env, argv[2], 1, &w->refs[0]);
  napi_create_reference(env, argv[3], 1, &w->refs[1]);
  napi_value name;
  napi_create_string_utf8(env, "memsnap.scanFile", NAPI_AUTO_LENGTH, &name);
  if (napi_create_async_work(env, NULL, name, scan_file_execute, scan_file_complete, w, &w->work) != napi_ok ||
      napi_queue_async_work(env, w->work) != napi_ok) {
    for (int i = 0; i < 2; i++) napi_delete_reference(env, w->refs[i]);
    free(w);
    napi_throw_error(env, NULL, "scanFile: cannot queue the work");
    return NULL;
  }
  return NULL;
}

static napi_value Init(napi_env env, napi_value exports) {
  for (unsigned i = 0; i < N_TRIGGERS; i++) IS_TRIGGER[TRIGGERS[i]] = 1;
  for (int c = 0; c < 128; c++)
    HIDES[c] = (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= 0x09 && c <= 0x0d) ||
               (c != 0 && strchr("_-.:=/@\\\"' ", c) != NULL);
#if defined(__SSE2__)
  init_vectors();
#endif
  for (unsigned i = 0; i < sizeof(KEY_WORDS) / sizeof(KEY_WORDS[0]); i++) {
    size_t n = strlen(KEY_WORDS[i]);
    KEY_END[(uint8_t)KEY_WORDS[i][n - 2]][(uint8_t)KEY_WORDS[i][n - 1]] = 1;
  }
  napi_value fn;
  napi_create_function(env, "scan", NAPI_AUTO_LENGTH, Scan, NULL, &fn);
  napi_set_named_property(env, exports, "scan", fn);
  napi_create_function(env, "scanFile", NAPI_AUTO_LENGTH, ScanFile, NULL, &fn);
  napi_set_named_property(env, exports, "scanFile", fn);
  napi_value yes;
  napi_get_boolean(env, true, &yes);
  napi_set_named_property(env, exports, "scanFileJson", yes); /* scanFile takes `json` (a fifth argument) */
  napi_value simd;
#if defined(__SSE2__)
  napi_get_boolean(env, true, &simd);
#else
  napi_get_boolean(env, false, &simd);
#endif
  napi_set_named_property(env, exports, "simd", simd);
  memsnap_register_sqlite_walk(env, exports);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
