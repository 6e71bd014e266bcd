#!/usr/bin/env node
/**
 * A real S3-compatible server on loopback for memsnap's tests and benchmarks: OpenStack Swift
 * (Debian's swift-proxy/account/container/object) with its s3api middleware and tempauth, and a
 * private memcached. Everything lives in one directory (configs, rings, the device, logs,
 * state.json); ports are free ones picked at start.
 *
 *   node scripts/s3-server.mjs start DIR   start, print one JSON line {endpoint, pids, ...}, stay in the
 *                                          foreground until SIGINT/SIGTERM (then stop the servers)
 *   node scripts/s3-server.mjs start DIR --detach   start, print the JSON line, exit (servers keep running)
 *   node scripts/s3-server.mjs stop DIR    stop the servers recorded in DIR/state.json
 *
 * Library: `startSwiftS3(dir)` → { endpoint, ..., stop(), pause(), resume(), kill(), restart() }.
 * S3 credentials: access key `test:tester`, secret `testing`, region `us-east-1`, path-style.
 */
import { spawn, spawnSync } from "node:child_process";
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, request } from "node:http";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

export const ACCESS_KEY_ID = "test:tester";
export const SECRET_ACCESS_KEY = "testing";
export const REGION = "us-east-1";
const PYTHON = "/usr/bin/python3"; // the Debian swift packages' interpreter (not a pyenv shim)
const SERVERS = ["account", "container", "object", "proxy"];

/** A free TCP port on 127.0.0.1 (picked by the kernel, then released). */
function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

function configs(dir, ports) {
  const user = process.getuid?.() === 0 ? "user = root\n" : "";
  const common = `[DEFAULT]\nbind_ip = 127.0.0.1\nworkers = 0\nswift_dir = ${dir}\ndevices = ${dir}/devices\n` +
    `mount_check = false\n${user}log_level = INFO\n`;
  const storage = (kind) => `${common}bind_port = ${ports[kind]}\n\n[pipeline:main]\npipeline = ${kind}-server\n\n` +
    `[app:${kind}-server]\nuse = egg:swift#${kind}\n` +
    `\n[${kind}-replicator]\n[${kind}-auditor]\n` + (kind === "account" ? "[account-reaper]\n" : "[" + kind + "-updater]\n");
  return {
    "account-server.conf": storage("account"),
    "container-server.conf": storage("container"),
    "object-server.conf": storage("object"),
    "proxy-server.conf": `${common}bind_port = ${ports.proxy}\n\n[pipeline:main]\n` +
      "pipeline = catch_errors gatekeeper healthcheck proxy-logging cache s3api tempauth copy slo dlo " +
      "proxy-logging proxy-server\n\n" +
      "[app:proxy-server]\nuse = egg:swift#proxy\naccount_autocreate = true\n\n" +
      "[filter:tempauth]\nuse = egg:swift#tempauth\nuser_test_tester = testing .admin\n" +
      "user_test2_other = other2\n\n" +
      "[filter:s3api]\nuse = egg:swift#s3api\nlocation = us-east-1\n\n" +
      `[filter:cache]\nuse = egg:swift#memcache\nmemcache_servers = 127.0.0.1:${ports.memcached}\n\n` +
      "[filter:catch_errors]\nuse = egg:swift#catch_errors\n[filter:gatekeeper]\nuse = egg:swift#gatekeeper\n" +
      "[filter:healthcheck]\nuse = egg:swift#healthcheck\n[filter:proxy-logging]\nuse = egg:swift#proxy_logging\n" +
      "[filter:copy]\nuse = egg:swift#copy\n[filter:slo]\nuse = egg:swift#slo\n[filter:dlo]\nuse = egg:swift#dlo\n",
  };
}

/** One python process builds the three one-device rings (faster than nine swift-ring-builder runs). */
function buildRings(dir, ports) {
  const py = `
import sys
from swift.common.ring import RingBuilder
d = sys.argv[1]
for kind, port in (("account", int(sys.argv[2])), ("container", int(sys.argv[3])), ("object", int(sys.argv[4]))):
    b = RingBuilder(0, 1, 1)
    b.add_dev({"id": 0, "region": 1, "zone": 1, "ip": "127.0.0.1", "port": port, "device": "d1", "weight": 1})
    b.rebalance()
    b.save(f"{d}/{kind}.builder")
    b.get_ring().save(f"{d}/{kind}.ring.gz")
`;
  const r = spawnSync(PYTHON, ["-c", py, dir, String(ports.account), String(ports.container), String(ports.object)],
    { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`s3-server: building the rings failed: ${r.stderr || r.error}`);
}

function spawnServer(dir, name, ports) {
  const log = openSync(join(dir, `${name}.log`), "a");
  const [cmd, args] = name === "memcached"
    ? ["memcached", ["-l", "127.0.0.1", "-p", String(ports.memcached), "-U", "0", "-m", "32",
      ...(process.getuid?.() === 0 ? ["-u", "root"] : [])]]
    : [`/usr/bin/swift-${name}-server`, [join(dir, `${name}-server.conf`), "-v"]];
  const child = spawn(cmd, args, { stdio: ["ignore", log, log], detached: true });
  closeSync(log);
  child.unref();
  return child;
}

function healthy(port) {
  return new Promise((res) => {
    const req = request({ host: "127.0.0.1", port, path: "/healthcheck", timeout: 1000 }, (r) => {
      r.resume();
      res(r.statusCode === 200);
    });
    req.on("error", () => res(false));
    req.on("timeout", () => { req.destroy(); res(false); });
    req.end();
  });
}

/** A storage server answers when its port accepts a connection (any HTTP answer). */
function listening(port) {
  return new Promise((res) => {
    const req = request({ host: "127.0.0.1", port, path: "/", method: "HEAD", timeout: 1000 }, (r) => {
      r.resume();
      res(true);
    });
    req.on("error", () => res(false));
    req.on("timeout", () => { req.destroy(); res(false); });
    req.end();
  });
}

async function waitFor(what, check, ms, dir) {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`s3-server: ${what} did not come up in ${ms} ms (logs in ${dir})`);
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function signal(pid, sig) {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}

async function stopPids(pids) {
  for (const pid of Object.values(pids)) signal(pid, "SIGCONT");
  for (const pid of Object.values(pids)) signal(pid, "SIGTERM");
  const until = Date.now() + 5000;
  while (Object.values(pids).some(alive) && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
  for (const pid of Object.values(pids)) if (alive(pid)) signal(pid, "SIGKILL");
}

/**
 * Start the servers in `dir` (created if missing) and wait until the proxy answers.
 * Returns the endpoint and controls; state.json in `dir` records the pids for `stop DIR`.
 */
export async function startSwiftS3(dirArg) {
  const dir = resolve(dirArg);
  // The servers read the hash path prefix from /etc/swift/swift.conf whatever swift_dir says (the
  // swift package installs it); the rings and configs are ours.
  if (!existsSync("/etc/swift/swift.conf")) {
    throw new Error("s3-server: /etc/swift/swift.conf is missing: install the swift packages (see .ci/run)");
  }
  mkdirSync(join(dir, "devices", "d1"), { recursive: true });
  const ports = {};
  for (const k of ["proxy", "account", "container", "object", "memcached"]) ports[k] = await freePort();
  for (const [name, text] of Object.entries(configs(dir, ports))) writeFileSync(join(dir, name), text);
  buildRings(dir, ports);
  const pids = {};
  const children = {};
  const start = (name) => {
    children[name] = spawnServer(dir, name, ports);
    pids[name] = children[name].pid;
  };
  const save = () => writeFileSync(join(dir, "state.json"), JSON.stringify({ endpoint, ports, pids }) + "\n");
  const endpoint = `http://127.0.0.1:${ports.proxy}`;
  try {
    start("memcached");
    for (const s of SERVERS) start(s);
    save();
    await Promise.all([
      ...["account", "container", "object"].map((s) => waitFor(`${s} server`, () => listening(ports[s]), 30_000, dir)),
      waitFor("proxy", () => healthy(ports.proxy), 30_000, dir),
    ]);
  } catch (e) {
    await stopPids(pids);
    throw e;
  }
  const server = {
    endpoint, dir, ports, pids,
    accessKeyId: ACCESS_KEY_ID, secretAccessKey: SECRET_ACCESS_KEY, region: REGION,
    /** Stop every server (SIGTERM, then SIGKILL after 5 s). */
    stop: () => stopPids(pids),
    /** Freeze / thaw the proxy (SIGSTOP / SIGCONT): connections stay open, nothing answers. */
    pause: () => signal(pids.proxy, "SIGSTOP"),
    resume: () => signal(pids.proxy, "SIGCONT"),
    /** Kill the proxy outright (SIGKILL): connections reset, new ones are refused. */
    kill: async () => {
      signal(pids.proxy, "SIGKILL");
      while (alive(pids.proxy)) await new Promise((r) => setTimeout(r, 20));
    },
    /** Start the proxy again on the same port (after kill()). */
    restart: async () => {
      if (alive(pids.proxy)) return;
      start("proxy");
      save();
      await waitFor("proxy", () => healthy(ports.proxy), 30_000, dir);
    },
  };
  return server;
}

async function main(argv) {
  const [cmd, dir, ...rest] = argv;
  if (cmd === "start" && dir) {
    const s = await startSwiftS3(dir);
    const info = {
      endpoint: s.endpoint, dir: s.dir, pids: s.pids, accessKeyId: s.accessKeyId,
      secretAccessKey: s.secretAccessKey, region: s.region,
    };
    process.stdout.write(JSON.stringify(info) + "\n");
    if (rest.includes("--detach")) return;
    const bye = async () => {
      await s.stop();
      process.exit(0);
    };
    process.on("SIGINT", bye);
    process.on("SIGTERM", bye);
    setInterval(() => {}, 1 << 30);
  } else if (cmd === "stop" && dir) {
    const state = JSON.parse(readFileSync(join(resolve(dir), "state.json"), "utf8"));
    await stopPids(state.pids);
  } else {
    process.stderr.write("usage: node scripts/s3-server.mjs start DIR [--detach] | stop DIR\n");
    process.exit(2);
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  main(process.argv.slice(2)).catch((e) => {
    process.stderr.write(`${e.message}\n`);
    process.exit(1);
  });
}
