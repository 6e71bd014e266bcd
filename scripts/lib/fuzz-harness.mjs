// Fuzzing the bundle's parsers with random and mutated inputs (issue #35): the manifest parser
// (parseManifest, then what is done with a parsed manifest: the seal, JSON output), the payload
// tar scanner (TarScanner, fed in random pieces) and the container reader (readLayout, on a
// file). Every input must end in a result or a MemsnapError whose code is not MEMSNAP_INTERNAL,
// within a time bound, with bounded memory.
//
// The functions under test are passed in (`api`): test/format/fuzz.test.ts passes src/, and
// scripts/fuzz.mjs passes dist/. A failure throws a FuzzFailure that carries the input, its
// target and the seed, so that it can be saved and replayed.
import { createHash } from "node:crypto";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** A small deterministic PRNG (mulberry32), so a run is replayed from its seed. */
export function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (n) => Math.floor(next() * n);
  return { next, int, pick: (xs) => xs[int(xs.length)], chance: (p) => next() < p };
}

export class FuzzFailure extends Error {
  constructor(target, why, input, seed) {
    super(`${target}: ${why} (seed ${seed}, input ${input.length} bytes)`);
    this.target = target;
    this.input = input;
    this.seed = seed;
  }
}

const INTERESTING_BYTES = [0x00, 0xff, 0x7f, 0x80, 0x20, 0x22, 0x5c, 0x7b, 0x7d, 0x5b, 0x5d, 0x2f, 0x2e, 0x30, 0x37, 0x38, 0x0a, 0x3a, 0x2c];
const INTERESTING_STRINGS = [
  "../outside/app", "/etc/passwd", "", ".", "..", "A", "a".repeat(300), "x\u0000y", "01JHXST1E0000000000/../../p", "01JHXST1E00000000000000000",
  "é", "\ud800", "memory/../../x", "memory", "sha256:" + "0".repeat(64), "0".repeat(64), "payload.tar.zst", "payload.tar.zst.age", "age", "zstd",
];
const INTERESTING_NUMBERS = [0, -1, 1, 2, 3, 0.5, 1e300, -1e300, 2 ** 53, 2 ** 53 - 1, 2 ** 31, 2 ** 32, 4096, 512, Number.MAX_SAFE_INTEGER];

/** A random JSON value of bounded size (and sometimes a deep one). */
function randomValue(r, budget = 6) {
  const k = r.int(budget > 0 ? 9 : 5);
  switch (k) {
    case 0: return null;
    case 1: return r.chance(0.5);
    case 2: return r.pick(INTERESTING_NUMBERS);
    case 3: return r.pick(INTERESTING_STRINGS);
    case 4: return r.int(1000);
    case 5: return Array.from({ length: r.int(4) }, () => randomValue(r, budget - 1));
    case 6: return Object.fromEntries(Array.from({ length: r.int(4) }, () => [r.pick(["name", "kind", "path", "layer", "a", "snapshot_id", "seal", "meta", ""]), randomValue(r, budget - 1)]));
    case 7: { let v = 1; const d = r.pick([10, 60, 61, 62, 63, 64, 65, 100, 1000, 2000]); for (let i = 0; i < d; i++) v = r.chance(0.5) ? [v] : { a: v }; return v; }
    default: return r.pick(INTERESTING_STRINGS);
  }
}

/** Every (container, key) pair inside a parsed JSON value, up to a bound. */
function slots(v, max = 2000) {
  const out = [];
  const stack = [v];
  while (stack.length && out.length < max) {
    const x = stack.pop();
    if (x === null || typeof x !== "object") continue;
    for (const k of Object.keys(x)) {
      out.push([x, k]);
      stack.push(x[k]);
    }
  }
  return out;
}

/** A JSON-aware mutation of a JSON document (null when it does not parse). */
function mutateJson(r, bytes) {
  let doc;
  try {
    doc = JSON.parse(bytes.toString("utf8"));
  } catch {
    return null;
  }
  const n = 1 + r.int(3);
  for (let i = 0; i < n; i++) {
    const s = slots(doc);
    if (!s.length) break;
    const [obj, key] = r.pick(s);
    const op = r.int(5);
    if (op === 0) delete obj[key];
    else if (op === 1 && Array.isArray(obj[key]) && obj[key].length) obj[key].push(obj[key][r.int(obj[key].length)]);
    else if (op === 2 && typeof obj[key] === "string") obj[key] = r.pick(INTERESTING_STRINGS);
    else obj[key] = randomValue(r);
  }
  try {
    return Buffer.from(r.chance(0.5) ? JSON.stringify(doc) : JSON.stringify(doc, null, 1));
  } catch {
    return null; // deep values put inside deep values: too deep for JSON.stringify (byte mutations nest deeper still)
  }
}

/** A byte-level mutation (bit flips, interesting bytes, inserts, deletes, splices, truncation). */
export function mutateBytes(r, input, others = []) {
  let b = Buffer.from(input);
  const n = 1 + r.int(4);
  for (let i = 0; i < n; i++) {
    const op = r.int(10);
    const at = b.length ? r.int(b.length) : 0;
    if (op === 0 && b.length) b[at] ^= 1 << r.int(8);
    else if (op === 1 && b.length) b[at] = r.pick(INTERESTING_BYTES);
    else if (op === 2) b = Buffer.concat([b.subarray(0, at), Buffer.from([r.int(256)]), b.subarray(at)]);
    else if (op === 3 && b.length) b = Buffer.concat([b.subarray(0, at), b.subarray(Math.min(b.length, at + 1 + r.int(64)))]);
    else if (op === 4 && b.length) { const len = 1 + r.int(Math.min(512, b.length - at)); b = Buffer.concat([b.subarray(0, at), b.subarray(at, at + len), b.subarray(at)]); }
    else if (op === 5 && others.length) { const o = r.pick(others); const from = o.length ? r.int(o.length) : 0; b = Buffer.concat([b.subarray(0, at), o.subarray(from, from + r.int(1024))]); }
    else if (op === 6) b = b.subarray(0, at);
    else if (op === 7 && b.length >= 4) { const v = r.pick([0, 0x7fffffff, 0xffffffff, 512, 1]); b.writeUInt32BE(v, Math.min(at, b.length - 4)); }
    else if (op === 9) { const open = r.pick(["[", '{"a":', "{", "[{"]).repeat(r.pick([1, 30, 64, 70_000])); b = Buffer.concat([b.subarray(0, at), Buffer.from(open), b.subarray(at)]); }
    else if (op === 8 && b.length) { const len = r.int(32); b = Buffer.concat([b.subarray(0, at), Buffer.from(String(r.pick(INTERESTING_NUMBERS))), b.subarray(Math.min(b.length, at + len))]); }
  }
  return b;
}

// ------------------------------------------------------------------------------ seeds

/** Tar pieces for seeds (ustar, with pax and GNU long-name members). */
function tarHeader(name, size, type = "0", { magic = "ustar\u000000", prefix = "", link = "" } = {}) {
  const b = Buffer.alloc(512);
  b.write(name, 0, 100, "utf8");
  b.write("0000644\0", 100);
  b.write("0000000\0", 108);
  b.write("0000000\0", 116);
  b.write(size.toString(8).padStart(11, "0") + "\0", 124);
  b.write("14700000000\0", 136);
  b.write(type, 156);
  b.write(link, 157, 100, "utf8");
  b.write(magic, 257, 8, "binary");
  if (prefix) b.write(prefix, 345, 155, "utf8");
  b.fill(0x20, 148, 156);
  let s = 0;
  for (const x of b) s += x;
  b.write(s.toString(8).padStart(6, "0") + "\0 ", 148);
  return b;
}
const pad = (n) => Buffer.alloc((512 - (n % 512)) % 512);
function member(name, data, type = "0", opts) {
  const d = Buffer.from(data);
  return Buffer.concat([tarHeader(name, d.length, type, opts), d, pad(d.length)]);
}
function paxRecord(k, v) {
  const body = ` ${k}=${v}\n`;
  let len = Buffer.byteLength(body) + 1;
  while (String(len).length + Buffer.byteLength(body) !== len) len = String(len).length + Buffer.byteLength(body);
  return `${len}${body}`;
}

/** Seed tar streams: what memsnap writes and what older writers wrote. */
export function tarSeeds() {
  const end = Buffer.alloc(1024);
  const long = `memory/${"d/".repeat(80)}file.md`;
  return [
    Buffer.concat([member("memory/a.md", "hello\n"), member("memory/b.md", "x".repeat(700)), member(".memsnap/index.json", '{"artifacts":[]}'), end]),
    Buffer.concat([member("PaxHeader", paxRecord("path", long) + paxRecord("size", "5"), "x"), member("ignored", "12345"), end]),
    Buffer.concat([member("././@LongLink", long + "\0", "L", { magic: "ustar  \0" }), member("x", "abc", "0", { magic: "ustar  \0" }), end]),
    Buffer.concat([member("g", paxRecord("comment", "global"), "g"), member("memory/c", "c"), end]),
    Buffer.concat([member("name.md", "prefixed\n", "0", { prefix: "memory/sub" }), end]),
    Buffer.concat([member("memory/dir/", ""), member("memory/link", "", "2", { link: "/etc" }), end]),
    Buffer.concat([member("K", "target\0", "K", { magic: "ustar  \0" }), member("memory/l", "", "1", { link: "memory/a" }), end]),
    end,
    Buffer.alloc(0),
  ];
}

/** Seed manifests and bundle files: every bundle under the given fixture directories. */
export function fileSeeds(dirs) {
  const bundles = [];
  for (const d of dirs) {
    let names = [];
    try {
      names = readdirSync(d);
    } catch {
      continue;
    }
    for (const n of names.filter((x) => x.endsWith(".memsnap")).sort()) {
      const b = readFileSync(join(d, n));
      if (b.length <= 2 * 1024 * 1024) bundles.push(b);
    }
  }
  return bundles;
}

/** The manifest member's bytes of a bundle file's bytes (the second tar member), or null. */
export function manifestOf(bundle) {
  if (bundle.length < 1024) return null;
  const size = parseInt(bundle.toString("latin1", 124, 136).replace(/\0.*$/, "").trim(), 8);
  if (!Number.isSafeInteger(size)) return null;
  const at = 512 + size + ((512 - (size % 512)) % 512);
  if (at + 512 > bundle.length) return null;
  const msize = parseInt(bundle.toString("latin1", at + 124, at + 136).replace(/\0.*$/, "").trim(), 8);
  if (!Number.isSafeInteger(msize) || at + 512 + msize > bundle.length) return null;
  return bundle.subarray(at + 512, at + 512 + msize);
}

// ------------------------------------------------------------------------------ targets

function checkError(target, e, input, seed, api) {
  if (!api.isMemsnapError(e)) throw new FuzzFailure(target, `threw a non-MemsnapError: ${e?.stack ?? e}`, input, seed);
  if (e.code === "MEMSNAP_INTERNAL") throw new FuzzFailure(target, `MEMSNAP_INTERNAL: ${e.message}`, input, seed);
  if (!e.hint) throw new FuzzFailure(target, `${e.code} without a hint`, input, seed);
}

/** parseManifest, then what readers do with a parsed manifest (seal, JSON output). */
export function fuzzManifest(api, input, seed) {
  let m;
  try {
    m = api.parseManifest(input);
  } catch (e) {
    checkError("parseManifest", e, input, seed, api);
    return "refused";
  }
  try {
    api.checkSeal(m);
    JSON.stringify(m);
    JSON.stringify(m, null, 2);
    for (const l of m.layers) String(l.name), String(l.kind);
  } catch (e) {
    throw new FuzzFailure("parseManifest", `a parsed manifest broke a reader: ${e?.stack ?? e}`, input, seed);
  }
  return "parsed";
}

/** TarScanner over `input` in random pieces: never throws, ops stay inside what was scanned. */
export function fuzzTar(api, input, seed, r) {
  const s = new api.TarScanner(() => createHash("sha256"), () => r.chance(0.5));
  let at = 0;
  let ok = true;
  while (at < input.length && ok) {
    const n = 1 + r.int(r.chance(0.5) ? 600 : 5000);
    const piece = Buffer.from(input.subarray(at, at + n));
    try {
      ok = s.scan(piece, 0, piece.length);
    } catch (e) {
      throw new FuzzFailure("TarScanner", `scan threw: ${e?.stack ?? e}`, input, seed);
    }
    const ops = s.ops;
    s.ops = [];
    for (let i = 0; i < ops.length;) {
      const op = ops[i];
      if (op === 1) {
        if (typeof ops[i + 1] !== "string" || !(ops[i + 2] >= 0)) throw new FuzzFailure("TarScanner", `bad OP_START ${JSON.stringify(ops.slice(i, i + 5))}`, input, seed);
        i += 5;
      } else if (op === 2) {
        const [from, len] = [ops[i + 1], ops[i + 2]];
        if (!(from >= 0 && len >= 0 && from + len <= piece.length)) throw new FuzzFailure("TarScanner", `OP_DATA ${from}+${len} outside a piece of ${piece.length}`, input, seed);
        i += 3;
      } else if (op === 3) {
        i += 2;
      } else {
        throw new FuzzFailure("TarScanner", `unknown op ${op}`, input, seed);
      }
    }
    at += n;
  }
  if (ok) {
    try {
      s.end();
    } catch (e) {
      throw new FuzzFailure("TarScanner", `end threw: ${e?.stack ?? e}`, input, seed);
    }
  }
  return s.error === null ? "framed" : "refused";
}

/** readLayout on a file holding `input`, then parseManifest on what it found. */
export async function fuzzLayout(api, input, seed, file) {
  writeFileSync(file, input);
  let layout;
  try {
    layout = await api.readLayout(file);
  } catch (e) {
    checkError("readLayout", e, input, seed, api);
    return "refused";
  }
  if (!(layout.payloadOffset >= 0 && layout.payloadSize >= 0 && layout.payloadOffset + layout.payloadSize <= layout.fileSize)) {
    throw new FuzzFailure("readLayout", `a layout outside the file: ${JSON.stringify({ ...layout, manifestBytes: undefined, payloadHead: undefined })}`, input, seed);
  }
  fuzzManifest(api, layout.manifestBytes, seed);
  return "read";
}

/** The seeds the cases mutate, from the seed bundles. */
export function seedsOf(bundles) {
  return { bundles, manifests: bundles.map(manifestOf).filter((m) => m && m.length < 4 * 1024 * 1024), tars: tarSeeds() };
}

/** Case `i` of a run: its target (0 manifest, 1 tar, 2 layout), its input, and its PRNG (the tar split uses it). */
export function makeCase(seeds, i, caseSeed) {
  const cr = rng(caseSeed);
  const target = i % 3;
  let input;
  if (target === 0) {
    const base = seeds.manifests.length && !cr.chance(0.05) ? cr.pick(seeds.manifests) : Buffer.from(JSON.stringify(randomValue(cr)));
    input = (cr.chance(0.6) && mutateJson(cr, base)) || mutateBytes(cr, base, seeds.manifests);
  } else if (target === 1) {
    const base = cr.chance(0.8) ? cr.pick(seeds.tars) : Buffer.from(Array.from({ length: cr.int(4096) }, () => cr.int(256)));
    input = cr.chance(0.1) ? base : mutateBytes(cr, base, seeds.tars);
  } else {
    const base = seeds.bundles.length ? cr.pick(seeds.bundles) : Buffer.alloc(0);
    input = cr.chance(0.05) ? base : mutateBytes(cr, base, seeds.bundles);
  }
  return { target, input, cr };
}

export const TARGETS = ["manifest", "tar", "layout"];
export const caseSeedOf = (seed, i) => (seed * 1_000_003 + i) >>> 0;

/**
 * Run the fuzzer until `until(i)` is false. `api`: {parseManifest, checkSeal, TarScanner,
 * readLayout, isMemsnapError}; `bundles`: seed bundle files; `scratch`: a file path to write
 * containers to. Returns counts per target and outcome. Throws a FuzzFailure on the first
 * problem, an input slower than `slowMs` or an RSS over `maxRssBytes` included. `onCase(i,
 * caseSeed)` is told of each case before it runs (a watchdog can then name the one that hangs).
 */
export async function fuzz(api, { seed, bundles, scratch, until, slowMs = 2000, maxRssBytes = 1.5 * 1024 ** 3, onProgress, onCase }) {
  const seeds = seedsOf(bundles);
  const counts = {};
  const count = (k) => { counts[k] = (counts[k] ?? 0) + 1; };
  let i = 0;
  while (until(i)) {
    const caseSeed = caseSeedOf(seed, i);
    onCase?.(i, caseSeed);
    const { target, input, cr } = makeCase(seeds, i, caseSeed);
    const t0 = performance.now();
    let out;
    if (target === 0) out = `manifest:${fuzzManifest(api, input, caseSeed)}`;
    else if (target === 1) out = `tar:${fuzzTar(api, input, caseSeed, cr)}`;
    else out = `layout:${await fuzzLayout(api, input, caseSeed, scratch)}`;
    count(out);
    const ms = performance.now() - t0;
    if (ms > slowMs) throw new FuzzFailure(TARGETS[target], `one input took ${Math.round(ms)} ms`, input, caseSeed);
    if (i % 256 === 0) {
      const rss = process.memoryUsage().rss;
      if (rss > maxRssBytes) throw new FuzzFailure("memory", `RSS ${Math.round(rss / 2 ** 20)} MiB over the bound`, input, caseSeed);
      onProgress?.(i, counts, rss);
    }
    i++;
  }
  return { runs: i, counts };
}
