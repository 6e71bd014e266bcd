// Throughput per stage: each stage of memsnap's pipeline run alone, on one thread, over a
// sample of the bench mix, next to the shell tool that does the same stage in the baseline
// pipeline (one process, `-T1`), on the same bytes and in the same minutes.
//
// The whole-operation rows say how memsnap compares; these say where the time goes. A stage
// memsnap runs that the pipeline has no counterpart for (SHA-256 of every artifact and of the
// stored bytes, redaction) is listed with `sha256sum` where that is the same work, or alone.
// Reading is left out: from a warm page cache it runs at memory speed on both sides.
//
// Engines measured are the ones memsnap runs: zstd-napi's native contexts in the encoder's
// 2 MiB frames (each at the level memsnap's policy picks for it: the configured level, or
// level 1 for dense bytes), node:crypto's SHA-256 in 1 MiB updates, age STREAM's
// ChaCha20-Poly1305 in 64 KiB chunks through native/aead (node:crypto without it), and the
// redactor as the snapshot runs it. Samples are held in memory (the bench's own process, not
// memsnap's RSS) and written once to a temp file for the CLIs; the page cache is warm for both.
import { spawnSync } from "node:child_process";
import { createCipheriv, createDecipheriv, createHash, randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";

const MiB = 1024 * 1024;
/** At most this much of each class is sampled (keeps the section to a few seconds at any scale). */
export const SAMPLE_MAX = 128 * MiB;
const FRAME = 2 * MiB;
const CHUNK = 64 * 1024;

/** Concatenated bytes of `files` (in order), at most `max`, as 1 MiB buffers. */
function sample(files, max) {
  const bufs = [];
  let n = 0;
  for (const f of files) {
    if (n >= max) break;
    const fd = fs.openSync(f, "r");
    try {
      for (;;) {
        const want = Math.min(MiB, max - n);
        if (want <= 0) break;
        const b = Buffer.allocUnsafe(want);
        const got = fs.readSync(fd, b, 0, want, null);
        if (got === 0) break;
        bufs.push(got === want ? b : b.subarray(0, got));
        n += got;
      }
    } finally {
      fs.closeSync(fd);
    }
  }
  return { bufs, bytes: n };
}

/** `bufs` regrouped into buffers of `size` bytes (the last may be shorter). */
function regroup(bufs, size) {
  const all = Buffer.concat(bufs);
  const out = [];
  for (let o = 0; o < all.length; o += size) out.push(all.subarray(o, o + size));
  return out;
}

/** Best of `rounds` timings of `fn` (seconds); the first round also warms up the code. */
function best(fn, rounds = 3) {
  let min = Infinity;
  for (let i = 0; i < rounds; i++) {
    const t0 = process.hrtime.bigint();
    fn();
    min = Math.min(min, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  return min;
}

/** Best of `rounds` wall times of a shell command (seconds), or null when it fails. */
function bestCli(cmd, rounds = 3) {
  let min = Infinity;
  for (let i = 0; i < rounds; i++) {
    const t0 = process.hrtime.bigint();
    const r = spawnSync("bash", ["-o", "pipefail", "-c", cmd], { stdio: ["ignore", "ignore", "pipe"] });
    if (r.status !== 0) return null;
    min = Math.min(min, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  return min;
}

const mbs = (bytes, s) => (s == null || s <= 0 ? null : Number((bytes / 1e6 / s).toFixed(0)));
const q = (s) => `'${s.replace(/'/g, `'\\''`)}'`;

/**
 * Measure every stage. `classes` maps a class name (`text`, `sqlite`, `kv`) to its files;
 * `tools` says which CLIs exist; `age` is `{ recipient, keyFile }` for the age CLI rows.
 * `redaction` is the MB/s the bench measured for the redaction stage (or null).
 * Returns rows `{ stage, data, bytes, memsnap, tool, toolMBs, note }` (MB/s, null = not run).
 */
export async function measureStages({ root, classes, tmpDir, level = 3, age, redaction = null }) {
  const require = (await import("node:module")).createRequire(path.join(root, "package.json"));
  const zstd = require("zstd-napi/binding");
  const { isDense } = await import(path.join(root, "dist", "snapshot", "levels.js"));
  let aead = null;
  try {
    aead = (await import(path.join(root, "dist", "codecs", "aead.js"))).aeadAddon();
  } catch { /* not built: node:crypto below */ }
  const rows = [];
  const cctx = new zstd.CCtx();
  const dctx = new zstd.DCtx();
  const work = fs.mkdtempSync(path.join(tmpDir, "stages-"));
  try {
    for (const [cls, files] of Object.entries(classes)) {
      if (!files.length) continue;
      const { bufs, bytes } = sample(files, SAMPLE_MAX);
      if (bytes === 0) continue;
      const file = path.join(work, `${cls}.bin`);
      fs.writeFileSync(file, Buffer.concat(bufs));
      const data = `${cls} (${(bytes / MiB).toFixed(0)} MiB)`;

      // SHA-256: every artifact's bytes (and, in the sink, the stored bytes); no pipeline stage does it
      const tHash = best(() => { const h = createHash("sha256"); for (const b of bufs) h.update(b); h.digest(); });
      rows.push({ stage: "sha256", data, bytes, memsnap: mbs(bytes, tHash), tool: "sha256sum", toolMBs: mbs(bytes, bestCli(`sha256sum ${q(file)} >/dev/null`)), note: "the pipeline hashes nothing" });

      // zstd compress in the encoder's 2 MiB frames, each at the level memsnap's policy picks
      // for it (snapshot/levels.ts: the configured level, or level 1 where that gains < 3 %)
      const frames = regroup(bufs, FRAME);
      const frameLevel = frames.map((f) => (isDense(f, level) ? Math.min(level, 1) : level));
      const dense = frameLevel.filter((l) => l !== level).length;
      const dst = Buffer.allocUnsafe(zstd.compressBound(FRAME));
      const compressed = [];
      const tZ = best(() => {
        compressed.length = 0;
        frames.forEach((f, i) => {
          const n = cctx.compress(dst, f, frameLevel[i]);
          compressed.push(Buffer.from(dst.subarray(0, n)));
        });
      });
      const zBytes = compressed.reduce((s, c) => s + c.length, 0);
      const zFile = path.join(work, `${cls}.zst`);
      spawnSync("bash", ["-c", `zstd -q -3 -T1 -c ${q(file)} > ${q(zFile)}`]);
      const toolZ = fs.existsSync(zFile) ? fs.statSync(zFile).size : null;
      rows.push({
        stage: "zstd", data, bytes, memsnap: mbs(bytes, tZ), tool: "zstd -3 -T1", toolMBs: mbs(bytes, bestCli(`zstd -q -3 -T1 -c ${q(file)} >/dev/null`)),
        note: `level ${level}${dense ? ` (level ${Math.min(level, 1)} in ${dense} of ${frames.length} frames)` : ""}: ${(100 * zBytes / bytes).toFixed(1)} % of the input${toolZ ? `, zstd -3 ${(100 * toolZ / bytes).toFixed(1)} %` : ""}`,
      });

      // zstd decompress (restore, verify with key)
      const out = Buffer.allocUnsafe(FRAME);
      const tD = best(() => { for (const c of compressed) dctx.decompress(out, c); });
      rows.push({ stage: "zstd -d", data, bytes, memsnap: mbs(bytes, tD), tool: "zstd -d", toolMBs: fs.existsSync(zFile) ? mbs(bytes, bestCli(`zstd -q -d -c ${q(zFile)} >/dev/null`)) : null });

      // age STREAM: ChaCha20-Poly1305 over the compressed bytes, 64 KiB chunks
      const stream = regroup(compressed, CHUNK);
      const key = randomBytes(32);
      const nonce = Buffer.alloc(12);
      const sealed = [];
      const seal = (c, i, last) => {
        if (aead) {
          const d = Buffer.allocUnsafe(c.length + 16);
          aead.seal(key, i, last, c, 0, c.length, d, 0);
          return d;
        }
        nonce.writeUIntBE(i, 5, 6);
        nonce[11] = last ? 1 : 0;
        const ci = createCipheriv("chacha20-poly1305", key, nonce, { authTagLength: 16 });
        return Buffer.concat([ci.update(c), ci.final(), ci.getAuthTag()]);
      };
      const tSeal = best(() => { sealed.length = 0; stream.forEach((c, i) => sealed.push(seal(c, i, i === stream.length - 1))); });
      const plain = Buffer.allocUnsafe(CHUNK);
      const tOpen = best(() => sealed.forEach((s, i) => {
        if (aead) { aead.open(key, i, i === sealed.length - 1, s, 0, s.length, plain, 0); return; }
        nonce.writeUIntBE(i, 5, 6);
        nonce[11] = i === sealed.length - 1 ? 1 : 0;
        const de = createDecipheriv("chacha20-poly1305", key, nonce, { authTagLength: 16 });
        de.setAuthTag(s.subarray(s.length - 16));
        de.update(s.subarray(0, s.length - 16));
        de.final();
      }));
      let ageEnc = null;
      let ageDec = null;
      if (age && fs.existsSync(zFile)) {
        const aFile = path.join(work, `${cls}.zst.age`);
        ageEnc = bestCli(`age -r ${q(age.recipient)} -o ${q(aFile)} ${q(zFile)}`);
        ageDec = fs.existsSync(aFile) ? bestCli(`age -d -i ${q(age.keyFile)} ${q(aFile)} >/dev/null`) : null;
      }
      // MB/s of the stage's own input: the compressed stream (the CLI's input is zstd -3's output, about as big)
      const zIn = fs.existsSync(zFile) ? fs.statSync(zFile).size : zBytes;
      rows.push({ stage: "age encrypt", data: `${data} → ${(zBytes / MiB).toFixed(0)} MiB zstd`, bytes: zBytes, memsnap: mbs(zBytes, tSeal), tool: "age -r", toolMBs: mbs(zIn, ageEnc), note: aead ? "native/aead" : "node:crypto" });
      rows.push({ stage: "age decrypt", data: `${data} → ${(zBytes / MiB).toFixed(0)} MiB zstd`, bytes: zBytes, memsnap: mbs(zBytes, tOpen), tool: "age -d", toolMBs: mbs(zIn, ageDec), note: aead ? "native/aead" : "node:crypto" });
    }
    if (redaction != null) rows.push({ stage: "redaction", data: "text (notes, JSON, JSONL)", bytes: null, memsnap: redaction, tool: "—", toolMBs: null, note: "the pipeline redacts nothing" });
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
  return rows;
}

/** The stage rows as table rows for textTable / markdownTable. */
export function stageTable(rows) {
  const header = ["stage", "data (one thread)", "memsnap MB/s", "pipeline tool", "tool MB/s", "note"];
  const body = rows.map((r) => [r.stage, r.data, r.memsnap ?? "—", r.tool, r.toolMBs ?? "—", r.note ?? ""]);
  return { header, body, right: [false, false, true, false, true, false] };
}
