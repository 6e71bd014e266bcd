/**
 * gen-pfimg.mjs — deterministic synthetic ProcessFork image stores for memsnap's tests and
 * benchmark. Plain ESM: Node built-ins + zstd-napi.
 *
 * Store layout (what ProcessFork writes):
 *   <root>/blobs/sha256/<hex[0:2]>/<hex>.zst   one zstd frame of the blob's bytes; <hex> is the
 *                                              SHA-256 of the *uncompressed* bytes
 *   <root>/images/<hex>.json                   an image manifest; <hex> = SHA-256 of its bytes
 * Every file is written temp → fsync → rename.
 *
 *   generatePfimgStore(opts)   a root image and forks (and optionally a merge) with every layer:
 *                              model base + diff, paged-batchinvariant-v1 cache (shared pages
 *                              across forks), world fs tree/env/procs, effects ledger, trace
 *   writeBlob / writeImage     the primitives (also for hand-made hostile stores in tests)
 *   writePagedCache            a cache page manifest + its K and V page blobs
 */
import { createHash, createHmac } from "node:crypto";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { kvValues } from "./gen-kv.mjs";

const require = createRequire(import.meta.url);
const zstd = require("zstd-napi");

export const GEN_PFIMG_VERSION = 1;
export const MEDIA_TYPE = "application/vnd.processfork.image.v1+json";
export const PF_DTYPE_BYTES = { bf16: 2, f16: 2, f32: 4, fp8e4m3: 1 };

const FIXED_MTIME = new Date("2024-06-01T12:00:00Z");

const sha256 = (b) => createHash("sha256").update(b).digest("hex");

/** `<root>/blobs/sha256/<xx>/<hex>.zst` for a digest string or hex. */
export function blobPath(root, digest) {
  const hex = digest.replace(/^sha256:/i, "").toLowerCase();
  return path.join(root, "blobs", "sha256", hex.slice(0, 2), `${hex}.zst`);
}

/** `<root>/images/<hex>.json` for an image id or hex. */
export function imagePath(root, id) {
  const hex = id.replace(/^sha256:/i, "").toLowerCase();
  return path.join(root, "images", `${hex}.json`);
}

function atomicWrite(file, bytes) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const tmp = `${file}.tmp-${process.pid}`;
  const fd = fs.openSync(tmp, "w", 0o644);
  try {
    fs.writeSync(fd, bytes);
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
  fs.utimesSync(tmp, FIXED_MTIME, FIXED_MTIME);
  fs.renameSync(tmp, file);
}

/** Store `bytes` as a blob (one zstd frame at `level`); returns its digest `sha256:<hex>`. */
export function writeBlob(root, bytes, level = 19) {
  const buf = typeof bytes === "string" ? Buffer.from(bytes, "utf8") : bytes;
  const hex = sha256(buf);
  const file = blobPath(root, hex);
  if (!fs.existsSync(file)) atomicWrite(file, zstd.compress(buf, { compressionLevel: level }));
  return `sha256:${hex}`;
}

/**
 * Store an image manifest (an object, serialised as JSON, or exact bytes) under images/ and,
 * with `asBlob` (default true), also as a blob. Returns the image id `sha256:<hex>`.
 */
export function writeImage(root, manifest, { asBlob = true, level = 19 } = {}) {
  const bytes = Buffer.isBuffer(manifest) ? manifest : Buffer.from(typeof manifest === "string" ? manifest : JSON.stringify(manifest), "utf8");
  const hex = sha256(bytes);
  atomicWrite(imagePath(root, hex), bytes);
  if (asBlob) writeBlob(root, bytes, level);
  return `sha256:${hex}`;
}

const camel = (s) => s.replace(/_([a-z0-9])/g, (_m, c) => c.toUpperCase());
function keys(obj, camelCase) {
  if (!camelCase) return obj;
  return Object.fromEntries(Object.entries(obj).map(([k, v]) => [camel(k), v]));
}

/**
 * Write a `paged-batchinvariant-v1` page manifest and its pages. `pages` is a list of content
 * keys (a string: fresh values for that key, shared between calls with the same key and seed;
 * null: an all-zero page). Returns { manifest: digest, pageBytes, pages: [{ix,k,v}], json }.
 * `oldShape` writes `page_size_bytes` instead of `page_size_tokens` (older fixtures).
 */
export function writePagedCache(root, {
  seed = 1, nLayers = 2, nHeads = 2, headDim = 16, dtype = "bf16", pageSizeTokens = 16, pages = ["p0", "p1"],
  camelCase = false, oldShape = false, level = 19, pageLevel = 3, logicalSeqs = true,
} = {}) {
  const pageBytes = nLayers * pageSizeTokens * nHeads * headDim * PF_DTYPE_BYTES[dtype];
  const list = pages.map((key, ix) => {
    const mk = (kv) => writeBlob(root, key === null ? Buffer.alloc(pageBytes) : kvValues(seed, `pf/${key}/${kv}`, pageBytes, dtype), pageLevel);
    return { ix, k: mk("k"), v: mk("v") };
  });
  const doc = keys({
    layout: "paged-batchinvariant-v1",
    ...(oldShape ? { page_size_bytes: pageBytes } : { page_size_tokens: pageSizeTokens }),
    n_layers: nLayers, n_heads: nHeads, head_dim: headDim, dtype,
    pages: list,
    ...(logicalSeqs ? { logical_seqs: [{ seq_id: "s0", pages: list.map((p) => p.ix), num_tokens: list.length * pageSizeTokens }] } : {}),
  }, camelCase);
  const json = JSON.stringify(doc);
  return { manifest: writeBlob(root, json, level), pageBytes, pages: list, json };
}

/** A minimal ustar archive of `files` (name → Buffer), for procs.criu.v1. */
function tarOf(files) {
  const parts = [];
  for (const [name, data] of Object.entries(files)) {
    const h = Buffer.alloc(512);
    h.write(name, 0, 100, "utf8");
    h.write("0000644\0", 100);
    h.write("0000000\0", 108);
    h.write("0000000\0", 116);
    h.write(data.length.toString(8).padStart(11, "0") + "\0", 124);
    h.write(Math.floor(FIXED_MTIME.getTime() / 1000).toString(8).padStart(11, "0") + "\0", 136);
    h.write("        ", 148);
    h.write("0", 156);
    h.write("ustar\0", 257);
    h.write("00", 263);
    let sum = 0;
    for (const b of h) sum += b;
    h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148);
    parts.push(h, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

function ledger(entries, sessionKey) {
  let prev = "";
  const lines = [JSON.stringify({ entries: entries.length, kind: "effects.ledger.v1" })];
  for (const e of entries) {
    const body = JSON.stringify(e);
    const session_hmac = createHmac("sha256", sessionKey).update(prev).update(body).digest("hex");
    lines.push(JSON.stringify({ ...e, session_hmac }));
    prev = session_hmac;
  }
  return lines.join("\n") + "\n";
}

const SECRET_NAME = /(KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)/i;

/**
 * Generate a store under `root`.
 *
 * Options: root, seed (1), nLayers (2), nHeads (2), headDim (16), dtype ("bf16"), pages (3: cache
 * pages of the root image; each fork adds one and keeps the rest), zeroPages (1: all-zero pages
 * at the end of each cache), forks (1), merge (false: with ≥ 2 forks, a merge image of the first
 * two), camelCase (false), oldCacheShape (false), level (19: JSON blobs), pageLevel (3: K/V pages),
 * criu (false: procs as procs.unsupported.v1; true: procs.criu.v1 with a small tar), secret
 * (false: when true the trace holds a fake API key, for redaction scans), asBlob (true: manifests
 * also stored as blobs).
 *
 * Returns { root, images: [{ id, parents, kind: "root"|"fork"|"merge" }], rootId, pageBytes,
 * blobs: number of blob files, blobBytes }.
 */
export function generatePfimgStore(opts) {
  const {
    root, seed = 1, nLayers = 2, nHeads = 2, headDim = 16, dtype = "bf16", pages = 3, zeroPages = 1, forks = 1,
    merge = false, camelCase = false, oldCacheShape = false, level = 19, pageLevel = 3, criu = false, secret = false,
    asBlob = true,
  } = opts;
  fs.mkdirSync(path.join(root, "blobs", "sha256"), { recursive: true });
  fs.mkdirSync(path.join(root, "images"), { recursive: true });
  const images = [];
  const baseModel = writeBlob(root, Buffer.from(`base-model-weights-ref/${seed}\n` + "w".repeat(4096)), level);

  const makeImage = (kind, n, parents, pageKeys) => {
    const tag = `${kind}${n}`;
    const diff = writeBlob(root, JSON.stringify({
      kind: "model.diff.v1", method: kind === "root" ? "lora" : "in-place-ttt", rank: 2,
      tensors: [{ name: "layers.0.attn.q_proj", a: [0.125, -0.5, 0.25, 1], b: [0.5, 0.75, -1, 2], shape: [2, 2] }],
      seed, tag,
    }), level);
    const cache = writePagedCache(root, {
      seed, nLayers, nHeads, headDim, dtype, pages: pageKeys, camelCase, oldShape: oldCacheShape, level, pageLevel,
    });
    const fileBlobs = {
      "README.md": writeBlob(root, `# workspace\nimage ${tag}\n`, level),
      "notes/todo.txt": writeBlob(root, `remember the milk (${seed})\n`, level),
      "data/blob.bin": writeBlob(root, kvValues(seed, `fs/${kind === "root" ? "root" : tag}`, 3000, "bf16"), level),
    };
    const fsTree = {
      kind: "fs.tree.v1",
      entries: [
        { path: "README.md", mode: "0644", size: Buffer.byteLength(`# workspace\nimage ${tag}\n`), kind: "file", blob: fileBlobs["README.md"] },
        { path: "data", mode: "0755", size: 0, kind: "dir" },
        { path: "data/blob.bin", mode: "0644", size: 3000, kind: "file", blob: fileBlobs["data/blob.bin"] },
        { path: "latest", mode: "0777", size: 0, kind: "symlink", link_target: "README.md" },
        { path: "notes", mode: "0755", size: 0, kind: "dir" },
        { path: "notes/todo.txt", mode: "0644", size: Buffer.byteLength(`remember the milk (${seed})\n`), kind: "file", blob: fileBlobs["notes/todo.txt"] },
      ].map((e) => (camelCase && e.link_target ? { ...e, linkTarget: e.link_target, link_target: undefined } : e)),
    };
    const vars = { HOME: "/home/agent", OPENAI_API_KEY: "sk-should-not-appear", PATH: "/usr/bin:/bin", TZ: "UTC" };
    const env = {
      kind: "env.v1", cwd: "/home/agent/work",
      vars: Object.fromEntries(Object.keys(vars).sort().map((k) => [k, SECRET_NAME.test(k) ? "<redacted>" : vars[k]])),
    };
    const procs = criu
      ? Buffer.concat([
        Buffer.from(JSON.stringify({ kind: "procs.criu.v1", criu_version: "3.19", pids: [4242] }) + "\n"),
        tarOf({ "images/core-4242.img": Buffer.from(kvValues(seed, `criu/${tag}`, 2048, "fp8e4m3")), "images/inventory.img": Buffer.from("inv\n") }),
      ])
      : JSON.stringify({ kind: "procs.unsupported.v1", reason: "criu not available" });
    const led = ledger([
      { ts: "2024-06-01T12:00:00Z", tool_id: "fs.write", args_hash: `sha256:${sha256(`a${tag}`)}`, idempotency_key: `k-${tag}-1`, result_hash: `sha256:${sha256(`r${tag}`)}`, side_effect_class: "idempotent" },
      { ts: "2024-06-01T12:00:01Z", tool_id: "http.get", args_hash: `sha256:${sha256(`b${tag}`)}`, idempotency_key: `k-${tag}-2`, result_hash: `sha256:${sha256(`s${tag}`)}`, side_effect_class: "network-only" },
    ], `session-${seed}-${tag}`);
    const msgs = [
      { content: "You are a helpful agent.", role: "system" },
      { content: `Plan the ${tag} task.`, role: "user" },
      { content: secret ? "Use key sk-ant-api03-" + "A".repeat(93) + "AA for the call." : `Working on ${tag}.`, role: "assistant" },
    ];
    const manifest = keys({
      schema_version: 1,
      media_type: MEDIA_TYPE,
      agent: { kind: "claude-code", version: "1.0.0", fingerprint: `sha256:${sha256(`agent/${seed}`)}` },
      model: { base: baseModel, diff },
      cache: { layout: "paged-batchinvariant-v1", manifest: cache.manifest },
      world: {
        fs: writeBlob(root, JSON.stringify(fsTree), level),
        env: writeBlob(root, JSON.stringify(env), level),
        procs: writeBlob(root, procs, level),
      },
      effects: { ledger: writeBlob(root, led, level) },
      trace: { messages: writeBlob(root, msgs.map((m) => JSON.stringify(m)).join("\n") + "\n", level) },
      created_at: new Date(FIXED_MTIME.getTime() + images.length * 60_000).toISOString(),
      parents,
    }, camelCase);
    const id = writeImage(root, manifest, { asBlob, level });
    images.push({ id, parents, kind });
    return { id, pageBytes: cache.pageBytes };
  };

  const zeros = Array.from({ length: zeroPages }, () => null);
  const rootKeys = [...Array.from({ length: pages }, (_, i) => `p${i}`), ...zeros];
  const r = makeImage("root", 0, [], rootKeys);
  const forkIds = [];
  for (let f = 0; f < forks; f++) {
    const keysF = [...Array.from({ length: pages }, (_, i) => `p${i}`), `fork${f}`, ...zeros];
    forkIds.push(makeImage("fork", f, [r.id], keysF).id);
  }
  if (merge && forkIds.length >= 2) {
    makeImage("merge", 0, [forkIds[0], forkIds[1]], [...Array.from({ length: pages }, (_, i) => `p${i}`), "fork0", "fork1", ...zeros]);
  }
  let blobs = 0;
  let blobBytes = 0;
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else {
        blobs++;
        blobBytes += fs.statSync(p).size;
      }
    }
  };
  walk(path.join(root, "blobs"));
  return { root, images, rootId: r.id, pageBytes: r.pageBytes, blobs, blobBytes };
}
