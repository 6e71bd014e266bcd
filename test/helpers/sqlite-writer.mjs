#!/usr/bin/env node
/**
 * A writer process for the sqlite source tests (node + better-sqlite3).
 *
 *   node sqlite-writer.mjs DB [--interval MIN,MAX] [--commits N] [--no-checkpoint]
 *                             [--journal wal|delete] [--lock exclusive|wal-exclusive] [--payload BYTES]
 *
 * Default: WAL mode; commits a two-row transaction (both rows share one `pair_id`) every
 * MIN–MAX ms (10–20) until SIGTERM, then prints one JSON line
 * `{"commits": n, "times": [ms since epoch of each commit], "pairs": [first, last]}` and exits.
 * `--commits N`: commit N pairs right away, print `{"ready":true,...}`, and hold the connection
 * open (no close, so no final checkpoint) until SIGTERM. `--no-checkpoint` sets
 * `wal_autocheckpoint=0`, so committed pages stay in the -wal file.
 * `--lock exclusive`: `BEGIN EXCLUSIVE` (rollback-journal database) and hold it;
 * `--lock wal-exclusive`: `PRAGMA locking_mode=EXCLUSIVE` on a WAL database plus a write, and hold.
 * Prints `ready` (or the ready JSON) once it is in the requested state.
 */
import { createRequire } from "node:module";

const Database = createRequire(import.meta.url)("better-sqlite3");

const args = process.argv.slice(2);
const dbPath = args.shift();
if (!dbPath) {
  process.stderr.write("usage: sqlite-writer.mjs DB [options]\n");
  process.exit(2);
}
const opt = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? (args[i + 1] ?? "") : undefined;
};
const flag = (name) => args.includes(name);
const [minMs, maxMs] = (opt("--interval") ?? "10,20").split(",").map(Number);
const commitsN = opt("--commits") === undefined ? null : Number(opt("--commits"));
const journal = opt("--journal") ?? "wal";
const lock = opt("--lock");
const payloadBytes = Number(opt("--payload") ?? "64");

const db = new Database(dbPath, { timeout: 10_000 });
db.pragma(`journal_mode = ${journal === "wal" ? "WAL" : "DELETE"}`);
if (flag("--no-checkpoint")) db.pragma("wal_autocheckpoint = 0");
db.exec(`CREATE TABLE IF NOT EXISTS pairs (
  id INTEGER PRIMARY KEY, pair_id INTEGER NOT NULL, side INTEGER NOT NULL, payload TEXT NOT NULL)`);

const out = (obj) => process.stdout.write(`${typeof obj === "string" ? obj : JSON.stringify(obj)}\n`);
const hold = () => setInterval(() => undefined, 1 << 30);

if (lock === "exclusive") {
  db.exec("BEGIN EXCLUSIVE");
  db.prepare("INSERT INTO pairs (pair_id, side, payload) VALUES (-1, 0, 'lock')").run();
  out("ready");
  hold();
  process.on("SIGTERM", () => process.exit(0));
} else if (lock === "wal-exclusive") {
  db.pragma("locking_mode = EXCLUSIVE");
  db.prepare("INSERT INTO pairs (pair_id, side, payload) VALUES (-1, 0, 'lock')").run();
  out("ready");
  hold();
  process.on("SIGTERM", () => process.exit(0));
} else {
  let pair = db.prepare("SELECT coalesce(max(pair_id), 0) + 1 FROM pairs").pluck().get();
  const firstPair = pair;
  const ins = db.prepare("INSERT INTO pairs (pair_id, side, payload) VALUES (?, ?, ?)");
  const body = "w".repeat(payloadBytes);
  const commitPair = db.transaction((p) => {
    ins.run(p, 0, body);
    ins.run(p, 1, body);
  });
  const times = [];
  const commit = () => {
    commitPair.immediate(pair++);
    times.push(Date.now());
  };
  const report = () => out({ commits: times.length, times, pairs: [firstPair, pair - 1] });
  if (commitsN !== null) {
    for (let i = 0; i < commitsN; i++) commit();
    out({ ready: true, commits: times.length, pairs: [firstPair, pair - 1] });
    hold();
    process.on("SIGTERM", () => process.exit(0)); // no close: keep the -wal as it is
  } else {
    let stopping = false;
    let timer = null;
    const loop = () => {
      if (stopping) return;
      commit();
      if (times.length === 1) out("ready");
      timer = setTimeout(loop, minMs + Math.random() * (maxMs - minMs));
    };
    loop();
    process.on("SIGTERM", () => {
      stopping = true;
      if (timer) clearTimeout(timer);
      report();
      db.close();
      process.exit(0);
    });
  }
}
