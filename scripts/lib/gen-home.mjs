#!/usr/bin/env node
/**
 * gen-home.mjs — a deterministic "realistic agent home" for the benchmark (issue #38 item 5):
 * the shapes a new user's home has, at `scale` 1 about 861 MiB. Plain ESM: Node built-ins,
 * better-sqlite3, the git binary; the KV dump and the memdir come from gen-paged-kv.mjs and
 * gen-memdir.mjs.
 *
 *   node scripts/lib/gen-home.mjs --out DIR [--scale S] [--seed N]
 *   import { generateHome } from "./lib/gen-home.mjs";
 *
 * The home (each part scaled by `scale`, counts rounded, with floors so that 0.02 still has
 * every shape):
 *
 *   kv/       a vLLM-style paged KV dump: 32 `layer_NN.kvpages` files of 64 KiB pages and a
 *             `manifest.json` giving `page_bytes`, the block tables and per-page SHA-256;
 *             6400 pages of which 3841 distinct (320 of them all-zero free blocks)   ~400 MiB
 *   db/       SQLite databases of text rows and float32 embedding BLOBs:
 *               knowledge.db  chunks(text, 768-d embedding), rollback journal      ~215 MiB
 *               memory.db     memories(text, 384-d embedding), WAL mode left with a hot WAL:
 *                             the last ~20 % of the rows and an update of ~5 % are frames in
 *                             memory.db-wal, never checkpointed                      ~90 MiB
 *               episodes.db   episodes(summary text, JSON) and a 256-d embedding      ~40 MiB
 *   memory/   a git memdir (gen-memdir.mjs): 20,000 notes, 3,000 commits               ~40 MiB
 *   traces/   JSONL traces, one file per day                                          ~60 MiB
 *   state/    JSON cursors                                                             tiny
 *
 * Determinism: the same seed and scale give the same rows, pages, notes and commits. Bytes
 * are the same too except memory.db-wal's header salts (SQLite draws them at random when a
 * WAL starts) and memory/.git/index (git caches inode numbers there). Nothing is held in memory
 * whole: rows are inserted in transactions of a few hundred, traces written line by line.
 *
 * Returns { dir, scale, seed, bytes, parts: { kv, sqlite: { file: { table: rows } }, wal:
 * { file, frames, pageSize }, git: { head, commits, notes }, traces: { files, lines }, state } }.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { generateMemdir } from "./gen-memdir.mjs";
import { generatePagedKvDump } from "./gen-paged-kv.mjs";
import { mulberry32 as prng } from "./prng.mjs";

export const GEN_HOME_VERSION = 1;

const Database = createRequire(import.meta.url)("better-sqlite3");


const SYL = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "de", "gu", "ho", "ji", "be", "fo", "an", "el"];
const VOCAB = (() => {
  const r = prng(777);
  const common = ("the a of to and in is that for it with as on was user agent said tool file memory task plan " +
    "result error retry search found note update project meeting deadline python sqlite docker git").split(" ");
  const made = Array.from({ length: 3000 }, () => {
    let w = "";
    for (let k = 1 + Math.floor(r() * 3); k >= 0; k--) w += SYL[Math.floor(r() * SYL.length)];
    return w;
  });
  return [...common, ...common, ...made];
})();

/** Prose-like text of about `bytes` bytes (words from a fixed vocabulary, sentences). */
function prose(r, bytes) {
  let s = "";
  let inSentence = 0;
  while (s.length < bytes) {
    let w = VOCAB[Math.floor(r() * VOCAB.length)];
    if (inSentence === 0) w = w[0].toUpperCase() + w.slice(1);
    s += w;
    inSentence++;
    if (inSentence > 6 && r() < 0.15) {
      s += ". ";
      inSentence = 0;
    } else s += " ";
  }
  return s.trimEnd() + ".";
}

/** `dim` float32 values like an embedding (about N(0, 0.05), unit-ish scale), little-endian bytes. */
function embedding(r, dim) {
  const f = new Float32Array(dim);
  for (let i = 0; i < dim; i++) f[i] = (r() + r() + r() - 1.5) * 0.1;
  return Buffer.from(f.buffer);
}

const FIXED_T0 = Date.UTC(2025, 0, 1);
const iso = (ms) => new Date(ms).toISOString();

/** Rows for `budget` bytes at about `rowBytes` each, at least `min`. */
const rowsFor = (budget, rowBytes, min) => Math.max(min, Math.round(budget / rowBytes));

function knowledgeDb(file, budget, seed) {
  const db = new Database(file);
  try {
    db.pragma("page_size = 4096");
    db.pragma("journal_mode = DELETE");
    db.pragma("synchronous = OFF");
    db.exec(`CREATE TABLE documents(id INTEGER PRIMARY KEY, uri TEXT NOT NULL, title TEXT NOT NULL, added_at TEXT NOT NULL);
CREATE TABLE chunks(id INTEGER PRIMARY KEY, doc_id INTEGER NOT NULL REFERENCES documents(id), ord INTEGER NOT NULL,
  text TEXT NOT NULL, embedding BLOB NOT NULL);
CREATE INDEX chunks_doc ON chunks(doc_id, ord);`);
    const rows = rowsFor(budget, 4790, 40);
    const docs = Math.max(4, Math.round(rows / 12));
    const r = prng(seed * 31 + 1);
    const insDoc = db.prepare("INSERT INTO documents VALUES (?, ?, ?, ?)");
    const insChunk = db.prepare("INSERT INTO chunks VALUES (?, ?, ?, ?, ?)");
    db.transaction(() => {
      for (let d = 1; d <= docs; d++) {
        insDoc.run(d, `file:///docs/${d}.md`, prose(r, 40), iso(FIXED_T0 + d * 3_600_000));
      }
    })();
    const batch = db.transaction((from, to) => {
      for (let i = from; i < to; i++) {
        insChunk.run(i + 1, 1 + (i % docs), Math.floor(i / docs), prose(r, 500 + Math.floor(r() * 600)), embedding(r, 768));
      }
    });
    for (let i = 0; i < rows; i += 500) batch(i, Math.min(rows, i + 500));
    return { documents: docs, chunks: rows };
  } finally {
    db.close();
  }
}

function episodesDb(file, budget, seed) {
  const db = new Database(file);
  try {
    db.pragma("page_size = 4096");
    db.pragma("synchronous = OFF");
    db.exec(`CREATE TABLE episodes(id INTEGER PRIMARY KEY, started_at TEXT NOT NULL, session TEXT NOT NULL,
  summary TEXT NOT NULL, meta TEXT NOT NULL CHECK (json_valid(meta)), embedding BLOB NOT NULL);
CREATE INDEX episodes_session ON episodes(session);`);
    const rows = rowsFor(budget, 4130, 40);
    const r = prng(seed * 31 + 2);
    const ins = db.prepare("INSERT INTO episodes VALUES (?, ?, ?, ?, ?, ?)");
    const batch = db.transaction((from, to) => {
      for (let i = from; i < to; i++) {
        const meta = JSON.stringify({ tools: Math.floor(r() * 12), outcome: r() < 0.8 ? "ok" : "failed", tokens: Math.floor(r() * 40000) });
        ins.run(i + 1, iso(FIXED_T0 + i * 420_000), `sess-${String(Math.floor(i / 9)).padStart(5, "0")}`,
          prose(r, 900 + Math.floor(r() * 900)), meta, embedding(r, 256));
      }
    });
    for (let i = 0; i < rows; i += 500) batch(i, Math.min(rows, i + 500));
    return { episodes: rows };
  } finally {
    db.close();
  }
}

/**
 * memory.db in WAL mode with a hot WAL: written in `tmpDir`, the base rows checkpointed into the
 * file, then (wal_autocheckpoint=0) the last rows inserted and some updated, and the database and
 * its -wal copied to `file` while the connection is still open (closing it would checkpoint).
 */
function memoryDb(file, budget, seed, tmpDir) {
  fs.mkdirSync(tmpDir, { recursive: true });
  const tmp = path.join(tmpDir, "memory.db");
  const db = new Database(tmp);
  try {
    db.pragma("page_size = 4096");
    db.pragma("journal_mode = WAL");
    db.pragma("synchronous = OFF");
    db.exec(`CREATE TABLE memories(id INTEGER PRIMARY KEY, created_at TEXT NOT NULL, kind TEXT NOT NULL,
  importance REAL NOT NULL, content TEXT NOT NULL, embedding BLOB NOT NULL);
CREATE INDEX memories_kind ON memories(kind, importance);
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID;
INSERT INTO meta VALUES ('schema', '4'), ('embedder', 'minilm-384');`);
    const rows = rowsFor(budget, 4040, 50);
    const base = Math.floor(rows * 0.8);
    const r = prng(seed * 31 + 3);
    const kinds = ["episodic", "semantic", "procedural", "preference", "reflection"];
    const ins = db.prepare("INSERT INTO memories VALUES (?, ?, ?, ?, ?, ?)");
    const batch = db.transaction((from, to) => {
      for (let i = from; i < to; i++) {
        ins.run(i + 1, iso(FIXED_T0 + i * 53_000), kinds[Math.floor(r() * kinds.length)], Math.round(r() * 1000) / 1000,
          prose(r, 300 + Math.floor(r() * 500)), embedding(r, 384));
      }
    });
    for (let i = 0; i < base; i += 500) batch(i, Math.min(base, i + 500));
    db.pragma("wal_checkpoint(TRUNCATE)");
    db.pragma("wal_autocheckpoint = 0");
    for (let i = base; i < rows; i += 200) batch(i, Math.min(rows, i + 200));
    const upd = db.prepare("UPDATE memories SET importance = ?, content = ? WHERE id = ?");
    db.transaction(() => {
      for (let k = 0; k < Math.max(2, Math.round(rows * 0.05)); k++) {
        upd.run(Math.round(r() * 1000) / 1000, prose(r, 400), 1 + Math.floor(r() * base));
      }
    })();
    fs.copyFileSync(tmp, file);
    fs.copyFileSync(`${tmp}-wal`, `${file}-wal`);
    const walBytes = fs.statSync(`${file}-wal`).size;
    return { rows: { memories: rows, meta: 2 }, wal: { frames: Math.max(0, (walBytes - 32) / (4096 + 24)), pageSize: 4096 } };
  } finally {
    db.close();
    fs.rmSync(tmpDir, { recursive: true, force: true });
  }
}

function traces(dir, budget, seed) {
  fs.mkdirSync(dir, { recursive: true });
  const r = prng(seed * 31 + 4);
  const files = Math.max(2, Math.round(30 * Math.min(1, budget / (60 * 2 ** 20))));
  const per = budget / files;
  let lines = 0;
  for (let f = 0; f < files; f++) {
    const name = path.join(dir, `${iso(FIXED_T0 + f * 86_400_000).slice(0, 10)}.jsonl`);
    const fd = fs.openSync(name, "w");
    let bytes = 0;
    let buf = "";
    try {
      for (let n = 0; bytes < per; n++) {
        const role = ["user", "assistant", "tool"][n % 3];
        const rec = {
          ts: iso(FIXED_T0 + f * 86_400_000 + n * 1500), session: `sess-${String(f * 40 + Math.floor(n / 50)).padStart(5, "0")}`,
          turn: n, role, content: prose(r, 120 + Math.floor(r() * 900)),
          ...(role === "tool" ? { tool: ["search", "read_file", "shell", "sql"][n % 4], ms: Math.floor(r() * 3000) } : {}),
          ...(role === "assistant" ? { usage: { in: Math.floor(r() * 8000), out: Math.floor(r() * 900) } } : {}),
        };
        const line = JSON.stringify(rec) + "\n";
        buf += line;
        bytes += line.length;
        lines++;
        if (buf.length > 1 << 20) {
          fs.writeSync(fd, buf);
          buf = "";
        }
      }
      fs.writeSync(fd, buf);
    } finally {
      fs.closeSync(fd);
    }
  }
  return { files, lines };
}

function state(dir, parts) {
  fs.mkdirSync(dir, { recursive: true });
  const docs = {
    "cursor.json": { trace: parts.lastTrace, offset: 0, updated_at: iso(FIXED_T0 + 86_400_000 * 30) },
    "dream-run.json": { last_run: iso(FIXED_T0 + 86_400_000 * 29), memories_consolidated: 412, next: "nightly" },
    "sessions.json": { active: ["sess-01200"], recent: Array.from({ length: 20 }, (_, i) => `sess-${String(1180 + i).padStart(5, "0")}`) },
    "embedder.json": { model: "minilm-384", dim: 384, normalized: true },
  };
  for (const [n, v] of Object.entries(docs)) fs.writeFileSync(path.join(dir, n), JSON.stringify(v, null, 2) + "\n");
  return { files: Object.keys(docs).length };
}

function treeBytes(dir) {
  let n = 0;
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) n += treeBytes(p);
    else if (e.isFile()) n += fs.statSync(p).size;
  }
  return n;
}

/**
 * Write the home at `dir` (must not exist or be empty). `scale` 1 ≈ 861 MiB; `log` gets progress lines.
 */
export async function generateHome({ dir, scale = 1, seed = 1, log = () => {} }) {
  if (!(scale > 0)) throw new Error("scale must be > 0");
  if (fs.existsSync(dir) && fs.readdirSync(dir).length) throw new Error(`${dir} exists and is not empty`);
  fs.mkdirSync(dir, { recursive: true });
  const MiB = 2 ** 20;
  const n = (x, min) => Math.max(min, Math.round(x * scale));
  log("kv: paged dump");
  const pages = n(6400, 64);
  const distinct = Math.max(3, Math.round(pages * (3841 / 6400)));
  const zeroPages = Math.max(1, Math.round(pages * (320 / 6400)));
  const kv = generatePagedKvDump({ dir: path.join(dir, "kv"), seed, pages, distinct, zeroPages, pageBytes: 65536, nLayers: 32 });
  log("db: knowledge.db, memory.db (hot WAL), episodes.db");
  const dbDir = path.join(dir, "db");
  fs.mkdirSync(dbDir);
  const sqlite = {};
  sqlite["db/knowledge.db"] = knowledgeDb(path.join(dbDir, "knowledge.db"), 213 * MiB * scale, seed);
  const mem = memoryDb(path.join(dbDir, "memory.db"), 90 * MiB * scale, seed, `${dir}.gen-wal`);
  sqlite["db/memory.db"] = mem.rows;
  sqlite["db/episodes.db"] = episodesDb(path.join(dbDir, "episodes.db"), 40 * MiB * scale, seed);
  log("memory: git memdir");
  const md = await generateMemdir({ dir: path.join(dir, "memory"), notes: n(20_000, 200), commits: n(3_000, 30), seed });
  const head = spawnSync("git", ["-C", md.dir, "rev-parse", "HEAD"], { encoding: "utf8" }).stdout.trim();
  log("traces, state");
  const tr = traces(path.join(dir, "traces"), 60 * MiB * scale, seed);
  const st = state(path.join(dir, "state"), { lastTrace: `${iso(FIXED_T0 + (tr.files - 1) * 86_400_000).slice(0, 10)}.jsonl` });
  return {
    dir, scale, seed, version: GEN_HOME_VERSION, bytes: treeBytes(dir),
    parts: {
      kv: { pages, distinct, zeroPages, pageBytes: kv.pageBytes, files: kv.files.length, expected: kv.expected },
      sqlite,
      wal: { file: "db/memory.db", ...mem.wal },
      git: { head, commits: md.commits, notes: md.notes },
      traces: tr,
      state: st,
    },
  };
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const a = process.argv.slice(2);
  const get = (k, d) => (a.includes(k) ? a[a.indexOf(k) + 1] : d);
  const out = get("--out");
  if (!out) {
    process.stderr.write("usage: gen-home.mjs --out DIR [--scale S] [--seed N]\n");
    process.exit(2);
  }
  const t0 = Date.now();
  const s = await generateHome({ dir: out, scale: Number(get("--scale", "1")), seed: Number(get("--seed", "1")), log: (m) => process.stderr.write(`gen-home: ${m}\n`) });
  process.stdout.write(JSON.stringify({ ...s, seconds: (Date.now() - t0) / 1000 }, null, 2) + "\n");
}
