#!/usr/bin/env bash
# Runtime test of the CUDA KV exporter. Needs a GPU, nvcc, and (for the memsnap round trip)
# a built memsnap (`npm run build` at the repository root).
#
# For each case the exporter's self-test allocates random KV blocks on the GPU (one block
# zeroed, one a copy of another), exports all but one block in scrambled order through pinned
# buffers + cudaMemcpyAsync, and writes DIR.reference/layer-NNN.bin from a plain synchronous
# cudaMemcpy of the same blocks. This script compares those byte for byte with `cmp`, then
# snapshots each dump with memsnap's kv source, deep-verifies and restores it, and diffs the
# restored directory with the dump.
#
#   ./test-on-gpu.sh              build (make ARCH=-arch=native) and test
#   ./test-on-gpu.sh --no-build   use $KV_EXPORT_BIN (default build/kv_export) as it is
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=1
[ "${1:-}" = "--no-build" ] && build=0
BIN=${KV_EXPORT_BIN:-$here/build/kv_export}
if [ "$build" = 1 ]; then
  command -v nvcc >/dev/null || { echo "test-on-gpu: nvcc not found" >&2; exit 2; }
  make -C "$here" ARCH="${ARCH:--arch=native}"
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L || true
work=$(mktemp -d "${TMPDIR:-/tmp}/kv-export-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

cases=()
run_case() {
  local name=$1
  shift
  "$BIN" --self-test "$work/$name" "$@"
  local n=0
  for f in "$work/$name.reference"/layer-*.bin; do
    cmp "$f" "$work/$name/data/$(basename "$f")"
    n=$((n + 1))
  done
  echo "  $name: $n layer files identical to plain cudaMemcpy"
  cases+=("$name")
}

run_case bf16-vllm --dtype bf16 --layers 4 --blocks 96
run_case f16-blocks-first --dtype f16 --layout blocks-first --layers 3 --blocks 64 --ring 3 --per-buffer 5
run_case f32 --dtype f32 --layers 2 --blocks 40 --heads 4 --dim 64
run_case fp8-nosha --dtype fp8e4m3 --layers 2 --blocks 33 --no-sha
run_case bf16-1gib --dtype bf16 --layers 32 --blocks 512 --heads 8 --dim 128 --per-buffer 64

if [ ! -f "$repo/dist/index.js" ]; then
  echo "test-on-gpu: $repo/dist/index.js missing (npm run build); skipped the memsnap round trip"
  exit 0
fi
for name in "${cases[@]}"; do
  node --input-type=module - "$repo" "$work" "$name" <<'JS'
const [repo, work, name] = process.argv.slice(2);
const { parseConfig, snapshot, verifyBundle, restoreToDir } = await import(`${repo}/dist/index.js`);
const config = parseConfig({ agent: "gpu", redaction: { enabled: false }, sources: [{ kind: "kv", name: "kv", path: name }] }, null, work);
const r = await snapshot({ config, out: `${work}/${name}.memsnap` });
const m = r.manifest.layers[0].meta;
const rep = await verifyBundle(r.path, { deep: true });
if (!rep.ok) { console.error(JSON.stringify(rep.findings)); process.exit(1); }
await restoreToDir(r.path, `${work}/${name}.restored`);
const layers = m.model.n_layers;
if (m.pages_zero < layers) { console.error(`expected ≥ ${layers} zero pages, got ${m.pages_zero}`); process.exit(1); }
if (m.pages_unique > m.pages_total - 2 * layers) { console.error(`expected the duplicated block to dedup: ${m.pages_unique} of ${m.pages_total}`); process.exit(1); }
console.log(`  ${name}: memsnap ${m.pages_total} pages, ${m.pages_unique} unique, ${m.pages_zero} zero, shuffle ${m.shuffle.applied}; bundle ${r.bundleBytes} bytes`);
JS
  diff -r "$work/$name" "$work/$name.restored/kv"
  echo "  $name: restored dump identical"
  rm -rf "$work/$name.restored" "$work/$name.memsnap"
done
echo "test-on-gpu: OK"
