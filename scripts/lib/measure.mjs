/**
 * Measurement helpers for scripts/bench.mjs: timed child processes (wall clock + peak RSS via
 * GNU time), tree hashing and comparison, page-cache control, machine facts, table rendering.
 * Node 20 built-ins only.
 */
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

export const GNU_TIME = "/usr/bin/time";

/** Single-quotes a string for bash. */
export const shq = (s) => "'" + String(s).replace(/'/g, "'\\''") + "'";

/** argv that runs `script` under bash with pipefail (a failing stage fails the pipeline). */
export const bashPipeline = (script) => ["bash", "-c", `set -o pipefail; ${script}`];

let timeFileNo = 0;

/** Busy CPU seconds of the whole machine so far (from /proc/stat; USER_HZ = 100), or null. */
export function machineBusySeconds() {
  try {
    const f = fs.readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal ...
    const busy = f[0] + f[1] + f[2] + f[5] + f[6];
    return busy / 100;
  } catch {
    return null;
  }
}

/**
 * Runs argv under `/usr/bin/time -f '%e %M'` and measures it.
 *
 * seconds: wall clock measured here with hrtime around the child (includes the ~1 ms of
 *          /usr/bin/time's own fork/exec); timeSeconds: GNU time's %e (10 ms resolution).
 * cpuSeconds: user + system CPU of the command and its children (GNU time's %U + %S).
 * foreignCpuSeconds: CPU the rest of the machine burnt meanwhile (/proc/stat busy time minus
 *          cpuSeconds): > 0 means other processes competed with the measurement.
 * rssKiB:  GNU time's %M — the peak RSS of the process; for `bash -c 'a | b | c'` it is the
 *          largest peak among bash and the pipeline stages (getrusage RUSAGE_CHILDREN takes the
 *          max, not the sum), so pipelines report their hungriest stage.
 *
 * rssSamples (with sampleRss): [[seconds since start, KiB], …] — the summed VmRSS of the
 *          command's process tree (the command and every descendant; /usr/bin/time itself left
 *          out) read from /proc every `sampleRss` ms (true = 50) while it runs;
 *          rssSampledPeakKiB is the largest sample. Linux only; [] elsewhere.
 *
 * @param {string[]} argv
 * @param {{cwd?: string, tmpDir: string, captureStdout?: boolean, env?: object, sampleRss?: boolean|number}} opts
 */
export function timedRun(argv, { cwd, tmpDir, captureStdout = false, env, sampleRss = false } = {}) {
  const haveTime = fs.existsSync(GNU_TIME);
  const tfile = path.join(tmpDir, `time-${process.pid}-${timeFileNo++}.txt`);
  const full = haveTime ? [GNU_TIME, "-o", tfile, "-f", "%e %M %U %S", ...argv] : argv;
  return new Promise((resolve) => {
    const busy0 = machineBusySeconds();
    const t0 = process.hrtime.bigint();
    let child;
    try {
      child = spawn(full[0], full.slice(1), {
        cwd,
        env: env ?? process.env,
        stdio: ["ignore", captureStdout ? "pipe" : "ignore", "pipe"],
      });
    } catch (e) {
      resolve({ ok: false, code: null, seconds: 0, rssKiB: null, stdout: "", stderr: String(e.message) });
      return;
    }
    const samples = [];
    let sampler = null;
    if (sampleRss && child.pid) {
      const every = typeof sampleRss === "number" ? sampleRss : 50;
      const take = () => {
        const kib = treeRssKiB(child.pid, haveTime);
        if (kib > 0) samples.push([Math.round(Number(process.hrtime.bigint() - t0) / 1e6) / 1000, kib]);
      };
      take();
      sampler = setInterval(take, every);
    }
    const out = [];
    let outLen = 0;
    let stderr = "";
    if (captureStdout) {
      child.stdout.on("data", (d) => {
        if (outLen < 64 * 1024 * 1024) {
          out.push(d);
          outLen += d.length;
        }
      });
    }
    child.stderr.on("data", (d) => {
      stderr += d;
      if (stderr.length > 64 * 1024) stderr = stderr.slice(-32 * 1024);
    });
    let spawnError = null;
    child.on("error", (e) => (spawnError = e));
    child.on("close", (code, signal) => {
      const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
      if (sampler) clearInterval(sampler);
      const busy1 = machineBusySeconds();
      let rssKiB = null;
      let timeSeconds = null;
      let cpuSeconds = null;
      if (haveTime) {
        try {
          const lines = fs.readFileSync(tfile, "utf8").trim().split("\n");
          const m = /^([\d.]+) (\d+) ([\d.]+) ([\d.]+)$/.exec(lines[lines.length - 1] ?? "");
          if (m) {
            timeSeconds = Number(m[1]);
            rssKiB = Number(m[2]);
            cpuSeconds = Math.round((Number(m[3]) + Number(m[4])) * 100) / 100;
          }
          // GNU time adds "Command exited with non-zero status N" / "Command terminated by signal N"
          for (const l of lines.slice(0, -1)) if (/^Command /.test(l)) stderr += `\n[time] ${l}`;
        } catch {
          /* no time output: the command could not be run */
        }
        fs.rmSync(tfile, { force: true });
      }
      if (spawnError) stderr += `\n${spawnError.message}`;
      resolve({
        ok: code === 0 && !spawnError,
        code,
        signal,
        seconds,
        timeSeconds,
        cpuSeconds,
        foreignCpuSeconds:
          busy0 != null && busy1 != null && cpuSeconds != null ? Math.max(0, Math.round((busy1 - busy0 - cpuSeconds) * 100) / 100) : null,
        rssKiB,
        rssSamples: sampleRss ? samples : undefined,
        rssSampledPeakKiB: sampleRss && samples.length ? Math.max(...samples.map((x) => x[1])) : null,
        stdout: Buffer.concat(out).toString("utf8"),
        stderr,
      });
    });
  });
}

/** Child pids of `pid` (all its threads' children), from /proc/<pid>/task/<tid>/children; null when unsupported. */
function childPids(pid) {
  let tasks;
  try {
    tasks = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  const out = [];
  let readable = false;
  for (const t of tasks) {
    let c;
    try {
      c = fs.readFileSync(`/proc/${pid}/task/${t}/children`, "utf8");
      readable = true;
    } catch {
      continue;
    }
    for (const x of c.split(/\s+/)) if (x) out.push(Number(x));
  }
  return readable ? out : null;
}

/** Child pids of every process, by scanning /proc/<pid>/stat (when the children files are missing). */
function childMapFromStat() {
  const map = new Map();
  for (const e of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const st = fs.readFileSync(`/proc/${e}/stat`, "utf8");
      const ppid = Number(st.slice(st.lastIndexOf(")") + 2).split(" ")[1]);
      if (!map.has(ppid)) map.set(ppid, []);
      map.get(ppid).push(Number(e));
    } catch {
      /* gone */
    }
  }
  return map;
}

function vmRssKiB(pid) {
  try {
    const m = /^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"));
    return m ? Number(m[1]) : 0;
  } catch {
    return 0;
  }
}

/** Summed VmRSS (KiB) of `root` and its descendants; `skipRoot` leaves the root out (a /usr/bin/time wrapper). */
export function treeRssKiB(root, skipRoot = false) {
  let total = 0;
  let statMap = null;
  const stack = [root];
  const seen = new Set();
  while (stack.length) {
    const p = stack.pop();
    if (seen.has(p)) continue;
    seen.add(p);
    if (!(skipRoot && p === root)) total += vmRssKiB(p);
    let kids = childPids(p);
    if (kids === null) kids = (statMap ??= childMapFromStat()).get(p) ?? [];
    stack.push(...kids);
  }
  return total;
}

/** Runs a command synchronously (setup steps, not measured); throws on failure. */
export function runChecked(argv, opts = {}) {
  const r = spawnSync(argv[0], argv.slice(1), { encoding: "utf8", maxBuffer: 64 * 1024 * 1024, ...opts });
  if (r.error) throw new Error(`${argv[0]}: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`${argv.join(" ")} exited ${r.status}: ${(r.stderr || "").trim().slice(-2000)}`);
  return r.stdout;
}

/** Flushes dirty pages (so a previous step's writeback does not bill the next one). */
export function syncDisks() {
  spawnSync("sync");
}

/** sync + drop the page cache (root only). Returns true when it worked. */
export function dropCaches() {
  syncDisks();
  try {
    fs.writeFileSync("/proc/sys/vm/drop_caches", "3\n");
    return true;
  } catch {
    return false;
  }
}

/** Reads every file under dir once (to warm the page cache). Returns bytes read. */
export async function warmTree(dir) {
  let bytes = 0;
  const buf = Buffer.allocUnsafe(1 << 20);
  for (const f of listFiles(dir)) {
    const fd = fs.openSync(path.join(dir, f), "r");
    try {
      let n;
      while ((n = fs.readSync(fd, buf, 0, buf.length, null)) > 0) bytes += n;
    } finally {
      fs.closeSync(fd);
    }
  }
  return bytes;
}

/** Relative paths of all regular files under dir, sorted (POSIX separators). */
export function listFiles(dir) {
  const out = [];
  const walk = (d, rel) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) walk(path.join(d, e.name), r);
      else if (e.isFile()) out.push(r);
    }
  };
  walk(dir, "");
  return out.sort();
}

export function treeBytes(dir) {
  let n = 0;
  for (const f of listFiles(dir)) n += fs.statSync(path.join(dir, f)).size;
  return n;
}

function hashFile(file) {
  const h = createHash("sha256");
  const buf = Buffer.allocUnsafe(1 << 20);
  const fd = fs.openSync(file, "r");
  let size = 0;
  try {
    let n;
    while ((n = fs.readSync(fd, buf, 0, buf.length, null)) > 0) {
      h.update(buf.subarray(0, n));
      size += n;
    }
  } finally {
    fs.closeSync(fd);
  }
  return { size, sha256: h.digest("hex") };
}

/**
 * Manifest of a tree: { files: { relPath: { size, sha256 } }, bytes, count, digest } where digest
 * is sha256 over "path\0size\0sha256\n" lines in path order (content only, not mtimes/modes).
 */
export function hashTree(dir) {
  const files = {};
  const d = createHash("sha256");
  let bytes = 0;
  const list = listFiles(dir);
  for (const f of list) {
    const e = hashFile(path.join(dir, f));
    files[f] = e;
    bytes += e.size;
    d.update(`${f}\0${e.size}\0${e.sha256}\n`);
  }
  return { files, bytes, count: list.length, digest: d.digest("hex") };
}

/** Compares a restored tree with a manifest; extra files are listed but do not fail the check. */
export function compareTree(manifest, dir) {
  const missing = [];
  const mismatched = [];
  for (const [f, e] of Object.entries(manifest.files)) {
    const p = path.join(dir, f);
    let st;
    try {
      st = fs.statSync(p);
    } catch {
      missing.push(f);
      continue;
    }
    if (!st.isFile() || st.size !== e.size || hashFile(p).sha256 !== e.sha256) mismatched.push(f);
  }
  const extra = listFiles(dir).filter((f) => !(f in manifest.files));
  return { ok: missing.length === 0 && mismatched.length === 0, missing, mismatched, extra };
}

/**
 * Finds where a restore put the mix: the shallowest directory under `root` (depth ≤ 4) holding
 * every top-level entry of the mix (kv/, db/, traces/, memory/, state/). null when none does.
 */
export function findTreeRoot(root, topLevel) {
  let level = [root];
  for (let depth = 0; depth <= 4 && level.length; depth++) {
    const next = [];
    for (const d of level) {
      let entries;
      try {
        entries = fs.readdirSync(d, { withFileTypes: true });
      } catch {
        continue;
      }
      const names = new Set(entries.map((e) => e.name));
      if (topLevel.every((t) => names.has(t))) return d;
      for (const e of entries) if (e.isDirectory()) next.push(path.join(d, e.name));
    }
    level = next;
  }
  return null;
}

function firstLine(argv) {
  const r = spawnSync(argv[0], argv.slice(1), { encoding: "utf8" });
  if (r.error || r.status !== 0) return null;
  return ((r.stdout || "") + (r.stderr || "")).trim().split("\n")[0];
}

/** "yes (sha_ni)", "yes (sha2)" or "no", from /proc/cpuinfo's flags (x86 sha_ni, arm64 sha2). */
export function shaExtensions(cpuinfo) {
  const flags = new Set((cpuinfo.match(/^(?:flags|Features)\s*:.*$/m)?.[0] ?? "").split(/[\s:]+/));
  return flags.has("sha_ni") ? "yes (sha_ni)" : flags.has("sha2") ? "yes (sha2)" : "no";
}

export function machineInfo() {
  const cpus = os.cpus();
  return {
    nproc: Number(firstLine(["nproc"]) ?? cpus.length),
    cpu: cpus[0]?.model ?? "unknown",
    memGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    os: `${os.type()} ${os.release()} ${os.arch()}`,
    node: process.version,
    tools: {
      tar: firstLine(["tar", "--version"]),
      zstd: firstLine(["zstd", "--version"])?.replace(/\*/g, "").replace(/, by .*$/, "").trim() ?? null,
      age: (v => v && `age ${v}`)(firstLine(["age", "--version"])),
      sqlite3: (v => v && `sqlite3 ${v.split(" ")[0]}`)(firstLine(["sqlite3", "--version"])),
      sha256sum: firstLine(["sha256sum", "--version"]),
    },
  };
}

// ---------------------------------------------------------------------------------------------
// formatting
// ---------------------------------------------------------------------------------------------

export const MB = 1e6;
export const MiB = 2 ** 20;

export const fmtS = (s) => (s == null ? "—" : s < 10 ? s.toFixed(3) : s.toFixed(2));
export const fmtRatio = (r) => (r == null || !Number.isFinite(r) ? "—" : `${r.toFixed(2)}×`);
export const fmtMBs = (v) => (v == null || !Number.isFinite(v) ? "—" : v.toFixed(0));
export const fmtRss = (kib) => (kib == null ? "—" : `${(kib / 1024).toFixed(1)} MiB`);
export const fmtBytes = (b) =>
  b == null ? "—" : b >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(2)} GiB` : b >= MiB ? `${(b / MiB).toFixed(1)} MiB` : `${(b / 1024).toFixed(1)} KiB`;

/** Plain-text table; `right[i]` right-aligns column i. */
export function textTable(header, rows, right = []) {
  const w = header.map((h, i) => Math.max(h.length, ...rows.map((r) => String(r[i]).length)));
  const line = (cells) =>
    cells.map((c, i) => (right[i] ? String(c).padStart(w[i]) : String(c).padEnd(w[i]))).join(" | ").trimEnd();
  return [line(header), w.map((x) => "-".repeat(x)).join("-+-"), ...rows.map(line)].join("\n");
}

export function markdownTable(header, rows, right = []) {
  const esc = (c) => String(c).replace(/\|/g, "\\|");
  return [
    `| ${header.map(esc).join(" | ")} |`,
    `|${header.map((_, i) => (right[i] ? " ---: " : " --- ")).join("|")}|`,
    ...rows.map((r) => `| ${r.map(esc).join(" | ")} |`),
  ].join("\n");
}
