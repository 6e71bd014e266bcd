/**
 * memsnap.json: parsing and validation through the library (loadConfig, parseConfig,
 * stripJsonComments) and through the CLI (exit 2 with the code and a hint, nothing written).
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { loadConfig, parseConfig } from "../src/index.js";
import { stripJsonComments } from "../src/config.js";
import { isMemsnapError, type ErrorCode } from "../src/errors.js";
import {
  expectCliError, expectJsonError, expectNothingLeft, expectOk, jsonOut, makeAgent, readBundle, runCli, tempDir,
} from "./helpers/cli.js";

const base = (): Record<string, unknown> => ({
  tenant: "acme",
  agent: "scribe",
  sources: [{ kind: "files", name: "memory", path: "memory" }, { kind: "state", name: "state", path: "state" }],
});

/** parseConfig must throw a MemsnapError with `code` whose message matches `msg`. */
function expectParseError(raw: unknown, code: ErrorCode, msg?: RegExp): void {
  let err: unknown = null;
  try {
    parseConfig(raw, "/x/memsnap.json", "/x");
  } catch (e) {
    err = e;
  }
  expect(isMemsnapError(err, code), `expected ${code}, got ${String(err)}`).toBe(true);
  if (msg) expect((err as Error).message).toMatch(msg);
  expect((err as { hint?: string }).hint).toBeTruthy();
}

describe("config: library", () => {
  it("a valid config parses; paths resolve against the config's directory; tenant defaults to 'default'", () => {
    const c = parseConfig({ ...base(), store: "../store", recipients_file: "keys/r.txt", compression: { level: 7, threads: 2 } }, "/a/b/memsnap.json", "/a/b");
    expect(c.tenant).toBe("acme");
    expect(c.agent).toBe("scribe");
    expect(c.store).toBe("/a/store");
    expect(c.recipientsFile).toBe("/a/b/keys/r.txt");
    expect(c.compression).toEqual({ level: 7, threads: 2 });
    expect(c.sources.map((s) => [s.impl.kind, s.cfg.name])).toEqual([["files", "memory"], ["state", "state"]]);
    const { tenant: _t, ...noTenant } = base();
    expect(parseConfig(noTenant, null, "/a").tenant).toBe("default");
    expect(parseConfig(base(), null, "/a").compression.level).toBe(3);
  });

  it("an unknown top-level key is MEMSNAP_CONFIG_UNKNOWN_KEY, naming the key and the allowed ones", () => {
    expectParseError({ ...base(), agnet: "typo" }, "MEMSNAP_CONFIG_UNKNOWN_KEY", /unknown key "agnet"/);
    try {
      parseConfig({ ...base(), agnet: "typo" }, null, "/");
    } catch (e) {
      expect((e as { hint: string }).hint).toMatch(/agent/);
    }
  });

  it("an unknown key inside a source or inside compression is MEMSNAP_CONFIG_UNKNOWN_KEY, naming where", () => {
    expectParseError({ ...base(), sources: [{ kind: "files", name: "m", path: "m", exclud: ["*.tmp"] }] }, "MEMSNAP_CONFIG_UNKNOWN_KEY", /sources\[0\].*unknown key "exclud"/);
    expectParseError({ ...base(), sources: [{ kind: "files", name: "m", path: "m" }, { kind: "state", name: "s", path: "s", pattern: "x" }] }, "MEMSNAP_CONFIG_UNKNOWN_KEY", /sources\[1\]/);
    expectParseError({ ...base(), compression: { level: 3, thread: 1 } }, "MEMSNAP_CONFIG_UNKNOWN_KEY", /compression.*unknown key "thread"/);
  });

  it("bad values are MEMSNAP_CONFIG_INVALID", () => {
    const cases: [unknown, RegExp][] = [
      [[], /JSON object/],
      [{ ...base(), agent: undefined }, /"agent"/],
      [{ ...base(), agent: "Bad Agent" }, /agent/],
      [{ ...base(), tenant: "x".repeat(65) }, /tenant/],
      [{ ...base(), sources: [] }, /sources/],
      [{ ...base(), sources: "memory" }, /sources/],
      [{ ...base(), sources: [{ kind: "nope", name: "m", path: "m" }] }, /unknown source kind "nope"/],
      [{ ...base(), sources: [{ kind: "files", name: "Memory!", path: "m" }] }, /name/],
      [{ ...base(), sources: [{ kind: "files", name: "m", path: "a" }, { kind: "files", name: "m", path: "b" }] }, /duplicate source name "m"/],
      [{ ...base(), sources: [{ kind: "files", name: "m" }] }, /"path"/],
      [{ ...base(), sources: [{ kind: "files", name: "m", path: "m", include: "*.md" }] }, /include/],
      [{ ...base(), compression: { level: 20 } }, /level/],
      [{ ...base(), compression: { level: 2.5 } }, /level/],
      [{ ...base(), recipients: ["age1x", 3] }, /recipients/],
    ];
    for (const [raw, msg] of cases) expectParseError(raw, "MEMSNAP_CONFIG_INVALID", msg);
  });

  it("stripJsonComments removes // and /* */ comments outside strings, keeps strings and line numbers", () => {
    const text = `{
  // a line comment
  "a": "x // not a comment /* nor this */", /* a block
  comment over lines */ "b": "quote \\" // still a string",
  "c": 1 // trailing
}`;
    const out = stripJsonComments(text);
    expect(out.split("\n")).toHaveLength(text.split("\n").length);
    expect(out).toHaveLength(text.length); // every offset stays where it was
    expect(JSON.parse(out)).toEqual({ a: "x // not a comment /* nor this */", b: "quote \" // still a string", c: 1 });
  });

  it("stripJsonComments blanks trailing commas (before } or ], past whitespace and comments), never one in a string or between values", () => {
    const text = `{\n  "a": [1, 2, /* x */\n  ],\n  "b": "x,}", "c": { "d": 1 , // y\n  },\n}`;
    const out = stripJsonComments(text);
    expect(out).toHaveLength(text.length);
    expect(out.split("\n")).toHaveLength(text.split("\n").length);
    expect(JSON.parse(out)).toEqual({ a: [1, 2], b: "x,}", c: { d: 1 } });
    // a doubled comma is still an error
    expect(() => JSON.parse(stripJsonComments("[1,,]"))).toThrow();
  });

  it("loadConfig: a missing file is MEMSNAP_CONFIG_NOT_FOUND, bad JSON MEMSNAP_CONFIG_INVALID, commented JSON loads", async () => {
    const d = tempDir();
    const missing = await loadConfig(join(d, "nope.json")).catch((e: unknown) => e);
    expect(isMemsnapError(missing, "MEMSNAP_CONFIG_NOT_FOUND")).toBe(true);
    writeFileSync(join(d, "bad.json"), '{ "agent": "x", "sources": [ ] ] }');
    const bad = await loadConfig(join(d, "bad.json")).catch((e: unknown) => e);
    expect(isMemsnapError(bad, "MEMSNAP_CONFIG_INVALID")).toBe(true);
    expect((bad as Error).message).toMatch(/not valid JSON/);
    writeFileSync(join(d, "ok.json"), '// hi\n{ /* agent */ "agent": "x", "sources": [{ "kind": "files", "name": "m", "path": "m" }] }\n');
    const ok = await loadConfig(join(d, "ok.json"));
    expect(ok.agent).toBe("x");
    // A JSON error after a long comment is named by the line and column of the file as written.
    writeFileSync(join(d, "comma.json"), `{\n  // ${"a long comment ".repeat(20)}\n  "agent": "x"\n  "sources": [],\n}\n`);
    const comma = await loadConfig(join(d, "comma.json")).catch((e: unknown) => e);
    expect((comma as Error).message).toMatch(/at line 4, column 3$/);
    // Trailing commas are accepted, as in other JSON-with-comments configs.
    writeFileSync(join(d, "trailing.json"), `{\n  "agent": "x", // c\n  "sources": [{ "kind": "files", "name": "m", "path": "m", }, /* c */ ],\n}\n`);
    expect((await loadConfig(join(d, "trailing.json"))).sources).toHaveLength(1);
    expect(ok.baseDir).toBe(d);
    expect(ok.file).toBe(join(d, "ok.json"));
  });
});

describe("config: CLI", () => {
  it("an unknown top-level key: exit 2, MEMSNAP_CONFIG_UNKNOWN_KEY, no bundle", async () => {
    const a = makeAgent({ config: { ...base(), labels: ["x"] } });
    const r = await runCli(["snapshot", "-c", a.config, "-o", "b.memsnap"], { cwd: a.dir });
    expectCliError(r, 2, "MEMSNAP_CONFIG_UNKNOWN_KEY");
    expect(r.stderr).toContain('"labels"');
    expectNothingLeft(a.dir);
  });

  it("an unknown key inside a source: exit 2, MEMSNAP_CONFIG_UNKNOWN_KEY (--json too)", async () => {
    const a = makeAgent({ config: { ...base(), sources: [{ kind: "files", name: "memory", path: "memory", includes: ["*.md"] }] } });
    expectCliError(await runCli(["snapshot", "-c", a.config, "-o", "b.memsnap"], { cwd: a.dir }), 2, "MEMSNAP_CONFIG_UNKNOWN_KEY");
    const rj = await runCli(["--json", "snapshot", "-c", a.config, "-o", "b.memsnap"], { cwd: a.dir });
    expectJsonError(rj, 2, "MEMSNAP_CONFIG_UNKNOWN_KEY");
    expect(jsonOut(rj).error.message).toMatch(/sources\[0\].*"includes"/);
    expectNothingLeft(a.dir);
  });

  it("bad JSON: exit 2, MEMSNAP_CONFIG_INVALID", async () => {
    const a = makeAgent({ configText: '{ "agent": "x", "sources": [ { "kind": "files", "name": "memory", "path": "memory" } ' });
    const r = await runCli(["snapshot", "-c", a.config, "-o", "b.memsnap"], { cwd: a.dir });
    expectCliError(r, 2, "MEMSNAP_CONFIG_INVALID");
    expect(r.stderr).toMatch(/not valid JSON/);
    expectNothingLeft(a.dir);
  });

  it("no config: exit 2, MEMSNAP_CONFIG_NOT_FOUND (default ./memsnap.json and an explicit -c)", async () => {
    const d = tempDir();
    expectCliError(await runCli(["snapshot", "-o", "b.memsnap"], { cwd: d }), 2, "MEMSNAP_CONFIG_NOT_FOUND");
    expectJsonError(await runCli(["--json", "snapshot", "-c", "no/such.json", "-o", "b.memsnap"], { cwd: d }), 2, "MEMSNAP_CONFIG_NOT_FOUND");
    expectNothingLeft(d);
  });

  it("commented JSON (// and /* */) is accepted, and relative paths resolve against the config's directory", async () => {
    const a = makeAgent({
      configText: `// memsnap.json with comments
{
  /* who */ "tenant": "acme", "agent": "scribe", // trailing comment
  "sources": [
    // memory files
    { "kind": "files", "name": "memory", "path": "memory", "exclude": ["*.bin"] },
    /* state,
       over two lines */
    { "kind": "state", "name": "state", "path": "state" }
  ]
}
`,
    });
    const elsewhere = tempDir();
    const r = await runCli(["--json", "snapshot", "-c", a.config, "-o", "b.memsnap"], { cwd: elsewhere });
    expectOk(r);
    const m = readBundle(join(elsewhere, "b.memsnap")).manifest;
    expect(m.tenant).toBe("acme");
    expect(m.index.map((e: { path: string }) => e.path)).not.toContain("memory/blob.bin");
    expect(m.index.map((e: { path: string }) => e.path)).toContain("memory/MEMORY.md");
    expect(jsonOut(r).artifacts).toBe(6);
  });
});
