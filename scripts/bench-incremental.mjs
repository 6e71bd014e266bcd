#!/usr/bin/env node
// Incremental snapshots below the file (issue 38, item 3): what an incremental snapshot stores,
// and how long it takes, after
//   - one row inserted into a SQLite database of --db-mb MiB (target: <= 1 MB stored, <= 0.5 s),
//   - --append-mb MiB appended to --jsonl-mb MiB of JSONL (target: <= 1.2 MB stored),
//   - an edit in the middle of a --blob-mb MiB binary file (content-defined chunks).
// Each scenario: a full incremental snapshot first (the base), the change, then the timed one;
// then a restore of it, checked byte for byte against the live file. Runs through the library
// (dist/, so `npm run build` first), in one process: the times leave out Node's start (~0.15 s
// for the CLI). Usage:
//   node scripts/bench-incremental.mjs [--db-mb 200] [--jsonl-mb 100] [--append-mb 1] [--blob-mb 64]
//     [--redact off|on|both] [--encrypt] [--dir DIR] [--json]
import { createHash, randomBytes } from "node:crypto";
import { appendFileSync, closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, writeFileSync, writeSync } from "node:fs";
import { createRequire } from "node:module";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { generateIdentity, parseConfig, restoreToDir, snapshot } from "../dist/index.js";

const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : def;
};
const flag = (name) => args.includes(`--${name}`);
const DB_MB = Number(opt("db-mb", "200"));
const JSONL_MB = Number(opt("jsonl-mb", "100"));
const APPEND_MB = Number(opt("append-mb", "1"));
const BLOB_MB = Number(opt("blob-mb", "64"));
const REDACT = opt("redact", "both");
const MiB = 1024 * 1024;

const Database = createRequire(import.meta.url)("better-sqlite3");
const root = opt("dir", null) ?? mkdtempSync(join(tmpdir(), "memsnap-bench-inc-"));
mkdirSync(root, { recursive: true });
const id = flag("encrypt") ? await generateIdentity() : null;
const fileSha = (p) => createHash("sha256").update(readFileSync(p)).digest("hex");
const results = [];

/** A database of about `mb` MiB: rows of text and a 1536-float embedding, in WAL mode, checkpointed. */
function makeDb(path, mb) {
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  db.exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, created TEXT, body TEXT, embedding BLOB)");
  const ins = db.prepare("INSERT INTO notes (created, body, embedding) VALUES (?, ?, ?)");
  const emb = Buffer.alloc(1536 * 4);
  const rows = Math.ceil((mb * MiB) / (emb.length + 300));
  db.exec("BEGIN");
  for (let i = 0; i < rows; i++) {
    for (let k = 0; k < emb.length; k += 32) createHash("sha256").update(`${i}:${k}`).digest().copy(emb, k);
    ins.run(new Date(1_700_000_000_000 + i * 1000).toISOString(), `note ${i}: the agent learned fact number ${i} about the project`, emb);
    if (i % 5000 === 4999) {
      db.exec("COMMIT");
      db.exec("BEGIN");
    }
  }
  db.exec("COMMIT");
  db.close(); // (a checkpoint: the WAL is empty, as on a quiet agent)
}

async function scenario(name, dir, sources, change, file, redact) {
  const config = parseConfig({ agent: "bench", sources }, null, dir);
  const store = join(dir, `store-${redact ? "r" : "n"}`);
  const opts = { config, store, incremental: true, redact, ...(id ? { recipients: [id.recipient] } : {}) };
  const base = await snapshot(opts);
  change();
  const t0 = performance.now();
  const c0 = process.cpuUsage(); // every thread of the process (workers and the thread pool included)
  const inc = await snapshot(opts);
  const ms = performance.now() - t0;
  const cu = process.cpuUsage(c0);
  const to = join(dir, `restored-${Date.now()}`);
  await restoreToDir(inc.path, to, id ? { keys: { identities: [id.identity] } } : {});
  const exact = fileSha(join(to, file.layer, file.rel)) === fileSha(join(dir, file.src));
  // a database copied to be redacted is not the file: its rows are counted instead
  let rows = null;
  if (!exact && file.live === false) {
    const count = (p) => { const d = new Database(p, { readonly: true }); try { return d.prepare("SELECT count(*) FROM notes").pluck().get(); } finally { d.close(); } };
    rows = count(join(to, file.layer, file.rel)) === count(join(dir, file.src));
  }
  rmSync(to, { recursive: true, force: true });
  const r = {
    scenario: name, redaction: redact, base_bytes: base.bundleBytes, stored_bytes: inc.bundleBytes, snapshot_s: +(ms / 1000).toFixed(3),
    snapshot_cpu_s: +((cu.user + cu.system) / 1e6).toFixed(3),
    chunked: inc.incremental?.chunked ?? 0, referenced_bytes: inc.incremental?.referencedBytes ?? 0, restored_exact: exact, ...(rows === null ? {} : { restored_rows_equal: rows }),
  };
  results.push(r);
  if (!flag("json")) {
    console.log(`${name} (redaction ${redact ? "on" : "off"}): base ${(base.bundleBytes / MiB).toFixed(1)} MiB; incremental stored ` +
      `${(inc.bundleBytes / 1e6).toFixed(3)} MB in ${r.snapshot_s} s, ${r.snapshot_cpu_s} CPU-s (${r.chunked} chunked, ${(r.referenced_bytes / MiB).toFixed(1)} MiB referenced); ` +
      `restore ${r.restored_exact ? "byte-exact" : r.restored_rows_equal ? "a redacted copy, same row count" : "DIFFERS"}`);
  }
}

const modes = REDACT === "both" ? [false, true] : [REDACT === "on"];
for (const redact of modes) {
  // SQLite: one row inserted.
  {
    const dir = mkdtempSync(join(root, "db-"));
    mkdirSync(join(dir, "db"));
    const db = join(dir, "db", "memory.db");
    makeDb(db, DB_MB);
    // With redaction the database is read live when the scan finds nothing (restored byte-exact);
    // else copied (VACUUM INTO) and its text redacted, and the copy is not the file.
    await scenario(`one row inserted into a ${(statSync(db).size / MiB).toFixed(0)} MiB SQLite database`, dir,
      [{ kind: "sqlite", name: "db", path: "db" }], () => {
        const c = new Database(db);
        c.prepare("INSERT INTO notes (created, body, embedding) VALUES (?, ?, ?)").run(new Date().toISOString(), "one more note", Buffer.alloc(6144, 1));
        c.close();
      }, { layer: "db", rel: "memory.db", src: "db/memory.db", live: !redact }, redact);
    rmSync(dir, { recursive: true, force: true });
  }
  // JSONL: appended to.
  {
    const dir = mkdtempSync(join(root, "jsonl-"));
    mkdirSync(join(dir, "traces"));
    const f = join(dir, "traces", "session.jsonl");
    const line = (i) => `${JSON.stringify({ i, ts: 1_700_000_000 + i, role: i % 2 ? "user" : "assistant", content: `turn ${i}: ${"the quick brown fox ".repeat(10)}` })}\n`;
    const write = (mb, from) => {
      const parts = [];
      let n = 0;
      let i = from;
      while (n < mb * MiB) {
        const l = line(i++);
        parts.push(l);
        n += l.length;
      }
      return { text: parts.join(""), next: i };
    };
    const first = write(JSONL_MB, 0);
    writeFileSync(f, first.text);
    await scenario(`${APPEND_MB} MiB appended to ${JSONL_MB} MiB of JSONL`, dir, [{ kind: "files", name: "traces", path: "traces" }],
      () => appendFileSync(f, write(APPEND_MB, first.next).text), { layer: "traces", rel: "session.jsonl", src: "traces/session.jsonl" }, redact);
    rmSync(dir, { recursive: true, force: true });
  }
  // A big binary file edited in the middle.
  if (BLOB_MB > 0) {
    const dir = mkdtempSync(join(root, "blob-"));
    mkdirSync(join(dir, "blobs"));
    const f = join(dir, "blobs", "state.bin");
    const fd = openSync(f, "w");
    for (let i = 0; i < BLOB_MB; i++) writeSync(fd, randomBytes(MiB));
    closeSync(fd);
    await scenario(`4 KiB rewritten in the middle of a ${BLOB_MB} MiB file`, dir, [{ kind: "files", name: "blobs", path: "blobs" }], () => {
      const w = openSync(f, "r+");
      writeSync(w, randomBytes(4096), 0, 4096, Math.floor(BLOB_MB / 2) * MiB + 123);
      closeSync(w);
    }, { layer: "blobs", rel: "state.bin", src: "blobs/state.bin" }, redact);
    rmSync(dir, { recursive: true, force: true });
  }
}
if (!opt("dir", null)) rmSync(root, { recursive: true, force: true });
const cpu = cpus()[0]?.model ?? "unknown";
const sha = /\bsha_ni\b/.test((() => { try { return readFileSync("/proc/cpuinfo", "utf8"); } catch { return ""; } })());
if (flag("json")) console.log(JSON.stringify({ cpu, sha_extensions: sha, encrypted: !!id, results }, null, 1));
else console.log(`CPU: ${cpu} (${cpus().length} cores; SHA extensions: ${sha ? "yes" : "no"}); ${id ? "encrypted to an age recipient" : "plaintext"}`);
