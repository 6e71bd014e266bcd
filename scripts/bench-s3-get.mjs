#!/usr/bin/env node
/**
 * bench-s3-get.mjs — what the S3 server alone gives: GETs of one object, bodies counted and dropped, as one stream
 * and as 8 MiB ranges N at a time, with the CPU each side spent. The bound an s3 restore cannot beat
 * (scripts/bench-s3.mjs measures the restore itself).
 *
 *   node scripts/bench-s3-get.mjs [--mib M] [--reps N] [--parallel 1,2,3,4,6] [--workdir DIR]
 *
 * Without MEMSNAP_S3_ENDPOINT it starts the loopback Swift + s3api server (scripts/s3-server.mjs), uploads M MiB
 * (default 55, about the scale-0.1 bench bundle) of random bytes in 8 MiB parts, as memsnap uploads a bundle, and
 * also reports the CPU seconds its processes spent per GET (from /proc/PID/stat). With MEMSNAP_S3_ENDPOINT it uses
 * that server and the AWS credentials in the environment (bucket memsnap-get-bench, created if missing). The
 * modes alternate, N rounds (default 5); each line gives the best and the median. Client CPU is this process's
 * (node's HTTP client and the SDK; the SDK is loaded before the clock starts).
 */
import { CreateBucketCommand, DeleteObjectCommand, GetObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { Upload } from "@aws-sdk/lib-storage";
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { machineInfo, textTable } from "./lib/measure.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const RANGE = 8 * 2 ** 20;

function parseArgs(argv) {
  const o = { mib: 55, reps: 5, parallel: [1, 2, 3, 4, 6], workdir: path.join(ROOT, ".bench") };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => argv[++i];
    if (a === "--mib") o.mib = Number(val());
    else if (a === "--reps") o.reps = Number(val());
    else if (a === "--parallel") o.parallel = val().split(",").map(Number);
    else if (a === "--workdir") o.workdir = path.resolve(val());
    else throw new Error(`unknown argument ${a}`);
  }
  if (!(o.mib > 0) || !(o.reps >= 1) || o.parallel.some((n) => !(n >= 1))) throw new Error("bad --mib, --reps or --parallel");
  return o;
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const log = (m) => process.stderr.write(`bench-s3-get: ${m}\n`);

/** CPU seconds the processes `pids` have used so far (utime + stime, USER_HZ 100), or null. */
function cpuOf(pids) {
  if (!pids) return null;
  let t = 0;
  for (const pid of pids) {
    try {
      const f = fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
      t += Number(f[11]) + Number(f[12]);
    } catch {
      return null;
    }
  }
  return t / 100;
}

/** Count a body's bytes, dropping them. */
const drain = (body) =>
  new Promise((res, rej) => {
    let n = 0;
    body.on("data", (c) => (n += c.length));
    body.on("end", () => res(n));
    body.on("error", rej);
  });

async function main() {
  const o = parseArgs(process.argv.slice(2));
  const env = { ...process.env, AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: "true" };
  let server = null;
  if (!env.MEMSNAP_S3_ENDPOINT) {
    const { startSwiftS3 } = await import("./s3-server.mjs");
    const dir = path.join(o.workdir, "s3-get", "server");
    fs.rmSync(dir, { recursive: true, force: true });
    log("starting the loopback S3 server (Swift + s3api)");
    server = await startSwiftS3(dir);
    Object.assign(env, {
      MEMSNAP_S3_ENDPOINT: server.endpoint, AWS_ACCESS_KEY_ID: server.accessKeyId,
      AWS_SECRET_ACCESS_KEY: server.secretAccessKey, AWS_REGION: server.region,
    });
  }
  const client = new S3Client({
    endpoint: env.MEMSNAP_S3_ENDPOINT, forcePathStyle: true, region: env.AWS_REGION ?? "us-east-1",
    credentials: { accessKeyId: env.AWS_ACCESS_KEY_ID, secretAccessKey: env.AWS_SECRET_ACCESS_KEY },
  });
  const Bucket = "memsnap-get-bench";
  const Key = `object-${process.pid}`;
  const size = Math.round(o.mib * 2 ** 20);
  try {
    await client.send(new CreateBucketCommand({ Bucket })).catch((e) => {
      if (!/BucketAlready/.test(e?.name ?? "")) throw e;
    });
    log(`uploading ${o.mib} MiB in 8 MiB parts`);
    await new Upload({ client, params: { Bucket, Key, Body: randomBytes(size) }, partSize: RANGE, queueSize: 4 }).done();
    const get = async (from, to) => {
      const Range = from === undefined ? undefined : `bytes=${from}-${to - 1}`;
      return drain((await client.send(new GetObjectCommand({ Bucket, Key, Range }))).Body);
    };
    await get(0, 1024); // the SDK's modules and the connection, before any clock
    const modes = [
      { name: "one GET of the whole object", run: () => get() },
      ...o.parallel.map((n) => ({
        name: `8 MiB ranges, ${n} in flight`,
        run: async () => {
          let next = 0;
          let got = 0;
          const worker = async () => {
            while (next < size) {
              const from = next;
              next = Math.min(size, from + RANGE);
              const k = await get(from, next);
              got += k;
            }
          };
          await Promise.all(Array.from({ length: n }, worker));
          return got;
        },
      })),
    ];
    const pids = server ? Object.values(server.pids) : null;
    const res = modes.map(() => ({ s: [], client: [], server: [] }));
    for (let r = 0; r < o.reps; r++) {
      for (const [i, m] of modes.entries()) {
        const s0 = cpuOf(pids);
        const c0 = process.cpuUsage();
        const t0 = process.hrtime.bigint();
        const got = await m.run();
        const s = Number(process.hrtime.bigint() - t0) / 1e9;
        const c = process.cpuUsage(c0);
        const s1 = cpuOf(pids);
        if (got !== size) throw new Error(`${m.name}: ${got} bytes, not ${size}`);
        res[i].s.push(s);
        res[i].client.push((c.user + c.system) / 1e6);
        if (s0 !== null && s1 !== null) res[i].server.push(s1 - s0);
      }
    }
    const mbs = (s) => (size / s / 1e6).toFixed(0);
    const m = machineInfo();
    const sha = /\bsha_ni\b/.test(fs.readFileSync("/proc/cpuinfo", "utf8")) ? "with" : "without";
    process.stdout.write(`${m.cpu} (${m.nproc} cores, ${sha} SHA extensions), ${m.node}; ${o.mib} MiB object in 8 MiB `
      + `parts, ${o.reps} rounds; S3 server: ${server ? "loopback Swift s3api on the same machine" : env.MEMSNAP_S3_ENDPOINT}\n`);
    const rows = modes.map((md, i) => {
      const r = res[i];
      const sv = r.server.length ? median(r.server).toFixed(2) : "—";
      return [md.name, mbs(Math.min(...r.s)), mbs(median(r.s)), median(r.s).toFixed(2), median(r.client).toFixed(2), sv];
    });
    process.stdout.write(textTable(["GET", "best MB/s", "median MB/s", "median s", "client CPU s", "server CPU s"], rows,
      [false, true, true, true, true, true]) + "\n");
    await client.send(new DeleteObjectCommand({ Bucket, Key })).catch(() => undefined);
  } finally {
    client.destroy();
    await server?.stop();
  }
}

main().catch((e) => {
  process.stderr.write(`bench-s3-get: ${e.stack ?? e}\n`);
  process.exit(1);
});
