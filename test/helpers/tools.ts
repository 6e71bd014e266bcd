/**
 * External CLI tools some tests need (tar, zstd, age, age-keygen, sqlite3, git).
 *
 * `requireTool(name, ctx)` returns true when the tool is on PATH. When it is missing:
 * with env CI set it throws, so the test FAILS (CI must have every tool); otherwise it skips
 * the test through the test context (`ctx.skip`), or, without a context, returns false so
 * the caller can `it.skipIf(...)`.
 */
import { accessSync, constants, statSync } from "node:fs";
import { delimiter, join } from "node:path";

const cache = new Map<string, boolean>();

/** True when an executable called `name` is on PATH (no process is spawned). */
export function hasTool(name: string): boolean {
  let found = cache.get(name);
  if (found === undefined) {
    found = (process.env.PATH ?? "").split(delimiter).filter(Boolean).some((d) => {
      const p = join(d, name);
      try {
        accessSync(p, constants.X_OK);
        return statSync(p).isFile();
      } catch {
        return false;
      }
    });
    cache.set(name, found);
  }
  return found;
}

/** The part of vitest's TestContext this needs. */
export interface SkipContext {
  skip: (note?: string) => never;
}

/**
 * Require CLI tools for the current test: true when all are there; when one is missing,
 * throw if env CI is set (the test fails), else skip the test via `ctx.skip`, or return
 * false when no context was given.
 */
export function requireTool(name: string | string[], ctx?: SkipContext): boolean {
  const missing = (Array.isArray(name) ? name : [name]).filter((n) => !hasTool(n));
  if (missing.length === 0) return true;
  const why = `required tool(s) not on PATH: ${missing.join(", ")}`;
  if (process.env.CI) throw new Error(`${why} (CI is set, so this test fails instead of skipping)`);
  if (ctx) ctx.skip(why);
  return false;
}
