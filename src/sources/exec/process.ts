/** A running plugin process: its request on stdin, its stderr kept, its timeout and its process group killed. */
import { spawn, type ChildProcess } from "node:child_process";
import { resolve } from "node:path";
import type { MemsnapError } from "../../errors.js";
import { failed, KILL_GRACE_MS, PLUGIN_PROTOCOL, STDERR_KEEP } from "./protocol.js";

/** Absolute command path when it names a file (contains a `/`); a bare name is looked up on PATH. */
export function resolveCommand(command: string[], baseDir: string): string[] {
  const [first, ...rest] = command;
  return [first!.includes("/") ? resolve(baseDir, first!) : first!, ...rest];
}

/** One running plugin process. */
export class PluginProcess {
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

  constructor(
    readonly argv: string[],
    op: "capture" | "restore",
    request: object,
    opts: {
      cwd: string;
      env: NodeJS.ProcessEnv;
      timeoutMs: number;
      onTimeout: () => void;
      signal?: AbortSignal | undefined;
    },
  ) {
    this.child = spawn(argv[0]!, [...argv.slice(1), op], {
      cwd: opts.cwd,
      env: opts.env,
      stdio: ["pipe", "pipe", "pipe"],
      detached: true,
    });
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
      void this.exited.then(() => {
        if (this.child.pid === undefined) res();
      });
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
    await Promise.race([
      this.exited,
      new Promise<void>((r) => {
        t = setTimeout(r, ms);
      }),
    ]);
    clearTimeout(t);
    return !this.running;
  }

  /** Wait up to `ms` for stdio to close after the exit (the last output). */
  async waitClosed(ms: number): Promise<void> {
    let t: NodeJS.Timeout | undefined;
    await Promise.race([
      this.closed,
      new Promise<void>((r) => {
        t = setTimeout(r, ms);
      }),
    ]);
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

export function pluginEnv(extra: Record<string, string> | undefined): NodeJS.ProcessEnv {
  return { ...process.env, ...(extra ?? {}), MEMSNAP_PLUGIN_PROTOCOL: PLUGIN_PROTOCOL };
}
