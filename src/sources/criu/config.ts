/** The criu source's config. */
import { configInvalid, optInt, optString, rejectUnknownKeys, reqString } from "../../util/config-check.js";

export interface CriuConfig {
  kind: "criu";
  name: string;
  /** An images directory, or a procs.criu.v1 blob file; with `pid`, where `criu dump` writes (new or empty). */
  path?: string;
  /** Dump this process with `criu dump --leave-running` (needs a working criu). */
  pid?: number;
  /** The criu executable (default `criu` on PATH). */
  criu_bin?: string;
}

export function parseCriuConfig(raw: Record<string, unknown>, where: string): CriuConfig {
  rejectUnknownKeys(raw, ["kind", "name", "path", "pid", "criu_bin"], where);
  const cfg: CriuConfig = { kind: "criu", name: reqString(raw, "name", where) };
  const path = optString(raw, "path", where);
  const pid = optInt(raw, "pid", where, 1, 4194304);
  const bin = optString(raw, "criu_bin", where);
  if (path !== undefined) cfg.path = path;
  if (pid !== undefined) cfg.pid = pid;
  if (bin !== undefined) cfg.criu_bin = bin;
  if (path === undefined && pid === undefined) {
    throw configInvalid(
      where,
      'a criu source needs "path" (an images directory or procs.criu.v1 blob) or "pid" ' + "(dump a running process)",
    );
  }
  return cfg;
}
