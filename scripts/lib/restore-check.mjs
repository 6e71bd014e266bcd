/**
 * restore-check.mjs — compares a `memsnap restore --to OUT` of the benchmark mix with the mix,
 * layer by layer (scripts/lib/mix-sources.mjs MIX_LAYERS says where each layer lands):
 *
 *   bytes   every file of the layer's mix directory is in OUT/<restored> with identical bytes,
 *           and OUT/<restored> holds no other file (files, state, kv, pfimg, criu layers)
 *   git     `git rev-parse HEAD` is the same; every work-tree file (committed, modified and
 *           untracked; .git/ left out) has identical bytes and there is no other; and
 *           `git status --porcelain` lists the same changes (memory layer)
 *   sqlite  for every database: `PRAGMA integrity_check` says ok, the journal mode (WAL or
 *           rollback, from the header) is the same, every table has the same row count, and the
 *           SHA-256 of `sqlite3 DB .dump` is the same (db layer; memsnap stores the file itself
 *           when it can read it live, else a VACUUM INTO copy whose bytes differ by design)
 *
 * The mix side of the sqlite facts is cached (keyed by the file's SHA-256) so a reused mix is
 * dumped once. Node built-ins plus the git and sqlite3 CLIs.
 */
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { compareTree, listFiles } from "./measure.mjs";

/** A manifest (as hashTree writes) of the files under `prefix/`, re-rooted there; `skip(rel)` leaves files out. */
function subManifest(manifest, prefix, skip = () => false) {
  const files = {};
  for (const [f, e] of Object.entries(manifest.files)) {
    if (!f.startsWith(`${prefix}/`)) continue;
    const rel = f.slice(prefix.length + 1);
    if (!skip(rel)) files[rel] = e;
  }
  return { files, count: Object.keys(files).length };
}

/** compareTree, but extra files fail too; `skip` leaves paths out on both sides. */
function compareExact(manifest, dir, skip = () => false) {
  if (!fs.existsSync(dir)) return { ok: false, missing: Object.keys(manifest.files), mismatched: [], extra: [], absent: true };
  const c = compareTree(manifest, dir);
  const extra = c.extra.filter((f) => !skip(f));
  return { ...c, extra, ok: c.ok && extra.length === 0 };
}

function treeText(c, n) {
  if (c.absent) return "directory missing";
  if (c.ok) return `${n} file(s) identical`;
  const eg = [...c.missing, ...c.mismatched, ...c.extra].slice(0, 3).join(", ");
  return `${c.missing.length} missing, ${c.mismatched.length} different, ${c.extra.length} extra (e.g. ${eg})`;
}

// ------------------------------------------------------------------------------ git

function gitEnv() {
  // No system or global config (a user's excludesFile or status settings would change what status shows).
  const env = { ...process.env, GIT_CONFIG_NOSYSTEM: "1", GIT_CONFIG_GLOBAL: "/dev/null", GIT_OPTIONAL_LOCKS: "0", GIT_TERMINAL_PROMPT: "0", LC_ALL: "C" };
  for (const k of ["GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_CEILING_DIRECTORIES"]) delete env[k];
  return env;
}

function git(repo, args) {
  const r = spawnSync("git", ["-C", repo, ...args], { encoding: "utf8", env: gitEnv(), maxBuffer: 256 * 1024 * 1024 });
  if (r.error || r.status !== 0) return { ok: false, out: "", err: (r.error?.message ?? r.stderr ?? "").trim().slice(0, 500) };
  return { ok: true, out: r.stdout };
}

function checkGit(manifest, layer, src, out) {
  const skip = (rel) => rel === ".git" || rel.startsWith(".git/");
  const sub = subManifest(manifest, layer.dir, skip);
  const tree = compareExact(sub, out, skip);
  const h1 = git(src, ["rev-parse", "HEAD"]);
  const h2 = git(out, ["rev-parse", "HEAD"]);
  const status = ["status", "--porcelain=v1", "--untracked-files=all", "--no-renames"];
  const s1 = git(src, status);
  const s2 = git(out, status);
  const head = h1.ok && h2.ok && h1.out.trim() === h2.out.trim();
  const statusSame = s1.ok && s2.ok && s1.out === s2.out;
  const lines = s1.ok ? s1.out.split("\n").filter(Boolean) : [];
  const modified = lines.filter((l) => !l.startsWith("??")).length;
  const untracked = lines.filter((l) => l.startsWith("??")).length;
  const parts = [];
  parts.push(head ? `HEAD ${h1.out.trim().slice(0, 12)} same` : `HEAD ${h1.ok ? h1.out.trim().slice(0, 12) : `? (${h1.err})`} vs ${h2.ok ? h2.out.trim().slice(0, 12) : `? (${h2.err})`}`);
  parts.push(`work tree ${treeText(tree, sub.count)}`);
  parts.push(statusSame ? `status same (${modified} changed, ${untracked} untracked)` : `status differs (${s1.ok ? lines.length : "?"} vs ${s2.ok ? s2.out.split("\n").filter(Boolean).length : "?"} lines)`);
  return {
    ok: head && tree.ok && statusSame,
    text: parts.join("; "),
    details: { head: h1.out?.trim() || null, restoredHead: h2.out?.trim() || null, modified, untracked, missing: tree.missing.slice(0, 20), mismatched: tree.mismatched.slice(0, 20), extra: tree.extra.slice(0, 20) },
  };
}

// ------------------------------------------------------------------------------ sqlite

function sqlite(db, sql) {
  const r = spawnSync("sqlite3", ["-batch", "-init", "/dev/null", db, sql], { encoding: "utf8", maxBuffer: 64 * 1024 * 1024 });
  if (r.error) throw new Error(`cannot run sqlite3: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`sqlite3 ${db}: ${(r.stderr || "").trim().slice(0, 500)}`);
  return r.stdout;
}

/** SHA-256 of `sqlite3 DB .dump`, streamed. */
function dumpSha(db) {
  return new Promise((resolve, reject) => {
    const h = createHash("sha256");
    let bytes = 0;
    let err = "";
    const child = spawn("sqlite3", ["-batch", "-init", "/dev/null", db, ".dump"], { stdio: ["ignore", "pipe", "pipe"] });
    child.stdout.on("data", (d) => {
      h.update(d);
      bytes += d.length;
    });
    child.stderr.on("data", (d) => (err += d));
    child.on("error", (e) => reject(new Error(`cannot run sqlite3: ${e.message}`)));
    child.on("close", (code) => (code === 0 ? resolve({ sha256: h.digest("hex"), bytes }) : reject(new Error(`sqlite3 ${db} .dump exited ${code}: ${err.trim().slice(0, 500)}`))));
  });
}

/** "wal" or "rollback", from the database header (bytes 18/19 are 2 in WAL mode). */
function journalOf(file) {
  const fd = fs.openSync(file, "r");
  try {
    const b = Buffer.alloc(20);
    fs.readSync(fd, b, 0, 20, 0);
    return b[18] === 2 && b[19] === 2 ? "wal" : "rollback";
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Facts of one database: integrity, journal mode, row counts, .dump hash. `readOnly` opens it
 * with immutable=1 (no -wal/-shm files are created next to the mix's databases) when it has no
 * WAL file to fold in.
 */
async function dbFacts(file, { readOnly }) {
  const abs = path.resolve(file);
  const name = readOnly && !fs.existsSync(`${abs}-wal`) ? `file:${abs.split("/").map(encodeURIComponent).join("/")}?immutable=1` : abs;
  const integrity = sqlite(name, "PRAGMA integrity_check;").trim();
  const tables = sqlite(name, "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name;")
    .split("\n").filter(Boolean);
  const counts = {};
  if (tables.length) {
    const q = tables.map((t) => `SELECT '${t.replace(/'/g, "''")}', count(*) FROM "${t.replace(/"/g, '""')}"`).join(" UNION ALL ") + ";";
    for (const line of sqlite(name, q).split("\n").filter(Boolean)) {
      const i = line.lastIndexOf("|");
      counts[line.slice(0, i)] = Number(line.slice(i + 1));
    }
  }
  const dump = await dumpSha(name);
  return { integrity, journal: journalOf(abs), counts, dumpSha256: dump.sha256, dumpBytes: dump.bytes };
}

async function checkSqlite(manifest, layer, src, out, cache) {
  const sub = subManifest(manifest, layer.dir);
  const dbs = Object.keys(sub.files).filter((f) => /\.(db|sqlite3?)$/i.test(f)).sort();
  const per = [];
  let ok = dbs.length > 0;
  for (const rel of dbs) {
    const key = `${layer.dir}/${rel}:${sub.files[rel].sha256}`;
    let a = cache?.get(key);
    if (!a) {
      a = await dbFacts(path.join(src, rel), { readOnly: true });
      cache?.set(key, a);
    }
    const restored = path.join(out, rel);
    if (!fs.existsSync(restored)) {
      ok = false;
      per.push({ db: rel, ok: false, text: `${rel} missing` });
      continue;
    }
    let b;
    try {
      b = await dbFacts(restored, { readOnly: false });
    } catch (e) {
      ok = false;
      per.push({ db: rel, ok: false, text: `${rel}: ${e.message}` });
      continue;
    }
    const why = [];
    if (b.integrity !== "ok") why.push(`integrity_check: ${b.integrity.split("\n")[0]}`);
    if (b.journal !== a.journal) why.push(`journal mode ${b.journal}, was ${a.journal}`);
    const tables = new Set([...Object.keys(a.counts), ...Object.keys(b.counts)]);
    const diff = [...tables].filter((t) => a.counts[t] !== b.counts[t]);
    if (diff.length) why.push(`row counts differ in ${diff.slice(0, 3).map((t) => `${t} (${a.counts[t] ?? "—"} → ${b.counts[t] ?? "—"})`).join(", ")}`);
    if (b.dumpSha256 !== a.dumpSha256) why.push(".dump differs");
    const rows = Object.values(b.counts).reduce((n, c) => n + c, 0);
    per.push({ db: rel, ok: why.length === 0, journal: b.journal, rows, tables: Object.keys(b.counts).length, text: why.length ? `${rel}: ${why.join(", ")}` : `${rel} ok (${b.journal}, ${rows} rows)` });
    if (why.length) ok = false;
  }
  // No extra databases in the restored layer either.
  const extra = fs.existsSync(out) ? listFiles(out).filter((f) => /\.(db|sqlite3?)$/i.test(f) && !dbs.includes(f)) : [];
  if (extra.length) ok = false;
  const okCount = per.filter((p) => p.ok).length;
  return {
    ok,
    text: ok
      ? `${dbs.length} database(s): integrity_check ok, same journal mode, row counts and .dump (${per.map((p) => `${p.db} ${p.journal} ${p.rows} rows`).join(", ")})`
      : `${okCount}/${dbs.length} database(s) match: ${per.filter((p) => !p.ok).map((p) => p.text).join("; ")}${extra.length ? `; extra: ${extra.join(", ")}` : ""}`,
    details: { databases: per },
  };
}

// ------------------------------------------------------------------------------ driver

/** A Map-like cache of the mix's sqlite facts, persisted as JSON at `file`. */
export function factsCache(file) {
  let data = {};
  try {
    data = JSON.parse(fs.readFileSync(file, "utf8"));
  } catch {
    /* none yet */
  }
  return {
    get: (k) => data[k],
    set: (k, v) => {
      data[k] = v;
      fs.writeFileSync(file, JSON.stringify(data, null, 1) + "\n");
    },
  };
}

/**
 * Checks every layer of a `memsnap restore --to OUT` against the mix.
 * @param {{manifest: object, mixDir: string, outDir: string, layers: readonly object[], cache?: object}} o
 * @returns {Promise<{ok: boolean, text: string, layers: object[]}>}
 */
export async function checkRestoredLayers({ manifest, mixDir, outDir, layers, cache }) {
  const results = [];
  for (const layer of layers) {
    const src = path.join(mixDir, layer.dir);
    const out = path.join(outDir, layer.restored ?? layer.name);
    let r;
    try {
      if (layer.check === "git") r = checkGit(manifest, layer, src, out);
      else if (layer.check === "sqlite") r = await checkSqlite(manifest, layer, src, out, cache);
      else {
        const sub = subManifest(manifest, layer.dir);
        const c = compareExact(sub, out);
        r = { ok: c.ok, text: treeText(c, sub.count), details: c.ok ? undefined : { missing: c.missing.slice(0, 20), mismatched: c.mismatched.slice(0, 20), extra: c.extra.slice(0, 20) } };
      }
    } catch (e) {
      r = { ok: false, text: `check failed: ${e.message}` };
    }
    results.push({ name: layer.name, kind: layer.kind, check: layer.check, source: layer.dir, restored: layer.restored ?? layer.name, ...r });
  }
  // Anything restored outside the layers' directories (besides .memsnap/)?
  const known = new Set(layers.map((l) => (l.restored ?? l.name).split("/")[0]));
  known.add(".memsnap");
  const strays = fs.existsSync(outDir) ? fs.readdirSync(outDir).filter((n) => !known.has(n)) : [];
  const ok = results.every((r) => r.ok) && strays.length === 0;
  const bad = results.filter((r) => !r.ok).map((r) => r.name);
  return {
    ok,
    text: ok
      ? `ok (${results.length} layers: ${results.map((r) => r.name).join(", ")})`
      : `MISMATCH in ${[...bad, ...strays.map((s) => `unexpected ${s}/`)].join(", ")}`,
    layers: results,
    strays,
  };
}
