/** The memsnap-plugin/1 protocol: its constants, its requests, its errors and the tar entry names it accepts. */
import { MemsnapError } from "../../errors.js";

export const PLUGIN_PROTOCOL = "memsnap-plugin/1";
/** The artifact memsnap adds to every exec layer: the request it made (config and command). */
export const PLUGIN_RECORD = ".memsnap-plugin.json";
export const DEFAULT_TIMEOUT_MS = 60_000;
/** Between SIGTERM and SIGKILL. */
export const KILL_GRACE_MS = 2_000;
/** How long a broken stream waits for the plugin's exit status before calling it a protocol error. */
export const EXIT_WAIT_MS = 1_000;
export const STDERR_KEEP = 64 * 1024;
export const RESPONSE_MAX = 1024 * 1024;

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
export interface PluginMeta {
  protocol: string;
  command: string[];
  cwd: string;
  timeout_ms: number;
}

export const MIN_TIMEOUT_MS = 100;
export const MAX_TIMEOUT_MS = 24 * 3600 * 1000;

export function failed(cmd: string[], why: string, stderr: string, path?: string): MemsnapError {
  const tail = stderr.trim().split("\n").slice(-5).join("\n").slice(-2000);
  return new MemsnapError("MEMSNAP_PLUGIN_FAILED", `plugin ${cmd.join(" ")} ${why}${tail ? `: ${tail}` : ""}`, {
    ...(path ? { path } : {}),
    hint: "run the plugin by hand (see docs/PLUGINS.md) and check its stderr",
  });
}

export function protocolError(cmd: string[], why: string): MemsnapError {
  const msg = `plugin ${cmd.join(" ")} broke the ${PLUGIN_PROTOCOL} protocol: ${why}`;
  return new MemsnapError("MEMSNAP_PLUGIN_PROTOCOL", msg, {
    hint: "the plugin must write a tar of regular files with relative paths on stdout; see docs/PLUGINS.md",
  });
}

export function timeoutError(cmd: string[], ms: number): MemsnapError {
  const msg = `plugin ${cmd.join(" ")} ran past its ${ms} ms timeout and was killed`;
  return new MemsnapError("MEMSNAP_PLUGIN_TIMEOUT", msg, {
    hint: "raise the source's timeout_ms, or find out why the plugin hangs",
  });
}

/** A safe artifact path from a tar entry name, or a reason it is not one. */
export function entryPath(name: string): { path: string } | { bad: string } {
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
