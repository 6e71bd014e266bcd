import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { loadConfig as readConfig, type MemsnapConfig } from "../config.js";
import { isMemsnapError, MemsnapError } from "../errors.js";
import { isBundleUrl } from "../format/bundle-file.js";
import { useConfiguredEndpoint } from "../objstore/location.js";
import { runHook, type HookEvent, type HooksConfig } from "../hooks.js";
import { resolveStore } from "../store/paths.js";
import { findSnapshot } from "../store/store.js";

/** Load memsnap.json; its `s3_endpoint` then applies to every s3 store this command opens. */
export async function loadConfig(path: string): Promise<MemsnapConfig> {
  const config = await readConfig(path);
  useConfiguredEndpoint(config.s3Endpoint);
  return config;
}

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
export async function hook(
  hooks: HooksConfig,
  event: HookEvent,
  metadata: Record<string, unknown>,
  cwd: string,
): Promise<void> {
  const r = await runHook(hooks, event, metadata, cwd);
  if (r && !r.ok) process.stderr.write(`memsnap: warning: hook ${event} (${r.command.join(" ")}) failed: ${r.error}\n`);
}

/** An error as JSON for hook metadata. */
export function errorJson(e: unknown): Record<string, unknown> {
  return isMemsnapError(e) ? e.toJSON() : { code: "MEMSNAP_INTERNAL", message: String(e) };
}

/** A snapshot id or a prefix of one (ULID: Crockford base32, no I, L, O or U), at least 6 characters. */
const ID_REF = /^[0-9a-hjkmnp-tv-z]{6,26}$/i;

/**
 * A bundle argument: a path, or (when no such file exists) a snapshot id or unique id prefix
 * in `store`, as `memsnap list` shows them; `filter` limits the lookup to one tenant/agent.
 * Throws MEMSNAP_SOURCE_MISSING ("no such file: PATH") when it is neither, MEMSNAP_USAGE for an ambiguous prefix.
 */
export async function bundleArg(
  ref: string,
  storeOf: () => Promise<string>,
  filter: { tenant?: string; agent?: string } = {},
): Promise<string> {
  if (existsSync(ref) || isBundleUrl(ref)) return ref;
  if (!ID_REF.test(ref)) {
    // A mistyped path is not a damaged bundle: say what happened before anything reads it.
    throw new MemsnapError("MEMSNAP_SOURCE_MISSING", `no such file: ${resolve(ref)}`, {
      path: resolve(ref),
      hint: "check the bundle path (memsnap list shows the store's bundles, by id and path)",
    });
  }
  const store = await storeOf();
  try {
    return (await findSnapshot(store, ref, filter)).path;
  } catch (e) {
    if (isMemsnapError(e) && /^no snapshot/.test(e.message)) {
      throw new MemsnapError(
        "MEMSNAP_SOURCE_MISSING",
        `no bundle file ${ref}, and no snapshot with that id in ${store}`,
        {
          hint: "pass a bundle path, or an id from `memsnap list` (--store DIR for another store)",
        },
      );
    }
    throw e;
  }
}

/** The store a command without a config of its own looks in: --store, else ./memsnap.json's, else the default. */
export async function defaultStore(store: string | undefined): Promise<string> {
  if (store) return resolveStore(store, undefined);
  return resolveStore(undefined, existsSync("memsnap.json") ? (await loadConfig("memsnap.json")).store : undefined);
}
