/**
 * Lifecycle hooks: commands from the config run on `on_created`, `before_restore`,
 * `on_restored` and `on_failed`, each receiving the event's metadata JSON on stdin, so
 * operators can publish to NATS, a webhook or a pager, or stop and start the agent, without
 * changing memsnap. A hook that fails, hangs past its timeout or cannot start is reported back
 * and never breaks the snapshot or restore, except `before_restore`: an in-place restore does
 * not start over an agent its hook could not stop (the CLI raises MEMSNAP_HOOK_REFUSED).
 */
import { spawn } from "node:child_process";
import { configInvalid, isPlainObject, optInt, rejectUnknownKeys } from "./util/config-check.js";

export type HookEvent = "on_created" | "before_restore" | "on_restored" | "on_failed";
export const HOOK_EVENTS: readonly HookEvent[] = ["on_created", "before_restore", "on_restored", "on_failed"];

export interface HooksConfig {
  on_created?: string[];
  /** Runs before an in-place restore touches anything (to stop the agent); its failure stops the restore. */
  before_restore?: string[];
  on_restored?: string[];
  on_failed?: string[];
  timeout_ms: number;
}

export interface HookResult {
  event: HookEvent;
  command: string[];
  ok: boolean;
  exit_code: number | null;
  /** Why it failed: exit code, signal, timeout, or spawn error; plus the tail of stderr. */
  error?: string;
  duration_ms: number;
}

/** Parse the config's `hooks` object: each event is an argv array (no shell). */
export function parseHooks(raw: unknown, where: string): HooksConfig {
  if (raw === undefined) return { timeout_ms: 30_000 };
  if (!isPlainObject(raw)) throw configInvalid(where, "must be an object");
  rejectUnknownKeys(raw, [...HOOK_EVENTS, "timeout_ms"], where);
  const out: HooksConfig = { timeout_ms: optInt(raw, "timeout_ms", where, 100, 3_600_000) ?? 30_000 };
  for (const e of HOOK_EVENTS) {
    const v = raw[e];
    if (v === undefined) continue;
    if (!Array.isArray(v) || v.length === 0 || !v.every((x) => typeof x === "string" && x !== "")) {
      throw configInvalid(where, `"${e}" must be a non-empty array of strings: the command and its arguments`);
    }
    out[e] = v as string[];
  }
  return out;
}

/** Run one event's hook if configured. Resolves with its result (never rejects), or null when none is configured. */
export function runHook(
  hooks: HooksConfig | undefined,
  event: HookEvent,
  metadata: Record<string, unknown>,
  cwd?: string,
): Promise<HookResult | null> {
  const cmd = hooks?.[event];
  if (!cmd) return Promise.resolve(null);
  const t0 = performance.now();
  return new Promise((resolve) => {
    const [file, ...args] = cmd as [string, ...string[]];
    let stderr = "";
    let settled = false;
    const done = (r: Omit<HookResult, "event" | "command" | "duration_ms">): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve({ event, command: cmd, duration_ms: Math.round(performance.now() - t0), ...r });
    };
    // Its own process group, so that a timeout ends everything it started: `sh -c "…"` (dash
    // forks its command rather than exec'ing it) killed alone left the command holding the
    // stderr pipe, and memsnap waited for that command to end, timeout or not.
    const child = spawn(file, args, {
      cwd,
      stdio: ["pipe", "ignore", "pipe"],
      env: { ...process.env, MEMSNAP_EVENT: event },
      detached: true,
    });
    const killGroup = (sig: NodeJS.Signals): void => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, sig);
      } catch {
        // the group is gone already
      }
    };
    // memsnap exiting (done, or SIGINT) takes a hook still running with it, as before it had a group of its own.
    const onExit = (): void => killGroup("SIGKILL");
    process.once("exit", onExit);
    child.once("close", () => process.off("exit", onExit));
    const timer = setTimeout(() => {
      killGroup("SIGTERM");
      setTimeout(() => killGroup("SIGKILL"), 2000).unref();
      // Whatever still holds its pipes is not waited for.
      child.stderr.destroy();
      child.stdin.destroy();
      child.unref();
      done({ ok: false, exit_code: null, error: `timed out after ${hooks!.timeout_ms} ms` });
    }, hooks!.timeout_ms);
    child.stderr.on("data", (c: Buffer) => {
      stderr = (stderr + c.toString("utf8")).slice(-2000);
    });
    child.on("error", (e) => done({ ok: false, exit_code: null, error: `cannot run ${file}: ${e.message}` }));
    child.on("close", (code, signal) => {
      if (code === 0) done({ ok: true, exit_code: 0 });
      else
        done({
          ok: false,
          exit_code: code,
          error: `${signal ? `killed by ${signal}` : `exit ${code}`}${
            stderr.trim() ? `: ${stderr.trim().split("\n").slice(-3).join(" | ")}` : ""
          }`,
        });
    });
    child.stdin.on("error", () => undefined); // a hook that ignores stdin must not crash us
    child.stdin.end(JSON.stringify({ event, ...metadata }) + "\n");
  });
}
