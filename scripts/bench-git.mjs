#!/usr/bin/env node
/**
 * bench-git.mjs — what the git layer of a memdir like issue 38's (~20k notes, ~3k commits,
 * scripts/lib/gen-memdir.mjs) costs: building its full bundle (the command memsnap runs, and
 * variants of it, in the same run), and memsnap snapshots of it, full then incremental after one
 * commit (bytes stored, CPU seconds of the whole process tree). Run after `npm run build`:
 *
 *   node scripts/bench-git.mjs [--notes 20000] [--commits 3000] [--runs 3] [--dir DIR] [--packed] [--json]
 *
 * The memdir's objects are loose (as after commits made one by one; git's auto gc packs them
 * past 6,700), or with --packed in fast-import's pack.
 * CPU seconds are user + system of the command and its children (/usr/bin/time); each variant
 * runs `--runs` times, the median is shown. The CPU's name and whether it has SHA extensions
 * (sha_ni) are printed: git hashes every object with SHA-1.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { commitOne, generateMemdir } from "./lib/gen-memdir.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : def;
};
const notes = Number(opt("notes", 20000));
const commits = Number(opt("commits", 3000));
const runs = Number(opt("runs", 3));
const work = opt("dir", null) ?? fs.mkdtempSync(path.join(os.tmpdir(), "memsnap-bench-git-"));
const cpuinfo = fs.readFileSync("/proc/cpuinfo", "utf8");
const cpu = /model name\s*:\s*(.*)/.exec(cpuinfo)?.[1] ?? "unknown";
const shaNi = /\bsha_ni\b/.test(cpuinfo);

/** Run argv under /usr/bin/time: { cpu (user+sys s), wall (s), rssMiB }. */
function timed(argv, cwd, env = process.env) {
  const r = spawnSync("/usr/bin/time", ["-f", "%U %S %e %M", ...argv], { cwd, env, maxBuffer: 1 << 26 });
  if (r.status !== 0) throw new Error(`${argv.join(" ")} failed: ${r.stderr.toString().slice(-2000)}`);
  const last = r.stderr.toString().trim().split("\n").pop().split(" ").map(Number);
  return { cpu: last[0] + last[1], wall: last[2], rssMiB: Math.round(last[3] / 1024) };
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const zstdSize = (file) => spawnSync("zstd", ["-3", "-q", "-c", file], { maxBuffer: 1 << 30 }).stdout.length;

const memdir = path.join(work, "agent", "memory");
if (!fs.existsSync(path.join(memdir, ".git"))) {
  const t0 = performance.now();
  const g = await generateMemdir({ dir: memdir, notes, commits, loose: !args.includes("--packed") });
  console.error(`generated ${g.notes} notes, ${g.commits} commits (${(g.bytes / 1048576).toFixed(1)} MiB of notes) in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}

// ---------------------------------------------------------------- the full bundle: variants
const gitEnv = { ...process.env, GIT_CONFIG_NOSYSTEM: "1", GIT_CONFIG_GLOBAL: "/dev/null" };
const out = path.join(work, "b.bundle");
const cfg = (...kv) => kv.flatMap((x) => ["-c", x]);
const variants = [
  ["git bundle create -q --all (memsnap today)", ["git", "bundle", "create", "-q", out, "--all"]],
  ["  pack.threads=1", ["git", ...cfg("pack.threads=1"), "bundle", "create", "-q", out, "--all"]],
  ["  pack.compression=0 (zstd compresses the payload)", ["git", ...cfg("pack.compression=0"), "bundle", "create", "-q", out, "--all"]],
  ["  pack.compression=1", ["git", ...cfg("pack.compression=1"), "bundle", "create", "-q", out, "--all"]],
  ["  pack.window=0 (no new delta search)", ["git", ...cfg("pack.window=0"), "bundle", "create", "-q", out, "--all"]],
  ["pack-objects --all --stdout (no bundle header)", ["sh", "-c", `git pack-objects --all --stdout -q --thin --delta-base-offset < /dev/null > ${out}`]],
];
const rows = [];
for (const [name, argv] of variants) {
  const t = [];
  for (let i = 0; i < runs; i++) t.push(timed(argv, memdir, gitEnv));
  const size = fs.statSync(out).size;
  rows.push({ name, cpu: median(t.map((x) => x.cpu)), wall: median(t.map((x) => x.wall)), bytes: size, zstd: zstdSize(out) });
  console.error(JSON.stringify(rows.at(-1)));
}
// ---------------------------------------------------------------- memsnap snapshots
const agent = path.join(work, "agent");
fs.writeFileSync(path.join(agent, "memsnap.json"), JSON.stringify({ tenant: "bench", agent: "memdir", sources: [{ kind: "git", name: "memory", path: "memory" }] }));
const store = path.join(work, "store");
fs.rmSync(store, { recursive: true, force: true });
fs.rmSync(path.join(agent, ".memsnap"), { recursive: true, force: true });
const memsnap = (extra) => {
  const t = timed([process.execPath, path.join(ROOT, "bin", "memsnap.js"), "snapshot", "-c", "memsnap.json", "--store", store, "--no-encrypt", "--json", ...extra], agent);
  const files = fs.readdirSync(store, { recursive: true }).filter((f) => String(f).endsWith(".memsnap")).map((f) => path.join(store, String(f)));
  const newest = files.map((f) => [f, fs.statSync(f).mtimeMs]).sort((a, b) => b[1] - a[1])[0][0];
  return { ...t, bytes: fs.statSync(newest).size };
};
const snaps = [];
snaps.push({ name: "memsnap snapshot --incremental (first: full)", ...memsnap(["--incremental", "--no-redact"]) });
commitOne(memdir, 1);
snaps.push({ name: "memsnap snapshot --incremental after one commit", ...memsnap(["--incremental", "--no-redact"]) });
commitOne(memdir, 2, { rev: 1_000_002 });
snaps.push({ name: "memsnap snapshot (full) after one more commit", ...memsnap(["--no-redact"]) });

// The same after `git gc` (deltas found once, reused by every bundle after): last, it repacks the memdir.
timed(["git", "gc", "-q"], memdir, gitEnv);
{
  const t = [];
  for (let i = 0; i < runs; i++) t.push(timed(variants[0][1], memdir, gitEnv));
  rows.push({ name: "git bundle create, after git gc", cpu: median(t.map((x) => x.cpu)), wall: median(t.map((x) => x.wall)), bytes: fs.statSync(out).size, zstd: zstdSize(out) });
}

const mib = (n) => `${(n / 1048576).toFixed(2)} MiB`;
const lines = [
  `CPU: ${cpu} (${os.cpus().length} cores), SHA extensions (sha_ni): ${shaNi ? "yes" : "no"}; ${spawnSync("git", ["--version"]).stdout.toString().trim()}`,
  `memdir: ${notes} notes, ${commits} commits, objects ${args.includes("--packed") ? "packed" : "loose"}; median of ${runs} runs`,
  "",
  "| full bundle build | CPU s | wall s | bundle | zstd -3 of it |",
  "| --- | ---: | ---: | ---: | ---: |",
  ...rows.map((r) => `| ${r.name.trim()} | ${r.cpu.toFixed(2)} | ${r.wall.toFixed(2)} | ${mib(r.bytes)} | ${mib(r.zstd)} |`),
  "",
  "| memsnap snapshot (git layer only, plaintext, no redaction) | CPU s | wall s | stored |",
  "| --- | ---: | ---: | ---: |",
  ...snaps.map((r) => `| ${r.name} | ${r.cpu.toFixed(2)} | ${r.wall.toFixed(2)} | ${r.bytes < 1048576 ? `${(r.bytes / 1024).toFixed(1)} KiB` : mib(r.bytes)} |`),
];
if (args.includes("--json")) console.log(JSON.stringify({ cpu, shaNi, rows, snaps }, null, 1));
else console.log(lines.join("\n"));
if (!opt("dir", null)) fs.rmSync(work, { recursive: true, force: true });
