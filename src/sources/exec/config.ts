/** The `exec` source's config entry. */
import { configInvalid, isPlainObject, optInt, rejectUnknownKeys, reqString } from "../../util/config-check.js";
import { MAX_TIMEOUT_MS, MIN_TIMEOUT_MS } from "./protocol.js";

export interface ExecConfig {
  kind: "exec";
  name: string;
  command: string[];
  timeout_ms?: number;
  env?: Record<string, string>;
  config?: Record<string, unknown>;
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Check an exec source's config entry. */
export function parseExecConfig(raw: Record<string, unknown>, where: string): ExecConfig {
  rejectUnknownKeys(raw, ["kind", "name", "command", "timeout_ms", "env", "config"], where);
  const name = reqString(raw, "name", where);
  const command = raw.command;
  if (!Array.isArray(command) || command.length === 0 || !command.every((x) => typeof x === "string" && x !== "")) {
    throw configInvalid(
      where,
      '"command" must be a non-empty array of non-empty strings (the plugin and its arguments)',
    );
  }
  const cfg: ExecConfig = { kind: "exec", name, command: command as string[] };
  const timeout = optInt(raw, "timeout_ms", where, MIN_TIMEOUT_MS, MAX_TIMEOUT_MS);
  if (timeout !== undefined) cfg.timeout_ms = timeout;
  if (raw.env !== undefined) {
    if (!isPlainObject(raw.env)) throw configInvalid(where, '"env" must be an object of strings');
    for (const [k, v] of Object.entries(raw.env)) {
      if (!ENV_NAME.test(k) || typeof v !== "string") {
        throw configInvalid(where, `"env" must map variable names to strings (bad entry ${JSON.stringify(k)})`);
      }
    }
    cfg.env = raw.env as Record<string, string>;
  }
  if (raw.config !== undefined) {
    if (!isPlainObject(raw.config)) {
      throw configInvalid(where, '"config" must be an object (passed to the plugin as is)');
    }
    cfg.config = raw.config;
  }
  return cfg;
}
