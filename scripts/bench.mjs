#!/usr/bin/env node
/**
 * bench.mjs — memsnap vs. a tar | zstd | age baseline on a generated agent-memory mix.
 *
 *   npm run bench                                  # build, then scale 1 (~1 GiB)
 *   node scripts/bench.mjs [--scale S] [--seed N] [--report] [--readme] [--keep] [--skip-gen]
 *                          [--regen] [--cold] [--runs N] [--baseline-only] [--cli PATH]
 *                          [--workdir DIR]
 *   node scripts/bench.mjs --store s3://BUCKET/PREFIX [--scale S] [--runs N]   # see scripts/bench-s3.mjs
 *   node scripts/bench.mjs --home [--scale S] [--runs N]   # a realistic agent home: see scripts/bench-home.mjs
 *   node scripts/bench.mjs --incremental [--db-mb 200] …   # incremental below the file: scripts/bench-incremental.mjs
 *
 *   --scale S        size of the mix in GiB (default 1; e.g. 0.05 for a quick run, 10 for ~10 GiB)
 *   --seed N         generator seed (default 1)
 *   --report         also write WORKDIR/report.md, report.json and report.svg (a chart: MB/s per
 *                    operation, memsnap vs baseline; time ratio per operation with its target;
 *                    memsnap's RSS over time)
 *   --readme         implies --report; then replaces the block between <!-- bench:start --> and
 *                    <!-- bench:end --> in README.md with the table, the chart (copied to
 *                    docs/bench.svg) and the command that reproduces it
 *                    (scripts/readme-bench.mjs does the same from an existing report.json)
 *   --keep           keep the archives, bundle and restored trees (default: each is deleted as
 *                    soon as its check is done, so disk peaks at about 3.3 × the mix: scale 10
 *                    needs ~35 GiB free, the 10 GiB mix cache included); with --runs N the
                   restored trees of earlier runs are moved aside until the last restore
                   run, while the disk keeps 3 × the mix + 2 GiB free (else deleted)
 *   --skip-gen       never generate: use the existing WORKDIR/mix-<scale>/ as it is (fails if absent)
 *   --regen          regenerate the mix even when a matching cached one exists
 *   --cold           drop the page cache (sync; echo 3 > /proc/sys/vm/drop_caches) before every
 *                    measured command; default is warm: the mix is read into the page cache at the
 *                    start and again before every snapshot run (both sides), so every command
 *                    runs with it cached; run as root, the page cache is also dropped before
 *                    every restore run and the restores' inputs read back in (system-wide: other
 *                    programs on the machine lose their cached files too)
 *   --runs N         measure every command N times and report the median time (default 1); the
 *                    baseline and memsnap runs of an operation alternate (b, m, b, m, …)
 *   --baseline-only  do not run memsnap (exit 0 if the baselines pass)
 *   --cli PATH       memsnap CLI to run, executed directly as an installed `memsnap` is (default bin/memsnap.js)
 *   --workdir DIR    where the mix cache, outputs and reports go (default .bench); the mix stays
 *                    cached in WORKDIR/mix-<scale>/ between runs (delete it to free the space)
 *
 * The mix (scripts/gen-mix.mjs) holds each kind of agent state in its own format, and memsnap
 * captures it with the typed source made for it (scripts/lib/mix-sources.mjs): git (memory/),
 * sqlite (db/), state (state/), files (traces/), kv (kv/), pfimg (runtime/pfimg/), criu
 * (runtime/criu/). The baselines run over the same directory.
 *
 * Everything is measured in one run so that the ratios compare like with like. Each measured
 * command runs under `/usr/bin/time -f '%e %M'` (peak RSS); seconds are wall clock around it.
 * While memsnap runs, the summed VmRSS of its process tree is sampled every 50 ms (the RSS
 * curves of the chart). Untimed `sync` between commands keeps one step's writeback out of the
 * next one's time. Neither baseline fsyncs its output; if memsnap does, that cost is in its numbers.
 *
 * Restore checks (untimed): the baseline's tree must equal the mix file for file. memsnap
 * restores each layer into its own directory, so its restore is checked per layer
 * (scripts/lib/restore-check.mjs): identical bytes for files/state/kv/pfimg/criu; same HEAD,
 * work tree and status for git; integrity_check, row counts and .dump for SQLite.
 *
 * Exit status: 0 when every command ran (targets missed or not: this reports, it does not gate);
 * 1 when a command failed, memsnap's CLI is missing, or a restore does not match the mix; 2 on
 * bad arguments.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { generateMix, formatSummary, GEN_VERSION } from "./gen-mix.mjs";
import { MIX_LAYERS, mixSources } from "./lib/mix-sources.mjs";
import { checkRestoredLayers, factsCache } from "./lib/restore-check.mjs";
import { README_END, README_START, renderSvg, updateReadme } from "./lib/bench-report.mjs";
import { measureStages, stageTable } from "./lib/stages.mjs";
import { changeMix } from "./lib/incremental.mjs";
import {
  MB,
  bashPipeline,
  compareTree,
  dropCaches,
  fmtBytes,
  fmtMBs,
  fmtRatio,
  fmtRss,
  fmtS,
  hashTree,
  listFiles,
  machineInfo,
  markdownTable,
  runChecked,
  shq,
  syncDisks,
  textTable,
  timedRun,
  warmTree,
} from "./lib/measure.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
let BENCH = path.join(ROOT, ".bench");
const RSS_TARGET_MIB = 200;
/** The performance issue's bundle-size target: at most this fraction of the baseline archive. */
const PERF_BUNDLE_MAX = 0.95;
/** A perf ratio target for the table: 1/1.5 reads "0.67×". */
const fmtPerfRatio = (r) => `${r.toFixed(2).replace(/0$/, "")}×`;
const RSS_SAMPLE_MS = 50;

const log = (m) => console.error(`bench: ${m}`);

/** A path relative to the repo root for display (commands run with cwd = repo root). */
const rel = (p) => {
  const r = path.relative(ROOT, p);
  return r.startsWith("..") ? p : r;
};

/** At most `n` points of a [t, v] series, keeping the largest v of each bucket (peaks stay visible). */
function downsample(points, n) {
  if (points.length <= n) return points;
  const out = [];
  const per = points.length / n;
  for (let i = 0; i < n; i++) {
    const bucket = points.slice(Math.floor(i * per), Math.floor((i + 1) * per));
    if (bucket.length) out.push(bucket.reduce((a, p) => (p[1] > a[1] ? p : a)));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// arguments
// ---------------------------------------------------------------------------------------------

function parseArgs(argv) {
  const o = { cli: "bin/memsnap.js", scale: 1, seed: 1, report: false, readme: false, keep: false, skipGen: false, regen: false, cold: false, runs: 1, baselineOnly: false, workdir: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === "--scale") o.scale = Number(val());
    else if (a === "--seed") o.seed = Number(val());
    else if (a === "--report") o.report = true;
    else if (a === "--readme") o.readme = o.report = true;
    else if (a === "--workdir") o.workdir = val();
    else if (a === "--keep") o.keep = true;
    else if (a === "--skip-gen") o.skipGen = true;
    else if (a === "--regen") o.regen = true;
    else if (a === "--cold") o.cold = true;
    else if (a === "--runs") o.runs = Number(val());
    else if (a === "--baseline-only") o.baselineOnly = true;
    else if (a === "--cli") o.cli = val();
    else if (a === "-h" || a === "--help") o.help = true;
    else throw new Error(`unknown argument ${a}`);
  }
  if (!(o.scale > 0)) throw new Error("--scale must be a number > 0");
  if (!Number.isInteger(o.seed)) throw new Error("--seed must be an integer");
  if (!Number.isInteger(o.runs) || o.runs < 1) throw new Error("--runs must be an integer ≥ 1");
  if (o.skipGen && o.regen) throw new Error("--skip-gen and --regen exclude each other");
  return o;
}

// ---------------------------------------------------------------------------------------------
// the mix (cached per scale)
// ---------------------------------------------------------------------------------------------

async function prepareMix(opts) {
  const base = path.join(BENCH, `mix-${String(opts.scale)}`);
  const data = path.join(base, "data"); // the tree that is snapshotted (.done stays outside it)
  const doneFile = path.join(base, ".done");
  const manifestFile = path.join(base, "manifest.json");
  let done = null;
  try {
    done = JSON.parse(fs.readFileSync(doneFile, "utf8"));
  } catch {
    /* none */
  }
  const matches = done && done.seed === opts.seed && done.scale === opts.scale && done.version === GEN_VERSION;
  let genSeconds = null;
  if (opts.skipGen) {
    if (!done || !fs.existsSync(data)) throw new Error(`--skip-gen: no generated mix at ${base} (run without --skip-gen once)`);
    if (!matches) log(`warning: cached mix was made with seed ${done.seed}, scale ${done.scale}, v${done.version}; using it anyway (--skip-gen)`);
    else log(`using cached mix ${path.relative(ROOT, data)} (--skip-gen)`);
  } else if (matches && !opts.regen && fs.existsSync(data)) {
    log(`reusing cached mix ${path.relative(ROOT, data)} (seed ${opts.seed}, scale ${opts.scale}; --regen to rebuild)`);
  } else {
    log(`generating mix: scale ${opts.scale}, seed ${opts.seed} → ${path.relative(ROOT, data)}`);
    fs.rmSync(base, { recursive: true, force: true });
    fs.mkdirSync(base, { recursive: true });
    const summary = await generateMix({ scale: opts.scale, out: data, seed: opts.seed, log: (m) => log(`  gen: ${m}`) });
    genSeconds = summary.seconds;
    console.log(formatSummary(summary));
    log("hashing the mix (restore checks compare against it)");
    const manifest = hashTree(data);
    fs.writeFileSync(manifestFile, JSON.stringify(manifest));
    done = { version: GEN_VERSION, seed: opts.seed, scale: opts.scale, digest: manifest.digest, summary };
    fs.writeFileSync(doneFile, JSON.stringify(done, null, 2) + "\n");
  }
  let manifest;
  try {
    manifest = JSON.parse(fs.readFileSync(manifestFile, "utf8"));
  } catch {
    log("hashing the mix (no manifest.json)");
    manifest = hashTree(data);
    fs.writeFileSync(manifestFile, JSON.stringify(manifest));
  }
  const mix = { base, dir: data, summary: done.summary, manifest, genSeconds, reused: genSeconds === null };
  tidyMix(mix);
  return mix;
}

/** Files under the mix that the generator did not write (relative paths). */
function strangers(mix) {
  return listFiles(mix.dir).filter((f) => !(f in mix.manifest.files));
}

/**
 * Puts a reused mix back the way the generator left it: an earlier memsnap snapshot opens the
 * WAL database read-only, and a read-only connection cannot remove the (empty) -wal and the
 * -shm it creates. Only an empty -wal and the -shm beside it are removed, and only next to a
 * database of the manifest; anything else foreign is reported, not touched.
 */
function tidyMix(mix, quiet = false) {
  const removed = [];
  for (const f of strangers(mix)) {
    const m = /^(.*)-(wal|shm)$/.exec(f);
    if (!m || !(m[1] in mix.manifest.files)) continue;
    const wal = path.join(mix.dir, `${m[1]}-wal`);
    if (fs.existsSync(wal) && fs.statSync(wal).size > 0) continue;
    fs.rmSync(path.join(mix.dir, f), { force: true });
    removed.push(f);
  }
  if (quiet) return;
  if (removed.length) log(`removed ${removed.join(", ")} from the cached mix (left by an earlier memsnap snapshot; not written by the generator)`);
  const rest = strangers(mix);
  if (rest.length) log(`warning: the cached mix holds ${rest.length} file(s) the generator did not write (e.g. ${rest.slice(0, 3).join(", ")}); --regen rebuilds it`);
}

// ---------------------------------------------------------------------------------------------
// measuring
// ---------------------------------------------------------------------------------------------

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

/** Bytes free for an unprivileged writer on the file system holding `dir` (Infinity when unknown). */
function freeBytes(dir) {
  try {
    const st = fs.statfsSync(dir);
    return st.bavail * st.bsize;
  } catch {
    return Infinity;
  }
}

/** One command's runs, gathered by {@link runOnce} and summarised by {@link summarize}. */
function newRuns(spec) {
  return { spec, times: [], cpu: [], foreign: [], curves: [], rss: null, last: null };
}

/**
 * One run of a command: its prep (untimed), a sync (or a dropped cache), then the timed run,
 * then its `after(last)` hook (untimed; `last`: no further run of it follows).
 */
async function runOnce(ctx, acc, last) {
  const { argv, prep, captureStdout = false, sampleRss = false } = acc.spec;
  if (prep) prep();
  if (ctx.opts.cold) {
    if (!dropCaches()) ctx.notes.add("--cold: could not drop the page cache (not root?); ran warm");
  } else syncDisks();
  const run = await timedRun(argv, { cwd: ROOT, tmpDir: ctx.tmp, captureStdout, sampleRss: sampleRss ? RSS_SAMPLE_MS : false });
  acc.last = run;
  acc.spec.after?.(last || !run.ok, run);
  if (!run.ok) return false;
  const l = run;
  acc.times.push(l.seconds);
  if (sampleRss) acc.curves.push({ seconds: l.seconds, samples: l.rssSamples ?? [], sampledPeakKiB: l.rssSampledPeakKiB, peakKiB: l.rssKiB });
  if (l.cpuSeconds != null) acc.cpu.push(l.cpuSeconds);
  if (l.foreignCpuSeconds != null) acc.foreign.push(l.foreignCpuSeconds);
  ctx.foreign.cpu += l.foreignCpuSeconds ?? 0;
  ctx.foreign.wall += l.seconds;
  if (l.rssKiB != null) acc.rss = Math.max(acc.rss ?? 0, l.rssKiB);
  return true;
}

/** @returns {{ok, seconds, allSeconds, rssKiB, stdout, stderr, code, display}} */
function summarize(acc) {
  const { times, cpu, foreign, curves, rss, last } = acc;
  // The RSS curve of the run whose time is the median one.
  const med = times.length ? median(times) : null;
  const curve = curves.length ? curves.reduce((a, c) => (Math.abs(c.seconds - med) < Math.abs(a.seconds - med) ? c : a)) : null;
  return {
    ok: last.ok,
    rssCurve: curve,
    code: last.code,
    signal: last.signal,
    seconds: last.ok ? median(times) : null,
    allSeconds: times,
    cpuSeconds: cpu.length ? Math.round(median(cpu) * 100) / 100 : null,
    foreignCpuSeconds: foreign.length ? Math.round(median(foreign) * 100) / 100 : null,
    rssKiB: last.ok ? rss : last.rssKiB,
    stdout: last.stdout,
    stderr: last.stderr,
    display: acc.spec.display,
  };
}

/**
 * Runs commands `runs` times each, alternating, and summarises each: a slow spell of the
 * machine, or what one side left in the page cache, then falls on every side alike instead of
 * on whichever ran last. Rounds go forth and back (a, b, c, then c, b, a, …; the last round
 * always forth, so each side's `after(last)` hook runs in the usual order): a drift over the
 * runs then cancels out too. (On this machine restores slow down run after run as the bench
 * deletes and recreates trees; in one forth-only run both sides' restores grew by ~0.4 s per
 * round, and memsnap, always second, read 1.25x where the same builds measured 0.99x. The
 * cause was ext4 without a journal skipping recently freed inodes: see `retire` in the restore
 * step, which now moves earlier trees aside instead of deleting them.)
 * A null command is skipped (`b` null: `a` alone).
 */
async function measureAlternating(ctx, a, ...others) {
  const all = [newRuns(a), ...others.map((o) => (o ? newRuns(o) : null))];
  for (let r = 0; r < ctx.opts.runs; r++) {
    const last = r === ctx.opts.runs - 1;
    let any = false;
    for (const acc of r % 2 === 1 && !last ? [...all].reverse() : all) {
      if (acc && (acc.last === null || acc.last.ok) && (await runOnce(ctx, acc, last))) any = true;
    }
    if (!any) break;
  }
  syncDisks();
  return all.map((acc) => (acc ? summarize(acc) : null));
}

function failureText(res) {
  const why = res.signal ? `killed by ${res.signal}` : `exit ${res.code}`;
  const tail = (res.stderr || "").trim().split("\n").filter((l) => l.trim()).slice(-12).join("\n    ");
  return `${why}${tail ? `\n    ${tail}` : ""}`;
}

function parseJsonOut(res, what, ctx) {
  const s = (res.stdout || "").trim();
  if (!s) return null;
  try {
    return JSON.parse(s);
  } catch {
    // tolerate log lines around the object: take the last line that parses
    for (const line of s.split("\n").reverse()) {
      try {
        return JSON.parse(line);
      } catch {
        /* next */
      }
    }
    ctx.notes.add(`memsnap ${what} --json did not print parseable JSON`);
    return null;
  }
}

/** The fields the bench passes through from memsnap's JSON. */
function passthrough(obj) {
  if (!obj || typeof obj !== "object") return null;
  const out = {};
  for (const k of ["throughput", "stages", "redaction"]) if (obj[k] !== undefined) out[k] = obj[k];
  return Object.keys(out).length ? out : null;
}

/** Keeps report.json small: arrays longer than 20 items are cut. */
function compact(v, depth = 0) {
  if (Array.isArray(v)) {
    const a = v.slice(0, 20).map((x) => compact(x, depth + 1));
    if (v.length > 20) a.push(`… ${v.length - 20} more`);
    return a;
  }
  if (v && typeof v === "object" && depth < 8) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, compact(x, depth + 1)]));
  return v;
}

// ---------------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------------

/** Redact every markdown/JSON/JSONL file of the mix through memsnap's redactor, draining the output; returns MB/s. */
async function measureRedaction(dir) {
  const { createRedactor, parseRedactionConfig } = await import("../dist/redact/index.js");
  const { walkFiles, fileArtifact } = await import("../dist/sources/walk.js");
  const tmp = fs.mkdtempSync(path.join(BENCH, "redact-"));
  const redactor = await createRedactor(parseRedactionConfig(undefined, "bench"), tmp);
  try {
    const { files } = await walkFiles(dir, { include: ["*.md", "*.json", "*.jsonl"] });
    const t0 = process.hrtime.bigint();
    let bytes = 0;
    for (const f of files) {
      const kind = f.rel.endsWith(".jsonl") ? "jsonl" : f.rel.endsWith(".json") ? "json" : "file";
      const a = await redactor.redactArtifact({ ...fileArtifact(f, kind), text: true }, `mix/${f.rel}`);
      for await (const _ of a.open()) { /* drain */ }
      bytes += f.stats.size;
    }
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    return Number((bytes / 1e6 / s).toFixed(1));
  } finally {
    await redactor.cleanup();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (e) {
    console.error(`bench: ${e.message}`);
    process.exit(2);
  }
  if (opts.help) {
    const src = fs.readFileSync(fileURLToPath(import.meta.url), "utf8");
    const doc = src.split("\n");
    console.log(doc.slice(2, doc.indexOf(" */")).map((l) => l.replace(/^ \* ?/, "")).join("\n"));
    return 0;
  }

  if (opts.workdir) BENCH = path.resolve(opts.workdir);
  const t0 = Date.now();
  fs.mkdirSync(BENCH, { recursive: true });
  const tmp = path.join(BENCH, "tmp");
  fs.mkdirSync(tmp, { recursive: true });
  const ctx = { opts, tmp, notes: new Set(), foreign: { cpu: 0, wall: 0 } };
  const failures = [];

  // 0. disk: the mix, then at the peak the baseline archive + the bundle + one restored tree
  const estMix = opts.scale * 2 ** 30;
  try {
    const st = fs.statfsSync(BENCH);
    const free = st.bavail * st.bsize;
    const need = (opts.keep ? 4.6 : 3.4) * estMix;
    if (free < need) log(`warning: ${fmtBytes(free)} free under ${rel(BENCH)}; scale ${opts.scale} needs about ${fmtBytes(need)} (mix included${opts.keep ? ", --keep" : ""})`);
  } catch {
    /* statfs unsupported */
  }

  // 1. mix
  const mix = await prepareMix(opts);
  const mixBytes = mix.manifest.bytes;

  // 2. age key
  // The bench's identity is kept between runs (bundles made with it stay readable); a file
  // without a public-key line (damaged, or not age-keygen's) is replaced.
  const keyFile = path.join(BENCH, "key.txt");
  const publicKey = () => (fs.existsSync(keyFile) ? /^# public key: (age1\S+)$/m.exec(fs.readFileSync(keyFile, "utf8"))?.[1] : undefined);
  if (!publicKey()) {
    fs.rmSync(keyFile, { force: true });
    runChecked(["age-keygen", "-o", keyFile]);
  }
  const recipient = publicKey();
  if (!recipient) throw new Error(`no "# public key:" line in ${keyFile}`);

  const outDir = path.join(BENCH, "out");
  const baseArchive = path.join(outDir, "base.tar.zst.age");
  const bundle = path.join(outDir, "snap.memsnap");
  const bundlePlain = path.join(outDir, "snap-no-redact.memsnap");
  const restoreBase = path.join(BENCH, "restore-base");
  const restoreBaseSync = path.join(BENCH, "restore-base-sync");
  const restoreMemsnap = path.join(BENCH, "restore-memsnap");
  const retiredDir = path.join(BENCH, "restore-retired");
  const configFile = path.join(BENCH, "memsnap.json");
  for (const p of [outDir, restoreBase, restoreBaseSync, restoreMemsnap, retiredDir]) fs.rmSync(p, { recursive: true, force: true });
  fs.mkdirSync(outDir, { recursive: true });
  const config = {
    tenant: "bench",
    agent: "bench",
    sources: mixSources(mix.dir),
    recipients: [recipient],
    compression: { level: 3 },
  };
  fs.writeFileSync(configFile, JSON.stringify(config, null, 2) + "\n");

  // memsnap available?
  const cli = path.resolve(ROOT, opts.cli);
  let memsnapSkip = null;
  if (opts.baselineOnly) memsnapSkip = "skipped (--baseline-only)";
  else if (!fs.existsSync(cli)) {
    memsnapSkip = "not run: memsnap CLI missing";
    const msg = `memsnap CLI not found at ${rel(cli)} — memsnap steps skipped, baselines still measured (build it with \`npm run build\`; --baseline-only silences this)`;
    log(msg);
    failures.push(msg);
  } else if (!fs.existsSync(path.join(ROOT, "dist"))) {
    log("warning: dist/ does not exist — memsnap will probably fail to load; run `npm run build` (npm run bench does)");
  }
  // Run as an installed `memsnap` is: the file itself (its sh preamble execs node with the
  // runtime flags it ships with; see bin/memsnap.js).
  const cliCmd = rel(cli).startsWith("/") || rel(cli).startsWith(".") ? rel(cli) : `./${rel(cli)}`;
  const memsnap = (...args) => [cliCmd, ...args];

  // cache state
  let cacheMode = "warm";
  if (opts.cold) {
    if (dropCaches()) cacheMode = "cold (page cache dropped before every measured command)";
    else {
      cacheMode = "warm (--cold asked, but the page cache could not be dropped)";
      opts.cold = false;
    }
  } else {
    log(`warming the page cache with the mix (${fmtBytes(mixBytes)})`);
    await warmTree(mix.dir);
    cacheMode = "warm (mix read into the page cache before every snapshot run; before every restore run, earlier trees dropped from it and the restores' inputs read in; outputs cached as written)";
  }
  // Each snapshot run, on either side, starts with the whole mix in the page cache again. Read
  // once at the start was not enough at scale 10: the runs' outputs (5-10 GiB each) evicted part
  // of the mix, and whichever side came next read it back from disk (one run's memsnap snapshot
  // without redaction used 48.5 CPU-s in 48.9 s, waiting on reads, while the same build took
  // 35-36 s with the mix cached).
  const rewarm = () => {
    if (!opts.cold) void warmTree(mix.dir); // synchronous reads: done when it returns
  };
  syncDisks();

  const rows = [];
  const memsnapJson = {};
  const rssCurves = {};
  const addRow = (row) => {
    rows.push(row);
    const b = row.baseline;
    const m = row.memsnap;
    const bs = b ? (b.ok ? `${fmtS(b.seconds)} s, ${fmtRss(b.rssKiB)}` : `FAILED (${failureText(b)})`) : "—";
    const ms = m ? (m.ok ? `${fmtS(m.seconds)} s, ${fmtRss(m.rssKiB)}` : m.skipped ? m.skipped : `FAILED (${failureText(m)})`) : "—";
    log(`${row.op}: memsnap ${ms}; baseline ${bs}`);
  };
  const skipped = (why) => ({ ok: false, skipped: why });
  /**
   * The baseline and memsnap for one operation, their runs alternating (measureAlternating);
   * `memSpec` null (no bundle to work on) or memsnap unavailable: the baseline alone.
   */
  /**
   * `also`: another memsnap command ({ what, spec }) measured against the same baseline runs (a, b, c alternating).
   * `base2`: another baseline command ({ what, spec }), alternating with the others; its result comes fourth.
   */
  const runPair = async (what, baseSpec, memSpec, memMissing, also = null, base2 = null) => {
    const runMem = memSpec && !memsnapSkip;
    const withJson = (spec) => ({ ...spec, captureStdout: true, sampleRss: true });
    const [b, m, m2, b2] = await measureAlternating(ctx, baseSpec, runMem ? withJson(memSpec) : null, runMem && also ? withJson(also.spec) : null, base2 ? base2.spec : null);
    if (!b.ok) failures.push(`baseline ${what} failed: ${failureText(b)}`);
    if (b2 && !b2.ok) failures.push(`baseline ${base2.what} failed: ${failureText(b2)}`);
    if (!runMem) return [b, memsnapSkip ? skipped(memsnapSkip) : memMissing, memsnapSkip ? skipped(memsnapSkip) : memMissing, b2];
    const check = (m, what) => {
      if (!m) return m;
      m.json = parseJsonOut(m, what, ctx);
      memsnapJson[what] = m.json;
      if (m.rssCurve) rssCurves[what] = m.rssCurve;
      if (m.ok && m.json && m.json.ok === false) {
        m.ok = false;
        m.stderr += `\n${what} --json reported ok: false`;
      }
      if (!m.ok) failures.push(`memsnap ${what} failed: ${failureText(m)}`);
      return m;
    };
    return [b, check(m, what), also ? check(m2, also.what) : null, b2];
  };
  const sizeOf = (p) => (fs.existsSync(p) ? fs.statSync(p).size : null);
  // Outputs go as soon as they are no longer needed (unless --keep): at scale 10 the mix is
  // ~10 GiB, and archive + bundle + two restored trees at once would need ~4.6 × that.
  const drop = (...ps) => {
    if (!opts.keep) for (const p of ps) fs.rmSync(p, { recursive: true, force: true });
  };

  // 3/4. snapshot
  log("snapshot");
  const [baseSnap, memSnap, memSnapPlain] = await runPair("snapshot", {
    argv: bashPipeline(`tar -cf - -C ${shq(mix.dir)} . | zstd -3 -T2 -q | age -r ${shq(recipient)} > ${shq(rel(baseArchive))}`),
    display: "tar -cf - -C MIX . | zstd -3 -T2 | age -r R > base.tar.zst.age",
    prep: () => {
      fs.rmSync(baseArchive, { force: true });
      tidyMix(mix, true); // what memsnap's run before this one left (an empty -wal, a -shm) is not archived
      rewarm();
    },
  }, {
    argv: memsnap("snapshot", "--config", rel(configFile), "--out", rel(bundle), "--json"),
    display: `${cliCmd} snapshot --config ${rel(configFile)} --out ${rel(bundle)} --json`,
    prep: () => {
      fs.rmSync(bundle, { force: true });
      rewarm();
    },
  }, null, {
    // The same snapshot without the redaction stage: what the pipeline itself does (read, hash,
    // compress, encrypt, write), against the same baseline runs. Its bundle is not kept.
    what: "snapshot (no redact)",
    spec: {
      argv: memsnap("snapshot", "--config", rel(configFile), "--out", rel(bundlePlain), "--no-redact", "--json"),
      display: `${cliCmd} snapshot --config ${rel(configFile)} --out ${rel(bundlePlain)} --no-redact --json`,
      prep: () => {
        fs.rmSync(bundlePlain, { force: true });
        rewarm();
      },
      after: () => fs.rmSync(bundlePlain, { force: true }),
    },
  });
  addRow({ op: "snapshot", baseline: baseSnap, memsnap: memSnap, bytes: mixBytes, bytesOf: "mix", maxRatio: 1.3, perfRatio: 1.0 });
  if (memSnapPlain) addRow({ op: "snapshot (no redact)", baseline: baseSnap, memsnap: memSnapPlain, bytes: mixBytes, bytesOf: "mix", maxRatio: null });
  if (!memsnapSkip) {
    // A snapshot should leave the live state as it found it.
    const left = strangers(mix);
    if (left.length) ctx.notes.add(`memsnap snapshot left ${left.length} file(s) in the live mix that were not there before: ${left.slice(0, 6).join(", ")}${left.length > 6 ? ", …" : ""}`);
  }
  const haveBundle = memSnap.ok && fs.existsSync(bundle);
  if (memSnap.ok && !haveBundle) failures.push(`memsnap snapshot exited 0 but ${rel(bundle)} does not exist`);
  const noBundle = skipped(memsnapSkip ?? "skipped: no bundle (snapshot failed)");
  const sizes = { mix: mixBytes, baseline: sizeOf(baseArchive), memsnap: haveBundle ? sizeOf(bundle) : null };

  // verify without key vs sha256sum of the bundle
  log("verify");
  const hashTarget = haveBundle ? bundle : baseArchive;
  if (!haveBundle) ctx.notes.add("sha256sum baseline hashed base.tar.zst.age (no memsnap bundle to hash)");
  const hashBytes = sizeOf(hashTarget);
  const [baseVerify, memVerify] = await runPair("verify (no key)", {
    argv: ["sha256sum", rel(hashTarget)],
    display: `sha256sum ${haveBundle ? "<memsnap bundle>" : "base.tar.zst.age"}`,
  }, haveBundle ? {
    argv: memsnap("verify", rel(bundle), "--json"),
    display: `${cliCmd} verify ${rel(bundle)} --json`,
  } : null, noBundle);
  addRow({ op: "verify (no key)", baseline: baseVerify, memsnap: memVerify, bytes: hashBytes, bytesOf: "bundle", maxRatio: 1.0, perfRatio: 1 / 1.5 });

  // verify with key vs decrypt + decompress + hash of the baseline archive
  const [baseVerifyKey, memVerifyKey] = await runPair("verify (key)", {
    argv: bashPipeline(`age -d -i ${shq(rel(keyFile))} ${shq(rel(baseArchive))} | zstd -d -q | sha256sum`),
    display: "age -d -i key base.tar.zst.age | zstd -d | sha256sum",
  }, haveBundle ? {
    argv: memsnap("verify", rel(bundle), "--identity", rel(keyFile), "--json"),
    display: `${cliCmd} verify ${rel(bundle)} --identity ${rel(keyFile)} --json`,
  } : null, noBundle);
  addRow({ op: "verify (key)", baseline: baseVerifyKey, memsnap: memVerifyKey, bytes: mixBytes, bytesOf: "mix", maxRatio: null, perfRatio: 1.0 });

  // restore, each side checked (untimed) and moved aside (or deleted) before the next one starts
  log("restore");
  const restoreCheck = {};
  // Earlier runs' restored trees are moved aside, not deleted, until the restore runs are over
  // (when the disk has room for them): on ext4 without a journal (this machine's disk), creating
  // a file skips every inode freed in the last 1-6 minutes (find_inode_bit → recently_deleted,
  // one buffer-cache lookup each), so deleting a tree of 3,000+ files made the next restore's
  // file creation slower, on both sides and run after run (perf: 2.4 CPU-s of one restore's
  // `git checkout` in recently_deleted; 3,000 files took 0.3-2 s to create, 0.05 s on a quiet
  // disk).
  // And every restore run, on either side, starts from the same page cache (where it can be
  // dropped, i.e. as root): the earlier runs' trees written back and dropped, then what the
  // restores read put back (the pipeline's archive, node, memsnap's files, the tools and their
  // libraries; memsnap reads its bundle with O_DIRECT). Without it the trees moved aside filled
  // the page cache run after run and the restores flipped to a slow mode part-way through: in
  // one scale-1 run the pipeline's took 1.8-2.0 s in the first three rounds and 3.8-4.3 s in the
  // last two (3.3 CPU-s at the median), memsnap's 2.6-2.7 s then 3.5-4.0 s, which read 1.80x.
  const restoreInputs = (() => {
    const bins = [process.execPath];
    for (const t of ["age", "zstd", "tar", "bash", "git", "sync"]) {
      const w = spawnSync("sh", ["-c", `command -v ${t}`], { encoding: "utf8" }).stdout.trim();
      if (w.startsWith("/")) bins.push(w);
    }
    if (fs.existsSync("/usr/lib/git-core/git")) bins.push("/usr/lib/git-core/git");
    const libs = new Set();
    for (const b of bins) {
      const r = spawnSync("ldd", [b], { encoding: "utf8" });
      for (const m of (r.stdout ?? "").matchAll(/=> (\/\S+)/g)) libs.add(m[1]);
    }
    return { files: [...bins, ...libs], dirs: ["bin", "dist", "native", "node_modules"].map((d) => path.join(ROOT, d)) };
  })();
  let restoreCacheLevelled = null;
  const levelRestoreCache = () => {
    if (opts.cold) return; // dropped before every command anyway
    restoreCacheLevelled = dropCaches();
    if (!restoreCacheLevelled) return;
    const buf = Buffer.allocUnsafe(1 << 20);
    for (const f of [...restoreInputs.files, baseArchive]) {
      let fd;
      try {
        fd = fs.openSync(f, "r");
        while (fs.readSync(fd, buf, 0, buf.length, null) > 0);
      } catch {
        // missing: nothing to warm
      } finally {
        if (fd !== undefined) fs.closeSync(fd);
      }
    }
    for (const d of restoreInputs.dirs) if (fs.existsSync(d)) void warmTree(d); // synchronous reads
  };
  let retired = 0;
  let deletedTrees = 0;
  const retire = (p, room = 3 * mixBytes + 2 ** 31) => {
    if (!fs.existsSync(p)) return;
    if (freeBytes(BENCH) > room) {
      fs.mkdirSync(retiredDir, { recursive: true });
      fs.renameSync(p, path.join(retiredDir, String(retired++)));
    } else {
      fs.rmSync(p, { recursive: true, force: true });
      deletedTrees++;
    }
  };
  const [baseRestore, memRestore, , baseRestoreSync] = await runPair("restore", {
    argv: bashPipeline(`age -d -i ${shq(rel(keyFile))} ${shq(rel(baseArchive))} | zstd -d -q | tar -xf - -C ${shq(rel(restoreBase))}`),
    display: "age -d -i key base.tar.zst.age | zstd -d | tar -xf - -C OUT",
    prep: () => {
      retire(restoreBase);
      fs.mkdirSync(restoreBase);
      levelRestoreCache();
    },
    // The baseline's last tree is checked, then moved aside too where the disk has room for
    // the two trees still to come (memsnap's, the pipeline + sync's; at scale 10 each is ~10
    // GiB), else deleted. Deleted, it made memsnap's next run create its files among freshly
    // freed inodes (above): at scale 10, with one run each, memsnap's only restore always came
    // right after 10 GiB of the baseline's tree were deleted (one such run: 1.52x).
    after: (last, run) => {
      if (last && run.ok) {
        log("checking the baseline restore");
        const c = compareTree(mix.manifest, restoreBase);
        restoreCheck.baseline = summarizeCheck(c, rel(restoreBase));
        if (!c.ok) failures.push(`baseline restore does not match the mix: ${restoreCheck.baseline.text}`);
      }
      if (last && opts.keep) return;
      retire(restoreBase, last ? 2 * mixBytes + 2 ** 31 : undefined);
    },
  }, haveBundle ? {
    argv: memsnap("restore", rel(bundle), "--to", rel(restoreMemsnap), "--identity", rel(keyFile), "--json"),
    display: `${cliCmd} restore ${rel(bundle)} --to ${rel(restoreMemsnap)} --identity ${rel(keyFile)} --json`,
    prep: () => {
      retire(restoreMemsnap);
      levelRestoreCache();
    },
    after: (last) => {
      if (!last) retire(restoreMemsnap);
    },
  } : null, noBundle, null, {
    // The pipeline again, timed until its tree is on disk: memsnap's restore syncs the staged
    // tree before it swaps it in (a crash must not leave a half-written agent), while `tar -x`
    // returns with the files still dirty in the page cache. Informational: no target.
    what: "restore (pipeline + sync)",
    spec: {
      argv: bashPipeline(`age -d -i ${shq(rel(keyFile))} ${shq(rel(baseArchive))} | zstd -d -q | tar -xf - -C ${shq(rel(restoreBaseSync))} && sync`),
      display: "age -d -i key base.tar.zst.age | zstd -d | tar -xf - -C OUT && sync",
      prep: () => {
        retire(restoreBaseSync);
        fs.mkdirSync(restoreBaseSync);
        levelRestoreCache();
      },
      after: (last) => {
        if (last) drop(restoreBaseSync);
        else retire(restoreBaseSync);
      },
    },
  });
  drop(baseArchive);
  fs.rmSync(retiredDir, { recursive: true, force: true });
  if (restoreCacheLevelled === false) ctx.notes.add("restore: the page cache could not be dropped between runs (not root?): later runs may find it full of earlier trees");
  if (deletedTrees) ctx.notes.add(`restore: ${deletedTrees} earlier restored tree(s) were deleted between runs for lack of disk space (on ext4 without a journal that slows the next runs' file creation)`);
  syncDisks();
  addRow({ op: "restore", baseline: baseRestore, memsnap: memRestore, bytes: mixBytes, bytesOf: "mix", maxRatio: 1.3, perfRatio: 1.0 });
  if (baseRestoreSync) addRow({ op: "restore (pipeline + sync)", baseline: baseRestoreSync, memsnap: memRestore, bytes: mixBytes, bytesOf: "mix", maxRatio: null });
  if (memRestore.ok) {
    log("checking the memsnap restore, layer by layer");
    const c = await checkRestoredLayers({
      manifest: mix.manifest,
      mixDir: mix.dir,
      outDir: restoreMemsnap,
      layers: MIX_LAYERS,
      cache: factsCache(path.join(mix.base, "sqlite-facts.json")),
    });
    restoreCheck.memsnap = { ok: c.ok, text: `${c.text} in ${rel(restoreMemsnap)}`, layers: c.layers, strays: c.strays };
    for (const l of c.layers) log(`  ${l.name} (${l.kind}): ${l.ok ? "ok" : "MISMATCH"} — ${l.text}`);
    if (!c.ok) failures.push(`memsnap restore does not match the mix: ${c.text} (${c.layers.filter((l) => !l.ok).map((l) => `${l.name}: ${l.text}`).join("; ")})`);
  }
  drop(restoreMemsnap, bundle);
  syncDisks();

  // 6. incremental (the issue's stretch target): `snapshot --incremental` right after a first
  // one (untimed, in each run's prep), with 3 % of the KV pages changed and 5 memory notes
  // edited, against the full snapshot measured above; then the same with 3 % of the rows of the
  // WAL database updated too. Each run's changes are undone byte for byte in its after().
  if (!memsnapSkip && memSnap.ok) {
    const incStore = path.join(BENCH, "inc-store");
    const incCache = path.join(path.dirname(configFile), ".memsnap");
    const incArgv = memsnap("snapshot", "--config", rel(configFile), "--store", rel(incStore), "--incremental", "--json");
    for (const [what, sqlite] of [["incremental snapshot", false], ["incremental (+ SQLite rows)", true]]) {
      log(what);
      let change = null;
      const spec = {
        argv: incArgv,
        display: `${cliCmd} snapshot --config ${rel(configFile)} --store ${rel(incStore)} --incremental --json`,
        captureStdout: true, sampleRss: true,
        prep: () => {
          fs.rmSync(incStore, { recursive: true, force: true });
          for (const f of fs.existsSync(incCache) ? fs.readdirSync(incCache) : []) if (f.startsWith("incremental-")) fs.rmSync(path.join(incCache, f), { force: true });
          tidyMix(mix, true);
          rewarm();
          runChecked(incArgv, { cwd: ROOT });
          change = changeMix(mix.dir, { share: 0.03, notes: 5, sqlite, tmpDir: ctx.tmp });
          rewarm();
        },
        after: () => {
          change?.undo();
          change = null;
          fs.rmSync(incStore, { recursive: true, force: true });
        },
      };
      const [inc] = await measureAlternating(ctx, spec);
      inc.json = parseJsonOut(inc, what, ctx);
      memsnapJson[what] = inc.json;
      if (!inc.ok) failures.push(`memsnap ${what} failed: ${failureText(inc)}`);
      const refd = inc.json?.incremental;
      if (refd) ctx.notes.add(`${what}: ${refd.referenced} artifact(s) referenced (${fmtBytes(refd.referenced_bytes)}), bundle ${fmtBytes(inc.json.bundle_bytes)}; changed: 3 % of the KV pages (256 bytes in each), 5 memory notes${sqlite ? ", 3 % of the rows of db/memory.db (WAL)" : ""}; its baseline is memsnap's own full snapshot above`);
      addRow({ op: what, baseline: memSnap, memsnap: inc, bytes: mixBytes, bytesOf: "mix", maxRatio: null, perfRatio: sqlite ? null : 0.3, vsSelf: true });
    }
    for (const f of fs.existsSync(incCache) ? fs.readdirSync(incCache) : []) if (f.startsWith("incremental-")) fs.rmSync(path.join(incCache, f), { force: true });
  }

  // ---------------------------------------------------------------------------------------------
  // table
  const header = ["operation", "memsnap s", "baseline s", "ratio", "memsnap MB/s", "baseline MB/s", "peak RSS memsnap", "peak RSS baseline", "target", "status", "perf target", "perf status"];
  const RIGHT = [false, true, true, true, true, true, true, true, false, false, false, false];
  const tableRows = [];
  const rowData = [];
  for (const r of rows) {
    const m = r.memsnap;
    const b = r.baseline;
    const ratio = m.ok && b.ok && b.seconds > 0 ? m.seconds / b.seconds : null;
    const mbps = m.ok && r.bytes ? r.bytes / MB / m.seconds : null;
    const baseMbps = b.ok && r.bytes ? r.bytes / MB / b.seconds : null;
    const target = r.maxRatio == null ? `RSS ≤ ${RSS_TARGET_MIB} MiB` : `≤ ${r.maxRatio.toFixed(1)}×, RSS ≤ ${RSS_TARGET_MIB} MiB`;
    let status;
    const missed = [];
    if (!m.ok) status = m.skipped ? "n/a" : "FAILED";
    else if (!b.ok) status = "baseline FAILED";
    else {
      if (r.maxRatio != null && ratio > r.maxRatio) missed.push("time");
      if (m.rssKiB != null && m.rssKiB / 1024 > RSS_TARGET_MIB) missed.push("RSS");
      status = missed.length ? `MISS (${missed.join(", ")})` : "ok";
    }
    // The performance issue's targets (time ratio; RSS as above), where it sets one.
    const perfTarget = r.perfRatio == null ? "—" : `≤ ${fmtPerfRatio(r.perfRatio)}`;
    let perfStatus = "—";
    if (r.perfRatio != null) {
      if (!m.ok || !b.ok) perfStatus = status;
      else perfStatus = ratio > r.perfRatio || (m.rssKiB != null && m.rssKiB / 1024 > RSS_TARGET_MIB) ? `MISS (${ratio > r.perfRatio ? "time" : "RSS"})` : "ok";
    }
    tableRows.push([
      r.op,
      m.ok ? fmtS(m.seconds) : "—",
      b.ok ? fmtS(b.seconds) : "FAILED",
      fmtRatio(ratio),
      fmtMBs(mbps),
      fmtMBs(baseMbps),
      m.ok ? fmtRss(m.rssKiB) : "—",
      b.ok ? fmtRss(b.rssKiB) : "—",
      target,
      status,
      perfTarget,
      perfStatus,
    ]);
    rowData.push({
      op: r.op,
      ...(r.vsSelf ? { vsSelf: true } : {}),
      status,
      ratio,
      target: { maxTimeRatio: r.maxRatio, maxRssMiB: RSS_TARGET_MIB },
      perfTarget: { maxTimeRatio: r.perfRatio ?? null, maxRssMiB: RSS_TARGET_MIB, status: perfStatus },
      throughputBytes: r.bytes,
      throughputOf: r.bytesOf,
      memsnap: m.skipped
        ? { ok: false, skipped: m.skipped }
        : { ok: m.ok, command: m.display, seconds: m.seconds, runs: m.allSeconds, cpuSeconds: m.cpuSeconds, foreignCpuSeconds: m.foreignCpuSeconds, rssKiB: m.rssKiB, rssSampledPeakKiB: m.rssCurve?.sampledPeakKiB ?? null, mbPerS: mbps, error: m.ok ? undefined : failureText(m) },
      baseline: { ok: b.ok, command: b.display, seconds: b.seconds, runs: b.allSeconds, cpuSeconds: b.cpuSeconds, foreignCpuSeconds: b.foreignCpuSeconds, rssKiB: b.rssKiB, mbPerS: baseMbps, error: b.ok ? undefined : failureText(b) },
    });
  }

  const machine = machineInfo();
  // Other processes competing for the CPUs make wall times noisy; say so.
  const foreignShare = ctx.foreign.wall > 0 ? ctx.foreign.cpu / (ctx.foreign.wall * machine.nproc) : 0;
  const contention = { foreignCpuSeconds: Math.round(ctx.foreign.cpu * 100) / 100, measuredWallSeconds: Math.round(ctx.foreign.wall * 100) / 100, share: Math.round(foreignShare * 1000) / 1000 };
  if (foreignShare > 0.05)
    ctx.notes.add(`other processes (and kernel writeback) used ${contention.foreignCpuSeconds} CPU-s during the ${contention.measuredWallSeconds} s of measured commands (${(100 * foreignShare).toFixed(0)} % of the machine): wall times are noisy, rerun on an idle machine`);
  const layerHeader = ["layer", "source", "mix dir", "restored to", "check", "result"];
  const layerRows = (restoreCheck.memsnap?.layers ?? []).map((l) => [l.name, l.kind, `${l.source}/`, `${l.restored}/`, l.check, `${l.ok ? "ok" : "MISMATCH"}: ${l.text}`]);
  const lines = [];
  lines.push("");
  lines.push(`memsnap bench — scale ${opts.scale} (${fmtBytes(mixBytes)}, ${mix.manifest.count} files), seed ${opts.seed}, ${opts.runs} run(s) per command (median), page cache: ${cacheMode}`);
  lines.push(`machine: ${machine.nproc} CPUs (${machine.cpu}), ${machine.memGiB} GiB RAM, node ${machine.node}`);
  lines.push(`mix: ${classLine(mix.summary)}`);
  lines.push("");
  lines.push(textTable(header, tableRows, RIGHT));
  lines.push("");
  lines.push("baselines:");
  for (const r of rows) lines.push(`  ${r.op.padEnd(16)} ${r.baseline.display}`);
  lines.push(`memsnap sources: ${config.sources.map((s) => `${s.name}=${s.kind}`).join(", ")}`);
  lines.push("MB/s = 10^6 bytes per second of the mix (uncompressed) for snapshot, verify (key) and restore; of the bundle for verify (no key).");
  lines.push(`cpu s (user+sys): ${rows.map((r) => `${r.op} memsnap ${r.memsnap.cpuSeconds ?? "—"} / baseline ${r.baseline.cpuSeconds ?? "—"}`).join("; ")}`);
  lines.push("ratio = memsnap seconds / baseline seconds (verify (no key) ≤ 1.0× means at least sha256sum's speed). Peak RSS of a pipeline = its largest process.");
  const sizeLine =
    `sizes: mix ${fmtBytes(sizes.mix)}; baseline archive ${fmtBytes(sizes.baseline)}` +
    (sizes.baseline ? ` (${((100 * sizes.baseline) / sizes.mix).toFixed(1)} % of mix)` : "") +
    `; memsnap bundle ${sizes.memsnap == null ? "—" : fmtBytes(sizes.memsnap)}` +
    (sizes.memsnap && sizes.baseline ? ` (${((100 * sizes.memsnap) / sizes.mix).toFixed(1)} % of mix, ${(sizes.memsnap / sizes.baseline).toFixed(3)}× the baseline archive; perf target ≤ ${PERF_BUNDLE_MAX}×: ${sizes.memsnap / sizes.baseline <= PERF_BUNDLE_MAX ? "ok" : "MISS"})` : "");
  lines.push(sizeLine);
  const checkLine = `restore check: baseline ${restoreCheck.baseline?.text ?? "—"}; memsnap ${restoreCheck.memsnap?.text ?? "—"}`;
  lines.push(checkLine);
  if (layerRows.length) {
    lines.push("");
    lines.push(textTable(layerHeader, layerRows));
  }

  const through = {};
  for (const [k, v] of Object.entries(memsnapJson)) {
    const p = passthrough(v);
    if (p) through[k] = p;
  }
  // The snapshot's own redaction timing overlaps packing (lookahead), so measure the stage alone.
  const redactionMBs = memsnapSkip ? null : await measureRedaction(mix.dir).catch((e) => { ctx.notes.add(`redaction measure failed: ${e.message}`); return null; });
  lines.push("");
  if (redactionMBs != null) lines.push(`memsnap redaction (stage alone, one thread, over the mix's markdown + JSON/JSONL): ${redactionMBs} MB/s`);
  // Throughput per stage, each alone on one thread, next to the pipeline's tool for it.
  let stages = null;
  if (!memsnapSkip) {
    log("measuring each stage alone (one thread, warm page cache)");
    stages = await measureStages({
      root: ROOT, tmpDir: BENCH, level: config.compression?.level ?? 3, redaction: redactionMBs,
      age: { recipient, keyFile }, classes: stageClasses(mix.dir),
    }).catch((e) => { ctx.notes.add(`stage measure failed: ${e.message}`); return null; });
  }
  const stageRows = stages ? stageTable(stages) : null;
  if (stageRows) {
    lines.push("");
    lines.push("throughput per stage (each alone, one thread, same bytes for memsnap's engine and the pipeline's tool):");
    lines.push(textTable(stageRows.header, stageRows.body, stageRows.right));
  }
  for (const [k, v] of Object.entries(through)) lines.push(`memsnap ${k}: ${JSON.stringify(v)}`);
  for (const n of ctx.notes) lines.push(`note: ${n}`);
  if (mix.genSeconds != null) lines.push(`mix generated in ${mix.genSeconds.toFixed(2)} s`);
  if (failures.length) {
    lines.push("");
    lines.push("FAILURES:");
    for (const f of failures) lines.push(`  - ${f}`);
  }
  console.log(lines.join("\n"));

  // ---------------------------------------------------------------------------------------------
  // report
  if (opts.report) {
    const tableMd = markdownTable(header, tableRows, RIGHT);
    const reproduce = `npm ci && npm run build && node scripts/bench.mjs --scale ${opts.scale} --seed ${opts.seed}${opts.runs > 1 ? ` --runs ${opts.runs}` : ""}${opts.cold ? " --cold" : ""} --report`;
    const md = [];
    md.push("# memsnap benchmark");
    md.push("");
    md.push(`- date: ${new Date().toISOString()}`);
    md.push(`- machine: \`nproc\` = ${machine.nproc} (${machine.cpu}), ${machine.memGiB} GiB RAM, ${machine.os}`);
    md.push(`- node ${machine.node}; ${Object.values(machine.tools).filter(Boolean).join("; ")}`);
    md.push(`- mix: scale ${opts.scale}, seed ${opts.seed}, generator v${mix.summary?.version ?? "?"}, ${fmtBytes(mixBytes)} in ${mix.manifest.count} files (${classLine(mix.summary)})`);
    md.push(`- memsnap sources: ${config.sources.map((s) => `\`${s.name}\` (${s.kind})`).join(", ")}`);
    md.push(`- runs per command: ${opts.runs} (median); page cache: ${cacheMode}`);
    md.push(`- reproduce: \`${reproduce}\``);
    md.push("");
    md.push(tableMd);
    md.push("");
    md.push("![throughput, time ratio and RSS](report.svg)");
    md.push("");
    if (stageRows) {
      md.push(STAGES_INTRO);
      md.push("");
      md.push(markdownTable(stageRows.header, stageRows.body, stageRows.right));
      md.push("");
    }
    if (layerRows.length) {
      md.push("Restore check of memsnap, per layer (`restore --to OUT` puts each layer in its own directory):");
      md.push("");
      md.push(markdownTable(layerHeader, layerRows));
      md.push("");
    }
    md.push("Baselines:");
    md.push("");
    for (const r of rows) md.push(`- ${r.op}: \`${r.baseline.display}\``);
    md.push("");
    md.push("Notes:");
    md.push("");
    md.push("- MB/s = 10^6 bytes/s of the uncompressed mix (snapshot, verify (key), restore) or of the bundle (verify (no key)).");
    md.push("- ratio = memsnap time / baseline time; targets: snapshot ≤ 1.3×, restore ≤ 1.3×, verify without key at least sha256sum's speed (≤ 1.0×), peak RSS ≤ 200 MiB. Perf targets (the performance issue): snapshot ≤ 1.0×, restore ≤ 1.0×, verify without key ≥ 1.5× sha256sum's speed (≤ 0.67×), verify with key ≤ 1.0×, the bundle ≤ 0.95× the baseline archive, the same RSS bound.");
    md.push("- Peak RSS from `/usr/bin/time -f '%e %M'`; for a `bash -c` pipeline it is the largest process of the pipeline, not the sum. The RSS curves in the chart are the summed VmRSS of memsnap's process tree (node and any git/sqlite3 children), sampled every 50 ms.");
    md.push("- Neither baseline fsyncs its output; untimed `sync` runs between commands.");
    md.push(`- CPU seconds (user+sys, memsnap / baseline): ${rows.map((r) => `${r.op} ${r.memsnap.cpuSeconds ?? "—"} / ${r.baseline.cpuSeconds ?? "—"}`).join("; ")}`);
    md.push(`- ${sizeLine}`);
    md.push(`- ${checkLine}`);
    if (redactionMBs != null) md.push(`- memsnap redaction: ${redactionMBs} MB/s`);
    for (const [k, v] of Object.entries(through)) md.push(`- memsnap ${k}: \`${JSON.stringify(v)}\``);
    for (const n of ctx.notes) md.push(`- ${n}`);
    if (failures.length) {
      md.push("");
      md.push("Failures:");
      md.push("");
      for (const f of failures) md.push(`- ${f.replace(/\n\s*/g, " / ")}`);
    }
    fs.writeFileSync(path.join(BENCH, "report.md"), md.join("\n") + "\n");
    const rss = {};
    for (const [k, c] of Object.entries(rssCurves)) rss[k] = { intervalMs: RSS_SAMPLE_MS, seconds: c.seconds, peakKiB: c.peakKiB, sampledPeakKiB: c.sampledPeakKiB, samples: downsample(c.samples, 600) };
    const report = {
      version: 2,
      date: new Date().toISOString(),
      machine,
      params: { scale: opts.scale, seed: opts.seed, runs: opts.runs, cache: cacheMode },
      mix: { bytes: mixBytes, files: mix.manifest.count, digest: mix.manifest.digest, generatedSeconds: mix.genSeconds, summary: mix.summary },
      sources: config.sources.map((s) => ({ ...s, [s.store ? "store" : "path"]: path.relative(mix.dir, s.store ?? s.path) || "." })),
      targets: { snapshotMaxRatio: 1.3, restoreMaxRatio: 1.3, verifyNoKeyMaxRatio: 1.0, maxRssMiB: RSS_TARGET_MIB },
      perfTargets: { snapshotMaxRatio: 1.0, restoreMaxRatio: 1.0, verifyNoKeyMaxRatio: 1 / 1.5, verifyKeyMaxRatio: 1.0, bundleMaxRatio: PERF_BUNDLE_MAX, maxRssMiB: RSS_TARGET_MIB },
      rows: rowData,
      table: { header, rows: tableRows, markdown: tableMd },
      stages: stages ? { rows: stages, intro: STAGES_INTRO, markdown: markdownTable(stageRows.header, stageRows.body, stageRows.right) } : null,
      reproduce,
      rss,
      sizes,
      restoreCheck,
      contention,
      memsnap: { available: !memsnapSkip, skipped: memsnapSkip, redactionMBPerS: redactionMBs ?? null, passthrough: through, json: compact(memsnapJson) },
      notes: [...ctx.notes],
      failures,
      ok: failures.length === 0,
    };
    fs.writeFileSync(path.join(BENCH, "report.json"), JSON.stringify(report, null, 2) + "\n");
    fs.writeFileSync(path.join(BENCH, "report.svg"), renderSvg(report));
    log(`wrote ${["report.md", "report.json", "report.svg"].map((f) => rel(path.join(BENCH, f))).join(", ")}`);
    if (opts.readme) {
      const r = updateReadme(report, { root: ROOT, svgFrom: path.join(BENCH, "report.svg") });
      log(`updated ${rel(r.readme)} (${README_START} … ${README_END}) and ${rel(r.svg)}`);
    }
  }

  for (const p of [outDir, restoreBase, restoreMemsnap]) drop(p);
  fs.rmSync(tmp, { recursive: true, force: true });
  log(`done in ${((Date.now() - t0) / 1000).toFixed(1)} s${failures.length ? ` with ${failures.length} failure(s)` : ""}`);
  return failures.length ? 1 : 0;
}

function summarizeCheck(c, where) {
  if (c.ok) return { ok: true, text: `ok (${where}: every mix file present with identical bytes${c.extra.length ? `; ${c.extra.length} extra file(s)` : ""})`, extra: c.extra.slice(0, 20) };
  return {
    ok: false,
    text: `MISMATCH in ${where}: ${c.missing.length} missing, ${c.mismatched.length} different (e.g. ${[...c.missing, ...c.mismatched].slice(0, 3).join(", ")})`,
    missing: c.missing.slice(0, 50),
    mismatched: c.mismatched.slice(0, 50),
  };
}

/** The mix's files in three classes of data: text (JSONL traces, notes), SQLite databases, KV-cache pages. */
function stageClasses(dir) {
  const files = listFiles(dir).sort();
  const abs = (f) => path.join(dir, f);
  return {
    text: files.filter((f) => /^(traces|memory)\/.*\.(jsonl|md)$/.test(f)).map(abs),
    sqlite: files.filter((f) => /^db\/.*\.db$/.test(f)).map(abs),
    kv: files.filter((f) => /^kv\/.*\.bin$/.test(f)).map(abs),
  };
}

const STAGES_INTRO = "Throughput per stage: each stage alone on one thread over up to 128 MiB of each class of the mix (text, SQLite, KV pages), memsnap's engine (zstd-napi in 2 MiB frames, each at the level memsnap's policy picks for it, node:crypto SHA-256, age STREAM chunks through native/aead, the redactor) next to the tool that does the same stage in the pipeline, on the same bytes. memsnap runs these stages on two cores at once (payload worker, bundle sink, main thread); the operation rows above are what that adds up to.";

function classLine(summary) {
  if (!summary?.classes) return "";
  return Object.entries(summary.classes)
    .map(([k, c]) => `${k} ${fmtBytes(c.bytes)}`)
    .join(", ");
}

// `--store s3://…`: the object-store comparison (scripts/bench-s3.mjs) instead of the pipeline one.
// `--home`: the realistic agent home (scripts/bench-home.mjs).
// `--incremental`: what an incremental snapshot stores after small changes (scripts/bench-incremental.mjs).
const run = process.argv.includes("--store")
  ? import("./bench-s3.mjs").then(() => new Promise(() => {}))
  : process.argv.includes("--home")
    ? import("./bench-home.mjs").then((m) => m.main(process.argv.slice(2)))
    : process.argv.includes("--incremental")
      ? import("./bench-incremental.mjs").then(() => new Promise(() => {}))
      : main();
run.then(
  (code) => process.exit(code),
  (e) => {
    console.error(`bench: ${e.stack || e.message}`);
    process.exit(1);
  },
);
