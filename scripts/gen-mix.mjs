#!/usr/bin/env node
/**
 * gen-mix.mjs — deterministic generator of an "agent memory" mix for the memsnap benchmark.
 *
 *   node scripts/gen-mix.mjs --scale S --out DIR [--seed N] [--force] [--quiet]
 *
 * Writes about S × 1 GiB (S may be fractional, e.g. 0.05) into DIR, each class in the layout the
 * memsnap source that captures it reads (scripts/lib/mix-sources.mjs maps them to sources):
 *
 *   kv/       ~52 %  one memsnap KV dump (kv-manifest.json + data/layer-NNN.bin, docs/FORMAT.md
 *                    "KV dump format"): bf16 values with a realistic exponent spread (barely
 *                    compressible) in 64 KiB pages (16 tokens × 8 KV heads × 128), 32 layers (4–31
 *                    below scale ~0.3), 6 sequences sharing a prompt prefix: ~15 % of the pages
 *                    repeat an earlier sequence's prefix page, ~10 % are free all-zero blocks.
 *   db/       ~35 %  SQLite databases built with the sqlite3 CLI: memory.db (journal_mode=WAL; text
 *                    memories), vectors.db (float32 embeddings as BLOBs; incompressible),
 *                    concepts.db (JSON concepts + edges).
 *   traces/   ~12 %  JSONL conversation traces (compressible text; not agentlog records).
 *   memory/   ~1.3 % a git repository of 3000 × S small markdown notes (1–8 KiB) in nested
 *                    directories, committed over 16 commits and repacked, with a few notes
 *                    modified since the last commit and one untracked note (inbox/).
 *   state/    tiny   JSON cursors (cursor.json, dream-run.json, ...).
 *   runtime/  small  a ProcessFork image store (pfimg/) and a CRIU images dir (criu/).
 *
 * The classes keep the 45 : 30 : 10 proportions of the benchmark brief but are scaled up so the
 * whole tree adds up to S GiB (45 + 30 + 10 + markdown alone would only be ~0.86 GiB).
 *
 * Determinism: the same seed + scale gives a byte-identical tree (every file and mtime) for
 * everything that memsnap-mix writes itself. All randomness comes from an AES-256-CTR keystream
 * (bulk bytes) and an sfc32 PRNG (structure, text), both keyed by sha256(seed, label). The SQLite
 * files are generated from deterministic SQL (no randomblob/now()), so with the same sqlite3
 * version they come out byte-identical too; across sqlite3 versions they may differ (header
 * version field, page layout), which is why determinism of the .db bytes is only "nice to have".
 * The git repository is written by git with a fixed environment (no user or system config, fixed
 * author, committer and dates, one pack thread): the same git gives the same commits, HEAD and
 * pack; only memory/.git/index (and its directory's mtime) differs, since git's index caches
 * inode and ctime numbers.
 *
 * Bulk data is produced in ≤ 4 MiB blocks; no file is ever held in memory whole. Needs the
 * sqlite3 and git CLIs.
 *
 * As a module:  import { generateMix } from "./gen-mix.mjs";
 *               const summary = await generateMix({ scale: 0.05, out: "/tmp/mix", seed: 1 });
 */
import { createCipheriv, createHash } from "node:crypto";
import { generateKvDump, kvPageBytes } from "./lib/gen-kv.mjs";
import { generatePfimgStore } from "./lib/gen-pfimg.mjs";
import { genCriuDump } from "./lib/gen-criu.mjs";
import fs from "node:fs";
import path from "node:path";
import os from "node:os";
import { spawn, spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

export const GEN_VERSION = 3;

const KiB = 1024;
const MiB = 1024 * KiB;
const GiB = 1024 * MiB;
const BLOCK = MiB; // write granularity
const FIXED_MTIME = new Date("2024-06-01T12:00:00Z"); // every file and dir gets this mtime

// Class shares of the S GiB budget (45:30:10 of the brief, rescaled; markdown/state take the rest).
const SHARE = { kv: 45, db: 30, traces: 10 };
const MD_FILES_PER_SCALE = 3000;
const MD_MIN = 1 * KiB;
const MD_MAX = 8 * KiB;

// ---------------------------------------------------------------------------------------------
// Randomness
// ---------------------------------------------------------------------------------------------

function seedBytes(seed, label) {
  return createHash("sha256").update(`memsnap-mix/v${GEN_VERSION}/${seed}/${label}`).digest();
}

/** sfc32: small fast counter PRNG, 32-bit output. Seeded from sha256(seed, label). */
export class Rng {
  constructor(seed, label) {
    const h = seedBytes(seed, `rng/${label}`);
    this.a = h.readUInt32LE(0) | 0;
    this.b = h.readUInt32LE(4) | 0;
    this.c = h.readUInt32LE(8) | 0;
    this.d = h.readUInt32LE(12) | 0;
    for (let i = 0; i < 16; i++) this.u32();
  }
  u32() {
    const t = (((this.a + this.b) | 0) + this.d) | 0;
    this.d = (this.d + 1) | 0;
    this.a = this.b ^ (this.b >>> 9);
    this.b = (this.c + (this.c << 3)) | 0;
    this.c = (this.c << 21) | (this.c >>> 11);
    this.c = (this.c + t) | 0;
    return t >>> 0;
  }
  /** float in [0, 1) */
  float() {
    return this.u32() / 4294967296;
  }
  /** integer in [lo, hi] */
  int(lo, hi) {
    return lo + Math.floor(this.float() * (hi - lo + 1));
  }
  pick(arr) {
    return arr[Math.floor(this.float() * arr.length)];
  }
  chance(p) {
    return this.float() < p;
  }
}

const ZEROS = Buffer.alloc(BLOCK);

/** AES-256-CTR keystream keyed by sha256(seed, label): a very fast deterministic byte source. */
class KeyStream {
  constructor(seed, label) {
    this.cipher = createCipheriv("aes-256-ctr", seedBytes(seed, `ks/${label}`), Buffer.alloc(16));
  }
  /** n ≤ 1 MiB fresh pseudo-random bytes, 4-byte aligned. */
  bytes(n) {
    let b = this.cipher.update(ZEROS.subarray(0, n));
    if (b.byteOffset % 4 !== 0) b = Buffer.from(b); // keep typed-array views legal
    return b;
  }
}

// ---------------------------------------------------------------------------------------------
// Text
// ---------------------------------------------------------------------------------------------

const WORDS = (
  "the a an and or but if then when while because so that this these those it its they them their " +
  "we our you your he she his her i me my is are was were be been being have has had do does did " +
  "will would can could should may might must not no yes all some any each every more most less few " +
  "many much other another same such only own just also very too again still already never always " +
  "often sometimes now later today tomorrow yesterday before after during between into onto from to " +
  "of in on at by for with about against over under above below up down out off through across " +
  "user assistant agent tool memory context window token tokens prompt reply answer question task " +
  "goal plan step steps result results error errors file files folder path config setting settings " +
  "database table row rows column index query search vector embedding embeddings model models cache " +
  "session sessions trace log logs event events message messages note notes summary summaries topic " +
  "project projects deadline meeting meetings email calendar document documents report reports code " +
  "function test tests build release branch commit review issue bug fix feature request response " +
  "customer team manager friend family travel flight hotel budget invoice payment account password " +
  "preference preferences habit habits schedule reminder reminders list lists idea ideas draft version " +
  "remember remembers remembered recall recalled forget forgot learn learned learns notice noticed " +
  "prefer prefers preferred ask asked asks tell told say said write wrote written read reads run ran " +
  "open opened close closed send sent receive received check checked update updated create created " +
  "delete deleted move moved find found keep kept start started finish finished try tried need needs " +
  "want wants like likes use used uses make made take took give gave get got see saw know knew think " +
  "thought feel felt seem seemed help helped work worked call called schedule scheduled book booked " +
  "important urgent small large new old recent early late quick slow simple complex clear unclear " +
  "good better best bad worse worst happy tired busy free available missing broken stable final " +
  "morning evening night week month year weekend monday tuesday wednesday thursday friday " +
  "alice bob carol dave erin frank grace heidi ivan judy mallory oscar peggy trent victor walter " +
  "berlin paris london tokyo lisbon boston denver seattle austin toronto " +
  "python typescript rust sqlite postgres docker kubernetes linux github slack notion jira " +
  "coffee tea lunch dinner walk run gym book music movie garden kitchen office home"
).split(/\s+/);

const CAPS = new Set(["i", "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
  "mallory", "oscar", "peggy", "trent", "victor", "walter", "berlin", "paris", "london", "tokyo", "lisbon",
  "boston", "denver", "seattle", "austin", "toronto", "monday", "tuesday", "wednesday", "thursday",
  "friday", "python", "typescript", "rust", "sqlite", "postgres", "docker", "kubernetes", "linux",
  "github", "slack", "notion", "jira"]);
const CAP_WORDS = WORDS.map((w) => (CAPS.has(w) ? w[0].toUpperCase() + w.slice(1) : w));
const capitalize = (s) => s[0].toUpperCase() + s.slice(1);

/** One English-like sentence of lo..hi words. */
function sentence(rng, lo = 5, hi = 18) {
  const n = rng.int(lo, hi);
  let s = capitalize(rng.pick(CAP_WORDS));
  for (let i = 1; i < n; i++) {
    s += " " + rng.pick(CAP_WORDS);
    if (i < n - 2 && rng.u32() % 13 === 0) s += ",";
  }
  const end = rng.u32() % 10;
  return s + (end === 0 ? "?" : end === 1 ? "!" : ".");
}

function paragraph(rng, lo = 2, hi = 6) {
  const n = rng.int(lo, hi);
  const parts = [];
  for (let i = 0; i < n; i++) parts.push(sentence(rng));
  return parts.join(" ");
}

function words(rng, lo, hi) {
  const n = rng.int(lo, hi);
  const parts = [];
  for (let i = 0; i < n; i++) parts.push(rng.pick(CAP_WORDS));
  return parts.join(" ");
}

const sqlStr = (s) => "'" + s.replace(/'/g, "''") + "'";

// ---------------------------------------------------------------------------------------------
// File helpers
// ---------------------------------------------------------------------------------------------

function mkdirp(p) {
  fs.mkdirSync(p, { recursive: true });
}

/** Writes a file from a producer that yields Buffers/strings of ≤ ~1 MiB; returns bytes. */
function writeChunked(file, produce) {
  const fd = fs.openSync(file, "w");
  let bytes = 0;
  try {
    produce((chunk) => {
      bytes += fs.writeSync(fd, chunk);
    });
  } finally {
    fs.closeSync(fd);
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// KV cache: one memsnap KV dump (kv-manifest.json + per-layer data files)
// ---------------------------------------------------------------------------------------------

const KV_SEQUENCES = 6;
const KV_ZERO_SHARE = 0.1; // free (all-zero) blocks
const KV_DUP_SHARE = 0.15; // shared-prompt-prefix blocks that repeat an earlier sequence's

/**
 * Options for generateKvDump that write about `budget` bytes of page data: a Llama-like shape
 * (8 KV heads × 128, bf16, 16-token blocks: 64 KiB pages), 32 layers (fewer below scale ~0.3,
 * so a small dump still has enough blocks per layer for the proportions to hold), 6 sequences
 * sharing a prompt prefix, ~10 % zero blocks and ~15 % duplicated prefix blocks.
 */
export function kvMixOptions(budget) {
  const base = { nKvHeads: 8, headDim: 128, dtype: "bf16", blockSize: 16, sequences: KV_SEQUENCES };
  const pageBytes = kvPageBytes(base);
  const nLayers = Math.max(4, Math.min(32, Math.floor(budget / (pageBytes * 128))));
  const blocks = Math.max(KV_SEQUENCES * 3, Math.round(budget / (pageBytes * nLayers)));
  const zeroBlocks = Math.max(1, Math.round(blocks * KV_ZERO_SHARE));
  const prefixBlocks = Math.max(1, Math.round((blocks * KV_DUP_SHARE) / (KV_SEQUENCES - 1)));
  const ownBlocks = Math.max(1, Math.floor((blocks - zeroBlocks - KV_SEQUENCES * prefixBlocks) / KV_SEQUENCES));
  return { ...base, nLayers, zeroBlocks, prefixBlocks, ownBlocks, shuffleBlocks: true, modelName: "bench-8x128-bf16" };
}

function genKvDump(root, budget, seed) {
  const opts = kvMixOptions(budget);
  const r = generateKvDump({ dir: path.join(root, "kv"), seed, ...opts });
  const e = r.expected;
  return {
    format: "memsnap-kv-dump",
    bytes: r.dataBytes,
    layers: opts.nLayers,
    blocks: r.numBlocks,
    sequences: opts.sequences,
    pageBytes: r.pageBytes,
    pages: e.pagesTotal,
    zeroPages: e.pagesZero,
    dupPages: e.pagesTotal - e.pagesZero - e.pagesUnique,
    uniquePages: e.pagesUnique,
  };
}

// ---------------------------------------------------------------------------------------------
// SQLite databases
// ---------------------------------------------------------------------------------------------

/** Runs sqlite3 on `db`, feeding stdin from an async producer; resolves when sqlite3 exits 0. */
function runSqlite(db, produce) {
  return new Promise((resolve, reject) => {
    const child = spawn("sqlite3", ["-batch", "-bail", "-init", "/dev/null", db], {
      stdio: ["pipe", "ignore", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    child.on("error", (e) => reject(new Error(`cannot run sqlite3: ${e.message}`)));
    child.on("close", (code) => {
      if (code === 0) resolve();
      else reject(new Error(`sqlite3 ${db} exited ${code}: ${stderr.trim().slice(0, 2000)}`));
    });
    child.stdin.on("error", () => {}); // reported through the exit code
    const write = (s) =>
      child.stdin.write(s) ? Promise.resolve() : new Promise((r) => child.stdin.once("drain", r));
    Promise.resolve(produce(write)).then(
      () => child.stdin.end(),
      (e) => {
        child.kill();
        reject(e);
      },
    );
  });
}

const M32 = 4294967295;
/** SQL expression: a 20-bit pseudo-random value from integer expression x and a salt. */
const sqlHash = (x, salt) => `((((((${x}) * 64 + ${salt % 64}) * 2654435761) & ${M32}) >> 12) % 1048573)`;

/**
 * Fragment pool: `bytes` of English-like text in fragments of ~40–400 bytes (a clause, one to three
 * sentences), written into a TEMP table (not persisted in the database file). SQL then builds
 * each text value by concatenating a few fragments picked by hashing the row id. A pool much
 * larger than zstd's window keeps the result about as compressible as free text.
 */
async function insertFragments(write, rng, bytes) {
  await write("CREATE TEMP TABLE frag(id INTEGER PRIMARY KEY, t TEXT NOT NULL);\n");
  let n = 0;
  let total = 0;
  while (total < bytes) {
    const vals = [];
    for (let j = 0; j < 200; j++) {
      const r = rng.u32() % 8;
      const t = r === 0 ? words(rng, 3, 8) + "," : r < 3 ? sentence(rng) : paragraph(rng, 2, 3);
      vals.push(`(${n++},${sqlStr(t)})`);
      total += t.length;
    }
    await write(`INSERT INTO frag VALUES ${vals.join(",")};\n`);
  }
  return n;
}

/** SQL text expression: `lenExpr` (1..maxSlots) pool fragments picked by hashing `iExpr`. */
function fragConcat(iExpr, lenExpr, maxSlots, nFrag, saltBase) {
  const pick = (k) => `(SELECT t FROM frag WHERE id = ${sqlHash(iExpr, saltBase + k)} % ${nFrag})`;
  let e = pick(0);
  for (let k = 1; k < maxSlots; k++) e += `\n  || CASE WHEN ${lenExpr} > ${k} THEN ' ' || ${pick(k)} ELSE '' END`;
  return e;
}

const fragPoolBytes = (budget) => Math.round(Math.min(16 * MiB, Math.max(1 * MiB, budget / 4)));

// Measured bytes of database file per row (page slack and indexes included), for sizing.
const MEMORY_ROW_BYTES = 824;
const CONCEPT_ROW_BYTES = 855;
const VECTOR_ROW_BYTES = 4140;

async function genMemoryDb(file, budget, seed) {
  const rng = new Rng(seed, "memory.db");
  const rows = Math.max(50, Math.round(budget / MEMORY_ROW_BYTES));
  await runSqlite(file, async (write) => {
    await write("PRAGMA page_size=4096;\nPRAGMA journal_mode=WAL;\nPRAGMA synchronous=OFF;\nPRAGMA temp_store=MEMORY;\nBEGIN;\n");
    const nFrag = await insertFragments(write, rng, fragPoolBytes(budget));
    await write(`CREATE TABLE memories(
  id INTEGER PRIMARY KEY,
  created_at TEXT NOT NULL,
  session TEXT NOT NULL,
  kind TEXT NOT NULL,
  importance REAL NOT NULL,
  tags TEXT NOT NULL,
  content TEXT NOT NULL
);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${rows}),
h(i, len) AS (SELECT i, 1 + ${sqlHash("i", 63)} % 8 FROM n)
INSERT INTO memories(id, created_at, session, kind, importance, tags, content)
SELECT i,
  strftime('%Y-%m-%dT%H:%M:%SZ', 1704067200 + i * 53 + ${sqlHash("i", 62)} % 50, 'unixepoch'),
  printf('sess-%05d', i / 37),
  CASE ${sqlHash("i", 61)} % 5 WHEN 0 THEN 'episodic' WHEN 1 THEN 'semantic' WHEN 2 THEN 'procedural'
    WHEN 3 THEN 'preference' ELSE 'reflection' END,
  round((${sqlHash("i", 60)} % 1000) / 1000.0, 3),
  json_array(printf('t%03d', ${sqlHash("i", 59)} % 300), printf('t%03d', ${sqlHash("i", 58)} % 300)),
  ${fragConcat("i", "len", 8, nFrag, 0)}
FROM h;
CREATE INDEX memories_created ON memories(created_at);
CREATE INDEX memories_kind ON memories(kind, importance);
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID;
INSERT INTO meta VALUES ('schema', '3'), ('agent', 'bench'), ('generator', 'memsnap gen-mix v${GEN_VERSION}');
COMMIT;
`);
  });
  return rows;
}

async function genConceptsDb(file, budget, seed) {
  const rng = new Rng(seed, "concepts.db");
  const rows = Math.max(20, Math.round(budget / CONCEPT_ROW_BYTES));
  await runSqlite(file, async (write) => {
    await write("PRAGMA page_size=4096;\nPRAGMA synchronous=OFF;\nPRAGMA temp_store=MEMORY;\nBEGIN;\n");
    const nFrag = await insertFragments(write, rng, fragPoolBytes(budget));
    await write(`CREATE TABLE concepts(
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  data TEXT NOT NULL CHECK (json_valid(data))
);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${rows}),
h(i, len) AS (SELECT i, 1 + ${sqlHash("i", 63)} % 5 FROM n)
INSERT INTO concepts(id, name, kind, data)
SELECT i,
  printf('concept-%06d', i),
  CASE ${sqlHash("i", 62)} % 4 WHEN 0 THEN 'person' WHEN 1 THEN 'place' WHEN 2 THEN 'topic' ELSE 'project' END,
  json_object(
    'label', rtrim(substr((SELECT t FROM frag WHERE id = ${sqlHash("i", 61)} % ${nFrag}), 1, 12 + i % 20), ' ,.'),
    'aliases', json_array(printf('alias-%x', ${sqlHash("i", 60)}), printf('alias-%x', ${sqlHash("i", 59)})),
    'summary', ${fragConcat("i", "len", 5, nFrag, 0)},
    'salience', round((${sqlHash("i", 58)} % 10000) / 10000.0, 4),
    'mentions', json_array(${sqlHash("i", 57)} % 100000, ${sqlHash("i", 56)} % 100000, ${sqlHash("i", 55)} % 100000),
    'updated_at', strftime('%Y-%m-%dT%H:%M:%SZ', 1704067200 + i * 97, 'unixepoch')
  )
FROM h;
CREATE TABLE edges(src INTEGER NOT NULL, dst INTEGER NOT NULL, rel TEXT NOT NULL, weight REAL NOT NULL,
  PRIMARY KEY (src, dst, rel)) WITHOUT ROWID;
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ${rows}),
k(j) AS (VALUES (1), (2), (3))
INSERT OR IGNORE INTO edges(src, dst, rel, weight)
SELECT i, 1 + ${sqlHash("i * 4 + j", 40)} % ${rows},
  CASE j WHEN 1 THEN 'related_to' WHEN 2 THEN 'part_of' ELSE 'mentioned_with' END,
  round((${sqlHash("i * 4 + j", 41)} % 1000) / 1000.0, 3)
FROM n, k;
CREATE INDEX edges_dst ON edges(dst);
COMMIT;
`);
  });
  return rows;
}

async function genVectorsDb(file, budget, seed) {
  const ks = new KeyStream(seed, "vectors.db");
  const DIM = 768;
  const rows = Math.max(20, Math.round(budget / VECTOR_ROW_BYTES));
  const PER_INSERT = 64;
  const vec = new Float32Array(DIM);
  const vecBuf = Buffer.from(vec.buffer);
  await runSqlite(file, async (write) => {
    await write(`PRAGMA page_size=4096;
PRAGMA synchronous=OFF;
BEGIN;
CREATE TABLE embeddings(
  id INTEGER PRIMARY KEY,
  memory_id INTEGER NOT NULL,
  model TEXT NOT NULL,
  dim INTEGER NOT NULL,
  norm REAL NOT NULL,
  vec BLOB NOT NULL
);
`);
    for (let i = 1; i <= rows; i += PER_INSERT) {
      const n = Math.min(PER_INSERT, rows - i + 1);
      const rb = ks.bytes(n * DIM * 4);
      const rnd = new Uint32Array(rb.buffer, rb.byteOffset, n * DIM);
      const parts = [];
      for (let r = 0; r < n; r++) {
        let ss = 0;
        for (let d = 0; d < DIM; d++) {
          // uniform in ±0.125 with a random 23-bit mantissa: random float32 bytes, barely compressible
          const v = ((rnd[r * DIM + d] >>> 9) * 1.1920928955078125e-7 - 0.5) * 0.25;
          vec[d] = v;
          ss += v * v;
        }
        const id = i + r;
        parts.push(`(${id},${1 + ((id * 7) % (rows + 13))},'e5-base-v2',${DIM},${Math.sqrt(ss).toFixed(6)},X'${vecBuf.toString("hex")}')`);
      }
      await write(`INSERT INTO embeddings VALUES ${parts.join(",\n")};\n`);
    }
    await write("CREATE INDEX embeddings_memory ON embeddings(memory_id);\nCOMMIT;\n");
  });
  return rows;
}

// ---------------------------------------------------------------------------------------------
// JSONL traces, markdown notes, state cursors
// ---------------------------------------------------------------------------------------------

function genTraces(root, budget, scale, seed) {
  const rng = new Rng(seed, "traces");
  const dir = path.join(root, "traces");
  mkdirp(dir);
  const g = Math.min(1, Math.max(1 / 8, scale));
  const stats = { files: 0, bytes: 0, lines: 0 };
  let left = budget;
  let ts = Date.parse("2024-05-01T08:00:00Z");
  let toolNo = 0;
  const tools = ["search_memory", "read_file", "write_file", "web_search", "calendar", "run_sql", "send_email"];
  while (left > 0) {
    let target = Math.round(rng.int(4 * MiB, 20 * MiB) * g);
    if (left - target < (2 * MiB * g)) target = left;
    const name = `session-${String(stats.files).padStart(4, "0")}.jsonl`;
    const file = path.join(dir, name);
    const sessionId = `s-${String(stats.files).padStart(4, "0")}-${(rng.u32() >>> 8).toString(16).padStart(6, "0")}`;
    let written = 0;
    let turn = 0;
    stats.bytes += writeChunked(file, (write) => {
      let buf = [];
      let bufLen = 0;
      while (written + bufLen < target) {
        turn++;
        ts += rng.int(200, 90_000);
        const r = rng.u32() % 10;
        let line;
        if (r < 3) {
          line = { ts: new Date(ts).toISOString(), session: sessionId, turn, role: "user", content: paragraph(rng, 1, 4), tool_id: null };
        } else if (r < 7) {
          line = { ts: new Date(ts).toISOString(), session: sessionId, turn, role: "assistant", content: paragraph(rng, 2, 10), tool_id: null,
            usage: { input_tokens: rng.int(200, 60000), output_tokens: rng.int(20, 2000) } };
        } else {
          const tool = rng.pick(tools);
          const result = { status: rng.chance(0.9) ? "ok" : "error", tool, items: [] };
          const k = rng.int(0, 6);
          for (let j = 0; j < k; j++) result.items.push({ id: rng.u32(), score: Math.round(rng.float() * 1000) / 1000, text: sentence(rng) });
          line = { ts: new Date(ts).toISOString(), session: sessionId, turn, role: "tool", content: JSON.stringify(result),
            tool_id: `call_${(toolNo++).toString(36).padStart(6, "0")}${(rng.u32() >>> 4).toString(36)}`, name: tool };
        }
        const s = JSON.stringify(line) + "\n";
        buf.push(s);
        bufLen += Buffer.byteLength(s);
        stats.lines++;
        if (bufLen >= BLOCK) {
          write(buf.join(""));
          written += bufLen;
          buf = [];
          bufLen = 0;
        }
      }
      if (bufLen) {
        write(buf.join(""));
        written += bufLen;
      }
    });
    left -= written;
    stats.files++;
  }
  return stats;
}

/**
 * memory/: the markdown notes as a live agent's git memory dir. The notes are committed over
 * MEMORY_COMMITS commits (later commits also edit earlier notes), the repository is repacked,
 * then a few tracked notes are edited and one new note is left untracked.
 *
 * git runs with a fixed environment (no system/global config, HOME in a temp dir, fixed author,
 * committer and dates, gc.auto=0, one pack thread), so the commits, HEAD and the pack are the
 * same on every run with the same git. Only .git/index differs run to run: it caches inode and
 * ctime numbers (refreshIndex() rewrites it once the final mtimes are set, as a live repo's is).
 */
const MEMORY_COMMITS = 16;
const GIT_EPOCH = Date.parse("2024-03-01T09:00:00Z");

function gitRunner(repo, home) {
  const base = {
    PATH: process.env.PATH ?? "/usr/bin:/bin",
    HOME: home,
    GIT_CONFIG_NOSYSTEM: "1",
    GIT_CONFIG_GLOBAL: "/dev/null",
    GIT_TERMINAL_PROMPT: "0",
    LC_ALL: "C",
    TZ: "UTC",
    GIT_AUTHOR_NAME: "memsnap-mix agent",
    GIT_AUTHOR_EMAIL: "agent@memsnap-mix.invalid",
    GIT_COMMITTER_NAME: "memsnap-mix agent",
    GIT_COMMITTER_EMAIL: "agent@memsnap-mix.invalid",
  };
  const cfg = [
    "-c", "init.defaultBranch=main", "-c", "core.autocrlf=false", "-c", "core.fileMode=true",
    "-c", "commit.gpgSign=false", "-c", "gc.auto=0", "-c", "pack.threads=1", "-c", "repack.updateServerInfo=false",
    "-c", "core.hooksPath=/dev/null",
  ];
  return (args, { date, ok = [0] } = {}) => {
    const env = { ...base };
    if (date) env.GIT_AUTHOR_DATE = env.GIT_COMMITTER_DATE = date;
    const r = spawnSync("git", [...cfg, ...args], { cwd: repo, env, encoding: "utf8", maxBuffer: 64 * MiB });
    if (r.error) throw new Error(`cannot run git: ${r.error.message}`);
    if (!ok.includes(r.status)) throw new Error(`git ${args.join(" ")} exited ${r.status}: ${(r.stderr || "").trim().slice(0, 2000)}`);
    return (r.stdout || "").trim();
  };
}

function noteText(rng, target) {
  let s = `# ${capitalize(words(rng, 2, 6))}\n\n`;
  s += `_updated: ${new Date(Date.parse("2024-06-01T00:00:00Z") - rng.int(0, 90 * 86400) * 1000).toISOString()}_\n\n`;
  while (Buffer.byteLength(s) < target) {
    const r = rng.u32() % 4;
    if (r === 0) s += `## ${capitalize(words(rng, 2, 5))}\n\n`;
    else if (r === 1) {
      const k = rng.int(2, 6);
      for (let j = 0; j < k; j++) s += `- ${sentence(rng, 3, 12)}\n`;
      s += "\n";
    } else s += paragraph(rng) + "\n\n";
  }
  // ASCII only, so any cut is a valid UTF-8 boundary
  return Buffer.from(s).subarray(0, target);
}

function genMemoryRepo(root, scale, seed) {
  const rng = new Rng(seed, "markdown");
  const nFiles = Math.max(20, Math.round(MD_FILES_PER_SCALE * scale));
  const areas = {
    episodic: ["2024-04", "2024-05", "2024-06"],
    semantic: ["people", "places", "tools", "facts"],
    procedural: ["howto", "checklists"],
    projects: ["alpha", "beta", "gamma", "archive"],
    reflections: ["weekly", "dreams"],
  };
  const repo = path.join(root, "memory");
  const dirs = [];
  for (const [a, subs] of Object.entries(areas)) for (const s of subs) dirs.push(path.join(a, s));
  dirs.push("");
  for (const d of dirs) mkdirp(path.join(repo, d));
  const home = fs.mkdtempSync(path.join(os.tmpdir(), "memsnap-mix-git-"));
  const git = gitRunner(repo, home);
  const stats = { files: 0, bytes: 0, commits: 0, edits: 0, modified: [], untracked: [], head: null };
  const notes = [];
  const append = (rel, text) => {
    fs.appendFileSync(path.join(repo, rel), text);
    stats.bytes += Buffer.byteLength(text);
  };
  const update = (when) => `\n## Update ${when.slice(0, 10)}\n\n${paragraph(rng, 1, 3)}\n`;
  try {
    git(["init", "-q", "--template=", "."]);
    const commits = Math.min(MEMORY_COMMITS, nFiles);
    let next = 0;
    for (let c = 0; c < commits; c++) {
      const when = new Date(GIT_EPOCH + c * 5 * 86400_000 + rng.int(0, 8 * 3600) * 1000).toISOString().replace(".000Z", "Z");
      const upto = Math.round(((c + 1) * nFiles) / commits);
      const added = upto - next;
      for (; next < upto; next++) {
        const rel = path.join(rng.pick(dirs), `note-${String(next).padStart(5, "0")}.md`);
        const b = noteText(rng, rng.int(MD_MIN, MD_MAX));
        fs.writeFileSync(path.join(repo, rel), b);
        notes.push(rel);
        stats.files++;
        stats.bytes += b.length;
      }
      // Later commits also revise a few earlier notes (consolidation, corrections).
      const edits = c === 0 ? 0 : Math.min(notes.length - added, rng.int(1, 3 + Math.round(nFiles / 400)));
      for (let e = 0; e < edits; e++) append(notes[rng.int(0, notes.length - added - 1)], update(when));
      stats.edits += edits;
      git(["add", "-A", "."]);
      const msg = c === 0 ? "memory: initial notes" : `memory: consolidate ${added} notes${edits ? `, revise ${edits}` : ""} (${words(rng, 2, 4)})`;
      git(["commit", "-q", "--no-verify", "-m", msg], { date: when });
      stats.commits++;
    }
    // A long-lived memdir has been gc'd: one pack, no loose objects.
    git(["repack", "-a", "-d", "-q"]);
    git(["prune-packed", "-q"]);
    stats.head = git(["rev-parse", "HEAD"]);
    // The live state: a few notes edited since the last commit, one new note not yet added.
    const nMod = Math.min(notes.length, 3 + Math.round(nFiles / 1000));
    const picked = new Set();
    while (picked.size < nMod) picked.add(notes[rng.int(0, notes.length - 1)]);
    for (const rel of [...picked].sort()) {
      append(rel, `\n- ${sentence(rng, 4, 12)} (unsaved)\n`);
      stats.modified.push(rel.split(path.sep).join("/"));
    }
    mkdirp(path.join(repo, "inbox"));
    const draft = path.join("inbox", "draft-0001.md");
    const b = noteText(rng, rng.int(MD_MIN, MD_MAX));
    fs.writeFileSync(path.join(repo, draft), b);
    stats.bytes += b.length;
    stats.files++;
    stats.untracked.push(draft.split(path.sep).join("/"));
  } finally {
    fs.rmSync(home, { recursive: true, force: true });
  }
  return stats;
}

/** Refreshes memory/.git/index after the final mtimes are set, so its stat cache matches the files (as a live repo's does). */
function refreshIndex(root) {
  const home = fs.mkdtempSync(path.join(os.tmpdir(), "memsnap-mix-git-"));
  try {
    gitRunner(path.join(root, "memory"), home)(["update-index", "-q", "--refresh"], { ok: [0, 1] });
  } finally {
    fs.rmSync(home, { recursive: true, force: true });
  }
}

function genState(root, scale, seed, info) {
  const rng = new Rng(seed, "state");
  const dir = path.join(root, "state");
  mkdirp(dir);
  const files = {
    "cursor.json": {
      agent: "bench",
      trace_file: info.lastTrace,
      trace_offset: info.traceBytes,
      memory_rowid: info.memoryRows,
      updated_at: "2024-06-01T11:59:58.000Z",
    },
    "dream-run.json": {
      run_id: `dream-${(rng.u32() >>> 0).toString(16)}`,
      started_at: "2024-06-01T03:00:00.000Z",
      finished_at: "2024-06-01T03:17:42.512Z",
      status: "ok",
      consolidated: rng.int(100, 5000),
      pruned: rng.int(0, 500),
      concepts_touched: rng.int(10, 900),
    },
    "sessions.json": {
      active: [],
      recent: Array.from({ length: 20 }, (_, i) => ({ id: `s-${String(i).padStart(4, "0")}`, turns: rng.int(3, 400) })),
    },
    "heartbeat.json": { pid: 4242, host: "agent-host", beat: 123456, scale },
  };
  let bytes = 0;
  for (const [name, obj] of Object.entries(files)) {
    const s = JSON.stringify(obj, null, 2) + "\n";
    fs.writeFileSync(path.join(dir, name), s);
    bytes += Buffer.byteLength(s);
  }
  return { files: Object.keys(files).length, bytes };
}

// ---------------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------------

function walk(dir, onEntry) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, onEntry);
    onEntry(p, e);
  }
}

/** Sizes and counts per top-level class directory, from the files on disk. */
function measureTree(root) {
  const classes = {};
  walk(root, (p, e) => {
    if (!e.isFile()) return;
    const cls = path.relative(root, p).split(path.sep)[0];
    const c = (classes[cls] ??= { files: 0, bytes: 0 });
    c.files++;
    c.bytes += fs.statSync(p).size;
  });
  return classes;
}

/**
 * Runtime layers in their own formats, under runtime/: a small ProcessFork image store (a root
 * image, two forks and a merge, with a paged KV cache and a CRIU procs blob) and a synthetic
 * CRIU dump of two processes.
 */
function genRuntime(out, scale, seed) {
  const dir = path.join(out, "runtime");
  const pf = generatePfimgStore({ root: path.join(dir, "pfimg"), seed, forks: 2, merge: true, criu: true, pages: 4 });
  const criu = genCriuDump(path.join(dir, "criu"), { pids: [1000, 1001], pagesPerProcess: Math.max(16, Math.round(256 * scale)), seed });
  return { pfimgImages: pf.images.length, criuBytes: criu.bytes };
}

/**
 * Generates the mix into `out` (created; must not exist or be empty).
 * @returns {Promise<object>} summary: { scale, seed, version, seconds, totalBytes, totalFiles, classes, details }
 */
export async function generateMix({ scale = 1, out, seed = 1, log = () => {} } = {}) {
  if (!out) throw new Error("generateMix: out is required");
  if (!(scale > 0)) throw new Error(`generateMix: bad scale ${scale}`);
  const t0 = process.hrtime.bigint();
  mkdirp(out);
  if (fs.readdirSync(out).length) throw new Error(`generateMix: ${out} is not empty`);

  const total = scale * GiB;
  const mdEstimate = Math.max(20, Math.round(MD_FILES_PER_SCALE * scale)) * ((MD_MIN + MD_MAX) / 2);
  const rest = Math.max(0, total - mdEstimate - 4 * KiB);
  const shareSum = SHARE.kv + SHARE.db + SHARE.traces;
  const budget = {
    kv: (rest * SHARE.kv) / shareSum,
    db: (rest * SHARE.db) / shareSum,
    traces: (rest * SHARE.traces) / shareSum,
  };

  const dbDir = path.join(out, "db");
  mkdirp(dbDir);
  // SQL-generated databases run in sqlite3 child processes while Node writes the rest.
  log("starting sqlite3: memory.db (WAL), concepts.db");
  const memoryP = genMemoryDb(path.join(dbDir, "memory.db"), budget.db * 0.3, seed);
  const conceptsP = genConceptsDb(path.join(dbDir, "concepts.db"), budget.db * 0.2, seed);
  // keep unhandled rejections from firing before we await them
  memoryP.catch(() => {});
  conceptsP.catch(() => {});

  log("vectors.db");
  const vectorRows = await genVectorsDb(path.join(dbDir, "vectors.db"), budget.db * 0.5, seed);
  log("kv: memsnap KV dump");
  const kv = genKvDump(out, budget.kv, seed);
  log("runtime layers: ProcessFork store, CRIU dump");
  const runtime = genRuntime(out, scale, seed);
  log("traces");
  const traces = genTraces(out, budget.traces, scale, seed);
  log("memory: markdown notes in a git repository");
  const md = genMemoryRepo(out, scale, seed);
  log("waiting for sqlite3");
  const [memoryRows, conceptRows] = await Promise.all([memoryP, conceptsP]);
  const state = genState(out, scale, seed, {
    lastTrace: `traces/session-${String(traces.files - 1).padStart(4, "0")}.jsonl`,
    traceBytes: traces.bytes,
    memoryRows,
  });

  // Fixed mtimes (files first, directories bottom-up) so the tree — and a tar of it — is stable;
  // then the git index is refreshed against those mtimes (it alone caches inode/ctime numbers).
  walk(out, (p) => fs.utimesSync(p, FIXED_MTIME, FIXED_MTIME));
  fs.utimesSync(out, FIXED_MTIME, FIXED_MTIME);
  refreshIndex(out);

  const classes = measureTree(out);
  const totalBytes = Object.values(classes).reduce((a, c) => a + c.bytes, 0);
  const totalFiles = Object.values(classes).reduce((a, c) => a + c.files, 0);
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  return {
    version: GEN_VERSION,
    scale,
    seed,
    seconds: Math.round(seconds * 100) / 100,
    totalBytes,
    totalFiles,
    classes,
    details: {
      kv: { ...kv, zeroPagePct: pct(kv.zeroPages, kv.pages), dupPagePct: pct(kv.dupPages, kv.pages) },
      db: { memoryRows, conceptRows, vectorRows, walMode: "memory.db", deterministic: "same sqlite3 version → identical bytes (not guaranteed across versions)" },
      traces,
      memory: md,
      runtime,
      state,
    },
  };
}

const pct = (a, b) => (b ? Math.round((1000 * a) / b) / 10 : 0);

export function formatSummary(s) {
  const lines = [];
  const mb = (b) => (b / MiB).toFixed(1).padStart(9);
  lines.push(`mix: scale ${s.scale}, seed ${s.seed}, generator v${s.version}`);
  lines.push(`  class      files        MiB   share`);
  for (const [k, c] of Object.entries(s.classes).sort()) {
    lines.push(`  ${k.padEnd(9)}${String(c.files).padStart(7)} ${mb(c.bytes)}  ${pct(c.bytes, s.totalBytes).toFixed(1).padStart(5)} %`);
  }
  lines.push(`  ${"total".padEnd(9)}${String(s.totalFiles).padStart(7)} ${mb(s.totalBytes)}`);
  const kv = s.details.kv;
  lines.push(`  kv dump: ${kv.layers} layers × ${kv.blocks} blocks = ${kv.pages} pages × ${kv.pageBytes / KiB} KiB, ${kv.zeroPagePct} % zero, ${kv.dupPagePct} % duplicated prefix pages`);
  const m = s.details.memory;
  if (m) lines.push(`  memory git: ${m.files} notes, ${m.commits} commits (HEAD ${m.head?.slice(0, 12)}), ${m.modified.length} modified, ${m.untracked.length} untracked`);
  const d = s.details.db;
  lines.push(`  db rows: memories ${d.memoryRows}, concepts ${d.conceptRows}, embeddings ${d.vectorRows}`);
  lines.push(`  generated in ${s.seconds.toFixed(2)} s`);
  return lines.join("\n");
}

// ---------------------------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------------------------

function parseArgs(argv) {
  const opts = { scale: 1, seed: 1, out: null, force: false, quiet: false, json: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === "--scale") opts.scale = Number(val());
    else if (a === "--out") opts.out = val();
    else if (a === "--seed") opts.seed = Number(val());
    else if (a === "--force") opts.force = true;
    else if (a === "--quiet") opts.quiet = true;
    else if (a === "--json") opts.json = true;
    else if (a === "-h" || a === "--help") opts.help = true;
    else throw new Error(`unknown argument ${a}`);
  }
  return opts;
}

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error(`gen-mix: ${e.message}`);
    process.exit(2);
  }
  if (opts.help || !opts.out) {
    console.error("usage: node scripts/gen-mix.mjs --scale S --out DIR [--seed N] [--force] [--quiet] [--json]");
    process.exit(opts.help ? 0 : 2);
  }
  if (!(opts.scale > 0) || !Number.isInteger(opts.seed)) {
    console.error("gen-mix: --scale must be > 0 and --seed an integer");
    process.exit(2);
  }
  const out = path.resolve(opts.out);
  if (fs.existsSync(out) && fs.readdirSync(out).length) {
    if (!opts.force) {
      console.error(`gen-mix: ${out} exists and is not empty (use --force to replace it)`);
      process.exit(2);
    }
    fs.rmSync(out, { recursive: true, force: true });
  }
  const log = opts.quiet ? () => {} : (m) => console.error(`gen-mix: ${m}`);
  const summary = await generateMix({ scale: opts.scale, out, seed: opts.seed, log });
  if (opts.json) console.log(JSON.stringify(summary, null, 2));
  else console.log(formatSummary(summary));
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main().catch((e) => {
    console.error(`gen-mix: ${e.stack || e.message}`);
    process.exit(1);
  });
}
