#!/usr/bin/env node
// Fuzz the bundle's parsers for a while (after `npm run build`): the manifest parser, the
// payload tar scanner and the container reader, on random and mutated inputs seeded by every
// bundle in fixtures/golden and fixtures/hostile (scripts/lib/fuzz-harness.mjs; the test suite
// runs the same harness for a few seconds in test/format/fuzz.test.ts).
//
//   node scripts/fuzz.mjs [MINUTES=1] [--seed N] [--out DIR] [--hang-seconds S=30] [--max-rss-mib M=1536]
//
// The fuzzer runs in a worker thread; the main thread is a watchdog: a case that runs past
// --hang-seconds is a hang. On any failure (an error that is not a MemsnapError, MEMSNAP_INTERNAL,
// a missing hint, an input slower than 2 s, RSS over the bound, a hang) the input is written to
// DIR (default ./fuzz-failures) with its target and seed, and the exit code is 1.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isMainThread, parentPort, Worker, workerData } from "node:worker_threads";
import { caseSeedOf, fileSeeds, fuzz, makeCase, seedsOf, TARGETS } from "./lib/fuzz-harness.mjs";

const root = new URL("../", import.meta.url).pathname;
const seedDirs = [join(root, "fixtures", "golden"), join(root, "fixtures", "hostile")];

if (!isMainThread) {
  const [{ parseManifest, checkSeal }, { isMemsnapError }] = await Promise.all([import("../dist/format/manifest.js"), import("../dist/errors.js")]);
  const { readLayout } = await import("../dist/format/container.js");
  const { TarScanner } = await import("../dist/read/tar-scan.js");
  const api = { parseManifest, checkSeal, TarScanner, readLayout, isMemsnapError };
  const { seed, endAt, scratch, maxRssBytes, shared } = workerData;
  const cur = new Float64Array(shared); // [case index, case seed, start time]
  try {
    const r = await fuzz(api, {
      seed, bundles: fileSeeds(seedDirs), scratch, maxRssBytes, until: () => Date.now() < endAt,
      onCase: (i, s) => { cur[0] = i; cur[1] = s; cur[2] = Date.now(); },
      onProgress: (i, counts, rss) => { if (i % 8192 === 0) parentPort.postMessage({ progress: { i, counts, rss } }); },
    });
    parentPort.postMessage({ done: r });
  } catch (e) {
    parentPort.postMessage({ failure: { message: String(e?.message ?? e), stack: String(e?.stack ?? ""), target: e?.target ?? null, seed: e?.seed ?? null, input: e?.input ?? null } });
  }
} else {
  const args = process.argv.slice(2);
  const opt = (name, dflt) => {
    const i = args.indexOf(name);
    if (i < 0) return dflt;
    const v = args[i + 1];
    args.splice(i, 2);
    return v;
  };
  const seed = Number(opt("--seed", String(Date.now() % 2 ** 31)));
  const out = opt("--out", join(process.cwd(), "fuzz-failures"));
  const hangMs = Number(opt("--hang-seconds", "30")) * 1000;
  const maxRssBytes = Number(opt("--max-rss-mib", "1536")) * 2 ** 20;
  const minutes = Number(args[0] ?? 1);
  if (!(minutes > 0) || !Number.isSafeInteger(seed)) {
    process.stderr.write("usage: node scripts/fuzz.mjs [MINUTES] [--seed N] [--out DIR] [--hang-seconds S] [--max-rss-mib M]\n");
    process.exit(2);
  }
  const scratchDir = mkdtempSync(join(tmpdir(), "memsnap-fuzz-"));
  const shared = new SharedArrayBuffer(24);
  const cur = new Float64Array(shared);
  const t0 = Date.now();
  const save = (f) => {
    mkdirSync(out, { recursive: true });
    const base = join(out, `${f.target ?? "unknown"}-${f.seed ?? "x"}`);
    if (f.input) writeFileSync(`${base}.bin`, Buffer.from(f.input));
    writeFileSync(`${base}.txt`, `${f.message}\n\nrun seed ${seed}; replay: node scripts/fuzz.mjs 1 --seed ${seed}\n\n${f.stack}\n`);
    return base;
  };
  process.stdout.write(`fuzz: seed ${seed}, ${minutes} min, targets ${TARGETS.join(", ")}\n`);
  const worker = new Worker(new URL(import.meta.url), { workerData: { seed, endAt: t0 + minutes * 60_000, scratch: join(scratchDir, "c.memsnap"), maxRssBytes, shared } });
  let finished = false;
  const watchdog = setInterval(() => {
    if (finished || cur[2] === 0 || Date.now() - cur[2] < hangMs) return;
    finished = true;
    const i = cur[0];
    const caseSeed = caseSeedOf(seed, i);
    const { target, input } = makeCase(seedsOf(fileSeeds(seedDirs)), i, caseSeed);
    const base = save({ message: `hang: case ${i} (${TARGETS[target]}) ran past ${hangMs / 1000} s`, target: TARGETS[target], seed: caseSeed, input, stack: "" });
    process.stdout.write(`FAIL hang in ${TARGETS[target]} (case ${i}); input saved as ${base}.bin\n`);
    void worker.terminate().then(() => { rmSync(scratchDir, { recursive: true, force: true }); process.exit(1); });
  }, 1000);
  worker.on("message", (m) => {
    if (m.progress) {
      const { i, counts, rss } = m.progress;
      process.stdout.write(`  ${Math.round((Date.now() - t0) / 1000)} s: ${i} inputs, RSS ${Math.round(rss / 2 ** 20)} MiB, ${JSON.stringify(counts)}\n`);
    } else if (m.done) {
      finished = true;
      clearInterval(watchdog);
      process.stdout.write(`ok: ${m.done.runs} inputs in ${Math.round((Date.now() - t0) / 1000)} s, no failure: ${JSON.stringify(m.done.counts)}\n`);
      process.exitCode = 0;
    } else if (m.failure) {
      finished = true;
      clearInterval(watchdog);
      const base = save(m.failure);
      process.stdout.write(`FAIL ${m.failure.message}\ninput saved as ${base}.bin\n`);
      process.exitCode = 1;
    }
  });
  worker.on("error", (e) => {
    finished = true;
    clearInterval(watchdog);
    process.stdout.write(`FAIL the fuzzer's worker died: ${e?.stack ?? e}\n`);
    process.exitCode = 1;
  });
  worker.on("exit", () => {
    clearInterval(watchdog);
    rmSync(scratchDir, { recursive: true, force: true });
  });
}
