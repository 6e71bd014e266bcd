/**
 * Store locations: a local directory or `s3://bucket/prefix`. A string that starts like a URL
 * (`scheme:`, e.g. `s3:/b`, `s3:b`, `gs://b`) and is not a well-formed s3 URL is a usage error, never a
 * local directory: a typo must not turn into a fake off-site copy under ./s3:/... A local directory
 * whose name has such a colon is written with a path in front (`./name:x`).
 */
import { resolve } from "node:path";
import { MemsnapError } from "../errors.js";

export type StoreLocation =
  | { kind: "local"; dir: string }
  /** `prefix` has no leading or trailing slash ("" for the bucket's root); `url` is the canonical form. */
  | { kind: "s3"; bucket: string; prefix: string; url: string };

const SCHEME = /^([A-Za-z][A-Za-z0-9+.-]*):\/\//;
/** Starts like a URL: a scheme and its colon (`s3:`, `gs:/`, `http:`). */
const URL_LIKE = /^([A-Za-z][A-Za-z0-9+.-]*):/;
/** S3's bucket naming rules: 3-63 of [a-z0-9.-], a letter or digit at each end, no "..", not an IPv4 address. */
const BUCKET = /^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/;
/** A prefix segment: characters S3 keys take without escaping (no spaces, %, ?, #, \, control characters). */
const SEGMENT = /^[A-Za-z0-9!_.*'()=+,@:;~-]+$/;
const HINT =
  "a store is a directory or s3://BUCKET[/PREFIX] (bucket: 3-63 of a-z 0-9 . -; prefix: segments split by /)";

/** True when `s` names an s3 store (`s3://...`, any case of the scheme); it may still be malformed. */
export function isS3Url(s: string): boolean {
  return /^s3:\/\//i.test(s);
}

function usage(s: string, why: string): MemsnapError {
  return new MemsnapError("MEMSNAP_USAGE", `bad store location ${JSON.stringify(s)}: ${why}`, { hint: HINT });
}

/** Parse a store location; a local path is resolved against the working directory (or `base`). */
export function parseStoreLocation(s: string, base?: string): StoreLocation {
  const m = SCHEME.exec(s);
  if (!m) {
    const u = URL_LIKE.exec(s);
    if (u) {
      const why =
        u[1]!.toLowerCase() === "s3" ? "an s3 URL is s3://BUCKET[/PREFIX]" : `the scheme ${u[1]}: is not supported`;
      throw usage(s, `${why} (for a local directory with a colon in its name, write ./${s})`);
    }
    return { kind: "local", dir: base === undefined ? resolve(s) : resolve(base, s) };
  }
  if (m[1]!.toLowerCase() !== "s3") throw usage(s, `the scheme ${m[1]}:// is not supported (only s3://)`);
  const rest = s.slice(m[0].length);
  const slash = rest.indexOf("/");
  const bucket = slash < 0 ? rest : rest.slice(0, slash);
  // One trailing slash is allowed (s3://b/ and s3://b/p/); anything else empty is a mistake.
  let prefix = slash < 0 ? "" : rest.slice(slash + 1);
  if (prefix.endsWith("/")) prefix = prefix.slice(0, -1);
  if (!bucket) throw usage(s, "no bucket");
  if (
    !BUCKET.test(bucket) ||
    bucket.includes("..") ||
    /^\d+\.\d+\.\d+\.\d+$/.test(bucket) ||
    bucket.startsWith("xn--")
  ) {
    throw usage(s, `${JSON.stringify(bucket)} is not a valid bucket name`);
  }
  if (prefix) {
    if (Buffer.byteLength(prefix) > 512) throw usage(s, "the prefix is longer than 512 bytes");
    for (const seg of prefix.split("/")) {
      if (!seg) throw usage(s, "the prefix has an empty segment (//)");
      if (seg === "." || seg === "..") throw usage(s, `the prefix has a ${seg} segment`);
      if (!SEGMENT.test(seg))
        throw usage(s, `the prefix segment ${JSON.stringify(seg)} has a character keys should not`);
    }
  }
  return { kind: "s3", bucket, prefix, url: `s3://${bucket}${prefix ? `/${prefix}` : ""}` };
}

/** The canonical string of a location: an absolute directory or the s3 URL. */
export function locationString(loc: StoreLocation): string {
  return loc.kind === "local" ? loc.dir : loc.url;
}

/** The object key under an s3 location for a store-relative path (`tenant/agent/ID.memsnap`). */
export function s3Key(loc: { prefix: string }, rel: string): string {
  return loc.prefix ? `${loc.prefix}/${rel}` : rel;
}

/** Split an object URL `s3://bucket/key` (a bundle's path in an s3 store) into bucket and key. */
export function parseObjectUrl(url: string): { bucket: string; key: string } {
  const loc = parseStoreLocation(url);
  if (loc.kind !== "s3" || !loc.prefix) throw usage(url, "not an object URL (s3://BUCKET/KEY)");
  return { bucket: loc.bucket, key: loc.prefix };
}

let configured: string | undefined;

/** The endpoint the agent's config names (`s3_endpoint`), for every client this process makes without one. */
export function useConfiguredEndpoint(endpoint: string | undefined): void {
  configured = endpoint;
}

/** The endpoint a client for `env` uses, or undefined for AWS itself. */
export function s3Endpoint(env: NodeJS.ProcessEnv = process.env, opts: { endpoint?: string } = {}): string | undefined {
  const e = env.MEMSNAP_S3_ENDPOINT || opts.endpoint || configured;
  if (e !== undefined && !/^https?:\/\/[^/?#\s]+\/?$/.test(e)) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      `MEMSNAP_S3_ENDPOINT must be an http:// or https:// URL of a host, got ${JSON.stringify(e)}`,
    );
  }
  return e;
}

/** An integer setting from the environment (`dflt` when unset), within [min, max]; MEMSNAP_USAGE otherwise. */
export function intEnv(env: NodeJS.ProcessEnv, name: string, dflt: number, min: number, max: number): number {
  const v = env[name];
  if (v === undefined || v === "") return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new MemsnapError(
      "MEMSNAP_USAGE",
      `${name} must be an integer from ${min} to ${max}, got ${JSON.stringify(v)}`,
      { hint: `set ${name} to an integer from ${min} to ${max}, or unset it for the default (${dflt})` },
    );
  }
  return n;
}
