/**
 * memsnap.json: which agent this is and what to capture. JSON with `//` and block comments
 * allowed (memsnap init writes a commented file). Every key is validated; an unknown key is
 * MEMSNAP_CONFIG_UNKNOWN_KEY, never silently ignored.
 */
import { readFile } from "node:fs/promises";
import { dirname, resolve } from "node:path";
import { MemsnapError } from "./errors.js";
import { ID_PATTERN } from "./format/manifest.js";
import { parseHooks, type HooksConfig } from "./hooks.js";
import { parseRedactionConfig, type RedactionConfig } from "./redact/index.js";
import { sourceKind, SOURCE_KINDS } from "./sources/registry.js";
import { locationString, parseStoreLocation } from "./objstore/location.js";
import type { SourceKind } from "./sources/types.js";
import {
  configInvalid,
  isPlainObject,
  optInt,
  optString,
  optStringArray,
  rejectUnknownKeys,
  reqString,
} from "./util/config-check.js";

/** A configured source: its kind's implementation and its parsed entry. */
export interface ConfiguredSource {
  impl: SourceKind<{ name: string }>;
  cfg: { name: string } & Record<string, unknown>;
}

export interface MemsnapConfig {
  /** Absolute path of the config file, or null when built in code. */
  file: string | null;
  /** Directory that relative paths resolve against. */
  baseDir: string;
  tenant: string;
  agent: string;
  /** Absolute store directory or `s3://bucket/prefix` URL, when the config names one. */
  store?: string;
  /** The S3 endpoint URL (config "s3_endpoint"; $MEMSNAP_S3_ENDPOINT overrides it). */
  s3Endpoint?: string;
  recipients: string[];
  recipientsFile?: string;
  /** Absolute path of the Ed25519 signing key snapshot and schedule sign with (config "sign_key"). */
  signKey?: string;
  compression: { level: number; threads?: number };
  redaction: RedactionConfig;
  hooks: HooksConfig;
  sources: ConfiguredSource[];
}

export const LAYER_NAME = /^[a-z0-9][a-z0-9_-]{0,63}$/;

/** The first character at or after `i` that is not whitespace or inside a comment ("" at the end). */
function nextSignificant(text: string, i: number): string {
  while (i < text.length) {
    const c = text[i]!;
    if (c === " " || c === "\t" || c === "\n" || c === "\r") i++;
    else if (c === "/" && text[i + 1] === "/") {
      const nl = text.indexOf("\n", i);
      i = nl < 0 ? text.length : nl;
    } else if (c === "/" && text[i + 1] === "*") {
      const end = text.indexOf("*/", i + 2);
      i = end < 0 ? text.length : end + 2;
    } else return c;
  }
  return "";
}

/**
 * Blank out `//` and block comments outside strings with spaces, and a trailing comma (one
 * followed only by whitespace and comments, then `}` or `]`), so every offset stays where it was
 * and an error names the line and column of the file as written.
 */
export function stripJsonComments(text: string): string {
  let out = "";
  let inStr = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (inStr) {
      out += c;
      if (c === "\\") out += text[++i] ?? "";
      else if (c === '"') inStr = false;
    } else if (c === '"') {
      inStr = true;
      out += c;
    } else if (c === ",") {
      const n = nextSignificant(text, i + 1);
      out += n === "}" || n === "]" ? " " : c;
    } else if (c === "/" && text[i + 1] === "/") {
      while (i < text.length && text[i] !== "\n") {
        out += " ";
        i++;
      }
      if (i < text.length) out += "\n";
    } else if (c === "/" && text[i + 1] === "*") {
      const end = text.indexOf("*/", i + 2);
      const body = text.slice(i, end < 0 ? text.length : end + 2);
      out += body.replace(/[^\n]/g, " ");
      i = end < 0 ? text.length : end + 1;
    } else {
      out += c;
    }
  }
  return out;
}

/** A JSON.parse message with its "at position N" said as the line and column of the original text. */
function jsonErrorWhere(message: string, text: string): string {
  const m = / at position (\d+)/.exec(message);
  if (!m) return message;
  const pos = Number(m[1]);
  const before = text.slice(0, pos);
  const line = before.split("\n").length;
  const col = pos - before.lastIndexOf("\n");
  return (
    `${message.replace(/ in JSON at position \d+.*$/, "").replace(/ at position \d+.*$/, "")} at line ${line}, ` +
    `column ${col}`
  );
}

/** The config's store: a directory relative to the config, or an s3 URL (another scheme is an error). */
function configStore(store: string, baseDir: string, where: string): string {
  try {
    return locationString(parseStoreLocation(store, baseDir));
  } catch (e) {
    if (!(e instanceof MemsnapError)) throw e;
    throw new MemsnapError("MEMSNAP_CONFIG_INVALID", `${where}: "store": ${e.message}`, {
      ...(e.hint ? { hint: e.hint } : {}),
    });
  }
}

/** Validate a parsed config object. Throws MEMSNAP_CONFIG_INVALID / MEMSNAP_CONFIG_UNKNOWN_KEY. */
export function parseConfig(raw: unknown, file: string | null, baseDir: string): MemsnapConfig {
  const where = file ?? "config";
  if (!isPlainObject(raw)) throw configInvalid(where, "must be a JSON object");
  rejectUnknownKeys(
    raw,
    [
      "$schema",
      "tenant",
      "agent",
      "store",
      "recipients",
      "recipients_file",
      "sign_key",
      "s3_endpoint",
      "compression",
      "redaction",
      "hooks",
      "sources",
    ],
    where,
  );
  const tenant = optString(raw, "tenant", where) ?? "default";
  const agent = reqString(raw, "agent", where);
  for (const [k, v] of [
    ["tenant", tenant],
    ["agent", agent],
  ] as const) {
    if (!ID_PATTERN.test(v)) throw configInvalid(where, `"${k}" must match [a-z0-9_-]{1,64}, got ${JSON.stringify(v)}`);
  }
  const store = optString(raw, "store", where);
  const s3Endpoint = optString(raw, "s3_endpoint", where);
  if (s3Endpoint !== undefined && !/^https?:\/\/[^/?#\s]+\/?$/.test(s3Endpoint)) {
    throw configInvalid(
      where,
      `"s3_endpoint" must be an http:// or https:// URL of a host, got ${JSON.stringify(s3Endpoint)}`,
    );
  }
  const recipients = optStringArray(raw, "recipients", where) ?? [];
  const recipientsFile = optString(raw, "recipients_file", where);
  const signKey = optString(raw, "sign_key", where);
  let level = 3;
  let threads: number | undefined;
  if (raw.compression !== undefined) {
    const c = raw.compression;
    const w = `${where}: compression`;
    if (!isPlainObject(c)) throw configInvalid(w, "must be an object");
    rejectUnknownKeys(c, ["level", "threads"], w);
    level = optInt(c, "level", w, 1, 19) ?? 3;
    threads = optInt(c, "threads", w, 0, 64);
  }
  if (raw.redaction !== undefined && !isPlainObject(raw.redaction))
    throw configInvalid(where, '"redaction" must be an object');
  const redaction = parseRedactionConfig(raw.redaction as Record<string, unknown> | undefined, `${where}: redaction`);
  const hooks = parseHooks(raw.hooks, `${where}: hooks`);
  if (!Array.isArray(raw.sources) || raw.sources.length === 0)
    throw configInvalid(where, '"sources" must be a non-empty array');
  const names = new Set<string>();
  const sources = raw.sources.map((s: unknown, i: number): ConfiguredSource => {
    const w = `${where}: sources[${i}]`;
    if (!isPlainObject(s)) throw configInvalid(w, "must be an object");
    const kind = reqString(s, "kind", w);
    const impl = sourceKind(kind);
    if (!impl) throw configInvalid(w, `unknown source kind "${kind}" (known: ${Object.keys(SOURCE_KINDS).join(", ")})`);
    const cfg = impl.parseConfig(s, w) as ConfiguredSource["cfg"];
    if (!LAYER_NAME.test(cfg.name))
      throw configInvalid(w, `"name" must match [a-z0-9][a-z0-9_-]{0,63}, got ${JSON.stringify(cfg.name)}`);
    if (names.has(cfg.name)) throw configInvalid(w, `duplicate source name "${cfg.name}"`);
    names.add(cfg.name);
    return { impl, cfg };
  });
  return {
    file,
    baseDir,
    tenant,
    agent,
    ...(store ? { store: configStore(store, baseDir, where) } : {}),
    ...(s3Endpoint ? { s3Endpoint } : {}),
    recipients,
    ...(recipientsFile ? { recipientsFile: resolve(baseDir, recipientsFile) } : {}),
    ...(signKey ? { signKey: resolve(baseDir, signKey) } : {}),
    compression: { level, ...(threads !== undefined ? { threads } : {}) },
    redaction,
    hooks,
    sources,
  };
}

/**
 * Read and validate a memsnap.json. Throws MEMSNAP_CONFIG_NOT_FOUND, MEMSNAP_CONFIG_INVALID,
 * MEMSNAP_CONFIG_UNKNOWN_KEY.
 */
export async function loadConfig(path: string): Promise<MemsnapConfig> {
  const file = resolve(path);
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (e) {
    throw new MemsnapError("MEMSNAP_CONFIG_NOT_FOUND", `cannot read config ${file}: ${(e as Error).message}`, {
      path: file,
      hint: "pass --config FILE, or run 'memsnap init' to write one",
    });
  }
  let raw: unknown;
  try {
    raw = JSON.parse(stripJsonComments(text));
  } catch (e) {
    throw configInvalid(file, `not valid JSON: ${jsonErrorWhere((e as Error).message, text)}`);
  }
  return parseConfig(raw, file, dirname(file));
}
