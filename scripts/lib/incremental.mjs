// The incremental scenario of the benchmark (issue: "a second snapshot right after the first,
// with 3 % of pages changed and a few memory files edited, costs <= 0.3x the first"):
// changes made to the live mix after a first `snapshot --incremental`, and undone after the
// second, byte for byte, so the runs after it see the mix the generator left.
import { randomBytes, createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { spawnSync } from "node:child_process";

/**
 * Overwrite 256 bytes inside `share` of the KV dump's non-zero pages (spread evenly, the same
 * ones every run), and append a line to `notes` tracked memory notes. With `sqlite`, also update
 * that share of the rows of the mix's WAL database (`db/memory.db`) through the sqlite3 CLI.
 * Returns a function that puts every byte back (the database files from a copy).
 */
export function changeMix(mixDir, opts) {
  const undo = [];
  try {
    return change(mixDir, opts, undo);
  } catch (e) {
    for (const u of undo.reverse()) u();
    throw e;
  }
}

function change(mixDir, { share = 0.03, notes = 5, sqlite = false, tmpDir }, undo) {
  // KV pages: the dump's manifest lists every page with its file and offset.
  const kvDir = path.join(mixDir, "kv");
  const manPath = path.join(kvDir, "kv-manifest.json");
  const manBytes = fs.readFileSync(manPath);
  const man = JSON.parse(manBytes.toString("utf8"));
  undo.push(() => fs.writeFileSync(manPath, manBytes));
  const pages = man.pages.filter((p) => !p.zero);
  const every = Math.max(1, Math.round(1 / share));
  let changedPages = 0;
  const fds = new Map();
  try {
    for (let i = 0; i < pages.length; i += every) {
      const p = pages[i];
      const file = path.join(kvDir, p.file);
      let fd = fds.get(file);
      if (fd === undefined) fds.set(file, (fd = fs.openSync(file, "r+")));
      const at = p.offset + 1024;
      const old = Buffer.alloc(256);
      fs.readSync(fd, old, 0, 256, at);
      undo.push(() => {
        const u = fs.openSync(file, "r+");
        try { fs.writeSync(u, old, 0, 256, at); } finally { fs.closeSync(u); }
      });
      fs.writeSync(fd, randomBytes(256), 0, 256, at);
      // The dump's manifest declares each page's SHA-256 (memsnap checks it): the writer of a
      // real dump records the new one.
      if (p.sha256) {
        const page = Buffer.alloc(man.page.bytes);
        fs.readSync(fd, page, 0, page.length, p.offset);
        p.sha256 = createHash("sha256").update(page).digest("hex");
      }
      changedPages++;
    }
  } finally {
    for (const fd of fds.values()) fs.closeSync(fd);
  }
  fs.writeFileSync(manPath, JSON.stringify(man));
  // Memory notes: the first `notes` tracked markdown files, by name.
  const memDir = path.join(mixDir, "memory");
  const tracked = spawnSync("git", ["-C", memDir, "ls-files", "*.md"], { encoding: "utf8" }).stdout.split("\n").filter(Boolean).sort().slice(0, notes);
  for (const rel of tracked) {
    const f = path.join(memDir, rel);
    const old = fs.readFileSync(f);
    fs.appendFileSync(f, `\n- edited between two incremental snapshots (${createHash("sha256").update(rel).digest("hex").slice(0, 8)})\n`);
    undo.push(() => fs.writeFileSync(f, old));
  }
  let rows = 0;
  if (sqlite) {
    const db = path.join(mixDir, "db", "memory.db");
    const saved = [];
    for (const ext of ["", "-wal", "-shm"]) {
      if (!fs.existsSync(db + ext)) continue;
      const copy = path.join(tmpDir, `memory.db${ext}.inc-${process.pid}`);
      fs.copyFileSync(db + ext, copy);
      saved.push([db + ext, copy]);
    }
    undo.push(() => {
      for (const ext of ["-wal", "-shm"]) fs.rmSync(db + ext, { force: true });
      for (const [to, copy] of saved) fs.renameSync(copy, to);
    });
    const tables = spawnSync("sqlite3", [db, "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name"], { encoding: "utf8" }).stdout.split("\n").filter(Boolean);
    for (const t of tables) {
      const col = spawnSync("sqlite3", [db, `SELECT name FROM pragma_table_info('${t}') LIMIT 1`], { encoding: "utf8" }).stdout.trim();
      if (!col) continue;
      // Rewrites every chosen row (SQLite writes an updated cell whatever its value), so its page changes.
      const r = spawnSync("sqlite3", [db, `UPDATE "${t}" SET "${col}" = "${col}" WHERE rowid % ${every} = 0; SELECT changes();`], { encoding: "utf8" });
      if (r.status !== 0 && /no such column: rowid/.test(r.stderr)) continue; // a WITHOUT ROWID table
      if (r.status !== 0) throw new Error(`sqlite3 ${db}: ${r.stderr}`);
      rows += Number(r.stdout.trim().split("\n").pop() || 0);
    }
  }
  return {
    pages: changedPages,
    pagesTotal: pages.length,
    notes: tracked.length,
    rows,
    undo: () => { for (const u of undo.reverse()) u(); },
  };
}
