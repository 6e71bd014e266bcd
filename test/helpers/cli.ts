/**
 * Helpers for tests that drive the memsnap CLI (`node bin/memsnap.js`, which runs the
 * compiled dist/): spawn it and capture stdout, stderr and the exit code; make temp agent
 * directories with a memsnap.json and `files` + `state` sources; list what a failed command
 * left behind; hash trees; and take bundles apart and put them back together (for the
 * bad-bundle tests) without going through memsnap's own writer.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import {
  existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, expect } from "vitest";
import { computeSeal } from "../../src/format/manifest.js";

/** The repository root and the CLI entry point. */
export const REPO = fileURLToPath(new URL("../../", import.meta.url));
export const BIN = join(REPO, "bin", "memsnap.js");

// ------------------------------------------------------------------------------ temp dirs

const made: string[] = [];

/** A fresh temp directory, removed after the test file finishes. */
export function tempDir(prefix = "memsnap-test-"): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  made.push(d);
  return d;
}

afterAll(() => {
  for (const d of made.splice(0)) rmSync(d, { recursive: true, force: true });
});

// ------------------------------------------------------------------------------ running the CLI

export interface CliResult {
  /** Exit code (null when killed by a signal). */
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

export interface CliOptions {
  cwd?: string;
  /** Extra environment; a value of undefined removes the variable. */
  env?: Record<string, string | undefined>;
  input?: string | Buffer;
  timeoutMs?: number;
  /** Run under `ulimit -f` (KiB): writes past it fail with EFBIG (node ignores SIGXFSZ). */
  fileSizeLimitKiB?: number;
}

/** The command line that runs the CLI (through bash for a file size limit). */
function cliCommand(args: string[], opts: CliOptions): [string, string[]] {
  if (opts.fileSizeLimitKiB === undefined) return [process.execPath, [BIN, ...args]];
  return ["bash", ["-c", `ulimit -f ${Math.floor(opts.fileSizeLimitKiB)} && exec "$@"`, "bash", process.execPath, BIN, ...args]];
}

/** The environment the CLI runs with: no inherited memsnap settings, a default store under the temp dir. */
function cliEnv(cwd: string, extra: Record<string, string | undefined> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, XDG_DATA_HOME: join(cwd, ".xdg-data") };
  delete env.MEMSNAP_PASSPHRASE;
  delete env.MEMSNAP_STORE;
  delete env.NODE_OPTIONS;
  for (const [k, v] of Object.entries(extra)) {
    if (v === undefined) delete env[k];
    else env[k] = v;
  }
  return env;
}

/** Start the CLI; `done` resolves with its result (never rejects on a non-zero exit). */
export function startCli(args: string[], opts: CliOptions = {}): { child: ChildProcess; done: Promise<CliResult> } {
  const cwd = opts.cwd ?? tempDir();
  const [cmd, argv] = cliCommand(args, opts);
  const child = spawn(cmd, argv, { cwd, env: cliEnv(cwd, opts.env), stdio: ["pipe", "pipe", "pipe"] });
  const done = new Promise<CliResult>((resolve, reject) => {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const timer = setTimeout(() => child.kill("SIGKILL"), opts.timeoutMs ?? 60_000);
    child.stdout!.on("data", (b: Buffer) => out.push(b));
    child.stderr!.on("data", (b: Buffer) => err.push(b));
    child.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout: Buffer.concat(out).toString("utf8"), stderr: Buffer.concat(err).toString("utf8") });
    });
  });
  child.stdin!.on("error", () => undefined);
  child.stdin!.end(opts.input ?? "");
  return { child, done };
}

/** Run `memsnap …args` and wait for it. */
export function runCli(args: string[], opts: CliOptions = {}): Promise<CliResult> {
  return startCli(args, opts).done;
}

/** Run `memsnap …args` synchronously (same environment as {@link runCli}). */
export function runCliSync(args: string[], opts: CliOptions = {}): CliResult {
  const cwd = opts.cwd ?? tempDir();
  const [cmd, argv] = cliCommand(args, opts);
  const r = spawnSync(cmd, argv, { cwd, env: cliEnv(cwd, opts.env), encoding: "utf8", input: opts.input ?? "", timeout: opts.timeoutMs ?? 60_000 });
  return { code: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}

/** Parse the one JSON object a `--json` command printed on stdout. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function jsonOut(r: CliResult): any {
  try {
    return JSON.parse(r.stdout);
  } catch {
    throw new Error(`stdout is not one JSON object:\n${r.stdout}\nstderr:\n${r.stderr}`);
  }
}

function show(r: CliResult): string {
  // Node exits 13 when the top-level await in bin/memsnap.js never settles: the command hung.
  const note = r.code === 13 ? " (13: the command's promise never settled, i.e. it hung and Node gave up)" : "";
  return `exit ${r.code}${note}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`;
}

/** Assert a successful run. */
export function expectOk(r: CliResult): void {
  expect(r.code, show(r)).toBe(0);
}

/**
 * Assert the house error format: the exit code, `memsnap: error: … [CODE]` and a
 * `memsnap: hint: …` line on stderr, nothing that looks like a stack trace.
 */
export function expectCliError(r: CliResult, exit: number, code: string): void {
  expect(r.code, show(r)).toBe(exit);
  const lines = r.stderr.split("\n");
  const errLine = lines.find((l) => l.startsWith("memsnap: error: "));
  expect(errLine, show(r)).toBeDefined();
  expect(errLine!.endsWith(`[${code}]`), show(r)).toBe(true);
  expect(lines.some((l) => /^memsnap: hint: \S/.test(l)), `no hint line\n${show(r)}`).toBe(true);
  expect(r.stderr, show(r)).not.toMatch(/\n\s+at .+:\d+:\d+\)?\n/); // no stack trace
}

/** Assert the `--json` error object: `{ok:false, exit_code, error:{code,message,hint}}`. */
export function expectJsonError(r: CliResult, exit: number, code: string): void {
  expect(r.code, show(r)).toBe(exit);
  const j = jsonOut(r);
  expect(j.ok).toBe(false);
  expect(j.exit_code).toBe(exit);
  expect(j.error.code, show(r)).toBe(code);
  expect(typeof j.error.message).toBe("string");
  expect(typeof j.error.hint).toBe("string");
  expect(j.error.hint.length).toBeGreaterThan(0);
}

// ------------------------------------------------------------------------------ agents

export interface AgentOptions {
  tenant?: string;
  agent?: string;
  /** Files of the `memory` files source (path → content). */
  files?: Record<string, string | Buffer>;
  /** Files of the `state` source (path → JSON value, or raw text/bytes). */
  state?: Record<string, unknown>;
  /** Replace the whole config object (written as JSON). */
  config?: Record<string, unknown>;
  /** Write this exact text as memsnap.json instead. */
  configText?: string;
}

export interface Agent {
  dir: string;
  /** Absolute path of memsnap.json. */
  config: string;
  memoryDir: string;
  stateDir: string;
}

export const DEFAULT_FILES: Record<string, string | Buffer> = {
  "MEMORY.md": "# Memory\n\n- likes tea\n",
  "notes/2024-06-01.md": "met ada; talked about the ingest cursor\n",
  "notes/empty.md": "",
  "deep/a/b/c.txt": "deep\n",
  "blob.bin": Buffer.from(Array.from({ length: 3000 }, (_, i) => (i * 7919) & 0xff)),
};

export const DEFAULT_STATE: Record<string, unknown> = {
  "cursor.json": { offset: 42, file: "log-7" },
  "runs/dream-run.json": { runs: [1, 2, 3] },
};

/** Write `files` under `root`, making directories. Buffers and strings are written as is. */
export function writeTree(root: string, files: Record<string, string | Buffer>): void {
  mkdirSync(root, { recursive: true });
  for (const [rel, content] of Object.entries(files)) {
    const p = join(root, rel);
    mkdirSync(dirname(p), { recursive: true });
    writeFileSync(p, content);
  }
}

/** A temp agent directory with `memory/` (files source) and `state/` (state source) and a memsnap.json. */
export function makeAgent(opts: AgentOptions = {}): Agent {
  const dir = tempDir("memsnap-agent-");
  const memoryDir = join(dir, "memory");
  const stateDir = join(dir, "state");
  writeTree(memoryDir, opts.files ?? DEFAULT_FILES);
  const state = opts.state ?? DEFAULT_STATE;
  writeTree(stateDir, Object.fromEntries(Object.entries(state).map(([k, v]) =>
    [k, typeof v === "string" || Buffer.isBuffer(v) ? v : JSON.stringify(v, null, 2)])));
  const config = join(dir, "memsnap.json");
  const cfg = opts.config ?? {
    tenant: opts.tenant ?? "acme",
    agent: opts.agent ?? "scribe",
    sources: [
      { kind: "files", name: "memory", path: "memory" },
      { kind: "state", name: "state", path: "state" },
    ],
  };
  writeFileSync(config, opts.configText ?? JSON.stringify(cfg, null, 2));
  return { dir, config, memoryDir, stateDir };
}

// ------------------------------------------------------------------------------ leftovers and trees

/** Every entry under `dir` (files, dirs, links; dot files included), as sorted relative paths. */
export function listTree(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string, rel: string): void => {
    for (const name of readdirSync(d)) {
      const r = rel ? `${rel}/${name}` : name;
      out.push(r);
      const st = lstatSync(join(d, name));
      if (st.isDirectory()) walk(join(d, name), r);
    }
  };
  if (existsSync(dir)) walk(dir, "");
  return out.sort();
}

/**
 * Entries under `dir` that a finished memsnap run must never leave: temp bundles
 * (`.<name>.tmp-<pid>-<hex>`), restore staging and work dirs (`.….memsnap-staging-…`,
 * `.memsnap-work-…`, `.memsnap-new-…`, `.memsnap-old-…`) and a held agent lock (`.memsnap/lock`).
 */
export function listLeftovers(dir: string): string[] {
  return listTree(dir).filter((p) => {
    const base = p.split("/").pop()!;
    return /\.tmp-/.test(base) || /\.memsnap-(staging|work|new|old)-/.test(base) || /(^|\/)\.memsnap\/lock$/.test(p);
  });
}

/** Files under `dir` whose name ends in `.memsnap` (bundles). */
export function listBundles(dir: string): string[] {
  return listTree(dir).filter((p) => /[^/]\.memsnap$/.test(p) && !p.endsWith("/.memsnap") && lstatSync(join(dir, p)).isFile());
}

/** Assert that nothing a failed run might leave is in `dir`: no temp file, no staging dir, no bundle. */
export function expectNothingLeft(dir: string, opts: { allowBundles?: string[] } = {}): void {
  expect(listLeftovers(dir)).toEqual([]);
  const bundles = listBundles(dir).filter((b) => !(opts.allowBundles ?? []).includes(b));
  expect(bundles).toEqual([]);
}

export const sha256 = (b: Buffer | string): string => createHash("sha256").update(b).digest("hex");

/** `{relative path: sha256}` of every regular file under `dir` (skipping relative paths `skip` matches). */
export function treeHashes(dir: string, skip: (rel: string) => boolean = () => false): Record<string, string> {
  const out: Record<string, string> = {};
  for (const rel of listTree(dir)) {
    if (skip(rel)) continue;
    const p = join(dir, rel);
    if (lstatSync(p).isFile()) out[rel] = sha256(readFileSync(p));
  }
  return out;
}

// ------------------------------------------------------------------------------ bundle surgery

const BLOCK = 512;
export const pad512 = (n: number): number => (n % BLOCK === 0 ? 0 : BLOCK - (n % BLOCK));

/** Recompute a ustar header block's checksum in place (the test's own implementation). */
export function fixTarChecksum(h: Buffer): void {
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : h[i]!;
  h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148, 8, "ascii");
}

/** A ustar regular-file header (independent of src/format/tar-header.ts). */
export function tarHeader(name: string, size: number, mode = 0o644): Buffer {
  const h = Buffer.alloc(BLOCK);
  h.write(name, 0, 100, "utf8");
  h.write(mode.toString(8).padStart(7, "0") + "\0", 100, 8, "ascii");
  h.write("0000000\0", 108, 8, "ascii");
  h.write("0000000\0", 116, 8, "ascii");
  h.write(size.toString(8).padStart(11, "0") + "\0", 124, 12, "ascii");
  h.write(Math.floor(Date.now() / 1000).toString(8).padStart(11, "0") + "\0", 136, 12, "ascii");
  h[156] = 0x30;
  h.write("ustar\0", 257, 6, "ascii");
  h.write("00", 263, 2, "ascii");
  h.write("test", 265, 32, "ascii");
  h.write("test", 297, 32, "ascii");
  fixTarChecksum(h);
  return h;
}

export interface BundleParts {
  payloadName: string;
  payload: Buffer;
  manifestBytes: Buffer;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  manifest: any;
  /** Offset of the manifest member's header in the file. */
  manifestHeaderOffset: number;
}

/** Split a bundle into its two members (reads the headers the simple way: octal sizes only). */
export function readBundle(path: string): BundleParts {
  const b = readFileSync(path);
  const name = b.toString("utf8", 0, b.indexOf(0, 0));
  const size = parseInt(b.toString("ascii", 124, 135), 8);
  const payload = b.subarray(BLOCK, BLOCK + size);
  const mh = BLOCK + size + pad512(size);
  const msize = parseInt(b.toString("ascii", mh + 124, mh + 135), 8);
  const mname = b.toString("utf8", mh, b.indexOf(0, mh));
  if (mname !== "manifest.json") throw new Error(`second member is ${mname}`);
  const manifestBytes = b.subarray(mh + BLOCK, mh + BLOCK + msize);
  return { payloadName: name, payload: Buffer.from(payload), manifestBytes: Buffer.from(manifestBytes), manifest: JSON.parse(manifestBytes.toString("utf8")), manifestHeaderOffset: mh };
}

/** Write a two-member container: payload, manifest, two zero blocks. */
export function writeBundle(path: string, payloadName: string, payload: Buffer, manifest: Buffer | object): void {
  const m = Buffer.isBuffer(manifest) ? manifest : Buffer.from(JSON.stringify(manifest, null, 1) + "\n", "utf8");
  writeFileSync(path, Buffer.concat([
    tarHeader(payloadName, payload.length, 0o600), payload, Buffer.alloc(pad512(payload.length)),
    tarHeader("manifest.json", m.length), m, Buffer.alloc(pad512(m.length)), Buffer.alloc(2 * BLOCK),
  ]));
}

/** Return a copy of `manifest` with a fresh seal (computeSeal from src/format/manifest.ts). */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function reseal<T extends Record<string, any>>(manifest: T): T {
  const { seal: _old, ...rest } = manifest;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  return { ...rest, seal: computeSeal(rest as any) } as unknown as T;
}

/** Flip one bit of a file in place. */
export function flipBit(path: string, offset: number, bit = 0): void {
  const b = readFileSync(path);
  if (offset < 0 || offset >= b.length) throw new RangeError(`offset ${offset} outside ${path} (${b.length} bytes)`);
  b[offset] = b[offset]! ^ (1 << bit);
  writeFileSync(path, b);
}

/** Read an age identity file's recipient (the `# public key:` line). */
export function recipientOf(keyFile: string): string {
  const m = /public key: (age1[0-9a-z]+)/.exec(readFileSync(keyFile, "utf8"));
  if (!m) throw new Error(`no public key line in ${keyFile}`);
  return m[1]!;
}

/**
 * An in-place restore of `bundle` onto a new machine: `dir` is created holding only the
 * config text `config`; the restore with a safety snapshot must be refused (nothing live to
 * keep, exit 6, with the way out in the message), and the one without must succeed.
 */
export function restoreOntoNewMachine(bundle: string, config: string, dir: string, args: string[] = []): void {
  mkdirSync(dir);
  writeFileSync(join(dir, "memsnap.json"), config);
  const refused = runCliSync(["restore", bundle, "-c", join(dir, "memsnap.json"), "--store", `${dir}-store`, ...args]);
  expect(refused.code, show(refused)).toBe(6);
  expect(refused.stderr).toContain("cannot take the safety snapshot of the live agent");
  expect(refused.stderr).toContain("nothing there to keep");
  expect(refused.stderr).toContain("--no-safety-snapshot");
  expectOk(runCliSync(["restore", bundle, "-c", join(dir, "memsnap.json"), "--no-safety-snapshot", ...args]));
}
