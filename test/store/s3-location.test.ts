/**
 * Store locations: parseStoreLocation / resolveStore, and that the CLI takes an s3 URL (or
 * another scheme) as a URL: a usage error for a bad one, never a local directory named "s3:".
 */
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { isMemsnapError } from "../../src/errors.js";
import { isS3Url, parseObjectUrl, parseStoreLocation } from "../../src/objstore/location.js";
import { resolveStore } from "../../src/store/paths.js";
import { parseConfig } from "../../src/config.js";
import { expectCliError, listTree, makeAgent, runCli } from "../helpers/cli.js";

function usageError(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    expect(isMemsnapError(e, "MEMSNAP_USAGE"), String(e)).toBe(true);
    expect((e as { hint?: string }).hint).toBeTruthy();
    return (e as Error).message;
  }
  throw new Error("no error thrown");
}

describe("parseStoreLocation", () => {
  it("parses s3://bucket and s3://bucket/prefix, canonical URL without a trailing slash", () => {
    expect(parseStoreLocation("s3://my-bucket")).toEqual({ kind: "s3", bucket: "my-bucket", prefix: "", url: "s3://my-bucket" });
    expect(parseStoreLocation("s3://my-bucket/")).toEqual({ kind: "s3", bucket: "my-bucket", prefix: "", url: "s3://my-bucket" });
    expect(parseStoreLocation("s3://b.example.com/a/b-c/d_e")).toEqual(
      { kind: "s3", bucket: "b.example.com", prefix: "a/b-c/d_e", url: "s3://b.example.com/a/b-c/d_e" });
    expect(parseStoreLocation("S3://bkt/memsnap/")).toEqual({ kind: "s3", bucket: "bkt", prefix: "memsnap", url: "s3://bkt/memsnap" });
    expect(isS3Url("s3://x")).toBe(true);
    expect(isS3Url("./s3:/x")).toBe(false);
  });

  it("a path without a scheme is a local directory, resolved", () => {
    expect(parseStoreLocation("store")).toEqual({ kind: "local", dir: join(process.cwd(), "store") });
    expect(parseStoreLocation("/abs/store")).toEqual({ kind: "local", dir: "/abs/store" });
    expect(parseStoreLocation("rel", "/base")).toEqual({ kind: "local", dir: "/base/rel" });
    expect(parseStoreLocation("./s3:bucket")).toEqual({ kind: "local", dir: join(process.cwd(), "s3:bucket") });
    expect(parseStoreLocation("dir/s3:bucket")).toEqual({ kind: "local", dir: join(process.cwd(), "dir", "s3:bucket") });
  });

  it("a string that starts like a URL but is not s3://… is a usage error, not a directory named s3:", () => {
    for (const bad of ["s3:bucket", "s3:/bucket/memsnap", "S3:bucket", "s3:"]) {
      expect(usageError(() => parseStoreLocation(bad)), bad).toMatch(/an s3 URL is s3:\/\/BUCKET\[\/PREFIX\].*write \.\//);
    }
    for (const bad of ["gs:/bucket", "file:store", "c:store"]) {
      expect(usageError(() => parseStoreLocation(bad)), bad).toMatch(/is not supported/);
    }
  });

  it("another scheme and malformed s3 URLs are usage errors", () => {
    expect(usageError(() => parseStoreLocation("ftp://x"))).toMatch(/ftp:\/\/ is not supported/);
    expect(usageError(() => parseStoreLocation("file:///tmp/store"))).toMatch(/not supported/);
    expect(usageError(() => parseStoreLocation("gs://bucket"))).toMatch(/not supported/);
    expect(usageError(() => parseStoreLocation("s3://"))).toMatch(/no bucket/);
    expect(usageError(() => parseStoreLocation("s3:///prefix"))).toMatch(/no bucket/);
    for (const bad of ["s3://Bad_Bucket", "s3://ab", "s3://-abc", "s3://abc-", "s3://a..b", "s3://192.168.1.1",
      `s3://${"a".repeat(64)}`, "s3://user:pw@bucket", "s3://bucket?x=1"]) {
      expect(usageError(() => parseStoreLocation(bad)), bad).toMatch(/not a valid bucket name/);
    }
    expect(usageError(() => parseStoreLocation("s3://bkt/a//b"))).toMatch(/empty segment/);
    expect(usageError(() => parseStoreLocation("s3://bkt/a/../b"))).toMatch(/\.\. segment/);
    expect(usageError(() => parseStoreLocation("s3://bkt/./b"))).toMatch(/\. segment/);
    expect(usageError(() => parseStoreLocation("s3://bkt/a b"))).toMatch(/character/);
    expect(usageError(() => parseStoreLocation("s3://bkt/a?x=1"))).toMatch(/character/);
    expect(usageError(() => parseStoreLocation("s3://bkt/a#frag"))).toMatch(/character/);
  });

  it("parseObjectUrl splits a bundle's URL", () => {
    expect(parseObjectUrl("s3://bkt/p/acme/scribe/01J.memsnap")).toEqual({ bucket: "bkt", key: "p/acme/scribe/01J.memsnap" });
    usageError(() => parseObjectUrl("s3://bkt"));
  });
});

describe("resolveStore", () => {
  it("keeps an s3 URL a URL from --store, MEMSNAP_STORE and the config", () => {
    expect(resolveStore("s3://bkt/p/", undefined, {})).toBe("s3://bkt/p");
    expect(resolveStore(undefined, undefined, { MEMSNAP_STORE: "s3://bkt/q" })).toBe("s3://bkt/q");
    expect(resolveStore(undefined, "s3://bkt/r", {})).toBe("s3://bkt/r");
    expect(resolveStore("dir", undefined, {})).toBe(join(process.cwd(), "dir"));
    usageError(() => resolveStore("ftp://x", undefined, {}));
    usageError(() => resolveStore(undefined, undefined, { MEMSNAP_STORE: "s3://Bad_Bucket" }));
  });

  it("the config's store may be an s3 URL; another scheme is MEMSNAP_CONFIG_INVALID", () => {
    const base = { agent: "a", sources: [{ kind: "files", name: "m", path: "m" }] };
    expect(parseConfig({ ...base, store: "s3://bkt/p" }, "/x/memsnap.json", "/x").store).toBe("s3://bkt/p");
    expect(parseConfig({ ...base, store: "st" }, "/x/memsnap.json", "/x").store).toBe("/x/st");
    expect(parseConfig({ ...base, s3_endpoint: "http://127.0.0.1:9000" }, null, "/x").s3Endpoint).toBe("http://127.0.0.1:9000");
    for (const [k, v] of [["store", "ftp://x"], ["store", "s3://"], ["s3_endpoint", "127.0.0.1:9000"]]) {
      try {
        parseConfig({ ...base, [k!]: v }, "/x/memsnap.json", "/x");
        throw new Error(`accepted ${k}=${v}`);
      } catch (e) {
        expect(isMemsnapError(e, "MEMSNAP_CONFIG_INVALID"), String(e)).toBe(true);
      }
    }
  });
});

describe("the CLI and store URLs", () => {
  // Unreachable on purpose: nothing listens on port 1, one attempt.
  const env = {
    MEMSNAP_S3_ENDPOINT: "http://127.0.0.1:1", MEMSNAP_S3_MAX_ATTEMPTS: "1",
    AWS_ACCESS_KEY_ID: "x", AWS_SECRET_ACCESS_KEY: "y", AWS_REGION: "us-east-1",
  };

  it("`snapshot --store s3://b/p` goes to the object store (here unreachable: exit 8), never to ./s3: on the local disk", async () => {
    const a = makeAgent();
    const before = listTree(a.dir);
    const r = await runCli(["snapshot", "-c", a.config, "--store", "s3://bkt/p"], { cwd: a.dir, env });
    expectCliError(r, 8, "MEMSNAP_STORE_UNREACHABLE");
    expect(existsSync(join(a.dir, "s3:"))).toBe(false);
    expect(listTree(a.dir).filter((p) => !p.startsWith(".memsnap/"))).toEqual(before.filter((p) => !p.startsWith(".memsnap/")));
  });

  for (const [how, args, extra] of [
    ["--store", ["--store", "ftp://x"], {}],
    ["--store", ["--store", "s3://"], {}],
    ["--store", ["--store", "s3://Bad_Bucket"], {}],
    ["--store", ["--store", "s3:/bkt/p"], {}],
    ["MEMSNAP_STORE", [], { MEMSNAP_STORE: "ftp://x" }],
    ["MEMSNAP_STORE", [], { MEMSNAP_STORE: "s3:bkt" }],
  ] as const) {
    it(`snapshot with ${how} ${args[1] ?? extra.MEMSNAP_STORE} exits 2 and writes nothing`, async () => {
      const a = makeAgent();
      const r = await runCli(["snapshot", "-c", a.config, ...args], { cwd: a.dir, env: { ...env, ...extra } });
      expectCliError(r, 2, "MEMSNAP_USAGE");
      expect(existsSync(join(a.dir, "ftp:"))).toBe(false);
      expect(existsSync(join(a.dir, "s3:"))).toBe(false);
      expect(existsSync(join(a.dir, "s3:bkt"))).toBe(false);
    });
  }

  it("a config store with another scheme exits 2", async () => {
    const a = makeAgent();
    writeFileSync(a.config, JSON.stringify({ agent: "x", store: "ftp://x", sources: [{ kind: "files", name: "m", path: "memory" }] }));
    const r = await runCli(["snapshot", "-c", a.config], { cwd: a.dir, env });
    expectCliError(r, 2, "MEMSNAP_CONFIG_INVALID");
    expect(existsSync(join(a.dir, "ftp:"))).toBe(false);
  });
});
