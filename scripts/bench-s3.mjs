#!/usr/bin/env node
/**
 * bench-s3.mjs — memsnap into an S3-compatible store vs the same commands on a local store, in one run.
 *
 *   npm run bench -- --store s3://BUCKET/PREFIX [--scale S] [--runs N] [--workdir DIR]
 *   node scripts/bench-s3.mjs --store s3://BUCKET/PREFIX [--scale S] [--runs N] [--workdir DIR]
 *
 * Without MEMSNAP_S3_ENDPOINT it starts the loopback Swift + s3api server (scripts/s3-server.mjs) and creates the
 * bucket; with it, it uses that server and the AWS credentials in the environment. On the benchmark mix
 * (scripts/gen-mix.mjs, cached in WORKDIR/mix-<scale>/ as bench.mjs caches it) it alternates, N times each:
 * snapshot into a local store and into the s3 store; restore --to from each. Every command runs under
 * /usr/bin/time (wall clock, peak RSS). Targets (#36): snapshot and restore ≤ 1.2× local, peak RSS ≤ 250 MiB.
 * The machine line names the CPU and whether it has SHA extensions (sha_ni), which SHA-256's speed depends on.
 * What the server gives a client that only counts the bytes (one GET, N ranges in flight, and the CPU each side
 * spends): scripts/bench-s3-get.mjs.
 */
import { CreateBucketCommand, S3Client } from "@aws-sdk/client-s3";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { generateMix } from "./gen-mix.mjs";
import { mixSources } from "./lib/mix-sources.mjs";
import { fmtRatio, fmtRss, machineInfo, syncDisks, textTable, timedRun } from "./lib/measure.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

function parseArgs(argv) {
  const o = { scale: 0.25, runs: 3, workdir: path.join(ROOT, ".bench"), store: null, seed: 1 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => argv[++i];
    if (a === "--store") o.store = val();
    else if (a === "--scale") o.scale = Number(val());
    else if (a === "--runs") o.runs = Number(val());
    else if (a === "--workdir") o.workdir = path.resolve(val());
    else if (a === "--seed") o.seed = Number(val());
    else throw new Error(`unknown argument ${a}`);
  }
  if (!o.store?.startsWith("s3://")) throw new Error("--store s3://BUCKET/PREFIX is required");
  return o;
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const log = (m) => process.stderr.write(`bench-s3: ${m}\n`);

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const bucket = o.store.slice(5).split("/")[0];
  const work = path.join(o.workdir, "s3");
  fs.rmSync(work, { recursive: true, force: true });
  fs.mkdirSync(work, { recursive: true });
  const env = { ...process.env, AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: "true" };
  let server = null;
  if (!env.MEMSNAP_S3_ENDPOINT) {
    const { startSwiftS3 } = await import("./s3-server.mjs");
    log("starting the loopback S3 server (Swift + s3api)");
    server = await startSwiftS3(path.join(work, "server"));
    Object.assign(env, {
      MEMSNAP_S3_ENDPOINT: server.endpoint, AWS_ACCESS_KEY_ID: server.accessKeyId,
      AWS_SECRET_ACCESS_KEY: server.secretAccessKey, AWS_REGION: server.region,
    });
  }
  try {
    const client = new S3Client({
      endpoint: env.MEMSNAP_S3_ENDPOINT, forcePathStyle: true, region: env.AWS_REGION ?? "us-east-1",
      credentials: { accessKeyId: env.AWS_ACCESS_KEY_ID, secretAccessKey: env.AWS_SECRET_ACCESS_KEY },
    });
    await client.send(new CreateBucketCommand({ Bucket: bucket })).catch((e) => {
      if (!/BucketAlready/.test(e?.name ?? "")) throw e;
    });
    client.destroy();

    const mixDir = path.join(o.workdir, `mix-${o.scale}`);
    if (!fs.existsSync(path.join(mixDir, "data"))) {
      log(`generating the mix at scale ${o.scale}`);
      await generateMix({ scale: o.scale, out: path.join(mixDir, "data"), seed: o.seed, log: (m) => log(`  gen: ${m}`) });
    }
    const data = path.join(mixDir, "data");
    const keyFile = path.join(work, "key.txt");
    const cli = path.join(ROOT, "bin", "memsnap.js");
    const kg = await timedRun([process.execPath, cli, "keygen", "-o", keyFile], { cwd: work, tmpDir: work, captureStdout: true });
    if (!kg.ok) throw new Error(`keygen failed: ${kg.stderr}`);
    const recipient = kg.stdout.match(/age1[0-9a-z]+/)[0];
    const config = path.join(work, "memsnap.json");
    fs.writeFileSync(config, JSON.stringify({
      tenant: "bench", agent: "bench", sources: mixSources(data), recipients: [recipient], compression: { level: 3 },
    }, null, 2));
    const local = path.join(work, "store");
    const rows = { snapshot: { local: [], s3: [] }, restore: { local: [], s3: [] } };
    const rss = { local: 0, s3: 0 };
    const run = async (what, where, argv) => {
      syncDisks();
      const r = await timedRun([process.execPath, cli, ...argv], { cwd: work, tmpDir: work, env, captureStdout: true });
      if (!r.ok) throw new Error(`${what} (${where}) failed: ${r.stderr}`);
      rows[what][where].push(r.seconds);
      rss[where] = Math.max(rss[where], r.rssKiB ?? 0);
      log(`${what} ${where}: ${r.seconds.toFixed(2)} s, ${((r.rssKiB ?? 0) / 1024).toFixed(0)} MiB`);
      return r;
    };
    for (let i = 0; i < o.runs; i++) {
      const ids = {};
      for (const where of i % 2 ? ["s3", "local"] : ["local", "s3"]) {
        const store = where === "local" ? local : o.store;
        const r = await run("snapshot", where, ["snapshot", "-c", config, "--store", store, "--json"]);
        ids[where] = JSON.parse(r.stdout).path;
      }
      for (const where of i % 2 ? ["s3", "local"] : ["local", "s3"]) {
        const out = path.join(work, `restore-${where}`);
        fs.rmSync(out, { recursive: true, force: true });
        await run("restore", where, ["restore", ids[where], "--to", out, "-i", keyFile, "--layout", "layers"]);
        fs.rmSync(out, { recursive: true, force: true });
      }
    }
    const m = machineInfo();
    const sha = /\bsha_ni\b/.test(fs.readFileSync("/proc/cpuinfo", "utf8")) ? "with" : "without";
    const table = textTable(["operation", "local s", "s3 s", "s3 / local", "target"], ["snapshot", "restore"].map((w) => {
      const l = median(rows[w].local), s = median(rows[w].s3);
      return [w, l.toFixed(2), s.toFixed(2), fmtRatio(s / l), "≤ 1.20×"];
    }), [false, true, true, true, false]);
    process.stdout.write(`${m.cpu} (${m.nproc} cores, ${sha} SHA extensions), ${m.node}; scale ${o.scale}, `
      + `median of ${o.runs}; S3 server: ${server ? "loopback Swift s3api on the same machine" : env.MEMSNAP_S3_ENDPOINT}\n`);
    process.stdout.write(table + "\n");
    process.stdout.write(`peak RSS: local ${fmtRss(rss.local)}, s3 ${fmtRss(rss.s3)} (target ≤ 250 MiB)\n`);
  } finally {
    await server?.stop();
  }
}

main().catch((e) => {
  process.stderr.write(`bench-s3: ${e.stack ?? e}\n`);
  process.exit(1);
});
