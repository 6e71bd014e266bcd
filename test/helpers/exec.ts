/** Small helpers for tests that drive external CLIs (age, age-keygen, script). */
import { spawn, spawnSync } from "node:child_process";
import { it } from "vitest";

export interface ExecResult {
  code: number | null;
  stdout: Buffer;
  stderr: string;
}

/** Run `cmd args…`, feeding `input` on stdin; resolves with exit code and output (never rejects on a non-zero exit). */
export function exec(
  cmd: string,
  args: string[],
  opts: { input?: Buffer | string; cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<ExecResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: opts.cwd, env: opts.env ?? process.env, stdio: ["pipe", "pipe", "pipe"] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const timer = setTimeout(() => child.kill("SIGKILL"), opts.timeoutMs ?? 30_000);
    child.stdout.on("data", (b: Buffer) => out.push(b));
    child.stderr.on("data", (b: Buffer) => err.push(b));
    child.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout: Buffer.concat(out), stderr: Buffer.concat(err).toString("utf8") });
    });
    child.stdin.on("error", () => {
      /* the tool may exit before reading all of stdin; the exit code tells */
    });
    child.stdin.end(opts.input ?? "");
  });
}

/** True when `cmd` can be spawned (looked up on PATH). */
export function toolAvailable(cmd: string, versionArgs: string[] = ["--version"]): boolean {
  const r = spawnSync(cmd, versionArgs, { stdio: "ignore", timeout: 10_000 });
  return r.error === undefined;
}

/**
 * `it` for a test that needs external tools: skipped when a tool is missing, except that
 * when env CI is set a missing tool makes the test fail instead.
 */
export type ToolTest = (name: string, fn: () => unknown, timeoutMs?: number) => void;

export function itWithTools(tools: Array<string | [string, string[]]>): ToolTest {
  const missing = tools
    .map((t) => (typeof t === "string" ? ([t, ["--version"]] as [string, string[]]) : t))
    .filter(([cmd, args]) => !toolAvailable(cmd, args))
    .map(([cmd]) => cmd);
  if (missing.length === 0) return (name, fn, timeoutMs) => it(name, async () => { await fn(); }, timeoutMs);
  if (!process.env.CI) return (name, fn, timeoutMs) => it.skip(name, async () => { await fn(); }, timeoutMs);
  return (name, _fn, timeoutMs) =>
    it(name, () => {
      throw new Error(`required tool(s) missing: ${missing.join(", ")} (CI is set, so this test fails instead of skipping)`);
    }, timeoutMs);
}
