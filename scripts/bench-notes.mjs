#!/usr/bin/env node
/**
 * memsnap against `tar | zstd | age` on a memory of many small notes (the case the scale-1/10
 * mix does not cover: it has ~3,000 files). Usage:
 *
 *   npm run build && node scripts/bench-notes.mjs [--notes 20000] [--runs 3] [--workdir DIR]
 *
 * Writes NOTES notes of 20-60 bytes into 100-note folders (seeded, so runs compare), then times,
 * alternating memsnap and the pipeline, medians of RUNS:
 *   snapshot  memsnap snapshot (redaction on, encrypted)  vs  tar -cf - | zstd -3 -T2 | age -r
 *   restore   memsnap restore --to (hashes checked, synced) vs  age -d | zstd -d | tar -x, then sync -f
 *   in place  memsnap restore over the live notes (journal, atomic swaps, no safety snapshot)
 *             vs  the same pipeline extracting over them (tar overwrites each file), then sync -f
 * and peak RSS (GNU time). Restored trees are moved aside, not deleted, until the end: deleting a
 * tree of thousands of files slows the next one's creation on ext4 (see scripts/bench.mjs).
 * Prints a Markdown table. Exit 1 when a command fails or a restore differs from the notes.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : dflt;
};
const NOTES = Number(opt("--notes", "20000"));
const RUNS = Number(opt("--runs", "3"));
const root = path.resolve(opt("--workdir", path.join(os.tmpdir(), `memsnap-bench-notes-${NOTES}`)));
const cli = path.resolve(new URL("../bin/memsnap.js", import.meta.url).pathname);
if (!(NOTES > 0) || !(RUNS > 0)) throw new Error("--notes and --runs take positive numbers");

// The notes: deterministic text, so every run and every machine snapshots the same bytes.
const notes = path.join(root, "agent", "notes");
const done = path.join(root, `.notes-${NOTES}.done`);
if (!fs.existsSync(done)) {
  fs.rmSync(path.join(root, "agent"), { recursive: true, force: true });
  let x = 12345;
  const rnd = () => (x = (x * 1103515245 + 12345) >>> 0);
  for (let i = 0; i < NOTES; i++) {
    const dir = path.join(notes, `d${String(Math.floor(i / 100)).padStart(4, "0")}`);
    if (i % 100 === 0) fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, `note-${i}.md`), `note ${i}: ${"word ".repeat(4 + (rnd() % 9))}\n`);
  }
  fs.writeFileSync(path.join(root, "agent", "memsnap.json"), JSON.stringify({ agent: "notes", sources: [{ kind: "files", name: "notes", path: "notes" }] }));
  fs.writeFileSync(done, "");
}
const key = path.join(root, "key.txt");
if (!fs.existsSync(key)) execFileSync(process.execPath, [cli, "keygen", "-o", key], { stdio: "ignore" });
const recipient = fs.readFileSync(key, "utf8").match(/public key: (age1\S+)/)[1];
const aside = path.join(root, "aside");
fs.mkdirSync(aside, { recursive: true });

/** Run a shell command under GNU time: [seconds, peak RSS KiB]. */
function timed(cmd) {
  const r = spawnSync("/usr/bin/time", ["-f", "%e %M", "bash", "-c", cmd], { encoding: "utf8" });
  if (r.status !== 0) {
    process.stderr.write(r.stderr);
    throw new Error(`failed: ${cmd}`);
  }
  const [s, kb] = r.stderr.trim().split("\n").pop().split(" ").map(Number);
  return [s, kb];
}
let n = 0;
const moveAside = (p) => {
  if (fs.existsSync(p)) fs.renameSync(p, path.join(aside, `${n++}`));
};
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const bundle = path.join(root, "b.memsnap");
const archive = path.join(root, "b.tar.zst.age");
const res = { snap: { m: [], p: [], mr: [], pr: [] }, rest: { m: [], p: [], mr: [], pr: [] }, inplace: { m: [], p: [], mr: [], pr: [] } };
const config = path.join(root, "agent", "memsnap.json");
for (let r = 0; r < RUNS; r++) {
  fs.rmSync(bundle, { force: true });
  fs.rmSync(archive, { force: true });
  let [s, kb] = timed(`bash ${cli} snapshot -c ${path.join(root, "agent", "memsnap.json")} --out ${bundle} -r ${recipient} > /dev/null`);
  res.snap.m.push(s); res.snap.mr.push(kb);
  [s, kb] = timed(`tar -cf - -C ${path.join(root, "agent")} notes | zstd -3 -T2 -q | age -r ${recipient} > ${archive}`);
  res.snap.p.push(s); res.snap.pr.push(kb);
  const to = path.join(root, "r-memsnap");
  const toP = path.join(root, "r-pipeline");
  moveAside(to);
  moveAside(toP);
  [s, kb] = timed(`bash ${cli} restore ${bundle} --to ${to} -i ${key} > /dev/null`);
  res.rest.m.push(s); res.rest.mr.push(kb);
  fs.mkdirSync(toP);
  [s, kb] = timed(`age -d -i ${key} ${archive} | zstd -d -q | tar -xf - -C ${toP} && sync -f ${toP}`);
  res.rest.p.push(s); res.rest.pr.push(kb);
}
// In place last: both sides delete thousands of files (memsnap its backups, tar each file it
// replaces), which slows the file creation of whatever runs next on ext4.
for (let r = 0; r < RUNS; r++) {
  let [s, kb] = timed(`bash ${cli} restore ${bundle} -c ${config} -i ${key} --no-safety-snapshot > /dev/null`);
  res.inplace.m.push(s); res.inplace.mr.push(kb);
  [s, kb] = timed(`age -d -i ${key} ${archive} | zstd -d -q | tar -xf - -C ${path.join(root, "agent")} && sync -f ${notes}`);
  res.inplace.p.push(s); res.inplace.pr.push(kb);
}

// The restores hold the notes, byte for byte.
const digest = (dir) => {
  const h = createHash("sha256");
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else h.update(`${path.relative(d, p)}\0`).update(fs.readFileSync(p));
    }
  };
  walk(dir);
  return h.digest("hex");
};
const want = digest(notes);
const bad = [["memsnap", path.join(root, "r-memsnap", "notes")], ["pipeline", path.join(root, "r-pipeline", "notes")]].filter(([, d]) => digest(d) !== want);
// (the in-place restores put back the very notes they started from: `want` is their digest too)

const row = (what, x) => `| ${what} | ${median(x.m).toFixed(2)} s | ${median(x.p).toFixed(2)} s | ${(median(x.m) / median(x.p)).toFixed(2)}× | ${(median(x.mr) / 1024).toFixed(0)} MiB | ${(median(x.pr) / 1024).toFixed(0)} MiB |`;
console.log(`memsnap bench-notes: ${NOTES} notes in ${Math.ceil(NOTES / 100)} folders, ${RUNS} run(s) each, medians (${os.cpus().length} CPUs)\n`);
console.log("| | memsnap | pipeline | ratio | memsnap RSS | pipeline RSS |");
console.log("| --- | --- | --- | --- | --- | --- |");
console.log(row("snapshot (redaction on, age)", res.snap));
console.log(row("restore (synced)", res.rest));
console.log(row("restore in place (synced)", res.inplace));
console.log(`\nbundle ${fs.statSync(bundle).size} B, pipeline ${fs.statSync(archive).size} B`);
fs.rmSync(aside, { recursive: true, force: true });
if (bad.length) {
  console.error(`restore differs from the notes: ${bad.map(([w]) => w).join(", ")}`);
  process.exit(1);
}
