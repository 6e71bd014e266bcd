/**
 * gen-memdir.mjs — a deterministic git memory directory like an agent's (issue 38: ~20k notes,
 * ~3k commits), for the benchmark and tests. Plain ESM, Node built-ins and the git binary.
 *
 *   generateMemdir(opts)   `git init` + one `git fast-import` run: a first commit of `notes`
 *                          Markdown notes (~`noteBytes` of word text each, 100 per directory),
 *                          then `commits - 1` commits each revising `perCommit` notes (a note's
 *                          "latest" paragraph is rewritten, as an agent updates a memory); then
 *                          the work tree is checked out. Returns what it wrote. With `loose`,
 *                          every object is loose (commits made one by one, never packed).
 *   commitOne(dir, n)      one more commit revising one note (the incremental case).
 *
 * The same options give the same objects (fixed identity and dates). The fast-import stream is
 * written with backpressure; no history is held in memory.
 */
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { mulberry32 as rng } from "./prng.mjs";

export const GEN_MEMDIR_VERSION = 1;

const ENV = {
  ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("GIT_"))),
  GIT_CONFIG_NOSYSTEM: "1", GIT_CONFIG_GLOBAL: "/dev/null",
  GIT_AUTHOR_NAME: "Agent", GIT_AUTHOR_EMAIL: "agent@example.com",
  GIT_COMMITTER_NAME: "Agent", GIT_COMMITTER_EMAIL: "agent@example.com",
};

function git(dir, args, env = {}) {
  const r = spawnSync("git", ["-c", "init.defaultBranch=main", "-c", "core.hooksPath=/dev/null", ...args],
    { cwd: dir, env: { ...ENV, ...env }, maxBuffer: 1 << 28 });
  if (r.status !== 0) throw new Error(`git ${args.join(" ")} failed: ${r.stderr}`);
  return r.stdout.toString("utf8").trim();
}


const SYL = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "de", "gu", "ho", "ji", "be", "fo", "an", "el", "or", "is"];
/** A vocabulary of 2,000 made-up words (text that compresses like prose, not like repeats). */
const WORDS = (() => {
  const r = rng(12345);
  return Array.from({ length: 2000 }, () => {
    let w = "";
    for (let k = 1 + Math.floor(r() * 3); k >= 0; k--) w += SYL[Math.floor(r() * SYL.length)];
    return w;
  });
})();

function words(r, bytes) {
  let s = "";
  let line = 0;
  while (s.length < bytes) {
    const w = WORDS[Math.floor(r() * WORDS.length)];
    s += w;
    line += w.length + 1;
    if (line > 72) {
      s += "\n";
      line = 0;
    } else s += " ";
  }
  return `${s.trimEnd()}\n`;
}

export const notePath = (i) => `notes/d${String(Math.floor(i / 100)).padStart(4, "0")}/n${String(i).padStart(6, "0")}.md`;

/** Note `i` at revision `rev`: a fixed body plus a "latest" paragraph that each revision rewrites. */
export function noteText(seed, i, rev, noteBytes = 1200) {
  const body = words(rng(seed * 1_000_003 + i), Math.max(64, noteBytes - 200));
  const latest = words(rng(seed * 7_919 + i * 104_729 + rev), 160);
  return `# note ${i}\n\n${body}\n## latest (revision ${rev})\n\n${latest}`;
}

/**
 * Write a memdir at `dir` (created; must not hold a repository). Returns
 * `{ dir, notes, commits, bytes }` (bytes: the checked-out notes' total size).
 */
export async function generateMemdir({
  dir, notes = 20_000, commits = 3_000, perCommit = 5, seed = 1, noteBytes = 1200, loose = false,
}) {
  fs.mkdirSync(dir, { recursive: true });
  git(dir, ["init", "-q"]);
  const child = spawn("git", ["-c", "core.hooksPath=/dev/null", "fast-import", "--quiet"], { cwd: dir, env: ENV, stdio: ["pipe", "ignore", "pipe"] });
  let err = "";
  child.stderr.on("data", (b) => { err += b; });
  const done = new Promise((res, rej) => child.on("close", (code) => (code === 0 ? res() : rej(new Error(`git fast-import failed: ${err}`)))));
  const write = async (s) => {
    if (!child.stdin.write(s)) await new Promise((res) => child.stdin.once("drain", res));
  };
  const data = (s) => `data ${Buffer.byteLength(s)}\n${s}\n`;
  const t0 = Date.UTC(2025, 0, 1) / 1000;
  const r = rng(seed);
  const rev = new Map();
  let bytes = 0;
  for (let c = 0; c < commits; c++) {
    const when = `${t0 + c * 600} +0000`;
    let out = `commit refs/heads/main\nauthor Agent <agent@example.com> ${when}\ncommitter Agent <agent@example.com> ${when}\n`;
    out += data(c === 0 ? "initial memories" : `memory update ${c}`);
    await write(out);
    if (c === 0) {
      for (let i = 0; i < notes; i++) {
        const t = noteText(seed, i, 0, noteBytes);
        bytes += Buffer.byteLength(t);
        await write(`M 100644 inline ${notePath(i)}\n${data(t)}`);
      }
    } else {
      for (let k = 0; k < perCommit; k++) {
        const i = Math.floor(r() * notes);
        const v = (rev.get(i) ?? 0) + 1;
        rev.set(i, v);
        await write(`M 100644 inline ${notePath(i)}\n${data(noteText(seed, i, v, noteBytes))}`);
      }
    }
    await write("\n");
  }
  child.stdin.end();
  await done;
  if (loose) {
    // As a memdir whose commits were made one by one and never packed: every object loose.
    const packDir = path.join(dir, ".git", "objects", "pack");
    for (const f of fs.readdirSync(packDir).filter((n) => n.endsWith(".pack"))) {
      const moved = path.join(dir, ".git", f);
      fs.renameSync(path.join(packDir, f), moved);
      for (const n of fs.readdirSync(packDir)) if (n.startsWith(f.slice(0, -5))) fs.rmSync(path.join(packDir, n));
      const r = spawnSync("git", ["unpack-objects", "-q"], { cwd: dir, env: ENV, input: fs.readFileSync(moved), maxBuffer: 1 << 20 });
      if (r.status !== 0) throw new Error(`git unpack-objects failed: ${r.stderr}`);
      fs.rmSync(moved);
    }
  }
  git(dir, ["reset", "-q", "--hard", "main"]);
  return { dir, notes, commits, bytes };
}

/** One more commit to the memdir at `dir`: note `i` gets a new "latest" paragraph. Returns the commit. */
export function commitOne(dir, i = 1, { seed = 1, noteBytes = 1200, rev = 1_000_001 } = {}) {
  const p = path.join(dir, notePath(i));
  fs.writeFileSync(p, noteText(seed, i, rev, noteBytes));
  git(dir, ["add", "-A"]);
  // No auto gc in the background: it would repack the memdir while it is measured.
  git(dir, ["-c", "gc.auto=0", "commit", "-q", "-m", `memory update ${i}`]);
  return git(dir, ["rev-parse", "HEAD"]);
}
