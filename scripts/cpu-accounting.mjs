#!/usr/bin/env node
/**
 * Where one command's CPU goes, system-wide, by kind of work: a development aid for the
 * performance work (docs/BENCHMARK.md), not part of the benchmark.
 *
 *   node scripts/cpu-accounting.mjs [--freq HZ] [--keep FILE] -- COMMAND [ARGS...]
 *
 * Runs COMMAND under `perf record -a` (every CPU, so threads, child processes and kernel
 * writeback are counted too; needs perf and root or perf_event_paranoid ≤ -1), then sorts the
 * samples into kinds of work and prints a Markdown table of CPU seconds (samples ÷ HZ) and
 * their share of the machine's time over the run (idle included). memsnap's own process is
 * split by what its code does (SHA-256, zstd, ChaCha20-Poly1305, the redaction pre-filter, V8's
 * compiler and collector, other JavaScript and runtime, kernel); any other process is one row
 * for its user time and one for its kernel time, by name (`git`, `tar`, `zstd`, `age`, `sync`,
 * kernel threads). Compare two commands by running this on each, e.g. a restore and the
 * pipeline it is measured against:
 *
 *   node scripts/cpu-accounting.mjs -- node bin/memsnap.js restore B --to OUT -i KEY
 *   node scripts/cpu-accounting.mjs -- bash -c 'age -d -i KEY A | zstd -d | tar -xf - -C OUT'
 *
 * The numbers include perf's own sampling cost (a few percent) and vary from run to run like
 * the benchmark's; use them for proportions, and the benchmark for times.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

const argv = process.argv.slice(2);
const sep = argv.indexOf("--");
if (sep < 0 || sep === argv.length - 1) {
  process.stderr.write("usage: node scripts/cpu-accounting.mjs [--freq HZ] [--keep FILE] -- COMMAND [ARGS...]\n");
  process.exit(2);
}
const opts = argv.slice(0, sep);
const command = argv.slice(sep + 1);
const opt = (name, dflt) => {
  const i = opts.indexOf(name);
  return i >= 0 ? opts[i + 1] : dflt;
};
const freq = Number(opt("--freq", "4000"));
const keep = opt("--keep", null);
const data = keep ?? path.join(fs.mkdtempSync(path.join(os.tmpdir(), "memsnap-cpu-")), "perf.data");

const t0 = performance.now();
const rec = spawnSync("perf", ["record", "-a", "-F", String(freq), "-q", "-o", data, "--", ...command], { stdio: ["ignore", "ignore", "inherit"] });
const wall = (performance.now() - t0) / 1000;
if (rec.error || rec.status !== 0) {
  process.stderr.write(`perf record failed (${rec.error?.message ?? `exit ${rec.status}`}): is perf installed, and may this user sample every CPU?\n`);
  process.exit(1);
}
const rep = spawnSync("perf", ["report", "-i", data, "--no-children", "--sort", "comm,dso,sym", "-F", "sample,comm,dso,sym", "-g", "none", "-q"], { encoding: "utf8", maxBuffer: 1 << 28 });
if (rep.status !== 0) {
  process.stderr.write(`perf report failed: ${rep.stderr}\n`);
  process.exit(1);
}
if (!keep) fs.rmSync(path.dirname(data), { recursive: true, force: true });

/** The kind of work of one sample row of memsnap's process (comm `node`). */
function nodeKind(dso, kernel, sym) {
  if (/sha256_block|sha256_multi|SHA256_/.test(sym)) return "SHA-256";
  if (kernel) return "kernel (memsnap's threads)";
  if (dso === "binding.node" || /ZSTD_|HUF_|FSE_|HIST_/.test(sym)) return "zstd";
  if (/ChaCha20|chacha20|poly1305|Poly1305/.test(sym)) return "ChaCha20-Poly1305";
  if (dso === "memsnap_prefilter.node") return "redaction pre-filter (native)";
  if (dso === "better_sqlite3.node") return "SQLite";
  if (/compiler::|Compil|Turbofan|maglev|Maglev|baseline::/.test(sym)) return "V8 compiler";
  if (/Scaveng|Mark(ing|er|Compact)|Sweep|Evacuat|heap::|Heap::|ConcurrentMarking/.test(sym)) return "V8 garbage collector";
  return "JavaScript, V8 and Node runtime, libc";
}

const rows = new Map();
let total = 0;
for (const line of rep.stdout.split("\n")) {
  // "   1234  node   binding.node   [.] ZSTD_compressBlock_doubleFast"
  const m = /^\s*(\d+)\s+(.+?)\s{2,}(\S+)\s+\[(.)\]\s+(.*)$/.exec(line);
  if (!m) continue;
  const [, n, comm, dso, mode, sym] = m;
  const samples = Number(n);
  total += samples;
  const kernel = mode === "k";
  let kind;
  if (comm === "swapper") kind = "idle";
  else if (comm === "node" || comm.startsWith("memsnap")) kind = nodeKind(dso, kernel, sym);
  else if (comm === "perf") kind = "perf (the measurement)";
  else kind = `${comm.replace(/[:/]\S*$/, "")} ${kernel ? "kernel" : "user"}`;
  rows.set(kind, (rows.get(kind) ?? 0) + samples);
}
if (total === 0) {
  process.stderr.write("perf recorded no samples\n");
  process.exit(1);
}
const cpus = os.cpus().length;
const idle = rows.get("idle") ?? 0;
const out = [
  `\`${command.join(" ")}\``,
  "",
  // The samples span the command (perf's start and stop are in `wall`, not in them).
  `${(total / freq / cpus).toFixed(2)} s sampled on ${cpus} CPUs (${wall.toFixed(2)} s under perf): ${((total - idle) / freq).toFixed(2)} CPU-s busy, ${(idle / freq).toFixed(2)} CPU-s idle (${freq} Hz)`,
  "",
  "| work | CPU-s | share of the machine |",
  "| --- | ---: | ---: |",
];
let small = 0;
for (const [kind, n] of [...rows].sort((a, b) => b[1] - a[1])) {
  if (n / freq < 0.005) small += n;
  else out.push(`| ${kind} | ${(n / freq).toFixed(2)} | ${((100 * n) / total).toFixed(1)} % |`);
}
if (small > 0) out.push(`| other (under 0.005 CPU-s each) | ${(small / freq).toFixed(2)} | ${((100 * small) / total).toFixed(1)} % |`);
process.stdout.write(out.join("\n") + "\n");
