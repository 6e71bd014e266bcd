/**
 * The `exec` source: external source plugins, for runtimes memsnap does not know (a LangGraph
 * checkpointer, a vector DB). The protocol (memsnap-plugin/1) is documented in docs/PLUGINS.md;
 * its wire types are JSON Schemas in docs/schemas/.
 *
 * capture: spawn `command… capture`, write one JSON capture request line on stdin, read a tar
 * stream of the layer's files on stdout. Each tar entry becomes one artifact whose declared
 * size is the tar header's size; its bytes stream from the plugin's stdout into the bundle
 * without being buffered (the pipeline pulls one artifact at a time, which is exactly when
 * tar-stream hands over the next entry). stderr is kept (its tail) for error messages.
 * restore (materialize): spawn `command… restore` with a JSON restore request naming the
 * directory where the layer's files were restored; the plugin turns them into live state.
 *
 * A plugin that cannot start or exits non-zero is MEMSNAP_PLUGIN_FAILED; one that runs past
 * timeout_ms is killed (SIGTERM to its process group, SIGKILL after a grace period) and is
 * MEMSNAP_PLUGIN_TIMEOUT; a malformed tar stream, an entry outside the layer (absolute, `..`)
 * or one that is not a regular file (symlink, hard link, device) is MEMSNAP_PLUGIN_PROTOCOL.
 * Any of them fails the snapshot: no bundle, no temp file.
 *
 * A bundle is untrusted input, so the command a restore runs comes from this host, never from
 * the bundle: MEMSNAP_ALLOW_PLUGINS lists whole commands (every argument), and a layer is
 * restored only when the command its manifest records (meta.plugin.command) is exactly one of
 * them; that entry is what runs, in the entry's cwd or else the layer's own directory. The
 * bundle's recorded cwd is never used. Anything else is MEMSNAP_PLUGIN_UNTRUSTED (exit 9) before
 * a process is started.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { readFile } from "node:fs/promises";
import { delimiter, isAbsolute, join, resolve } from "node:path";
import { Readable } from "node:stream";
import type tar from "tar-stream";
import { tarStream } from "../util/tar-stream.js";
import { MemsnapError } from "../errors.js";
import type { LayerEntry } from "../format/manifest.js";
import { configInvalid, isPlainObject, optInt, rejectUnknownKeys, reqString } from "../util/config-check.js";
import type { Artifact, SourceKind } from "./types.js";

export const PLUGIN_PROTOCOL = "memsnap-plugin/1";
/** The artifact memsnap adds to every exec layer: the request it made (config and command). */
export const PLUGIN_RECORD = ".memsnap-plugin.json";
export const DEFAULT_TIMEOUT_MS = 60_000;
/** Between SIGTERM and SIGKILL. */
export const KILL_GRACE_MS = 2_000;
/** How long a broken stream waits for the plugin's exit status before calling it a protocol error. */
const EXIT_WAIT_MS = 1_000;
const STDERR_KEEP = 64 * 1024;
const RESPONSE_MAX = 1024 * 1024;
/**
 * Env var naming the plugin commands a restore may run: a JSON array of whole commands, each an
 * argv array or `{"command": argv, "cwd": "/abs/dir"}`; or a `:`-separated list of one-word
 * commands (an executable run with no argument but the op). See {@link parseAllowedPlugins}.
 */
export const ALLOW_PLUGINS_ENV = "MEMSNAP_ALLOW_PLUGINS";
/** Values that once admitted any command a bundle named; they now admit nothing (and say so). */
const ALLOW_ANY_WORDS = new Set(["1", "all", "true", "yes", "*"]);
const ALLOW_EXAMPLE = `${ALLOW_PLUGINS_ENV}='[["/usr/bin/node","/opt/plugins/kv.mjs"]]'`;

export interface ExecConfig {
  kind: "exec";
  name: string;
  command: string[];
  timeout_ms?: number;
  env?: Record<string, string>;
  config?: Record<string, unknown>;
}

/** The capture request written to the plugin's stdin (docs/schemas/plugin-capture-request.json). */
export interface PluginCaptureRequest {
  protocol: typeof PLUGIN_PROTOCOL;
  op: "capture";
  layer: string;
  config: Record<string, unknown>;
}

/** The restore request (docs/schemas/plugin-restore-request.json). */
export interface PluginRestoreRequest {
  protocol: typeof PLUGIN_PROTOCOL;
  op: "restore";
  layer: string;
  dir: string;
  config: Record<string, unknown>;
}

/** What the plugin's meta in the manifest holds. */
interface PluginMeta {
  protocol: string;
  command: string[];
  cwd: string;
  timeout_ms: number;
}

type TarEntry = tar.ExtractEvents["entry"][1];

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MIN_TIMEOUT_MS = 100;
const MAX_TIMEOUT_MS = 24 * 3600 * 1000;
const KIND = /^[a-z0-9][a-z0-9_-]{0,31}$/;

function failed(cmd: string[], why: string, stderr: string, path?: string): MemsnapError {
  const tail = stderr.trim().split("\n").slice(-5).join("\n").slice(-2000);
  return new MemsnapError("MEMSNAP_PLUGIN_FAILED", `plugin ${cmd.join(" ")} ${why}${tail ? `: ${tail}` : ""}`, {
    ...(path ? { path } : {}), hint: "run the plugin by hand (see docs/PLUGINS.md) and check its stderr",
  });
}

function protocolError(cmd: string[], why: string): MemsnapError {
  return new MemsnapError("MEMSNAP_PLUGIN_PROTOCOL", `plugin ${cmd.join(" ")} broke the ${PLUGIN_PROTOCOL} protocol: ${why}`, {
    hint: "the plugin must write a tar of regular files with relative paths on stdout; see docs/PLUGINS.md",
  });
}

function timeoutError(cmd: string[], ms: number): MemsnapError {
  return new MemsnapError("MEMSNAP_PLUGIN_TIMEOUT", `plugin ${cmd.join(" ")} ran past its ${ms} ms timeout and was killed`, {
    hint: "raise the source's timeout_ms, or find out why the plugin hangs",
  });
}

/** Absolute command path when it names a file (contains a `/`); a bare name is looked up on PATH. */
function resolveCommand(command: string[], baseDir: string): string[] {
  const [first, ...rest] = command;
  return [first!.includes("/") ? resolve(baseDir, first!) : first!, ...rest];
}

/** One running plugin process. */
class PluginProcess {
  readonly child: ChildProcess;
  private stderr = "";
  private timer: NodeJS.Timeout | null = null;
  private killTimer: NodeJS.Timeout | null = null;
  timedOut = false;
  spawnError: Error | null = null;
  exit: { code: number | null; signal: NodeJS.Signals | null } | null = null;
  readonly exited: Promise<void>;
  /** Resolves when the process exited and its stdio closed. */
  readonly closed: Promise<void>;

  constructor(readonly argv: string[], op: "capture" | "restore", request: object, opts: {
    cwd: string; env: NodeJS.ProcessEnv; timeoutMs: number; onTimeout: () => void; signal?: AbortSignal | undefined;
  }) {
    this.child = spawn(argv[0]!, [...argv.slice(1), op], { cwd: opts.cwd, env: opts.env, stdio: ["pipe", "pipe", "pipe"], detached: true });
    this.exited = new Promise<void>((res) => {
      this.child.once("exit", (code, signal) => {
        this.exit = { code, signal };
        this.clearTimers();
        res();
      });
      this.child.once("error", (e) => {
        this.spawnError ??= e;
        if (this.child.pid === undefined) {
          this.exit = { code: null, signal: null };
          this.clearTimers();
          res();
        }
      });
    });
    this.closed = new Promise<void>((res) => {
      this.child.once("close", () => res());
      void this.exited.then(() => { if (this.child.pid === undefined) res(); });
    });
    this.child.stderr!.on("data", (b: Buffer) => {
      this.stderr = (this.stderr + b.toString("utf8")).slice(-STDERR_KEEP);
    });
    this.child.stderr!.on("error", () => undefined);
    this.child.stdout!.on("error", () => undefined);
    this.child.stdin!.on("error", () => undefined); // a plugin may exit without reading its request
    this.child.stdin!.end(`${JSON.stringify(request)}\n`);
    this.timer = setTimeout(() => {
      this.timedOut = true;
      this.terminate();
      opts.onTimeout();
    }, opts.timeoutMs);
    if (opts.signal) {
      const onAbort = (): void => this.terminate();
      if (opts.signal.aborted) onAbort();
      else opts.signal.addEventListener("abort", onAbort, { once: true });
      void this.exited.then(() => opts.signal!.removeEventListener("abort", onAbort));
    }
  }

  get stderrText(): string {
    return this.stderr;
  }

  get running(): boolean {
    return this.exit === null;
  }

  private signalGroup(sig: NodeJS.Signals): void {
    if (!this.running || this.child.pid === undefined) return;
    try {
      process.kill(-this.child.pid, sig); // the plugin's process group (it was spawned detached)
    } catch {
      try {
        this.child.kill(sig);
      } catch {
        /* already gone */
      }
    }
  }

  /** SIGTERM now, SIGKILL after the grace period if it is still running. */
  terminate(): void {
    if (!this.running) return;
    this.signalGroup("SIGTERM");
    this.killTimer ??= setTimeout(() => this.signalGroup("SIGKILL"), KILL_GRACE_MS);
  }

  private clearTimers(): void {
    if (this.timer) clearTimeout(this.timer);
    if (this.killTimer) clearTimeout(this.killTimer);
    this.timer = this.killTimer = null;
  }

  /** Wait up to `ms` for the exit; true when it exited. */
  async waitExit(ms: number): Promise<boolean> {
    if (!this.running) return true;
    let t: NodeJS.Timeout | undefined;
    await Promise.race([this.exited, new Promise<void>((r) => { t = setTimeout(r, ms); })]);
    clearTimeout(t);
    return !this.running;
  }

  /** Wait up to `ms` for stdio to close after the exit (the last output). */
  async waitClosed(ms: number): Promise<void> {
    let t: NodeJS.Timeout | undefined;
    await Promise.race([this.closed, new Promise<void>((r) => { t = setTimeout(r, ms); })]);
    clearTimeout(t);
  }

  /** Make sure the process is gone: SIGTERM, then SIGKILL, waiting for its exit. */
  async kill(): Promise<void> {
    if (!this.running) return;
    this.terminate();
    if (await this.waitExit(KILL_GRACE_MS + 500)) return;
    this.signalGroup("SIGKILL");
    await this.waitExit(5_000);
  }

  /** The error for a finished run, or null when it exited 0 in time. */
  statusError(): MemsnapError | null {
    if (this.spawnError && this.child.pid === undefined) {
      return failed(this.argv, `could not be started (${this.spawnError.message})`, "");
    }
    if (this.timedOut) return null; // the caller raises the timeout
    if (!this.exit) return null;
    if (this.exit.signal) return failed(this.argv, `was killed by ${this.exit.signal}`, this.stderr);
    if (this.exit.code !== 0) return failed(this.argv, `exited with status ${this.exit.code}`, this.stderr);
    return null;
  }
}

/** A safe artifact path from a tar entry name, or a reason it is not one. */
function entryPath(name: string): { path: string } | { bad: string } {
  const n = name.replace(/^(\.\/)+/, "");
  if (name.startsWith("/")) return { bad: "absolute path" };
  if (n.includes("\0")) return { bad: "NUL byte in name" };
  if (n.includes("\\")) return { bad: "backslash in name" };
  const trimmed = n.replace(/\/+$/, "");
  if (trimmed === "" || trimmed === ".") return { path: "" };
  for (const seg of trimmed.split("/")) {
    if (seg === "..") return { bad: "'..' segment (outside the layer)" };
    if (seg === "" || seg === ".") return { bad: "empty or '.' segment" };
  }
  if (trimmed === PLUGIN_RECORD) return { bad: `${PLUGIN_RECORD} is reserved for memsnap` };
  return { path: trimmed };
}

function pluginEnv(extra: Record<string, string> | undefined): NodeJS.ProcessEnv {
  return { ...process.env, ...(extra ?? {}), MEMSNAP_PLUGIN_PROTOCOL: PLUGIN_PROTOCOL };
}

/** Restores that already ran in this process (a layer is materialized once). */
const materialized = new Set<string>();

/** One entry of MEMSNAP_ALLOW_PLUGINS: a whole command, and where it runs (absent: the layer's directory). */
export interface AllowedPlugin {
  command: string[];
  cwd?: string;
}

const isArgv = (v: unknown): v is string[] => Array.isArray(v) && v.length > 0 && v.every((x) => typeof x === "string" && x !== "" && !x.includes("\0"));

/**
 * The whole commands MEMSNAP_ALLOW_PLUGINS allows, or why the value is not usable:
 * - unset or empty: none;
 * - starting with `[`: a JSON array whose entries are argv arrays (`["/usr/bin/node", "/opt/kv.mjs"]`)
 *   or `{"command": argv, "cwd": "/absolute/dir"}` (the directory the plugin runs in; without
 *   it, the restored layer's directory);
 * - otherwise a `:`-separated list of one-word commands (`/usr/local/bin/kv-plugin`), each
 *   allowing only a plugin whose whole recorded command is that word.
 * `1`, `all`, `true` once allowed any command a bundle named: they are refused with a reason.
 */
export function parseAllowedPlugins(value: string | undefined): { allowed: AllowedPlugin[] } | { error: string } {
  const v = (value ?? "").trim();
  if (v === "") return { allowed: [] };
  if (ALLOW_ANY_WORDS.has(v.toLowerCase())) {
    return { error: `${ALLOW_PLUGINS_ENV}=${v} no longer allows every plugin: a bundle would choose the code that runs. List each whole command instead` };
  }
  if (!v.startsWith("[") && !v.startsWith("{")) return { allowed: v.split(delimiter).filter(Boolean).map((w) => ({ command: [w] })) };
  let doc: unknown;
  try {
    doc = JSON.parse(v);
  } catch (e) {
    return { error: `${ALLOW_PLUGINS_ENV} is not valid JSON (${(e as Error).message})` };
  }
  if (!Array.isArray(doc)) return { error: `${ALLOW_PLUGINS_ENV} must be a JSON array of commands` };
  const allowed: AllowedPlugin[] = [];
  for (const [i, e] of doc.entries()) {
    if (isArgv(e)) {
      allowed.push({ command: e });
      continue;
    }
    if (isPlainObject(e) && isArgv(e.command) && Object.keys(e).every((k) => k === "command" || k === "cwd")
      && (e.cwd === undefined || (typeof e.cwd === "string" && isAbsolute(e.cwd)))) {
      allowed.push({ command: e.command, ...(e.cwd !== undefined ? { cwd: e.cwd as string } : {}) });
      continue;
    }
    return { error: `${ALLOW_PLUGINS_ENV} entry ${i} must be an array of non-empty strings (a whole command) or {"command": [...], "cwd": "/absolute/dir"}` };
  }
  return { allowed };
}

const sameArgv = (a: readonly string[], b: readonly string[]): boolean => a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * The host's entry for the command a bundle records, or MEMSNAP_PLUGIN_UNTRUSTED. The entry, not
 * the bundle, is what runs; the bundle's command only selects it, and only by being equal to it.
 */
function allowedPlugin(layer: LayerEntry, recorded: string[]): AllowedPlugin {
  const parsed = parseAllowedPlugins(process.env[ALLOW_PLUGINS_ENV]);
  const shown = `${JSON.stringify(recorded)} + "restore"`;
  if ("error" in parsed) {
    throw new MemsnapError("MEMSNAP_PLUGIN_UNTRUSTED", `restoring layer ${layer.name} runs a plugin, and ${parsed.error}`, {
      path: layer.name, hint: `list each plugin you trust by its whole command, e.g. ${ALLOW_EXAMPLE} (see docs/PLUGINS.md)`,
    });
  }
  const hit = parsed.allowed.find((a) => sameArgv(a.command, recorded));
  if (hit) return hit;
  throw new MemsnapError("MEMSNAP_PLUGIN_UNTRUSTED",
    `restoring layer ${layer.name} would run the plugin command the bundle records (${shown}), which ${ALLOW_PLUGINS_ENV} does not list as a whole command`, {
      path: layer.name,
      hint: `check the command (memsnap inspect); a plugin runs only when ${ALLOW_PLUGINS_ENV} lists its whole command, every argument equal, e.g. ${ALLOW_EXAMPLE} (see docs/PLUGINS.md)`,
    });
}

function readMeta(layer: LayerEntry): PluginMeta {
  const p = (layer.meta as { plugin?: unknown } | undefined)?.plugin;
  const ok = isPlainObject(p) && isArgv(p.command) && typeof p.cwd === "string"
    && Number.isSafeInteger(p.timeout_ms) && (p.timeout_ms as number) >= MIN_TIMEOUT_MS && (p.timeout_ms as number) <= MAX_TIMEOUT_MS;
  if (!ok) {
    throw new MemsnapError("MEMSNAP_PLUGIN_PROTOCOL", `exec layer ${layer.name}: the manifest does not name the plugin command (meta.plugin)`, {
      path: layer.name, hint: "the bundle was not written by memsnap or was altered",
    });
  }
  return p as unknown as PluginMeta;
}

/** External source plugins; see the module comment and docs/PLUGINS.md. */
export const execSource: SourceKind<ExecConfig> = {
  kind: "exec",
  schemaVersion: 1,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "command", "timeout_ms", "env", "config"], where);
    const name = reqString(raw, "name", where);
    const command = raw.command;
    if (!Array.isArray(command) || command.length === 0 || !command.every((x) => typeof x === "string" && x !== "")) {
      throw configInvalid(where, '"command" must be a non-empty array of non-empty strings (the plugin and its arguments)');
    }
    const cfg: ExecConfig = { kind: "exec", name, command: command as string[] };
    const timeout = optInt(raw, "timeout_ms", where, MIN_TIMEOUT_MS, MAX_TIMEOUT_MS);
    if (timeout !== undefined) cfg.timeout_ms = timeout;
    if (raw.env !== undefined) {
      if (!isPlainObject(raw.env)) throw configInvalid(where, '"env" must be an object of strings');
      for (const [k, v] of Object.entries(raw.env)) {
        if (!ENV_NAME.test(k) || typeof v !== "string") throw configInvalid(where, `"env" must map variable names to strings (bad entry ${JSON.stringify(k)})`);
      }
      cfg.env = raw.env as Record<string, string>;
    }
    if (raw.config !== undefined) {
      if (!isPlainObject(raw.config)) throw configInvalid(where, '"config" must be an object (passed to the plugin as is)');
      cfg.config = raw.config;
    }
    return cfg;
  },
  async capture(cfg, ctx) {
    const argv = resolveCommand(cfg.command, ctx.baseDir);
    const timeoutMs = cfg.timeout_ms ?? DEFAULT_TIMEOUT_MS;
    const request: PluginCaptureRequest = { protocol: PLUGIN_PROTOCOL, op: "capture", layer: cfg.name, config: cfg.config ?? {} };
    const extract = (await tarStream()).extract();
    const entries = extract[Symbol.asyncIterator]();
    const proc = new PluginProcess(argv, "capture", request, {
      cwd: ctx.baseDir, env: pluginEnv(cfg.env), timeoutMs,
      onTimeout: () => extract.destroy(timeoutError(argv, timeoutMs)),
      signal: ctx.signal,
    });
    const stdout = proc.child.stdout!;
    stdout.pipe(extract);
    let streamBroken = false;
    /** The error to report for a failure of the stream (`e`): timeout, crash, or protocol. */
    const classify = async (e: unknown): Promise<MemsnapError> => {
      if (!streamBroken) {
        streamBroken = true;
        stdout.unpipe(extract);
        stdout.resume(); // keep draining so a still-running plugin is not blocked on a full pipe
      }
      if (!proc.timedOut) await proc.waitExit(EXIT_WAIT_MS);
      if (proc.timedOut) return timeoutError(argv, timeoutMs);
      const st = proc.statusError();
      if (st) return st;
      await proc.kill();
      if (e instanceof MemsnapError && e.code.startsWith("MEMSNAP_PLUGIN_")) return e;
      return protocolError(argv, `malformed tar stream on stdout (${(e as Error)?.message ?? String(e)})`);
    };
    const unsafe = async (why: string): Promise<MemsnapError> => {
      streamBroken = true;
      stdout.unpipe(extract);
      stdout.resume();
      await proc.kill();
      return protocolError(argv, why);
    };
    const record = Buffer.from(`${JSON.stringify({ protocol: PLUGIN_PROTOCOL, layer: cfg.name, command: cfg.command, config: cfg.config ?? {} }, null, 2)}\n`);
    const stats = { entries: 0, bytes: 0, directories: 0 };
    const seen = new Set<string>();
    const startedAt = new Date();
    return {
      artifacts: (async function* (): AsyncGenerator<Artifact> {
        yield {
          path: PLUGIN_RECORD, kind: "json", size: record.length, mode: 0o600, mtime: startedAt, text: true,
          open: () => Readable.from([record]),
        };
        for (;;) {
          let next: IteratorResult<TarEntry>;
          try {
            next = await entries.next();
          } catch (e) {
            throw await classify(e);
          }
          if (next.done) break;
          const entry = next.value;
          const h = entry.header;
          const p = entryPath(h.name);
          if ("bad" in p) throw await unsafe(`entry ${JSON.stringify(h.name)}: ${p.bad}`);
          if (h.type === "directory") {
            stats.directories++;
            entry.resume();
            continue;
          }
          if (h.type !== "file" && h.type !== "contiguous-file") {
            throw await unsafe(`entry ${JSON.stringify(h.name)} is a ${h.type ?? "unknown"} entry; only regular files are allowed`);
          }
          if (p.path === "") throw await unsafe(`entry ${JSON.stringify(h.name)} has no name`);
          if (seen.has(p.path)) throw await unsafe(`entry ${JSON.stringify(p.path)} appears twice`);
          seen.add(p.path);
          const pax = (h.pax ?? {}) as Record<string, string | undefined>;
          const kind = pax["MEMSNAP.kind"] && KIND.test(pax["MEMSNAP.kind"]) ? pax["MEMSNAP.kind"] : "file";
          const size = h.size ?? 0;
          stats.entries++;
          stats.bytes += size;
          yield {
            path: p.path,
            kind,
            size,
            mode: (h.mode ?? 0o644) & 0o777,
            mtime: h.mtime ?? startedAt,
            text: pax["MEMSNAP.text"] === "1",
            open: () => (async function* () {
              let n = 0;
              try {
                for await (const c of entry as AsyncIterable<Buffer>) {
                  n += (c as Buffer).length;
                  yield c as Buffer;
                }
              } catch (e) {
                throw await classify(e);
              }
              if (n !== size) throw await classify(new Error(`entry ${p.path} ended after ${n} of ${size} bytes`));
            })(),
          };
          entry.resume(); // in case the consumer left bytes behind
        }
        await proc.exited;
        if (proc.timedOut) throw timeoutError(argv, timeoutMs);
        const st = proc.statusError();
        if (st) throw st;
      })(),
      finish: async () => ({
        plugin: { protocol: PLUGIN_PROTOCOL, command: argv, cwd: ctx.baseDir, timeout_ms: timeoutMs } satisfies PluginMeta,
        entries: stats.entries,
        bytes: stats.bytes,
        ...(stats.directories ? { directories_skipped: stats.directories } : {}),
      }),
      cleanup: async () => {
        if (proc.running) {
          stdout.unpipe(extract);
          stdout.destroy();
          await proc.kill();
        }
        extract.destroy();
      },
    };
  },
  async deepVerify({ entry, bytes }) {
    const rel = entry.path.slice(entry.layer.length + 1);
    const parts: Buffer[] = [];
    let n = 0;
    for await (const c of bytes) {
      if (rel !== PLUGIN_RECORD) continue;
      n += c.length;
      if (n <= RESPONSE_MAX) parts.push(c);
    }
    if (rel !== PLUGIN_RECORD) return null;
    if (n > RESPONSE_MAX) return `${entry.path}: over ${RESPONSE_MAX} bytes`;
    try {
      const doc = JSON.parse(Buffer.concat(parts).toString("utf8")) as Record<string, unknown>;
      if (!isPlainObject(doc) || doc.protocol !== PLUGIN_PROTOCOL || !isPlainObject(doc.config)) {
        return `${entry.path}: not a ${PLUGIN_PROTOCOL} plugin record (protocol and config are required)`;
      }
      return null;
    } catch (e) {
      return `${entry.path}: not valid JSON (${(e as Error).message})`;
    }
  },
  async materialize(dir, layer, _verified, signal) {
    const key = resolve(dir);
    if (materialized.has(key)) return;
    const meta = readMeta(layer);
    // The command that runs is the host's allow-list entry (equal to the recorded one); its cwd
    // is the entry's or the layer directory, never the cwd the bundle records. Checked first:
    // nothing the bundle holds is read before the command is known to be allowed.
    const plugin = allowedPlugin(layer, meta.command);
    let config: Record<string, unknown> = {};
    try {
      const doc = JSON.parse(await readFile(join(dir, PLUGIN_RECORD), "utf8")) as unknown;
      if (isPlainObject(doc) && isPlainObject(doc.config)) config = doc.config;
      else throw new Error("no config object");
    } catch (e) {
      throw new MemsnapError("MEMSNAP_PLUGIN_PROTOCOL", `exec layer ${layer.name}: ${PLUGIN_RECORD} is missing or broken (${(e as Error).message})`, {
        path: `${layer.name}/${PLUGIN_RECORD}`, hint: "the bundle was not written by memsnap or was altered",
      });
    }
    const argv = [...plugin.command];
    const cwd = plugin.cwd ?? key;
    const request: PluginRestoreRequest = { protocol: PLUGIN_PROTOCOL, op: "restore", layer: layer.name, dir: key, config };
    let timedOut = false;
    const proc = new PluginProcess(argv, "restore", request, {
      cwd, env: pluginEnv(undefined), timeoutMs: meta.timeout_ms, onTimeout: () => { timedOut = true; }, signal,
    });
    let out = Buffer.alloc(0);
    let tooLong = false;
    proc.child.stdout!.on("data", (b: Buffer) => {
      if (out.length + b.length > RESPONSE_MAX) tooLong = true;
      else out = Buffer.concat([out, b]);
    });
    await proc.exited;
    await proc.waitClosed(2_000);
    if (timedOut) throw timeoutError(argv, meta.timeout_ms);
    const st = proc.statusError();
    if (st) throw st;
    if (tooLong) throw protocolError(argv, `restore response over ${RESPONSE_MAX} bytes`);
    const text = out.toString("utf8").trim();
    if (text !== "") {
      let resp: unknown;
      try {
        resp = JSON.parse(text);
      } catch {
        throw protocolError(argv, "the restore response on stdout is not JSON");
      }
      if (!isPlainObject(resp) || resp.protocol !== PLUGIN_PROTOCOL || typeof resp.ok !== "boolean") {
        throw protocolError(argv, `the restore response must be {"protocol":"${PLUGIN_PROTOCOL}","ok":true|false,…}`);
      }
      if (!resp.ok) {
        throw failed(argv, `could not restore layer ${layer.name}`, typeof resp.error === "string" ? resp.error : proc.stderrText);
      }
    }
    materialized.add(key);
  },
};
