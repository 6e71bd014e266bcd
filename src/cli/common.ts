import { isMemsnapError, runHook, type HookEvent, type HooksConfig } from "../index.js";

/** Helpers shared by the CLI commands. */
export interface GlobalOpts {
  json: boolean;
}

/** Commander collector for repeatable options. */
export function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

/**
 * Run `fn` with an AbortSignal that fires on SIGINT/SIGTERM, so a command interrupted by
 * the user cleans up (no partial bundle, staging removed) before the process exits.
 */
export async function withAbort<T>(fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const ac = new AbortController();
  const onSignal = (): void => ac.abort();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    return await fn(ac.signal);
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

/** Run a lifecycle hook; a failing hook is reported on stderr and never fails the command. */
export async function hook(hooks: HooksConfig, event: HookEvent, metadata: Record<string, unknown>, cwd: string): Promise<void> {
  const r = await runHook(hooks, event, metadata, cwd);
  if (r && !r.ok) process.stderr.write(`memsnap: warning: hook ${event} (${r.command.join(" ")}) failed: ${r.error}\n`);
}

/** An error as JSON for hook metadata. */
export function errorJson(e: unknown): Record<string, unknown> {
  return isMemsnapError(e) ? e.toJSON() : { code: "MEMSNAP_INTERNAL", message: String(e) };
}
