// kv_export.cu — copy KV-cache blocks from GPU memory into a memsnap KV dump directory
// (docs/FORMAT.md "KV dump format"): data/layer-NNN.bin page files + kv-manifest.json.
//
// Each page is the K and V of one layer for one block ([2, block_size, n_kv_heads, head_dim]).
// Pages are copied device → pinned host with cudaMemcpyAsync (one call for K and one for V
// per block; one call per block for the blocks-first layout) into a small ring of pinned
// buffers on one stream: while the GPU fills buffer i+1 the CPU writes buffer i to its
// file (pwrite at the page's offset), hashes it (SHA-256, optional) and checks for zeros.
//
// Library:  kvx_export()  (extern "C", for ctypes/cffi from an engine process)
// Program:  kv_export --self-test DIR [options]   allocates random KV blocks on the GPU,
//           exports them, and writes DIR.reference/layer-NNN.bin from a plain cudaMemcpy
//           device→host of the same blocks, for test-on-gpu.sh to compare byte for byte.
//
// Build: make (needs nvcc).  No dependencies beyond the CUDA runtime.

#ifdef KVX_HOST_SHIM
#include "host_shim.h"
#else
#include <cuda_runtime.h>
#endif

#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "kv_export.h"

namespace {

// ------------------------------------------------------------------------------ errors

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}

std::string errno_msg(const std::string& what) { return what + ": " + strerror(errno); }

// ------------------------------------------------------------------------------ SHA-256

struct Sha256 {
  uint32_t h[8];
  uint8_t buf[64];
  uint64_t total = 0;
  size_t n = 0;
  static constexpr uint32_t K[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  Sha256() {
    static const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(h, init, sizeof h);
  }
  static uint32_t rotr(uint32_t x, int r) { return (x >> r) | (x << (32 - r)); }
  void block(const uint8_t* p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
      uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
  void update(const uint8_t* p, size_t len) {
    total += len;
    if (n) {
      size_t take = len < 64 - n ? len : 64 - n;
      memcpy(buf + n, p, take);
      n += take; p += take; len -= take;
      if (n == 64) { block(buf); n = 0; }
    }
    while (len >= 64) { block(p); p += 64; len -= 64; }
    if (len) { memcpy(buf, p, len); n = len; }
  }
  std::string hex() {
    uint64_t bits = total * 8;
    uint8_t pad = 0x80;
    update(&pad, 1);
    uint8_t z = 0;
    while (n != 56) update(&z, 1);
    uint8_t l[8];
    for (int i = 0; i < 8; i++) l[i] = (uint8_t)(bits >> (56 - 8 * i));
    update(l, 8);
    char out[65];
    for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", h[i]);
    return std::string(out, 64);
  }
};
constexpr uint32_t Sha256::K[64];

std::string sha256_hex(const uint8_t* p, size_t n) {
  Sha256 s;
  s.update(p, n);
  return s.hex();
}

bool all_zero(const uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    memcpy(&v, p + i, 8);
    if (v) return false;
  }
  for (; i < n; i++) if (p[i]) return false;
  return true;
}

// ------------------------------------------------------------------------------ files

void mkdirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); i++) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) throw Error(errno_msg("mkdir " + cur));
    }
    if (i < path.size()) cur += path[i];
  }
}

void pwrite_all(int fd, const uint8_t* p, size_t n, off_t off, const std::string& what) {
  while (n) {
    ssize_t w = pwrite(fd, p, n, off);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(errno_msg("write " + what));
    }
    p += w; n -= (size_t)w; off += w;
  }
}

void write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(errno_msg("open " + tmp));
  pwrite_all(fd, (const uint8_t*)text.data(), text.size(), 0, tmp);
  if (fsync(fd) != 0) { close(fd); throw Error(errno_msg("fsync " + tmp)); }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) throw Error(errno_msg("rename " + tmp));
}

std::string json_str(const char* s) {
  std::string o = "\"";
  for (const char* p = s ? s : ""; *p; p++) {
    unsigned char c = (unsigned char)*p;
    if (c == '"' || c == '\\') { o += '\\'; o += (char)c; }
    else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
    else o += (char)c;
  }
  return o + "\"";
}

int dtype_bytes(const char* d) {
  if (!d) return 0;
  if (!strcmp(d, "bf16") || !strcmp(d, "f16")) return 2;
  if (!strcmp(d, "f32")) return 4;
  if (!strcmp(d, "fp8e4m3")) return 1;
  return 0;
}

struct PageRec {
  int layer;
  int64_t block;
  int64_t offset;
  std::string sha;
  bool zero;
};

struct Slot {
  uint8_t* host = nullptr;
  cudaEvent_t ev = nullptr;
  bool busy = false;
  int layer = 0;
  int64_t first = 0;  // index of its first page within the layer (and in the blocks list)
  int64_t count = 0;
};

}  // namespace

// ------------------------------------------------------------------------------ export

extern "C" int kvx_export(const kvx_spec* spec, void* const* layer_ptrs, const int64_t* blocks, int64_t n_blocks,
                          const kvx_seq* seqs, int n_seqs, const char* out_dir, char* err, size_t errlen) {
  std::vector<Slot> ring;
  std::vector<int> fds;
  cudaStream_t stream = nullptr;
  auto cleanup = [&]() {
    if (stream) cudaStreamSynchronize(stream);
    for (auto& s : ring) {
      if (s.ev) cudaEventDestroy(s.ev);
      if (s.host) cudaFreeHost(s.host);
    }
    for (int fd : fds) if (fd >= 0) close(fd);
    if (stream) cudaStreamDestroy(stream);
  };
  try {
    if (!spec || !layer_ptrs || !out_dir || (n_blocks > 0 && !blocks)) throw Error("null argument");
    const int eb = dtype_bytes(spec->dtype);
    if (!eb) throw Error(std::string("unknown dtype ") + (spec->dtype ? spec->dtype : "(null)") + " (bf16, f16, f32, fp8e4m3)");
    if (spec->n_layers <= 0 || spec->n_kv_heads <= 0 || spec->head_dim <= 0 || spec->block_size <= 0 || spec->num_blocks <= 0) throw Error("dimensions must be positive");
    const size_t half = (size_t)spec->block_size * spec->n_kv_heads * spec->head_dim * eb;  // K or V of one block
    const size_t page = 2 * half;
    const int nring = spec->ring_buffers > 0 ? spec->ring_buffers : 4;
    const int per = spec->pages_per_buffer > 0 ? spec->pages_per_buffer : 64;
    for (int64_t i = 0; i < n_blocks; i++) {
      if (blocks[i] < 0 || blocks[i] >= spec->num_blocks) throw Error("block id " + std::to_string(blocks[i]) + " is out of range");
    }
    const std::string dir(out_dir);
    mkdirs(dir + "/data");
    ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    ring.resize(nring);
    for (auto& s : ring) {
      ck(cudaHostAlloc((void**)&s.host, (size_t)per * page, cudaHostAllocDefault), "cudaHostAlloc");
      ck(cudaEventCreateWithFlags(&s.ev, cudaEventDisableTiming), "cudaEventCreate");
    }
    std::vector<std::string> names;
    for (int l = 0; l < spec->n_layers; l++) {
      char name[64];
      snprintf(name, sizeof name, "data/layer-%03d.bin", l);
      names.push_back(name);
      std::string p = dir + "/" + name;
      int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) throw Error(errno_msg("open " + p));
      fds.push_back(fd);
    }
    std::vector<PageRec> recs((size_t)spec->n_layers * (size_t)n_blocks);
    // Write a finished buffer: pages to their offsets, hashes, zero flags.
    auto drain = [&](Slot& s) {
      if (!s.busy) return;
      ck(cudaEventSynchronize(s.ev), "cudaEventSynchronize");
      pwrite_all(fds[s.layer], s.host, (size_t)s.count * page, (off_t)(s.first * (int64_t)page), names[s.layer]);
      for (int64_t k = 0; k < s.count; k++) {
        const uint8_t* p = s.host + k * page;
        PageRec& r = recs[(size_t)s.layer * n_blocks + s.first + k];
        r.layer = s.layer;
        r.block = blocks[s.first + k];
        r.offset = (s.first + k) * (int64_t)page;
        r.zero = all_zero(p, page);
        r.sha = spec->compute_sha256 ? sha256_hex(p, page) : "";
      }
      s.busy = false;
    };
    size_t next = 0;
    for (int l = 0; l < spec->n_layers; l++) {
      const uint8_t* base = (const uint8_t*)layer_ptrs[l];
      if (!base) throw Error("layer " + std::to_string(l) + " has a null device pointer");
      for (int64_t first = 0; first < n_blocks; first += per) {
        Slot& s = ring[next++ % ring.size()];
        drain(s);  // the oldest buffer in flight
        s.layer = l;
        s.first = first;
        s.count = n_blocks - first < per ? n_blocks - first : per;
        for (int64_t k = 0; k < s.count; k++) {
          const int64_t b = blocks[first + k];
          uint8_t* dst = s.host + k * page;
          if (spec->layout == KVX_LAYOUT_BLOCKS_FIRST) {
            // (num_blocks, 2, block_size, heads, dim): K and V of a block are contiguous.
            ck(cudaMemcpyAsync(dst, base + (size_t)b * page, page, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
          } else {
            // vLLM (2, num_blocks, block_size, heads, dim): K at [0, b], V at [1, b].
            ck(cudaMemcpyAsync(dst, base + (size_t)b * half, half, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync K");
            ck(cudaMemcpyAsync(dst + half, base + ((size_t)spec->num_blocks + (size_t)b) * half, half, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync V");
          }
        }
        ck(cudaEventRecord(s.ev, stream), "cudaEventRecord");
        s.busy = true;
      }
    }
    for (size_t i = 0; i < ring.size(); i++) drain(ring[(next + i) % ring.size()]);
    for (size_t l = 0; l < fds.size(); l++) {
      if (fsync(fds[l]) != 0) throw Error(errno_msg("fsync " + names[l]));
      close(fds[l]);
      fds[l] = -1;
    }
    // kv-manifest.json
    std::string j;
    j.reserve(256 + recs.size() * 160);
    char b[512];
    j += "{\n \"format\": \"memsnap-kv-dump\",\n \"format_version\": 1,\n";
    j += " \"engine\": {\"name\": " + json_str(spec->engine_name ? spec->engine_name : "kv-export") + ", \"version\": " +
         json_str(spec->engine_version ? spec->engine_version : "") + ", \"exporter\": \"memsnap-kv-export/1\"},\n";
    snprintf(b, sizeof b, " \"model\": {\"name\": %s, \"n_layers\": %d, \"n_kv_heads\": %d, \"head_dim\": %d},\n",
             json_str(spec->model_name ? spec->model_name : "").c_str(), spec->n_layers, spec->n_kv_heads, spec->head_dim);
    j += b;
    snprintf(b, sizeof b, " \"dtype\": %s,\n \"block_size\": %d,\n \"page\": {\"layout\": \"kv-block\", \"shape\": [2, %d, %d, %d], \"bytes\": %zu},\n",
             json_str(spec->dtype).c_str(), spec->block_size, spec->block_size, spec->n_kv_heads, spec->head_dim, page);
    j += b;
    j += " \"data_files\": [";
    for (int l = 0; l < spec->n_layers; l++) {
      snprintf(b, sizeof b, "%s\n  {\"path\": \"%s\", \"bytes\": %" PRId64 "}", l ? "," : "", names[l].c_str(), n_blocks * (int64_t)page);
      j += b;
    }
    j += "\n ],\n \"pages\": [";
    for (size_t i = 0; i < recs.size(); i++) {
      const PageRec& r = recs[i];
      snprintf(b, sizeof b, "%s\n  {\"layer\": %d, \"block\": %" PRId64 ", \"file\": \"%s\", \"offset\": %" PRId64 ", \"sha256\": \"%s\", \"zero\": %s}",
               i ? "," : "", r.layer, r.block, names[r.layer].c_str(), r.offset, r.sha.c_str(), r.zero ? "true" : "false");
      j += b;
    }
    j += "\n ],\n \"sequences\": [";
    for (int s = 0; s < n_seqs; s++) {
      snprintf(b, sizeof b, "%s\n  {\"seq_id\": %s, \"num_tokens\": %" PRId64 ", \"blocks\": [", s ? "," : "",
               json_str(seqs[s].seq_id).c_str(), seqs[s].num_tokens);
      j += b;
      for (int64_t k = 0; k < seqs[s].n_blocks; k++) {
        snprintf(b, sizeof b, "%s%" PRId64, k ? ", " : "", seqs[s].blocks[k]);
        j += b;
      }
      j += "]}";
    }
    j += "\n ]\n}\n";
    write_file_atomic(dir + "/kv-manifest.json", j);
    cleanup();
    return 0;
  } catch (const std::exception& e) {
    if (err && errlen) snprintf(err, errlen, "%s", e.what());
    cleanup();
    return 1;
  }
}

// ------------------------------------------------------------------------------ self-test program

#ifndef KVX_NO_MAIN

#ifdef KVX_HOST_SHIM
#define KVX_HD
#else
#define KVX_HD __host__ __device__
#endif

KVX_HD inline uint8_t random_byte(size_t i, uint64_t seed) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ULL ^ seed;
  x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27; x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return (uint8_t)x;
}

#ifndef KVX_HOST_SHIM
__global__ void fill_random_kernel(uint8_t* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = random_byte(i, seed);
}
#endif

static void fill_random(uint8_t* p, size_t n, uint64_t seed) {
#ifdef KVX_HOST_SHIM
  for (size_t i = 0; i < n; i++) p[i] = random_byte(i, seed);
#else
  fill_random_kernel<<<256, 256>>>(p, n, seed);
#endif
}

static void usage() {
  fprintf(stderr,
          "usage: kv_export --self-test DIR [--layers N] [--blocks N] [--export N] [--heads N] [--dim N]\n"
          "                 [--block-size N] [--dtype bf16|f16|f32|fp8e4m3] [--layout vllm|blocks-first]\n"
          "                 [--ring N] [--per-buffer N] [--no-sha] [--seed N] [--device N]\n"
          "Allocates random KV blocks on the GPU (some zeroed, some duplicated), exports --export of\n"
          "them to DIR, and writes DIR.reference/layer-NNN.bin from a plain cudaMemcpy of the same blocks.\n");
}

int main(int argc, char** argv) {
  std::string out;
  int layers = 4, heads = 8, dim = 128, bs = 16, ring = 4, per = 16, device = 0;
  int64_t nblocks = 96, nexport = -1;
  uint64_t seed = 1;
  bool sha = true;
  const char* dtype = "bf16";
  int layout = KVX_LAYOUT_VLLM;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) { usage(); exit(2); }
      return argv[++i];
    };
    if (a == "--self-test") out = val();
    else if (a == "--layers") layers = atoi(val());
    else if (a == "--blocks") nblocks = atoll(val());
    else if (a == "--export") nexport = atoll(val());
    else if (a == "--heads") heads = atoi(val());
    else if (a == "--dim") dim = atoi(val());
    else if (a == "--block-size") bs = atoi(val());
    else if (a == "--dtype") dtype = val();
    else if (a == "--layout") { std::string v = val(); layout = v == "blocks-first" ? KVX_LAYOUT_BLOCKS_FIRST : KVX_LAYOUT_VLLM; }
    else if (a == "--ring") ring = atoi(val());
    else if (a == "--per-buffer") per = atoi(val());
    else if (a == "--no-sha") sha = false;
    else if (a == "--seed") seed = strtoull(val(), nullptr, 10);
    else if (a == "--device") device = atoi(val());
    else { usage(); return 2; }
  }
  if (out.empty()) { usage(); return 2; }
  const int eb = dtype_bytes(dtype);
  if (!eb || layers <= 0 || nblocks < 4) { usage(); return 2; }
  if (nexport < 0 || nexport > nblocks) nexport = nblocks - 1;  // leave one block out
  try {
    ck(cudaSetDevice(device), "cudaSetDevice");
    const size_t half = (size_t)bs * heads * dim * eb, page = 2 * half, per_layer = (size_t)nblocks * page;
    std::vector<void*> dev(layers, nullptr);
    for (int l = 0; l < layers; l++) {
      ck(cudaMalloc(&dev[l], per_layer), "cudaMalloc");
      fill_random((uint8_t*)dev[l], per_layer, seed * 1000003ULL + (uint64_t)l);
      ck(cudaGetLastError(), "fill_random");
      // Block 2 is free (zero); block 3 repeats block 0 (a shared prefix held twice).
      auto kv = [&](int64_t b, int which) -> uint8_t* {
        return layout == KVX_LAYOUT_BLOCKS_FIRST ? (uint8_t*)dev[l] + b * page + which * half
                                                 : (uint8_t*)dev[l] + ((size_t)which * nblocks + b) * half;
      };
      for (int w = 0; w < 2; w++) {
        ck(cudaMemset(kv(2, w), 0, half), "cudaMemset");
        ck(cudaMemcpy(kv(3, w), kv(0, w), half, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
      }
    }
    ck(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    // Export blocks in a scrambled order (as an allocator hands them out), all but the last.
    auto gcd = [](int64_t a, int64_t b) { while (b) { int64_t t = a % b; a = b; b = t; } return a; };
    int64_t stride = 7;
    while (gcd(stride, nexport) != 1) stride++;
    std::vector<int64_t> blocks;
    for (int64_t k = 0; k < nexport; k++) blocks.push_back((k * stride) % nexport);
    std::vector<int64_t> s0(blocks.begin(), blocks.begin() + nexport / 2), s1(blocks.begin() + nexport / 2, blocks.end());
    kvx_seq seqs[2] = {{"seq-0", (int64_t)s0.size() * bs, s0.data(), (int64_t)s0.size()},
                       {"seq-1", (int64_t)s1.size() * bs, s1.data(), (int64_t)s1.size()}};
    kvx_spec spec{};
    spec.n_layers = layers; spec.n_kv_heads = heads; spec.head_dim = dim; spec.block_size = bs;
    spec.num_blocks = nblocks; spec.dtype = dtype; spec.layout = layout;
    spec.ring_buffers = ring; spec.pages_per_buffer = per; spec.compute_sha256 = sha ? 1 : 0;
    spec.engine_name = "kv_export-self-test"; spec.engine_version = "1"; spec.model_name = "random";
    char err[512] = {0};
    const auto t0 = std::chrono::steady_clock::now();
    if (kvx_export(&spec, dev.data(), blocks.data(), (int64_t)blocks.size(), seqs, 2, out.c_str(), err, sizeof err) != 0) {
      fprintf(stderr, "kv_export: export failed: %s\n", err);
      return 1;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Reference: one plain synchronous copy of each whole layer, gathered on the CPU.
    const std::string ref = out + ".reference";
    mkdirs(ref);
    std::vector<uint8_t> host(per_layer), gathered(blocks.size() * page);
    int64_t zero = 0, mismatched = 0;
    for (int l = 0; l < layers; l++) {
      ck(cudaMemcpy(host.data(), dev[l], per_layer, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
      for (size_t k = 0; k < blocks.size(); k++) {
        const int64_t b = blocks[k];
        uint8_t* dst = gathered.data() + k * page;
        if (layout == KVX_LAYOUT_BLOCKS_FIRST) {
          memcpy(dst, host.data() + b * page, page);
        } else {
          memcpy(dst, host.data() + b * half, half);
          memcpy(dst + half, host.data() + ((size_t)nblocks + b) * half, half);
        }
        if (all_zero(dst, page)) zero++;
      }
      char name[64];
      snprintf(name, sizeof name, "/layer-%03d.bin", l);
      int fd = open((ref + name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) throw Error(errno_msg("open " + ref + name));
      pwrite_all(fd, gathered.data(), gathered.size(), 0, ref + name);
      close(fd);
      // In-process comparison too.
      std::vector<uint8_t> got(gathered.size());
      std::string data = out + "/data" + name;
      int in = open(data.c_str(), O_RDONLY);
      if (in < 0) throw Error(errno_msg("open " + data));
      size_t n = 0;
      while (n < got.size()) {
        ssize_t r = pread(in, got.data() + n, got.size() - n, (off_t)n);
        if (r <= 0) break;
        n += (size_t)r;
      }
      close(in);
      if (n != got.size() || memcmp(got.data(), gathered.data(), got.size()) != 0) mismatched++;
      ck(cudaFree(dev[l]), "cudaFree");
    }
    const double bytes = (double)layers * blocks.size() * page;
    printf("kv_export self-test: %d layers x %zu blocks, %zu-byte pages, %s, layout %s: %" PRId64 " zero pages; "
           "export %.3f s (%.2f GB/s incl. files%s); %s\n",
           layers, blocks.size(), page, dtype, layout == KVX_LAYOUT_BLOCKS_FIRST ? "blocks-first" : "vllm", zero,
           secs, bytes / secs / 1e9, sha ? " and SHA-256" : "",
           mismatched ? "MISMATCH against cudaMemcpy" : "data files match cudaMemcpy");
    return mismatched ? 1 : 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "kv_export: %s\n", e.what());
    return 1;
  }
}

#endif  // KVX_NO_MAIN
