/**
 * A bundle is untrusted input, so the command a restore runs comes from this host, never from
 * the bundle: MEMSNAP_ALLOW_PLUGINS lists whole commands (every argument), and a layer is
 * restored only when the command its manifest records (meta.plugin.command) is exactly one of
 * them; that entry is what runs, in the entry's cwd or else the layer's own directory. The
 * bundle's recorded cwd is never used. Anything else is MEMSNAP_PLUGIN_UNTRUSTED (exit 9) before
 * a process is started.
 */
import { delimiter, isAbsolute } from "node:path";
import { MemsnapError } from "../../errors.js";
import type { LayerEntry } from "../../format/manifest.js";
import { isPlainObject } from "../../util/config-check.js";

/**
 * Env var naming the plugin commands a restore may run: a JSON array of whole commands, each an
 * argv array or `{"command": argv, "cwd": "/abs/dir"}`; or a `:`-separated list of one-word
 * commands (an executable run with no argument but the op). See {@link parseAllowedPlugins}.
 */
export const ALLOW_PLUGINS_ENV = "MEMSNAP_ALLOW_PLUGINS";
/** Values that once admitted any command a bundle named; they now admit nothing (and say so). */
const ALLOW_ANY_WORDS = new Set(["1", "all", "true", "yes", "*"]);
const ALLOW_EXAMPLE = `${ALLOW_PLUGINS_ENV}='[["/usr/bin/node","/opt/plugins/kv.mjs"]]'`;

/** One entry of MEMSNAP_ALLOW_PLUGINS: a whole command, and where it runs (absent: the layer's directory). */
export interface AllowedPlugin {
  command: string[];
  cwd?: string;
}

export const isArgv = (v: unknown): v is string[] =>
  Array.isArray(v) && v.length > 0 && v.every((x) => typeof x === "string" && x !== "" && !x.includes("\0"));

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
    return {
      error:
        `${ALLOW_PLUGINS_ENV}=${v} no longer allows every plugin: a bundle would choose the code that runs. ` +
        "List each whole command instead",
    };
  }
  if (!v.startsWith("[") && !v.startsWith("{")) {
    return {
      allowed: v
        .split(delimiter)
        .filter(Boolean)
        .map((w) => ({ command: [w] })),
    };
  }
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
    if (
      isPlainObject(e) &&
      isArgv(e.command) &&
      Object.keys(e).every((k) => k === "command" || k === "cwd") &&
      (e.cwd === undefined || (typeof e.cwd === "string" && isAbsolute(e.cwd)))
    ) {
      allowed.push({ command: e.command, ...(e.cwd !== undefined ? { cwd: e.cwd as string } : {}) });
      continue;
    }
    return {
      error:
        `${ALLOW_PLUGINS_ENV} entry ${i} must be an array of non-empty strings (a whole command) ` +
        'or {"command": [...], "cwd": "/absolute/dir"}',
    };
  }
  return { allowed };
}

const sameArgv = (a: readonly string[], b: readonly string[]): boolean =>
  a.length === b.length && a.every((x, i) => x === b[i]);

/**
 * The host's entry for the command a bundle records, or MEMSNAP_PLUGIN_UNTRUSTED. The entry, not
 * the bundle, is what runs; the bundle's command only selects it, and only by being equal to it.
 */
export function allowedPlugin(layer: LayerEntry, recorded: string[]): AllowedPlugin {
  const parsed = parseAllowedPlugins(process.env[ALLOW_PLUGINS_ENV]);
  const shown = `${JSON.stringify(recorded)} + "restore"`;
  if ("error" in parsed) {
    const msg = `restoring layer ${layer.name} runs a plugin, and ${parsed.error}`;
    throw new MemsnapError("MEMSNAP_PLUGIN_UNTRUSTED", msg, {
      path: layer.name,
      hint: `list each plugin you trust by its whole command, e.g. ${ALLOW_EXAMPLE} (see docs/PLUGINS.md)`,
    });
  }
  const hit = parsed.allowed.find((a) => sameArgv(a.command, recorded));
  if (hit) return hit;
  throw new MemsnapError(
    "MEMSNAP_PLUGIN_UNTRUSTED",
    `restoring layer ${layer.name} would run the plugin command the bundle records (${shown}), ` +
      `which ${ALLOW_PLUGINS_ENV} does not list as a whole command`,
    {
      path: layer.name,
      hint:
        `check the command (memsnap inspect); a plugin runs only when ${ALLOW_PLUGINS_ENV} lists its whole ` +
        `command, every argument equal, e.g. ${ALLOW_EXAMPLE} (see docs/PLUGINS.md)`,
    },
  );
}
