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
 *
 * scanDir and readFiles (below) list and read the many small files of a memory directory with
 * one path lookup relative to a directory each, the reads on a libuv pool thread.
 */
#define _GNU_SOURCE
#define NAPI_VERSION 8
#include <node_api.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

/* The stat time fields: POSIX 2008 names them st_mtim/st_ctim; macOS st_mtimespec/st_ctimespec. */
#ifdef __APPLE__
#define ST_MTIM st_mtimespec
#define ST_CTIM st_ctimespec
#else
#define ST_MTIM st_mtim
#define ST_CTIM st_ctim
#endif

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
    napi_throw_type_error(env, NULL, "Uint8Arrays expected");
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

/* ------------------------------------------------------------------ planes */

/*
 * planes(dst, src, elem, inverse): the byte-plane shuffle of KV pages (src/sources/kv/format.ts).
 * Forward: byte b of element i of src goes to dst[b * n + i] (n = length / elem); inverse undoes
 * it. dst and src have the same length, a whole number of 2- or 4-byte elements, and do not
 * overlap. The JS loop it replaces ran at ~0.2 GB/s (1.2 s for the 250 MB of a realistic
 * home's KV pages); this runs at memory speed.
 */
static napi_value Planes(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value argv[4];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 4) {
    return fail(env, "planes(dst, src, elem, inverse): four arguments expected");
  }
  uint8_t *dst, *src;
  size_t dst_len, src_len;
  if (!bytes_of(env, argv[0], &dst, &dst_len) || !bytes_of(env, argv[1], &src, &src_len)) return NULL;
  int32_t elem = 0;
  bool inverse = false;
  napi_get_value_int32(env, argv[2], &elem);
  napi_get_value_bool(env, argv[3], &inverse);
  if ((elem != 2 && elem != 4) || dst_len != src_len || src_len % (size_t)elem != 0) {
    return fail(env, "planes: elem must be 2 or 4, and dst and src one length, a whole number of elements");
  }
  if (dst_len && dst < src + src_len && src < dst + dst_len) return fail(env, "planes: dst and src overlap");
  const size_t n = src_len / (size_t)elem;
  if (elem == 2) {
    uint8_t *lo = inverse ? src : dst, *hi = lo + n, *il = inverse ? dst : src;
    if (!inverse) {
      for (size_t i = 0; i < n; i++) {
        lo[i] = il[2 * i];
        hi[i] = il[2 * i + 1];
      }
    } else {
      for (size_t i = 0; i < n; i++) {
        il[2 * i] = lo[i];
        il[2 * i + 1] = hi[i];
      }
    }
  } else {
    for (size_t b = 0; b < 4; b++) {
      if (!inverse)
        for (size_t i = 0; i < n; i++) dst[b * n + i] = src[4 * i + b];
      else
        for (size_t i = 0; i < n; i++) dst[4 * i + b] = src[b * n + i];
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------ scanDir */

/*
 * scanDir(path) -> [errno, names, meta]: a directory's entries ("." and ".." left out) sorted by
 * their bytes (strcmp), each lstat'ed relative to the directory (fstatat, AT_SYMLINK_NOFOLLOW):
 * one call instead of a readdir and an lstat by full path per entry, which cost a memory of
 * 200,000 notes ~1 s of its main thread. `names` holds the names back to back; `meta` holds
 * SD_FIELDS numbers per entry (see the SD_ constants; times as seconds and nanoseconds, so the
 * caller computes milliseconds exactly as Node does). errno != 0: the directory could not be
 * read (names and meta undefined). An entry whose fstatat failed has its errno in SD_ERR.
 */
enum { SD_OFF, SD_LEN, SD_UTF8, SD_ERR, SD_FMT, SD_DEV, SD_INO, SD_MODE, SD_SIZE, SD_MSEC, SD_MNSEC, SD_CSEC, SD_CNSEC, SD_FIELDS };

typedef struct {
  char *name;
  size_t len;
  struct stat st;
  int err;
} sd_entry_t;

static int sd_cmp(const void *a, const void *b) {
  return strcmp(((const sd_entry_t *)a)->name, ((const sd_entry_t *)b)->name);
}

/* Whether s[0, n) is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static int utf8_ok(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) { i++; continue; }
    size_t k;
    unsigned int cp, min;
    if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (i + k >= n) return 0; /* truncated: the continuation bytes are s[i + 1 .. i + k] */
    for (size_t j = 1; j <= k; j++) {
      if ((s[i + j] & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    i += k + 1;
  }
  return 1;
}

static napi_value ScanDir(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  char path[4096];
  size_t plen = 0;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 1 ||
      napi_get_value_string_utf8(env, argv[0], path, sizeof path, &plen) != napi_ok || plen >= sizeof path - 1) {
    napi_throw_type_error(env, NULL, "scanDir(path): a path under 4 KiB expected");
    return NULL;
  }
  napi_value result, v;
  napi_create_array_with_length(env, 3, &result);
  DIR *d = opendir(path);
  if (d == NULL) {
    napi_create_int32(env, errno, &v);
    napi_set_element(env, result, 0, v);
    return result;
  }
  int dfd = dirfd(d);
  size_t cap = 64, n = 0, bytes = 0;
  sd_entry_t *ents = malloc(cap * sizeof *ents);
  int err = ents ? 0 : ENOMEM;
  struct dirent *de;
  while (!err) {
    errno = 0;
    de = readdir(d);
    if (de == NULL) {
      err = errno;
      break;
    }
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
    if (n == cap) {
      sd_entry_t *more = realloc(ents, 2 * cap * sizeof *ents);
      if (!more) { err = ENOMEM; break; }
      ents = more;
      cap *= 2;
    }
    sd_entry_t *e = &ents[n];
    e->len = strlen(de->d_name);
    e->name = malloc(e->len + 1);
    if (!e->name) { err = ENOMEM; break; }
    memcpy(e->name, de->d_name, e->len + 1);
    e->err = fstatat(dfd, e->name, &e->st, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : errno;
    bytes += e->len;
    n++;
  }
  closedir(d);
  if (!err) qsort(ents, n, sizeof *ents, sd_cmp);
  napi_value names = NULL, meta = NULL, ab;
  char *nbuf = NULL;
  double *m = NULL;
  if (!err && (napi_create_buffer(env, bytes, (void **)&nbuf, &names) != napi_ok ||
               napi_create_arraybuffer(env, n * SD_FIELDS * sizeof(double), (void **)&m, &ab) != napi_ok ||
               napi_create_typedarray(env, napi_float64_array, n * SD_FIELDS, ab, 0, &meta) != napi_ok)) {
    err = ENOMEM;
  }
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    sd_entry_t *e = &ents[i];
    if (!err) {
      double *f = m + i * SD_FIELDS;
      memcpy(nbuf + off, e->name, e->len);
      f[SD_OFF] = (double)off;
      f[SD_LEN] = (double)e->len;
      f[SD_UTF8] = utf8_ok((const unsigned char *)e->name, e->len);
      f[SD_ERR] = e->err;
      f[SD_FMT] = e->err ? 0 : (double)(e->st.st_mode & S_IFMT);
      f[SD_DEV] = (double)e->st.st_dev;
      f[SD_INO] = (double)e->st.st_ino;
      f[SD_MODE] = (double)e->st.st_mode;
      f[SD_SIZE] = (double)e->st.st_size;
      f[SD_MSEC] = (double)e->st.ST_MTIM.tv_sec;
      f[SD_MNSEC] = (double)e->st.ST_MTIM.tv_nsec;
      f[SD_CSEC] = (double)e->st.ST_CTIM.tv_sec;
      f[SD_CNSEC] = (double)e->st.ST_CTIM.tv_nsec;
      off += e->len;
    }
    free(e->name);
  }
  free(ents);
  napi_create_int32(env, err, &v);
  napi_set_element(env, result, 0, v);
  if (!err) {
    napi_set_element(env, result, 1, names);
    napi_set_element(env, result, 2, meta);
  }
  return result;
}

/* ------------------------------------------------------------------ pool jobs */

/*
 * The first member of readFiles' and writeFiles' jobs: their libuv work and the references
 * that keep their five JavaScript arguments alive until it is done (the callback last).
 */
typedef struct {
  napi_async_work work;
  napi_ref refs[5];
} pool_job_t;

/* Keep argv[keep[i]] alive and queue `job`; false (with an error thrown, `job` freed) when it cannot be queued. */
static bool pool_queue(napi_env env, pool_job_t *job, napi_value *argv, const int keep[5], const char *name,
                       napi_async_execute_callback execute, napi_async_complete_callback complete) {
  for (int i = 0; i < 5; i++) napi_create_reference(env, argv[keep[i]], 1, &job->refs[i]);
  napi_value n;
  napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &n);
  if (napi_create_async_work(env, NULL, n, execute, complete, job, &job->work) != napi_ok ||
      napi_queue_async_work(env, job->work) != napi_ok) {
    for (int i = 0; i < 5; i++) napi_delete_reference(env, job->refs[i]);
    free(job);
    napi_throw_error(env, NULL, "could not queue the work");
    return false;
  }
  return true;
}

/* Release `job` (freed) and call its callback with `err`. */
static void pool_finish(napi_env env, pool_job_t *job, int err) {
  napi_value cb, undef, arg;
  int have_cb = napi_get_reference_value(env, job->refs[4], &cb) == napi_ok && cb != NULL;
  for (int i = 0; i < 5; i++) napi_delete_reference(env, job->refs[i]);
  napi_delete_async_work(env, job->work);
  free(job);
  if (!have_cb) return;
  napi_create_int32(env, err, &arg);
  napi_get_undefined(env, &undef);
  napi_call_function(env, undef, cb, 1, &arg, NULL);
}

/* ------------------------------------------------------------------ readFiles */

/*
 * readFiles(root, paths, count, limits, out, meta, callback): on a libuv pool thread, for each
 * of `count` NUL-terminated paths relative to the directory `root`: open it (O_NOFOLLOW, and
 * O_NONBLOCK so a FIFO put in a file's place cannot block), read at most limits[i] bytes into
 * `out` (the files back to back), fstat the descriptor after the read, close it. meta holds
 * RF_FIELDS numbers per file. callback(errno): non-zero when `root` could not be opened (each
 * file's own failure is its RF_ERR). The small files of a memory directory are read this way in
 * batches, off the main thread, each with one path lookup relative to the root instead of two
 * (lstat and open) from `/`.
 */
enum { RF_ERR, RF_OFF, RF_LEN, RF_DEV, RF_INO, RF_MODE, RF_SIZE, RF_MSEC, RF_MNSEC, RF_CSEC, RF_CNSEC, RF_FIELDS };

typedef struct {
  pool_job_t job; /* refs: paths, limits, out, meta, callback */
  char root[4096];
  const char *paths;
  size_t paths_len;
  uint32_t count;
  const double *limits;
  uint8_t *out;
  size_t out_len;
  double *meta;
  int err;
} read_files_t;

static void read_files_execute(napi_env env, void *data) {
  (void)env;
  read_files_t *w = (read_files_t *)data;
  int rfd = open(w->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (rfd < 0) {
    w->err = errno;
    return;
  }
  size_t at = 0, off = 0;
  for (uint32_t i = 0; i < w->count; i++) {
    double *f = w->meta + (size_t)i * RF_FIELDS;
    const char *p = w->paths + at;
    size_t plen = strnlen(p, w->paths_len - at);
    at += plen + 1;
    f[RF_OFF] = (double)off;
    f[RF_LEN] = 0;
    int fd = openat(rfd, p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      f[RF_ERR] = errno;
      continue;
    }
    size_t limit = (size_t)w->limits[i], n = 0;
    if (limit > w->out_len - off) limit = w->out_len - off;
    int e = 0;
    while (n < limit) {
      ssize_t r = read(fd, w->out + off + n, limit - n);
      if (r < 0) {
        if (errno == EINTR) continue;
        e = errno;
        break;
      }
      if (r == 0) break;
      n += (size_t)r;
    }
    struct stat st;
    if (!e && fstat(fd, &st) != 0) e = errno;
    close(fd);
    f[RF_ERR] = e;
    if (e) continue;
    f[RF_LEN] = (double)n;
    f[RF_DEV] = (double)st.st_dev;
    f[RF_INO] = (double)st.st_ino;
    f[RF_MODE] = (double)st.st_mode;
    f[RF_SIZE] = (double)st.st_size;
    f[RF_MSEC] = (double)st.ST_MTIM.tv_sec;
    f[RF_MNSEC] = (double)st.ST_MTIM.tv_nsec;
    f[RF_CSEC] = (double)st.ST_CTIM.tv_sec;
    f[RF_CNSEC] = (double)st.ST_CTIM.tv_nsec;
    off += n;
  }
  close(rfd);
}

static void read_files_complete(napi_env env, napi_status status, void *data) {
  read_files_t *w = (read_files_t *)data;
  pool_finish(env, &w->job, status == napi_ok ? w->err : ECANCELED);
}

/* A typed array's memory and element count, of the given type; false with a TypeError thrown otherwise. */
static bool typed_of(napi_env env, napi_value v, napi_typedarray_type want, void **data, size_t *len) {
  bool is_ta = false;
  napi_typedarray_type type;
  napi_value ab;
  size_t off;
  if (napi_is_typedarray(env, v, &is_ta) != napi_ok || !is_ta ||
      napi_get_typedarray_info(env, v, &type, len, data, &ab, &off) != napi_ok || type != want) {
    napi_throw_type_error(env, NULL, "typed arrays of the documented types expected");
    return false;
  }
  return true;
}

static napi_value ReadFiles(napi_env env, napi_callback_info info) {
  size_t argc = 7;
  napi_value argv[7];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 7) {
    napi_throw_type_error(env, NULL, "readFiles(root, paths, count, limits, out, meta, callback): seven arguments expected");
    return NULL;
  }
  read_files_t *w = calloc(1, sizeof *w);
  if (!w) {
    napi_throw_error(env, "ENOMEM", "readFiles: out of memory");
    return NULL;
  }
  size_t rlen = 0, limits_n = 0, meta_n = 0;
  void *paths, *limits, *out, *meta;
  napi_valuetype cbt;
  if (napi_get_value_string_utf8(env, argv[0], w->root, sizeof w->root, &rlen) != napi_ok || rlen >= sizeof w->root - 1 ||
      napi_get_value_uint32(env, argv[2], &w->count) != napi_ok ||
      napi_typeof(env, argv[6], &cbt) != napi_ok || cbt != napi_function) {
    free(w);
    napi_throw_type_error(env, NULL, "readFiles: a root path under 4 KiB, a count and a callback expected");
    return NULL;
  }
  if (!typed_of(env, argv[1], napi_uint8_array, &paths, &w->paths_len) ||
      !typed_of(env, argv[3], napi_float64_array, &limits, &limits_n) ||
      !typed_of(env, argv[4], napi_uint8_array, &out, &w->out_len) ||
      !typed_of(env, argv[5], napi_float64_array, &meta, &meta_n)) {
    free(w);
    return NULL;
  }
  /* every path NUL-terminated inside `paths`, one limit and RF_FIELDS numbers per file */
  size_t nuls = 0;
  for (size_t i = 0; i < w->paths_len; i++) nuls += ((const char *)paths)[i] == 0;
  if (limits_n < w->count || meta_n < (size_t)w->count * RF_FIELDS || nuls < w->count) {
    free(w);
    napi_throw_range_error(env, NULL, "readFiles: paths, limits or meta too short for count");
    return NULL;
  }
  w->paths = paths;
  w->limits = limits;
  w->out = out;
  w->meta = meta;
  const int keep[5] = {1, 3, 4, 5, 6};
  pool_queue(env, &w->job, argv, keep, "memsnap.readFiles", read_files_execute, read_files_complete);
  return NULL;
}

/* ------------------------------------------------------------------ writeFiles */

/*
 * writeFiles(paths, count, data, offsets, results, callback): on a libuv pool thread, create
 * each of `count` NUL-terminated absolute paths as a new file (O_CREAT | O_EXCL | O_NOFOLLOW,
 * mode 0600), write data[offsets[i], offsets[i + 1]) to it and close it; results[i] is 0 or the
 * errno of its failure. callback() when all are done. A restore's small files are written this
 * way in batches, off the main thread (20,000 notes: ~0.4 s of open, write and close there).
 */
typedef struct {
  pool_job_t job; /* refs: paths, data, offsets, results, callback */
  const char *paths;
  size_t paths_len;
  uint32_t count;
  const uint8_t *data;
  size_t data_len;
  const double *offsets;
  int32_t *results;
} write_files_t;

static void write_files_execute(napi_env env, void *data) {
  (void)env;
  write_files_t *w = (write_files_t *)data;
  size_t at = 0;
  for (uint32_t i = 0; i < w->count; i++) {
    const char *p = w->paths + at;
    at += strnlen(p, w->paths_len - at) + 1;
    size_t from = (size_t)w->offsets[i], to = (size_t)w->offsets[i + 1];
    if (from > to || to > w->data_len) {
      w->results[i] = EINVAL;
      continue;
    }
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      w->results[i] = errno;
      continue;
    }
    int e = 0;
    while (from < to) {
      ssize_t r = write(fd, w->data + from, to - from);
      if (r < 0) {
        if (errno == EINTR) continue;
        e = errno;
        break;
      }
      from += (size_t)r;
    }
    if (close(fd) != 0 && !e) e = errno;
    w->results[i] = e;
  }
}

static void write_files_complete(napi_env env, napi_status status, void *data) {
  pool_finish(env, &((write_files_t *)data)->job, status == napi_ok ? 0 : ECANCELED);
}

static napi_value WriteFiles(napi_env env, napi_callback_info info) {
  size_t argc = 6;
  napi_value argv[6];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 6) {
    napi_throw_type_error(env, NULL, "writeFiles(paths, count, data, offsets, results, callback): six arguments expected");
    return NULL;
  }
  write_files_t *w = calloc(1, sizeof *w);
  if (!w) {
    napi_throw_error(env, "ENOMEM", "writeFiles: out of memory");
    return NULL;
  }
  void *paths, *data, *offsets, *results;
  size_t offsets_n = 0, results_n = 0;
  napi_valuetype cbt;
  if (napi_get_value_uint32(env, argv[1], &w->count) != napi_ok || napi_typeof(env, argv[5], &cbt) != napi_ok || cbt != napi_function) {
    free(w);
    napi_throw_type_error(env, NULL, "writeFiles: a count and a callback expected");
    return NULL;
  }
  if (!typed_of(env, argv[0], napi_uint8_array, &paths, &w->paths_len) ||
      !typed_of(env, argv[2], napi_uint8_array, &data, &w->data_len) ||
      !typed_of(env, argv[3], napi_float64_array, &offsets, &offsets_n) ||
      !typed_of(env, argv[4], napi_int32_array, &results, &results_n)) {
    free(w);
    return NULL;
  }
  size_t nuls = 0;
  for (size_t i = 0; i < w->paths_len; i++) nuls += ((const char *)paths)[i] == 0;
  if (offsets_n < (size_t)w->count + 1 || results_n < w->count || nuls < w->count) {
    free(w);
    napi_throw_range_error(env, NULL, "writeFiles: paths, offsets or results too short for count");
    return NULL;
  }
  w->paths = paths;
  w->data = data;
  w->offsets = offsets;
  w->results = results;
  const int keep[5] = {0, 2, 3, 4, 5};
  pool_queue(env, &w->job, argv, keep, "memsnap.writeFiles", write_files_execute, write_files_complete);
  return NULL;
}

/* ------------------------------------------------------------------ background writer */

/*
 * A thread of its own that writes one buffer at a time, for the bundle sink: the sink blocks in
 * Atomics.wait and never returns to its event loop, so it cannot use libuv's pool, and an
 * O_DIRECT write returns only once the device has the bytes.
 *
 * writer() returns a handle; writerStart(h, fd, bytes, pos) writes all of `bytes` (a Uint8Array
 * the caller leaves untouched until the wait) at file offset `pos` on the writer's thread,
 * retrying short writes and EINTR; writerWait(h) blocks until it is done and returns
 * [bytesWritten, errno] (errno 0: all written). One write at a time per handle, each waited for
 * before the next starts (writerStart throws otherwise). The thread is
 * started by the first writerStart and joined (after its write) when the handle is collected
 * or its environment ends.
 */
#include <pthread.h>

typedef struct {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int started;
  int state; /* 0 idle, 1 queued, 2 done */
  int quit;
  int fd;
  const uint8_t *data;
  size_t len;
  off_t pos;
  size_t done;
  int err;
} bg_writer_t;

static void *bg_main(void *arg) {
  bg_writer_t *w = (bg_writer_t *)arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (w->state != 1 && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
    if (w->state != 1) break;
    pthread_mutex_unlock(&w->mu);
    size_t done = 0;
    int err = 0;
    while (done < w->len) {
      ssize_t n = pwrite(w->fd, w->data + done, w->len - done, w->pos + (off_t)done);
      if (n < 0) {
        if (errno == EINTR) continue;
        err = errno;
        break;
      }
      if (n == 0) {
        err = EIO;
        break;
      }
      done += (size_t)n;
    }
    pthread_mutex_lock(&w->mu);
    w->done = done;
    w->err = err;
    w->state = 2;
    pthread_cond_broadcast(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static void bg_release(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  bg_writer_t *w = (bg_writer_t *)data;
  if (w->started) {
    pthread_mutex_lock(&w->mu);
    w->quit = 1; /* the thread finishes a queued write first */
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
  }
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

static napi_value Writer(napi_env env, napi_callback_info info) {
  bg_writer_t *w = calloc(1, sizeof(bg_writer_t));
  if (w == NULL) {
    napi_throw_error(env, "ENOMEM", "writer: out of memory");
    return NULL;
  }
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  napi_value h;
  if (napi_create_external(env, w, bg_release, NULL, &h) != napi_ok) {
    bg_release(env, w, NULL);
    napi_throw_error(env, NULL, "writer: could not create the handle");
    return NULL;
  }
  return h;
}

static bg_writer_t *writer_of(napi_env env, napi_value v) {
  napi_valuetype t;
  void *p = NULL;
  if (napi_typeof(env, v, &t) != napi_ok || t != napi_external || napi_get_value_external(env, v, &p) != napi_ok || p == NULL) {
    napi_throw_type_error(env, NULL, "a handle from writer() expected");
    return NULL;
  }
  return (bg_writer_t *)p;
}

/* The `want` arguments of a writer call, the first its handle; NULL (with an error thrown) otherwise. */
static bg_writer_t *writer_args(napi_env env, napi_callback_info info, size_t want, napi_value *argv, const char *usage) {
  size_t argc = want;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < want) {
    fail(env, usage);
    return NULL;
  }
  return writer_of(env, argv[0]);
}

static napi_value WriterStart(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  bg_writer_t *w = writer_args(env, info, 4, argv, "writerStart(handle, fd, bytes, pos): four arguments expected");
  if (w == NULL) return NULL;
  int32_t fd = -1;
  double pos = -1;
  uint8_t *data;
  size_t len;
  if (napi_get_value_int32(env, argv[1], &fd) != napi_ok || fd < 0 ||
      napi_get_value_double(env, argv[3], &pos) != napi_ok || !(pos >= 0) || pos > 9007199254740991.0) {
    return fail(env, "writerStart: a descriptor and a non-negative offset expected");
  }
  if (!bytes_of(env, argv[2], &data, &len)) return NULL;
  pthread_mutex_lock(&w->mu);
  if (w->state != 0) {
    pthread_mutex_unlock(&w->mu);
    napi_throw_error(env, NULL, "writerStart: a write is already in flight (or not waited for)");
    return NULL;
  }
  if (!w->started) {
    if (pthread_create(&w->thread, NULL, bg_main, w) != 0) {
      pthread_mutex_unlock(&w->mu);
      napi_throw_error(env, NULL, "writerStart: could not start the writer thread");
      return NULL;
    }
    w->started = 1;
  }
  w->fd = fd;
  w->data = data;
  w->len = len;
  w->pos = (off_t)pos;
  w->done = 0;
  w->err = 0;
  w->state = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static napi_value WriterWait(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  bg_writer_t *w = writer_args(env, info, 1, argv, "writerWait(handle): one argument expected");
  if (w == NULL) return NULL;
  pthread_mutex_lock(&w->mu);
  while (w->state == 1) pthread_cond_wait(&w->cv, &w->mu);
  size_t done = w->state == 2 ? w->done : 0;
  int err = w->state == 2 ? w->err : 0;
  w->state = 0;
  pthread_mutex_unlock(&w->mu);
  napi_value result, v;
  napi_create_array_with_length(env, 2, &result);
  napi_create_double(env, (double)done, &v);
  napi_set_element(env, result, 0, v);
  napi_create_int32(env, err, &v);
  napi_set_element(env, result, 1, v);
  return result;
}

/*
 * mallocTrim(): hand the free memory at the top of glibc's heaps back to the kernel
 * (malloc_trim(0)); true when some was. A worker thread's isolate and buffers are freed into
 * malloc's arenas when it exits, and stay resident there: the main process's RSS only grew.
 * Elsewhere than glibc: false, nothing done.
 */
static napi_value MallocTrim(napi_env env, napi_callback_info info) {
  (void)info;
  int released = 0;
#if defined(__GLIBC__)
  released = malloc_trim(0);
#endif
  napi_value v;
  napi_get_boolean(env, released != 0, &v);
  return v;
}

static napi_value Init(napi_env env, napi_value exports) {
  napi_property_descriptor props[] = {
      {"copy", NULL, Copy, NULL, NULL, NULL, napi_enumerable, NULL},
      {"alignedBuffer", NULL, AlignedBuffer, NULL, NULL, NULL, napi_enumerable, NULL},
      {"scanDir", NULL, ScanDir, NULL, NULL, NULL, napi_enumerable, NULL},
      {"readFiles", NULL, ReadFiles, NULL, NULL, NULL, napi_enumerable, NULL},
      {"writeFiles", NULL, WriteFiles, NULL, NULL, NULL, napi_enumerable, NULL},
      {"writer", NULL, Writer, NULL, NULL, NULL, napi_enumerable, NULL},
      {"writerStart", NULL, WriterStart, NULL, NULL, NULL, napi_enumerable, NULL},
      {"writerWait", NULL, WriterWait, NULL, NULL, NULL, napi_enumerable, NULL},
      {"mallocTrim", NULL, MallocTrim, NULL, NULL, NULL, napi_enumerable, NULL},
      {"planes", NULL, Planes, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  if (napi_define_properties(env, exports, sizeof props / sizeof props[0], props) != napi_ok) return NULL;
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
