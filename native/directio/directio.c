/*
 * memsnap_directio: page-aligned memory for O_DIRECT writes.
 *
 * alignedBuffer(size, align) returns an ArrayBuffer of `size` bytes whose memory starts at a
 * multiple of `align` (a power of two, 512 to 65536), from posix_memalign and freed when the
 * ArrayBuffer is collected. The bundle sink (src/pipeline/encoder.ts) writes its batches from
 * it with O_DIRECT, which Linux refuses (EINVAL) for memory not aligned to the device's DMA
 * alignment; JavaScript has no other way to ask for aligned memory.
 *
 * copy(dst, dstOffset, src, srcOffset, length) copies bytes between Uint8Arrays with memcpy.
 * The payload worker uses it to fill the ring it shares with the sink (a SharedArrayBuffer):
 * V8 copies into or out of shared memory with relaxed atomic word stores (relaxed_memmove),
 * which took ~0.16 CPU-s per bench snapshot for ~550 MB. The ring's slots are handed over
 * with Atomics (store + notify after the copy, load before the read), so the sink reads what
 * this copy wrote.
 */
#define NAPI_VERSION 8
#include <node_api.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

static void release(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  free(data);
}

static napi_value fail(napi_env env, const char *msg) {
  napi_throw_range_error(env, NULL, msg);
  return NULL;
}

static napi_value AlignedBuffer(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 2) {
    return fail(env, "alignedBuffer(size, align): two arguments expected");
  }
  uint32_t size = 0, align = 0;
  if (napi_get_value_uint32(env, argv[0], &size) != napi_ok || napi_get_value_uint32(env, argv[1], &align) != napi_ok) {
    return fail(env, "alignedBuffer(size, align): numbers expected");
  }
  if (size == 0 || size > (1u << 30)) return fail(env, "alignedBuffer: size must be 1 byte to 1 GiB");
  if (align < 512 || align > 65536 || (align & (align - 1)) != 0) return fail(env, "alignedBuffer: align must be a power of two from 512 to 65536");
  void *p = NULL;
  if (posix_memalign(&p, align, size) != 0 || p == NULL) {
    napi_throw_error(env, "ENOMEM", "alignedBuffer: out of memory");
    return NULL;
  }
  napi_value ab;
  if (napi_create_external_arraybuffer(env, p, size, release, NULL, &ab) != napi_ok) {
    free(p);
    napi_throw_error(env, NULL, "alignedBuffer: external ArrayBuffers are not supported here");
    return NULL;
  }
  return ab;
}

/* A Uint8Array's bytes; false (with a TypeError thrown) when v is not one. */
static bool bytes_of(napi_env env, napi_value v, uint8_t **data, size_t *len) {
  bool is_ta = false;
  napi_typedarray_type type;
  napi_value ab;
  size_t off;
  void *p;
  if (napi_is_typedarray(env, v, &is_ta) != napi_ok || !is_ta ||
      napi_get_typedarray_info(env, v, &type, len, &p, &ab, &off) != napi_ok || type != napi_uint8_array) {
    napi_throw_type_error(env, NULL, "copy: Uint8Arrays expected");
    return false;
  }
  *data = p;
  return true;
}

static napi_value Copy(napi_env env, napi_callback_info info) {
  size_t argc = 5;
  napi_value argv[5];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 5) {
    return fail(env, "copy(dst, dstOffset, src, srcOffset, length): five arguments expected");
  }
  uint8_t *dst, *src;
  size_t dst_len, src_len;
  if (!bytes_of(env, argv[0], &dst, &dst_len) || !bytes_of(env, argv[2], &src, &src_len)) return NULL;
  int64_t d = -1, s = -1, n = -1;
  napi_get_value_int64(env, argv[1], &d);
  napi_get_value_int64(env, argv[3], &s);
  napi_get_value_int64(env, argv[4], &n);
  if (d < 0 || s < 0 || n < 0 || (uint64_t)d + (uint64_t)n > dst_len || (uint64_t)s + (uint64_t)n > src_len) {
    return fail(env, "copy: offsets and length must lie within both arrays");
  }
  memmove(dst + d, src + s, (size_t)n);
  return NULL;
}

static napi_value Init(napi_env env, napi_value exports) {
  napi_value fn;
  if (napi_create_function(env, "copy", NAPI_AUTO_LENGTH, Copy, NULL, &fn) != napi_ok) return NULL;
  if (napi_set_named_property(env, exports, "copy", fn) != napi_ok) return NULL;
  if (napi_create_function(env, "alignedBuffer", NAPI_AUTO_LENGTH, AlignedBuffer, NULL, &fn) != napi_ok) return NULL;
  if (napi_set_named_property(env, exports, "alignedBuffer", fn) != napi_ok) return NULL;
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
