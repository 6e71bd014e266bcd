#!/usr/bin/env node
/**
 * bench-home.mjs — memsnap on a realistic agent home (issue #38 item 5) vs the pipelines a user
 * would write instead, in one run.
 *
 *   npm run bench -- --home [--scale S] [--runs N] [--seed N] [--workdir DIR] [--regen] [--keep] [--cli PATH]
 *   node scripts/bench-home.mjs [same options]
 *
 * The home (scripts/lib/gen-home.mjs; scale 1 ≈ 861 MiB; cached in WORKDIR/home-<scale>/): a
 * vLLM-style paged KV dump, three SQLite databases of text and float32 embedding BLOBs (one in
 * WAL mode with a hot WAL), a git memdir of ~20k notes and 3k commits, JSONL traces, JSON cursors.
 * `memsnap init` writes its config (one age recipient; redaction as init configures it) and its
 * coverage line must say that it captures every byte. Then, alternating (the order turns each
 * round), N times each, median:
 *
 *   snapshot   memsnap snapshot --out BUNDLE
 *              vs  tar -C HOME -cf - . | zstd -3 -T2 | age -r R > OUT                  (bare)
 *              vs  the same with sha256sum teed on its input and its output            (hashed)
 *   restore    memsnap restore BUNDLE --to DIR   vs   age -d -i K OUT | zstd -d | tar -x -C DIR && sync
 *
 * Targets: bundle ≤ 0.75 × the pipeline's output (KV dedup); snapshot ≤ 0.6 × hashed and, on a CPU
 * with SHA extensions, ≤ 1.0 × bare; restore ≤ 0.9 × the pipeline + sync; memsnap's peak RSS
 * ≤ 200 MiB (its process tree's summed VmRSS sampled every 50 ms, and GNU time's %M). The header
 * names the CPU and whether it has SHA extensions (sha_ni / sha2 in /proc/cpuinfo).
 *
 * Checks (untimed): the pipeline's restore equals the home file for file; memsnap's, per source:
 * files byte-equal (kv, traces, state), SQLite integrity, row counts and .dump equal to a copy of
 * the generated databases (the hot WAL folded in there, never in the home), git HEAD, work tree
 * and status. The home itself must be unchanged at the end (memsnap reads it, never writes it).
 * Exit 0 when everything ran and checked (targets met or not), 1 otherwise.
 */
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { generateHome, GEN_HOME_VERSION } from "./lib/gen-home.mjs";
import { checkRestoredLayers, factsCache } from "./lib/restore-check.mjs";
import {
  bashPipeline, compareTree, fmtBytes, fmtRatio, fmtRss, hashTree, listFiles, machineInfo, markdownTable, runChecked,
  shaExtensions, shq, syncDisks, timedRun, warmTree,
} from "./lib/measure.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const log = (m) => process.stderr.write(`bench-home: ${m}\n`);
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

/** The targets of #38 item 5. */
export const HOME_TARGETS = Object.freeze({ bundle: 0.75, snapshotVsHashed: 0.6, snapshotVsBare: 1.0, restore: 0.9, rssMiB: 200 });

function parseArgs(argv) {
  const o = { scale: 1, runs: 3, seed: 1, workdir: path.join(ROOT, ".bench"), regen: false, keep: false, cli: path.join(ROOT, "bin", "memsnap.js") };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === "--home") continue; // how bench.mjs dispatches here
    else if (a === "--scale") o.scale = Number(val());
    else if (a === "--runs") o.runs = Number(val());
    else if (a === "--seed") o.seed = Number(val());
    else if (a === "--workdir") o.workdir = path.resolve(val());
    else if (a === "--regen") o.regen = true;
    else if (a === "--keep") o.keep = true;
    else if (a === "--cli") o.cli = path.resolve(val());
    else throw new Error(`unknown argument ${a}`);
  }
  if (!(o.scale > 0)) throw new Error("--scale must be a number > 0");
  if (!Number.isInteger(o.runs) || o.runs < 1) throw new Error("--runs must be an integer ≥ 1");
  if (!Number.isInteger(o.seed)) throw new Error("--seed must be an integer");
  return o;
}

/** The home, generated once per scale and seed: { dir, base, refDb, summary, manifest }. */
async function prepareHome(o) {
  const base = path.join(o.workdir, `home-${o.scale}`);
  const dir = path.join(base, "home");
  const doneFile = path.join(base, "done.json");
  let done = null;
  try {
    done = JSON.parse(fs.readFileSync(doneFile, "utf8"));
  } catch {
    /* none */
  }
  const ok = done && done.version === GEN_HOME_VERSION && done.seed === o.seed && done.scale === o.scale && fs.existsSync(dir);
  if (!ok || o.regen) {
    log(`generating the home: scale ${o.scale}, seed ${o.seed} → ${path.relative(ROOT, dir)}`);
    fs.rmSync(base, { recursive: true, force: true });
    fs.mkdirSync(base, { recursive: true });
    const t0 = Date.now();
    const summary = await generateHome({ dir, scale: o.scale, seed: o.seed, log: (m) => log(`  gen: ${m}`) });
    log(`  ${fmtBytes(summary.bytes)} in ${((Date.now() - t0) / 1000).toFixed(1)} s; hashing it`);
    // The restore check opens the databases with sqlite3, which folds a hot WAL into its file:
    // it opens this copy, never the home.
    fs.cpSync(path.join(dir, "db"), path.join(base, "ref", "db"), { recursive: true });
    fs.writeFileSync(path.join(base, "manifest.json"), JSON.stringify(hashTree(dir)));
    done = { version: GEN_HOME_VERSION, seed: o.seed, scale: o.scale, summary };
    fs.writeFileSync(doneFile, JSON.stringify(done, null, 2) + "\n");
  } else log(`reusing the home ${path.relative(ROOT, dir)} (--regen to rebuild)`);
  const manifest = JSON.parse(fs.readFileSync(path.join(base, "manifest.json"), "utf8"));
  return { dir, base, ref: path.join(base, "ref"), summary: done.summary, manifest };
}

/** Removes what memsnap's runs leave in the home (its .memsnap/ lock directory, a read-only connection's -shm). */
function tidyHome(home) {
  const left = listFiles(home.dir).filter((f) => !(f in home.manifest.files) && f !== "memsnap.json");
  for (const f of left) if (/-shm$/.test(f) && f.slice(0, -4) in home.manifest.files) fs.rmSync(path.join(home.dir, f));
  const lock = path.join(home.dir, ".memsnap");
  if (fs.existsSync(lock) && listFiles(lock).length === 0) fs.rmSync(lock, { recursive: true });
  return listFiles(home.dir).filter((f) => !(f in home.manifest.files) && f !== "memsnap.json");
}

/** `memsnap init` on the home; throws unless it finds every shape and captures every byte. */
async function initHome(o, home, recipient, tmp) {
  const cfg = path.join(home.dir, "memsnap.json");
  fs.rmSync(cfg, { force: true });
  const r = await timedRun([process.execPath, o.cli, "init", home.dir, "-r", recipient, "--agent", "home"], { cwd: home.dir, tmpDir: tmp, captureStdout: true });
  if (!r.ok) throw new Error(`memsnap init failed: ${r.stderr}`);
  const line = r.stdout.split("\n").find((l) => l.startsWith("captures ")) ?? "";
  const j = await timedRun([process.execPath, o.cli, "--json", "init", home.dir, "--print", "-r", recipient, "--agent", "home"], { cwd: home.dir, tmpDir: tmp, captureStdout: true });
  const d = JSON.parse(j.stdout);
  const kinds = d.sources.map((s) => `${s.kind}${s.format ?? s.extra?.format ? `:${s.format ?? s.extra.format}` : ""}`).sort();
  const m = /^captures (.+) of (.+)$/.exec(line);
  const problems = [];
  if (!m || m[1] !== m[2]) problems.push(`coverage line "${line}" does not capture everything`);
  if (d.coverage.captured_bytes !== d.coverage.total_bytes || d.left_out.length) problems.push(`left out: ${JSON.stringify(d.left_out).slice(0, 300)}`);
  for (const k of ["git", "kv:paged", "sqlite", "state", "files"]) if (!kinds.includes(k)) problems.push(`no ${k} source`);
  if (kinds.filter((k) => k === "sqlite").length !== 3) problems.push(`${kinds.filter((k) => k === "sqlite").length} sqlite sources, expected 3`);
  if (problems.length) throw new Error(`memsnap init on the home: ${problems.join("; ")}\n${r.stdout}`);
  return { config: cfg, line, sources: d.sources, seconds: r.seconds };
}

/** Runs the benchmark with `argv` (process.argv.slice(2)); resolves to the exit status. */
export async function main(argv) {
  const o = parseArgs(argv);
  const work = path.join(o.workdir, "home-run");
  fs.rmSync(work, { recursive: true, force: true });
  fs.mkdirSync(work, { recursive: true });
  const tmp = path.join(work, "tmp");
  fs.mkdirSync(tmp);
  const home = await prepareHome(o);
  const mixBytes = home.manifest.bytes;
  tidyHome(home);

  const keyFile = path.join(work, "key.txt");
  runChecked(["age-keygen", "-o", keyFile], { stdio: ["ignore", "ignore", "pipe"] });
  const recipient = /^# public key: (age1\S+)$/m.exec(fs.readFileSync(keyFile, "utf8"))[1];
  const init = await initHome(o, home, recipient, tmp);
  log(`memsnap init: ${init.line} (${init.sources.map((s) => `${s.kind} ${s.path}`).join(", ")})`);

  const out = (n) => path.join(work, n);
  const archive = out("pipe.tar.zst.age");
  const archiveH = out("pipe-hashed.tar.zst.age");
  const bundle = out("snap.memsnap");
  const fifoIn = out("in.fifo");
  const fifoOut = out("out.fifo");
  const tarCmd = `tar -C ${shq(home.dir)} -cf - .`;
  const snapshotSpecs = {
    bare: { argv: bashPipeline(`${tarCmd} | zstd -3 -T2 -q | age -r ${shq(recipient)} > ${shq(archive)}`), pre: () => fs.rmSync(archive, { force: true }) },
    // sha256sum on the pipeline's input and output, through FIFOs so that the command waits for both.
    hashed: {
      argv: bashPipeline(`rm -f ${shq(fifoIn)} ${shq(fifoOut)} && mkfifo ${shq(fifoIn)} ${shq(fifoOut)} && ` +
        `{ sha256sum < ${shq(fifoIn)} > ${shq(out("in.sha"))} & sha256sum < ${shq(fifoOut)} > ${shq(out("out.sha"))} & ` +
        `${tarCmd} | tee ${shq(fifoIn)} | zstd -3 -T2 -q | age -r ${shq(recipient)} | tee ${shq(fifoOut)} > ${shq(archiveH)}; ` +
        `s=$?; wait; exit $s; }`),
      pre: () => fs.rmSync(archiveH, { force: true }),
    },
    memsnap: {
      argv: [o.cli, "snapshot", "--config", init.config, "--out", bundle, "--json"],
      pre: () => fs.rmSync(bundle, { force: true }),
      sampleRss: true,
    },
  };
  const restPipe = out("restore-pipe");
  const restMem = out("restore-memsnap");
  const restoreSpecs = {
    pipeline: {
      argv: bashPipeline(`age -d -i ${shq(keyFile)} ${shq(archive)} | zstd -d -q | tar -xf - -C ${shq(restPipe)} && sync`),
      pre: () => fs.mkdirSync(restPipe),
    },
    memsnap: {
      argv: [o.cli, "restore", bundle, "--to", restMem, "-c", init.config, "-i", keyFile, "--json"],
      pre: () => {},
      sampleRss: true,
    },
  };
  const res = {};
  const peak = { sampled: 0, time: 0 };
  let retired = 0;
  const retire = (p) => {
    // Moved aside, not deleted, until the end: creating files among freshly freed inodes is slow
    // on this machine's ext4 (see bench.mjs's restore step).
    if (fs.existsSync(p)) fs.renameSync(p, out(`retired-${retired++}`));
  };
  const measure = async (what, name, spec, round) => {
    spec.pre();
    tidyHome(home);
    syncDisks();
    const r = await timedRun(spec.argv, { cwd: work, tmpDir: tmp, captureStdout: name === "memsnap", sampleRss: spec.sampleRss ? 50 : false });
    if (!r.ok) throw new Error(`${what} (${name}) failed (exit ${r.code}): ${r.stderr.slice(-2000)}`);
    ((res[what] ??= {})[name] ??= []).push({ s: r.seconds, cpu: r.cpuSeconds, foreign: r.foreignCpuSeconds });
    if (name === "memsnap") {
      peak.sampled = Math.max(peak.sampled, r.rssSampledPeakKiB ?? 0);
      peak.time = Math.max(peak.time, r.rssKiB ?? 0);
    }
    log(`${what} ${name} #${round + 1}: ${r.seconds.toFixed(2)} s, ${r.cpuSeconds} CPU-s, foreign ${r.foreignCpuSeconds} CPU-s, ${fmtRss(r.rssKiB)}`);
    return r;
  };
  const order = (names, round) => {
    const k = round % names.length;
    return [...names.slice(k), ...names.slice(0, k)];
  };

  log(`warming the page cache (${fmtBytes(mixBytes)})`);
  await warmTree(home.dir);
  for (let round = 0; round < o.runs; round++) {
    for (const name of order(Object.keys(snapshotSpecs), round)) await measure("snapshot", name, snapshotSpecs[name], round);
  }
  const sizes = { pipeline: fs.statSync(archive).size, hashed: fs.statSync(archiveH).size, memsnap: fs.statSync(bundle).size };
  fs.rmSync(archiveH, { force: true });
  const left = tidyHome(home);
  if (left.length) throw new Error(`memsnap snapshot left files in the home: ${left.slice(0, 5).join(", ")}`);

  const checks = {};
  for (let round = 0; round < o.runs; round++) {
    for (const name of order(Object.keys(restoreSpecs), round)) {
      const dir = name === "pipeline" ? restPipe : restMem;
      retire(dir);
      await measure("restore", name, restoreSpecs[name], round);
      if (round === o.runs - 1) {
        if (name === "pipeline") {
          const c = compareTree(home.manifest, restPipe);
          checks.pipeline = c.ok ? "ok" : `MISMATCH (${c.missing.length} missing, ${c.mismatched.length} different)`;
        } else {
          const layers = [
            { name: "memory", kind: "git", dir: "memory", restored: "memory", check: "git" },
            { name: "kv", kind: "kv", dir: "kv", restored: "kv", check: "bytes" },
            { name: "traces", kind: "files", dir: "traces", restored: "traces", check: "bytes" },
            { name: "state", kind: "state", dir: "state", restored: "state", check: "bytes" },
          ];
          const a = await checkRestoredLayers({ manifest: home.manifest, mixDir: home.dir, outDir: restMem, layers });
          const cache = factsCache(path.join(home.base, "sqlite-facts.json"));
          const b = await checkRestoredLayers({ manifest: home.manifest, mixDir: home.ref, outDir: restMem, layers: [{ name: "db", kind: "sqlite", dir: "db", restored: "db", check: "sqlite" }], cache });
          const all = [...a.layers, ...b.layers];
          for (const l of all) log(`  restore check ${l.name}: ${l.ok ? "ok" : "MISMATCH"} — ${l.text}`);
          // strays: each pass sees the other's directories as strays
          const known = new Set([...layers.map((l) => l.restored), "db", ".memsnap"]);
          const strays = fs.readdirSync(restMem).filter((n) => !known.has(n));
          checks.memsnap = all.every((l) => l.ok) && strays.length === 0 ? "ok" : `MISMATCH (${all.filter((l) => !l.ok).map((l) => l.name).join(", ")}${strays.length ? `; strays ${strays.join(", ")}` : ""})`;
        }
      }
    }
  }
  log("checking that the home is unchanged");
  const after = hashTree(home.dir);
  const changed = Object.keys(home.manifest.files).filter((f) => after.files[f]?.sha256 !== home.manifest.files[f].sha256);
  checks.home = changed.length ? `CHANGED: ${changed.slice(0, 5).join(", ")}` : "unchanged";
  if (!o.keep) for (const n of fs.readdirSync(work)) if (/^retired-|^restore-|\.memsnap$|\.age$/.test(n)) fs.rmSync(out(n), { recursive: true, force: true });

  // report
  const med = (what, name) => median(res[what][name].map((x) => x.s));
  const medCpu = (what, name) => median(res[what][name].map((x) => x.cpu ?? NaN));
  const m = machineInfo();
  const sha = shaExtensions(fs.readFileSync("/proc/cpuinfo", "utf8"));
  const hasSha = sha !== "no";
  const st = (r, t) => (r <= t ? "ok" : "MISS");
  const ratio = (a, b) => a / b;
  const snapM = med("snapshot", "memsnap"), snapB = med("snapshot", "bare"), snapH = med("snapshot", "hashed");
  const restM = med("restore", "memsnap"), restP = med("restore", "pipeline");
  const T = HOME_TARGETS;
  const cpuR = (what, a, b) => fmtRatio(medCpu(what, a) / medCpu(what, b));
  const rss = (kib) => `${(kib / 1024).toFixed(0)} MiB`;
  const rows = [
    ["bundle size vs the pipeline's output (KV dedup)", fmtBytes(sizes.memsnap), fmtBytes(sizes.pipeline), fmtRatio(ratio(sizes.memsnap, sizes.pipeline)), "—", `≤ ${T.bundle.toFixed(2)}×`, st(ratio(sizes.memsnap, sizes.pipeline), T.bundle)],
    ["snapshot vs pipeline + sha256sum in and out", `${snapM.toFixed(2)} s (${medCpu("snapshot", "memsnap")} CPU-s)`, `${snapH.toFixed(2)} s (${medCpu("snapshot", "hashed")} CPU-s)`, fmtRatio(snapM / snapH), cpuR("snapshot", "memsnap", "hashed"), `≤ ${T.snapshotVsHashed.toFixed(2)}×`, st(snapM / snapH, T.snapshotVsHashed)],
    ["snapshot vs bare pipeline", `${snapM.toFixed(2)} s`, `${snapB.toFixed(2)} s (${medCpu("snapshot", "bare")} CPU-s)`, fmtRatio(snapM / snapB), cpuR("snapshot", "memsnap", "bare"), hasSha ? `≤ ${T.snapshotVsBare.toFixed(2)}× (SHA ext.)` : "— (no SHA ext.)", hasSha ? st(snapM / snapB, T.snapshotVsBare) : "n/a"],
    ["restore vs age -d \\| zstd -d \\| tar -x && sync", `${restM.toFixed(2)} s (${medCpu("restore", "memsnap")} CPU-s)`, `${restP.toFixed(2)} s (${medCpu("restore", "pipeline")} CPU-s)`, fmtRatio(restM / restP), cpuR("restore", "memsnap", "pipeline"), `≤ ${T.restore.toFixed(2)}×`, st(restM / restP, T.restore)],
    ["memsnap peak RSS, its process (GNU time %M)", rss(peak.time), "—", "—", "—", `≤ ${T.rssMiB} MiB`, st(peak.time / 1024, T.rssMiB)],
    ["memsnap peak RSS, with its git children (summed, sampled)", rss(peak.sampled), "—", "—", "—", `≤ ${T.rssMiB} MiB`, st(peak.sampled / 1024, T.rssMiB)],
  ];
  const header = `CPU: ${m.cpu} (${m.nproc} cores), SHA extensions: ${sha}; ${m.node}, ${m.tools.zstd}, ${m.tools.age}; ` +
    `home: scale ${o.scale}, ${fmtBytes(mixBytes)} in ${home.manifest.count} files; median of ${o.runs}, alternating`;
  const table = markdownTable(["measure", "memsnap", "pipeline", "ratio", "CPU ratio", "target", ""], rows.map((r) => r.map((c) => String(c).replace(/\\\|/g, "|"))));
  const foreign = Object.values(res).flatMap((x) => Object.values(x).flat()).reduce((a, x) => a + (x.foreign ?? 0), 0);
  process.stdout.write(`${header}\n\n${table}\n\n`);
  process.stdout.write(`init: ${init.line}; restore checks: pipeline ${checks.pipeline}, memsnap ${checks.memsnap}; home after the runs: ${checks.home}\n`);
  process.stdout.write(`runs (s): ${Object.entries(res).map(([w, x]) => `${w} ${Object.entries(x).map(([n, v]) => `${n} ${v.map((y) => y.s.toFixed(2)).join("/")}`).join(", ")}`).join("; ")}\n`);
  process.stdout.write(`other processes burnt ${foreign.toFixed(1)} CPU-s during the measured commands (a shared machine makes the figures noisy)\n`);
  fs.writeFileSync(path.join(work, "report.json"), JSON.stringify({ header, rows, sizes, res, peak, checks, init: init.line, params: o }, null, 2) + "\n");
  const bad = Object.values(checks).some((c) => c !== "ok" && c !== "unchanged");
  return bad ? 1 : 0;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (e) => {
      process.stderr.write(`bench-home: ${e.stack ?? e}\n`);
      process.exit(1);
    },
  );
}
