/*
 * memsnap_aead: age STREAM chunks sealed and opened in place, with the ChaCha20-Poly1305 of the
 * OpenSSL that Node itself carries (its libcrypto symbols, which Node exports to addons).
 *
 * age's payload is a run of 64 KiB chunks, each sealed under its own nonce (an 11-byte
 * big-endian counter and a last-chunk flag). node:crypto needs a new cipher object per chunk,
 * and each returns freshly allocated output that is then copied again; in the bundle sink that
 * was ~0.2 CPU-s per gigabyte of payload in allocation, page faults and copies. Here one cipher
 * context per thread (per Node environment) is re-keyed for each chunk, and the output goes
 * straight to the caller's buffer.
 *
 *   seal(key, counter, last, src, srcOffset, length, dst, dstOffset) -> length + 16
 *     writes the ciphertext then the 16-byte tag at dst[dstOffset]
 *   open(key, counter, last, src, srcOffset, sealedLength, dst, dstOffset) -> plaintext length, or -1
 *     when the tag does not authenticate (dst may then hold garbage)
 *
 * key: 32 bytes. counter: 0 to 2^48 - 1 (age's counter is 11 bytes; no payload gets near 2^48
 * chunks). length <= 65536. src and dst may not overlap.
 *
 * And, for the KV source, the SHA-256 of Node's OpenSSL off the main thread:
 *
 *   readHash(fd, position, buf, lens, count, digests, zero, callback)
 *     on a libuv pool thread, reads sum(lens[0..count)) bytes of fd at position into buf
 *     (pread until done or end of file), then for each tile i of lens[i] bytes sets zero[i] to 1
 *     when it is all zero bytes, else to 0 and writes its SHA-256 at digests[32 * i].
 *     callback(errno, bytesRead): errno 0, or the read's errno (nothing hashed); bytesRead short
 *     of the sum means the file ended (nothing hashed either).
 *
 * The caller must not touch buf, digests or zero until the callback: they are written from
 * another thread meanwhile (the addon holds references so they stay alive).
 *
 * And, for the SQLite source's changed-page pass, a whole range hashed in one pool job, so that
 * the calling thread is free meanwhile (it runs quick_check in the same read transaction):
 *
 *   hashRange(fd, position, length, pageSize, out, callback)
 *     on a libuv pool thread, reads `length` bytes of fd at position, 1 MiB at a time into a
 *     buffer of its own; pageSize > 0: writes the first 16 bytes of each page's SHA-256 at
 *     out[16 * i] (the last page may be short); pageSize 0: writes the SHA-256 of the whole
 *     range at out[0..32). callback(errno, bytesRead) as readHash's: a short bytesRead or an
 *     errno means `out` holds nothing to use.
 */
#define NAPI_VERSION 8
#include <node_api.h>
#include <openssl/evp.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK 65536
#define TAG 16

static napi_value fail(napi_env env, const char *msg) {
  napi_throw_range_error(env, NULL, msg);
  return NULL;
}

static void free_ctx(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  EVP_CIPHER_CTX_free((EVP_CIPHER_CTX *)data);
}

/* This environment's cipher context (one per thread: N-API instance data is per environment). */
static EVP_CIPHER_CTX *ctx_of(napi_env env) {
  void *p = NULL;
  if (napi_get_instance_data(env, &p) == napi_ok && p) return (EVP_CIPHER_CTX *)p;
  EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
  if (!c) return NULL;
  if (napi_set_instance_data(env, c, free_ctx, NULL) != napi_ok) {
    EVP_CIPHER_CTX_free(c);
    return NULL;
  }
  return c;
}

static int bytes_of(napi_env env, napi_value v, uint8_t **data, size_t *len) {
  bool is = false;
  napi_typedarray_type type;
  void *p = NULL;
  size_t n = 0;
  if (napi_is_typedarray(env, v, &is) != napi_ok || !is) return 0;
  if (napi_get_typedarray_info(env, v, &type, &n, &p, NULL, NULL) != napi_ok || type != napi_uint8_array) return 0;
  *data = (uint8_t *)p;
  *len = n;
  return 1;
}

/* Arguments shared by seal and open. */
typedef struct {
  EVP_CIPHER_CTX *ctx;
  uint8_t nonce[12];
  const uint8_t *key;
  const uint8_t *src;
  uint8_t *dst;
  size_t len; /* bytes read from src */
  size_t room; /* bytes available at dst */
} call_t;

static int parse(napi_env env, napi_callback_info info, call_t *c, const char *name) {
  size_t argc = 8;
  napi_value argv[8];
  char msg[160];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 8) {
    snprintf(msg, sizeof msg, "%s(key, counter, last, src, srcOffset, length, dst, dstOffset): eight arguments expected", name);
    fail(env, msg);
    return 0;
  }
  uint8_t *key, *src, *dst;
  size_t klen, slen, dlen;
  double counter, so, n, dof;
  bool last = false;
  if (!bytes_of(env, argv[0], &key, &klen) || klen != 32) return fail(env, "key: 32 bytes expected"), 0;
  if (napi_get_value_double(env, argv[1], &counter) != napi_ok || !(counter >= 0 && counter < 281474976710656.0) || counter != (double)(uint64_t)counter)
    return fail(env, "counter: an integer from 0 to 2^48 - 1 expected"), 0;
  if (napi_get_value_bool(env, argv[2], &last) != napi_ok) return fail(env, "last: a boolean expected"), 0;
  if (!bytes_of(env, argv[3], &src, &slen) || !bytes_of(env, argv[6], &dst, &dlen)) return fail(env, "src and dst: Uint8Arrays expected"), 0;
  if (napi_get_value_double(env, argv[4], &so) != napi_ok || napi_get_value_double(env, argv[5], &n) != napi_ok ||
      napi_get_value_double(env, argv[7], &dof) != napi_ok)
    return fail(env, "offsets and length: numbers expected"), 0;
  if (!(so >= 0 && n >= 0 && dof >= 0) || so != (double)(size_t)so || n != (double)(size_t)n || dof != (double)(size_t)dof ||
      (size_t)so > slen || (size_t)n > slen - (size_t)so || (size_t)dof > dlen)
    return fail(env, "offsets and length: out of range"), 0;
  c->ctx = ctx_of(env);
  if (!c->ctx) {
    napi_throw_error(env, "ENOMEM", "aead: no cipher context");
    return 0;
  }
  uint64_t k = (uint64_t)counter;
  memset(c->nonce, 0, sizeof c->nonce);
  for (int i = 0; i < 6; i++) c->nonce[10 - i] = (uint8_t)(k >> (8 * i));
  c->nonce[11] = last ? 1 : 0;
  c->key = key;
  c->src = src + (size_t)so;
  c->len = (size_t)n;
  c->dst = dst + (size_t)dof;
  c->room = dlen - (size_t)dof;
  if (c->src < c->dst + c->room && c->dst < c->src + c->len) return fail(env, "src and dst overlap"), 0;
  return 1;
}

static napi_value number(napi_env env, double v) {
  napi_value r;
  napi_create_double(env, v, &r);
  return r;
}

static napi_value Seal(napi_env env, napi_callback_info info) {
  call_t c;
  if (!parse(env, info, &c, "seal")) return NULL;
  if (c.len > CHUNK) return fail(env, "seal: a chunk is at most 65536 bytes");
  if (c.room < c.len + TAG) return fail(env, "seal: dst has no room for the sealed chunk");
  int out = 0, fin = 0;
  if (EVP_EncryptInit_ex(c.ctx, EVP_chacha20_poly1305(), NULL, c.key, c.nonce) != 1 ||
      (c.len > 0 && EVP_EncryptUpdate(c.ctx, c.dst, &out, c.src, (int)c.len) != 1) ||
      EVP_EncryptFinal_ex(c.ctx, c.dst + out, &fin) != 1 || (size_t)(out + fin) != c.len ||
      EVP_CIPHER_CTX_ctrl(c.ctx, EVP_CTRL_AEAD_GET_TAG, TAG, c.dst + c.len) != 1) {
    napi_throw_error(env, NULL, "seal: OpenSSL's ChaCha20-Poly1305 failed");
    return NULL;
  }
  return number(env, (double)(c.len + TAG));
}

static napi_value Open(napi_env env, napi_callback_info info) {
  call_t c;
  if (!parse(env, info, &c, "open")) return NULL;
  if (c.len < TAG || c.len > CHUNK + TAG) return fail(env, "open: a sealed chunk is 16 to 65552 bytes");
  size_t plain = c.len - TAG;
  if (c.room < plain) return fail(env, "open: dst has no room for the chunk");
  int out = 0, fin = 0;
  if (EVP_DecryptInit_ex(c.ctx, EVP_chacha20_poly1305(), NULL, c.key, c.nonce) != 1 ||
      (plain > 0 && EVP_DecryptUpdate(c.ctx, c.dst, &out, c.src, (int)plain) != 1) ||
      EVP_CIPHER_CTX_ctrl(c.ctx, EVP_CTRL_AEAD_SET_TAG, TAG, (void *)(c.src + plain)) != 1) {
    napi_throw_error(env, NULL, "open: OpenSSL's ChaCha20-Poly1305 failed");
    return NULL;
  }
  if (EVP_DecryptFinal_ex(c.ctx, c.dst + out, &fin) != 1) return number(env, -1);
  return number(env, (double)plain);
}

/* ------------------------------------------------------------------ readHash */

typedef struct {
  napi_async_work work;
  napi_ref refs[5]; /* buf, lens, digests, zero, callback */
  int fd;
  int64_t pos;
  uint8_t *buf;
  const uint32_t *lens;
  size_t count;
  size_t total;
  uint8_t *digests;
  uint8_t *zero;
  size_t got;
  int err;
} read_hash_t;

static int all_zero(const uint8_t *p, size_t n) {
  if (n == 0) return 1;
  return p[0] == 0 && memcmp(p, p + 1, n - 1) == 0;
}

static void read_hash_execute(napi_env env, void *data) {
  (void)env;
  read_hash_t *w = (read_hash_t *)data;
  while (w->got < w->total) {
    ssize_t r = pread(w->fd, w->buf + w->got, w->total - w->got, (off_t)(w->pos + (int64_t)w->got));
    if (r < 0) {
      if (errno == EINTR) continue;
      w->err = errno;
      return;
    }
    if (r == 0) return; /* the file ended early */
    w->got += (size_t)r;
  }
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  if (!md) {
    w->err = ENOMEM;
    return;
  }
  const EVP_MD *sha = EVP_sha256();
  size_t off = 0;
  for (size_t i = 0; i < w->count; i++) {
    const uint8_t *p = w->buf + off;
    size_t n = w->lens[i];
    off += n;
    if (all_zero(p, n)) {
      w->zero[i] = 1;
      continue;
    }
    w->zero[i] = 0;
    unsigned int outlen = 0;
    if (EVP_DigestInit_ex(md, sha, NULL) != 1 || EVP_DigestUpdate(md, p, n) != 1 || EVP_DigestFinal_ex(md, w->digests + 32 * i, &outlen) != 1 || outlen != 32) {
      w->err = EIO;
      break;
    }
  }
  EVP_MD_CTX_free(md);
}

static void read_hash_complete(napi_env env, napi_status status, void *data) {
  read_hash_t *w = (read_hash_t *)data;
  napi_value cb, undef, argv[2];
  int have_cb = napi_get_reference_value(env, w->refs[4], &cb) == napi_ok;
  for (int i = 0; i < 5; i++) napi_delete_reference(env, w->refs[i]);
  napi_delete_async_work(env, w->work);
  int err = status == napi_ok ? w->err : ECANCELED;
  size_t got = w->got;
  free(w);
  if (!have_cb) return;
  napi_create_int32(env, err, &argv[0]);
  napi_create_double(env, (double)got, &argv[1]);
  napi_get_undefined(env, &undef);
  napi_call_function(env, undef, cb, 2, argv, NULL);
}

static napi_value ReadHash(napi_env env, napi_callback_info info) {
  size_t argc = 8;
  napi_value argv[8];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 8)
    return fail(env, "readHash(fd, position, buf, lens, count, digests, zero, callback): eight arguments expected");
  int32_t fd;
  double pos, count;
  if (napi_get_value_int32(env, argv[0], &fd) != napi_ok || fd < 0) return fail(env, "fd: a file descriptor expected");
  if (napi_get_value_double(env, argv[1], &pos) != napi_ok || !(pos >= 0 && pos < 9007199254740992.0) || pos != (double)(int64_t)pos)
    return fail(env, "position: a non-negative integer expected");
  if (napi_get_value_double(env, argv[4], &count) != napi_ok || !(count >= 0) || count != (double)(size_t)count) return fail(env, "count: a non-negative integer expected");
  uint8_t *buf, *digests, *zero;
  size_t blen, dlen, zlen;
  if (!bytes_of(env, argv[2], &buf, &blen) || !bytes_of(env, argv[5], &digests, &dlen) || !bytes_of(env, argv[6], &zero, &zlen))
    return fail(env, "buf, digests and zero: Uint8Arrays expected");
  bool is = false;
  napi_typedarray_type type;
  void *lp = NULL;
  size_t llen = 0;
  if (napi_is_typedarray(env, argv[3], &is) != napi_ok || !is || napi_get_typedarray_info(env, argv[3], &type, &llen, &lp, NULL, NULL) != napi_ok ||
      type != napi_uint32_array)
    return fail(env, "lens: a Uint32Array expected");
  napi_valuetype t;
  if (napi_typeof(env, argv[7], &t) != napi_ok || t != napi_function) return fail(env, "callback: a function expected");
  size_t n = (size_t)count;
  if (n > llen || n > zlen || n > dlen / 32) return fail(env, "count: more tiles than lens, digests or zero hold");
  const uint32_t *lens = (const uint32_t *)lp;
  size_t total = 0;
  for (size_t i = 0; i < n; i++) total += lens[i];
  if (total > blen) return fail(env, "buf: smaller than the tiles");
  read_hash_t *w = (read_hash_t *)calloc(1, sizeof *w);
  if (!w) {
    napi_throw_error(env, "ENOMEM", "readHash: out of memory");
    return NULL;
  }
  w->fd = fd;
  w->pos = (int64_t)pos;
  w->buf = buf;
  w->lens = lens;
  w->count = n;
  w->total = total;
  w->digests = digests;
  w->zero = zero;
  const int keep[5] = {2, 3, 5, 6, 7};
  for (int i = 0; i < 5; i++) napi_create_reference(env, argv[keep[i]], 1, &w->refs[i]);
  napi_value name;
  napi_create_string_utf8(env, "memsnap.readHash", NAPI_AUTO_LENGTH, &name);
  if (napi_create_async_work(env, NULL, name, read_hash_execute, read_hash_complete, w, &w->work) != napi_ok ||
      napi_queue_async_work(env, w->work) != napi_ok) {
    for (int i = 0; i < 5; i++) napi_delete_reference(env, w->refs[i]);
    free(w);
    napi_throw_error(env, NULL, "readHash: cannot queue the work");
    return NULL;
  }
  return NULL;
}

/* ------------------------------------------------------------------ hashRange */

#define RANGE_BLOCK (1 << 20)

typedef struct {
  napi_async_work work;
  napi_ref refs[2]; /* out, callback */
  int fd;
  int64_t pos;
  int64_t len;
  uint32_t page;
  uint8_t *out;
  int64_t got;
  int err;
} hash_range_t;

static void hash_range_execute(napi_env env, void *data) {
  (void)env;
  hash_range_t *w = (hash_range_t *)data;
  /* whole pages per block, so that no page straddles two reads */
  size_t block = RANGE_BLOCK;
  if (w->page > 0) block = w->page >= RANGE_BLOCK ? w->page : (RANGE_BLOCK / w->page) * w->page;
  uint8_t *buf = (uint8_t *)malloc(block);
  EVP_MD_CTX *whole = EVP_MD_CTX_new();
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  const EVP_MD *sha = EVP_sha256();
  if (!buf || !whole || !md || (w->page == 0 && EVP_DigestInit_ex(whole, sha, NULL) != 1)) {
    w->err = ENOMEM;
    goto done;
  }
  size_t pageIndex = 0;
  while (w->got < w->len) {
    size_t want = (size_t)(w->len - w->got) < block ? (size_t)(w->len - w->got) : block;
    size_t have = 0;
    while (have < want) {
      ssize_t r = pread(w->fd, buf + have, want - have, (off_t)(w->pos + w->got + (int64_t)have));
      if (r < 0) {
        if (errno == EINTR) continue;
        w->err = errno;
        goto done;
      }
      if (r == 0) { /* the file ended early: report what was read, hash nothing more */
        w->got += (int64_t)have;
        goto done;
      }
      have += (size_t)r;
    }
    if (w->page == 0) {
      if (EVP_DigestUpdate(whole, buf, have) != 1) {
        w->err = EIO;
        goto done;
      }
    } else {
      uint8_t d[32];
      for (size_t off = 0; off < have; off += w->page, pageIndex++) {
        size_t n = have - off < w->page ? have - off : w->page;
        unsigned int outlen = 0;
        if (EVP_DigestInit_ex(md, sha, NULL) != 1 || EVP_DigestUpdate(md, buf + off, n) != 1 ||
            EVP_DigestFinal_ex(md, d, &outlen) != 1 || outlen != 32) {
          w->err = EIO;
          goto done;
        }
        memcpy(w->out + 16 * pageIndex, d, 16);
      }
    }
    w->got += (int64_t)have;
  }
  if (w->page == 0) {
    unsigned int outlen = 0;
    if (EVP_DigestFinal_ex(whole, w->out, &outlen) != 1 || outlen != 32) w->err = EIO;
  }
done:
  EVP_MD_CTX_free(md);
  EVP_MD_CTX_free(whole);
  free(buf);
}

static void hash_range_complete(napi_env env, napi_status status, void *data) {
  hash_range_t *w = (hash_range_t *)data;
  napi_value cb, undef, argv[2];
  int have_cb = napi_get_reference_value(env, w->refs[1], &cb) == napi_ok;
  for (int i = 0; i < 2; i++) napi_delete_reference(env, w->refs[i]);
  napi_delete_async_work(env, w->work);
  int err = status == napi_ok ? w->err : ECANCELED;
  double got = (double)w->got;
  free(w);
  if (!have_cb) return;
  napi_create_int32(env, err, &argv[0]);
  napi_create_double(env, got, &argv[1]);
  napi_get_undefined(env, &undef);
  napi_call_function(env, undef, cb, 2, argv, NULL);
}

static napi_value HashRange(napi_env env, napi_callback_info info) {
  size_t argc = 6;
  napi_value argv[6];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 6)
    return fail(env, "hashRange(fd, position, length, pageSize, out, callback): six arguments expected");
  int32_t fd;
  double pos, len, page;
  if (napi_get_value_int32(env, argv[0], &fd) != napi_ok || fd < 0) return fail(env, "fd: a file descriptor expected");
  if (napi_get_value_double(env, argv[1], &pos) != napi_ok || !(pos >= 0 && pos < 9007199254740992.0) || pos != (double)(int64_t)pos)
    return fail(env, "position: a non-negative integer expected");
  if (napi_get_value_double(env, argv[2], &len) != napi_ok || !(len >= 0 && len < 9007199254740992.0) || len != (double)(int64_t)len)
    return fail(env, "length: a non-negative integer expected");
  if (napi_get_value_double(env, argv[3], &page) != napi_ok || !(page >= 0 && page <= 65536) || page != (double)(uint32_t)page)
    return fail(env, "pageSize: an integer from 0 to 65536 expected");
  uint8_t *out;
  size_t olen;
  if (!bytes_of(env, argv[4], &out, &olen)) return fail(env, "out: a Uint8Array expected");
  napi_valuetype t;
  if (napi_typeof(env, argv[5], &t) != napi_ok || t != napi_function) return fail(env, "callback: a function expected");
  uint32_t ps = (uint32_t)page;
  double need = ps == 0 ? 32.0 : 16.0 * (double)(((int64_t)len + ps - 1) / ps);
  if ((double)olen < need) return fail(env, "out: smaller than the digests of the range");
  hash_range_t *w = (hash_range_t *)calloc(1, sizeof *w);
  if (!w) {
    napi_throw_error(env, "ENOMEM", "hashRange: out of memory");
    return NULL;
  }
  w->fd = fd;
  w->pos = (int64_t)pos;
  w->len = (int64_t)len;
  w->page = ps;
  w->out = out;
  napi_create_reference(env, argv[4], 1, &w->refs[0]);
  napi_create_reference(env, argv[5], 1, &w->refs[1]);
  napi_value name;
  napi_create_string_utf8(env, "memsnap.hashRange", NAPI_AUTO_LENGTH, &name);
  if (napi_create_async_work(env, NULL, name, hash_range_execute, hash_range_complete, w, &w->work) != napi_ok ||
      napi_queue_async_work(env, w->work) != napi_ok) {
    for (int i = 0; i < 2; i++) napi_delete_reference(env, w->refs[i]);
    free(w);
    napi_throw_error(env, NULL, "hashRange: cannot queue the work");
    return NULL;
  }
  return NULL;
}

static napi_value Init(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
      {"seal", NULL, Seal, NULL, NULL, NULL, napi_enumerable, NULL},
      {"open", NULL, Open, NULL, NULL, NULL, napi_enumerable, NULL},
      {"readHash", NULL, ReadHash, NULL, NULL, NULL, napi_enumerable, NULL},
      {"hashRange", NULL, HashRange, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  napi_define_properties(env, exports, 4, props);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
