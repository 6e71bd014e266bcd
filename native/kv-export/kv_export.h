/* kv_export.h — C API of the memsnap KV exporter (see README.md). */
#ifndef MEMSNAP_KV_EXPORT_H
#define MEMSNAP_KV_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Device layout of one layer's KV tensor. */
enum {
  /** vLLM: (2, num_blocks, block_size, n_kv_heads, head_dim) — K planes, then V planes. */
  KVX_LAYOUT_VLLM = 0,
  /** (num_blocks, 2, block_size, n_kv_heads, head_dim) — K and V of a block are contiguous. */
  KVX_LAYOUT_BLOCKS_FIRST = 1
};

typedef struct kvx_spec {
  int n_layers;
  int n_kv_heads;
  int head_dim;
  int block_size;       /* tokens per block (vLLM: 16) */
  int64_t num_blocks;   /* blocks in each layer's tensor */
  const char* dtype;    /* "bf16", "f16", "f32" or "fp8e4m3" */
  int layout;           /* KVX_LAYOUT_* */
  int ring_buffers;     /* pinned buffers in the ring (default 4) */
  int pages_per_buffer; /* pages per pinned buffer (default 64) */
  int compute_sha256;   /* 1: fill each page's sha256 on the CPU; 0: leave "" for memsnap */
  const char* engine_name;
  const char* engine_version;
  const char* model_name;
} kvx_spec;

typedef struct kvx_seq {
  const char* seq_id;
  int64_t num_tokens;
  const int64_t* blocks;
  int64_t n_blocks;
} kvx_seq;

/**
 * Export blocks `blocks[0..n_blocks)` of every layer (`layer_ptrs[l]` is the device pointer
 * of layer l's KV tensor) into `out_dir` as a memsnap KV dump: data/layer-NNN.bin (pages in
 * `blocks` order) and kv-manifest.json (written last, atomically). Returns 0, or 1 with a
 * message in `err`. The caller must keep the engine from writing those blocks meanwhile.
 */
int kvx_export(const kvx_spec* spec, void* const* layer_ptrs, const int64_t* blocks, int64_t n_blocks,
               const kvx_seq* seqs, int n_seqs, const char* out_dir, char* err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
