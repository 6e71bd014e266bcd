#!/usr/bin/env node
/**
 * bench-pfimg-stream.mjs — what ProcessFork blobs framed by a streaming compressor cost (issue #38
 * item 4): the same store twice, its 142 blobs once as one-shot zstd frames (the header declares
 * the content size) and once as streaming frames (no content size: `zstd` reading a pipe), each
 * through `memsnap snapshot`, `restore --to` and `verify --deep`, alternating, in the same run.
 *
 *   node scripts/bench-pfimg-stream.mjs [--runs N] [--cli PATH] [--keep] [--json]
 *
 * Prints a table of the median wall and CPU seconds (user + system, GNU time) of each command on
 * each store, their ratio, the CPU's name and whether it has SHA extensions (sha_ni/sha2 in
 * /proc/cpuinfo). Needs a build (bin/memsnap.js runs dist/) and /usr/bin/time for the CPU column.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { generatePfimgStore } from "./lib/gen-pfimg.mjs";
import { fmtS, machineInfo, textTable, timedRun } from "./lib/measure.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(import.meta.url);
const zstd = require("zstd-napi");
const binding = require("zstd-napi/binding");

function args() {
  const o = { runs: 3, cli: path.join(ROOT, "bin", "memsnap.js"), keep: false, json: false };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    if (a[i] === "--runs") o.runs = Number(a[++i]);
    else if (a[i] === "--cli") o.cli = path.resolve(a[++i]);
    else if (a[i] === "--keep") o.keep = true;
    else if (a[i] === "--json") o.json = true;
    else throw new Error(`unknown argument ${a[i]}`);
  }
  return o;
}

/** `bytes` as a streaming zstd frame (no content size): `zstd -3` reading a pipe, else the binding streamed. */
function streamFrame(bytes, haveCli) {
  if (haveCli) {
    const r = spawnSync("zstd", ["-q", "-3", "-c"], { input: bytes, maxBuffer: 1 << 30 });
    if (r.status === 0) return r.stdout;
  }
  const c = new binding.CCtx();
  c.setParameter(binding.CParameter.compressionLevel, 3);
  c.setParameter(binding.CParameter.checksumFlag, 1);
  const out = Buffer.alloc(binding.compressBound(bytes.length) + 64);
  // A first call that does not end the frame: zstd cannot know the size, so the header leaves it out.
  let [, w, r] = c.compressStream2(out, bytes, binding.EndDirective.continue);
  let pos = w;
  for (;;) {
    const [left, w2] = c.compressStream2(out.subarray(pos), bytes.subarray(r), binding.EndDirective.end);
    pos += w2;
    r = bytes.length;
    if (left === 0) return out.subarray(0, pos);
  }
}

function blobFiles(root) {
  const out = [];
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith(".zst")) out.push(p);
    }
  };
  walk(path.join(root, "blobs"));
  return out;
}

function cpuFacts() {
  let flags = "";
  try {
    flags = fs.readFileSync("/proc/cpuinfo", "utf8");
  } catch {
    /* not Linux */
  }
  return { cpu: machineInfo().cpu, shaExtensions: /\b(sha_ni|sha2)\b/.test(flags), nproc: os.cpus().length };
}

const median = (xs) => {
  const s = xs.filter((x) => x != null).sort((a, b) => a - b);
  return s.length ? s[Math.floor((s.length - 1) / 2)] : null;
};

async function main() {
  const o = args();
  const work = fs.mkdtempSync(path.join(os.tmpdir(), "memsnap-bench-pfstream-"));
  const haveCli = spawnSync("zstd", ["--version"]).status === 0;
  try {
    // 45 pages × K/V of 64 KiB, 4 forks: 142 blobs (the store had 142).
    const sized = path.join(work, "sized", "store");
    const g = generatePfimgStore({
      root: sized, pages: 45, forks: 4, zeroPages: 0, nLayers: 4, nHeads: 8, headDim: 64,
    });
    const streamed = path.join(work, "streamed", "store");
    fs.cpSync(sized, streamed, { recursive: true, preserveTimestamps: true });
    let noSize = 0;
    for (const f of blobFiles(streamed)) {
      const st = fs.statSync(f);
      const frame = streamFrame(zstd.decompress(fs.readFileSync(f)), haveCli);
      if (binding.getFrameContentSize(frame) === null) noSize++;
      fs.writeFileSync(f, frame);
      fs.utimesSync(f, st.atime, st.mtime);
    }
    const sizedBlobs = blobFiles(sized);
    const declared = sizedBlobs.filter((f) => binding.getFrameContentSize(fs.readFileSync(f)) !== null).length;
    if (noSize !== g.blobs || declared !== g.blobs) {
      throw new Error(`framing: ${declared}/${g.blobs} one-shot frames declare their size, ${noSize} streamed do not`);
    }
    const stores = { sized, streamed };
    for (const [k, s] of Object.entries(stores)) {
      fs.writeFileSync(path.join(path.dirname(s), "memsnap.json"), JSON.stringify({
        agent: `pf-${k}`, sources: [{ kind: "pfimg", name: "pf", store: "store" }],
      }));
    }
    const times = {};
    const record = (k, step, r) => {
      if (!r.ok) throw new Error(`${k} ${step} failed (${r.code}): ${r.stderr.slice(-2000)}`);
      ((times[k] ??= {})[step] ??= []).push(r);
    };
    const cli = (argv, cwd) => timedRun([process.execPath, o.cli, ...argv], { cwd, tmpDir: work });
    for (let run = 0; run < o.runs; run++) {
      for (const [k, s] of Object.entries(stores)) {
        const home = path.dirname(s);
        const bundle = path.join(work, `${k}-${run}.memsnap`);
        record(k, "snapshot", await cli(["snapshot", "-c", path.join(home, "memsnap.json"), "--out", bundle], home));
        const to = path.join(work, `${k}-${run}-restored`);
        record(k, "restore", await cli(["restore", bundle, "--to", to], work));
        record(k, "verify --deep", await cli(["verify", bundle, "--deep"], work));
        fs.rmSync(to, { recursive: true, force: true });
        fs.rmSync(bundle, { force: true });
      }
    }
    const facts = cpuFacts();
    const rows = [];
    const result = {
      blobs: g.blobs, blob_bytes: g.blobBytes, runs: o.runs, ...facts,
      framer: haveCli ? "zstd -3 (pipe)" : "zstd-napi streamed", steps: {},
    };
    for (const step of ["snapshot", "restore", "verify --deep"]) {
      const m = (k, f) => median(times[k][step].map((r) => r[f]));
      const a = { wall: m("sized", "seconds"), cpu: m("sized", "cpuSeconds") };
      const b = { wall: m("streamed", "seconds"), cpu: m("streamed", "cpuSeconds") };
      result.steps[step] = { sized: a, streamed: b };
      const ratio = (x, y) => (x && y ? `${(y / x).toFixed(2)}×` : "—");
      rows.push([
        step, fmtS(a.wall), fmtS(b.wall), ratio(a.wall, b.wall), fmtS(a.cpu), fmtS(b.cpu), ratio(a.cpu, b.cpu),
      ]);
    }
    if (o.json) {
      process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    } else {
      process.stdout.write(`${g.blobs} ProcessFork blobs (${(g.blobBytes / 2 ** 20).toFixed(1)} MiB stored), ` +
        `median of ${o.runs} run(s); streamed frames by ${result.framer}\n`);
      const sha = facts.shaExtensions ? "yes" : "no";
      process.stdout.write(`CPU: ${facts.cpu} (${facts.nproc} cores), SHA extensions: ${sha}\n\n`);
      process.stdout.write(`${textTable(
        ["step", "wall, size declared", "wall, streamed", "ratio", "CPU s, size declared", "CPU s, streamed", "ratio"],
        rows, [false, true, true, true, true, true, true])}\n`);
    }
  } finally {
    if (!o.keep) fs.rmSync(work, { recursive: true, force: true });
    else process.stderr.write(`kept ${work}\n`);
  }
}

main().catch((e) => {
  process.stderr.write(`${e.stack ?? e}\n`);
  process.exit(1);
});
