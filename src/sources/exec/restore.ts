/**
 * Restore (materialize): spawn `command… restore` with a JSON restore request naming the
 * directory where the layer's files were restored; the plugin turns them into live state.
 */
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { MemsnapError } from "../../errors.js";
import type { LayerEntry } from "../../format/manifest.js";
import { isPlainObject } from "../../util/config-check.js";
import type { VerifiedLookup } from "../types.js";
import { allowedPlugin, isArgv } from "./allow.js";
import { pluginEnv, PluginProcess } from "./process.js";
import {
  failed,
  MAX_TIMEOUT_MS,
  MIN_TIMEOUT_MS,
  PLUGIN_PROTOCOL,
  PLUGIN_RECORD,
  protocolError,
  RESPONSE_MAX,
  timeoutError,
  type PluginMeta,
  type PluginRestoreRequest,
} from "./protocol.js";

/** Restores that already ran in this process (a layer is materialized once). */
const materialized = new Set<string>();

function readMeta(layer: LayerEntry): PluginMeta {
  const p = (layer.meta as { plugin?: unknown } | undefined)?.plugin;
  const ok =
    isPlainObject(p) &&
    isArgv(p.command) &&
    typeof p.cwd === "string" &&
    Number.isSafeInteger(p.timeout_ms) &&
    (p.timeout_ms as number) >= MIN_TIMEOUT_MS &&
    (p.timeout_ms as number) <= MAX_TIMEOUT_MS;
  if (!ok) {
    const msg = `exec layer ${layer.name}: the manifest does not name the plugin command (meta.plugin)`;
    throw new MemsnapError("MEMSNAP_PLUGIN_PROTOCOL", msg, {
      path: layer.name,
      hint: "the bundle was not written by memsnap or was altered",
    });
  }
  return p as unknown as PluginMeta;
}

/** Run the plugin's restore on the layer's restored files in `dir` (once per directory and process). */
export async function materializeLayer(
  dir: string,
  layer: LayerEntry,
  _verified?: VerifiedLookup,
  signal?: AbortSignal,
): Promise<void> {
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
    const msg = `exec layer ${layer.name}: ${PLUGIN_RECORD} is missing or broken (${(e as Error).message})`;
    throw new MemsnapError("MEMSNAP_PLUGIN_PROTOCOL", msg, {
      path: `${layer.name}/${PLUGIN_RECORD}`,
      hint: "the bundle was not written by memsnap or was altered",
    });
  }
  const argv = [...plugin.command];
  const cwd = plugin.cwd ?? key;
  const request: PluginRestoreRequest = {
    protocol: PLUGIN_PROTOCOL,
    op: "restore",
    layer: layer.name,
    dir: key,
    config,
  };
  let timedOut = false;
  const proc = new PluginProcess(argv, "restore", request, {
    cwd,
    env: pluginEnv(undefined),
    timeoutMs: meta.timeout_ms,
    onTimeout: () => {
      timedOut = true;
    },
    signal,
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
      const said = typeof resp.error === "string" ? resp.error : proc.stderrText;
      throw failed(argv, `could not restore layer ${layer.name}`, said);
    }
  }
  materialized.add(key);
}
