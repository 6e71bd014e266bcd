/**
 * The `trace` source and the agentlog canonical form: canonical JSON vectors (the published
 * one and derived ones: nesting, NFC keys, UTF-8 key order, exponent-free numbers, big
 * integers, escapes), the lossless parser; and end to end through the library: round trips
 * byte for byte (big integers and odd number spellings included), every validation failure
 * with MEMSNAP_TRACE_INVALID and nothing left, live traces with a partial last line, redaction
 * with re-sealing (a stub Redactor stands in for src/redact/), and deep verify.
 */
import { createHash } from "node:crypto";
import { appendFileSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it, vi } from "vitest";
import { isMemsnapError, parseConfig, restoreToDir, snapshot, verifyBundle } from "../../src/index.js";
import { SOURCE_KINDS } from "../../src/sources/registry.js";
import type { RedactionReport, Redactor } from "../../src/redact/types.js";
import { LineSplitter, TraceValidator, validateTrace } from "../../src/sources/trace.js";
import type { Artifact, SourceKind } from "../../src/sources/types.js";
import {
  agentlogId, canonicalize, canonicalNumber, JsonBudgetError, JsonNumber, parseLossless, serializeFaithful, VALUE_COST,
} from "../../src/util/canonical-agentlog.js";
import { REPO, runCli, tempDir } from "../helpers/cli.js";

// ------------------------------------------------------------------------------ redactor stub

const redactorHook = vi.hoisted(() => ({ current: undefined as undefined | (() => unknown) }));
vi.mock(import("../../src/redact/index.js"), async (importOriginal) => {
  const mod = await importOriginal();
  return { ...mod, createRedactor: async () => redactorHook.current?.() as Redactor | undefined };
});

const SECRET = /sk-live-[A-Za-z0-9]{16,}/g;

class StubRedactor implements Redactor {
  readonly redacted: Record<string, Record<string, number>> = {};
  total = 0;
  readonly artifactsSeen: string[] = [];
  candidate(text: string): boolean {
    return text.includes("sk-live-");
  }
  async redactText(text: string, artifact: string): Promise<string> {
    return text.replace(SECRET, () => {
      const r = (this.redacted[artifact] ??= {});
      r["stub-api-key"] = (r["stub-api-key"] ?? 0) + 1;
      this.total++;
      return "[REDACTED:stub-api-key]";
    });
  }
  async scanText(): Promise<void> {}
  async redactArtifact(artifact: Artifact): Promise<Artifact> {
    this.artifactsSeen.push(artifact.path);
    return artifact;
  }
  report(): RedactionReport {
    return {
      policy: "stub", rules_fired: this.total ? ["stub-api-key"] : [], redacted: this.redacted, unredacted: {},
      total_redacted: this.total, total_unredacted: 0, bytes_scanned: 0,
    };
  }
  async cleanup(): Promise<void> {}
}

// ------------------------------------------------------------------------------ helpers

const sha = (s: string | Buffer): string => createHash("sha256").update(s).digest("hex");

/** Canonical JSON for test payloads made of ASCII keys, strings, safe integers: sorted-key JSON.stringify. */
function stable(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(stable).join(",")}]`;
  if (v && typeof v === "object") {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${stable((v as Record<string, unknown>)[k])}`).join(",")}}`;
  }
  return JSON.stringify(v);
}

const idOf = (payload: unknown): string => `sha256:${sha(stable(payload))}`;

interface Rec {
  id: string;
  line: string;
}

/** One record line; `payloadText` overrides the payload's JSON text (its canonical form must then be given). */
function rec(kind: string, payload: unknown, parent: string | null, opts: { meta?: unknown; payloadText?: string; canonical?: string; ts?: string } = {}): Rec {
  const id = opts.canonical ? `sha256:${sha(opts.canonical)}` : idOf(payload);
  const meta = opts.meta === undefined ? "" : `,"meta":${JSON.stringify(opts.meta)}`;
  const line = `{"version":"0.1","id":"${id}","kind":"${kind}","ts":"${opts.ts ?? "2024-06-01T00:00:00Z"}","parent":${parent === null ? "null" : `"${parent}"`}${meta},"payload":${opts.payloadText ?? JSON.stringify(payload)}}`;
  return { id, line };
}

/** A small valid trace: metadata → request → response → tool call → tool result. */
function sampleTrace(secret = false): { recs: Rec[]; text: string } {
  const m = rec("metadata", { agent: "demo", session: 1 }, null);
  const q = rec("chat_request", { messages: [{ role: "user", content: secret ? "my key is sk-live-ABCDEFGHIJKLMNOP1234" : "hello" }] }, m.id);
  const r = rec("chat_response", { content: "hi", usage: { in: 3, out: 1 } }, q.id);
  const t = rec("tool_call", { name: "search", args: { q: "x" } }, r.id, { meta: { note: secret ? "sk-live-ZZZZZZZZZZZZZZZZZZZZ" : "n" } });
  const u = rec("tool_result", { ok: true }, q.id);
  const recs = [m, q, r, t, u];
  return { recs, text: `${recs.map((x) => x.line).join("\n")}\n` };
}

interface Agent {
  dir: string;
  out: string;
}

function agent(): Agent {
  const dir = tempDir("memsnap-trace-");
  const out = join(dir, "out");
  mkdirSync(out);
  mkdirSync(join(dir, "traces"));
  return { dir, out };
}

function config(a: Agent, source: Record<string, unknown>, redaction = false) {
  return parseConfig({ agent: "a1", redaction: { enabled: redaction }, sources: [{ kind: "trace", name: "t", path: "traces", ...source }] }, null, a.dir);
}

async function snap(a: Agent, source: Record<string, unknown> = {}, redaction = false) {
  return snapshot({ config: config(a, source, redaction), out: join(a.out, "b.memsnap") });
}

async function expectRefused(a: Agent, p: Promise<unknown>, code: string, msg?: RegExp): Promise<void> {
  const e = await p.then(() => null, (x: unknown) => x as Error);
  expect(e, "snapshot should fail").not.toBeNull();
  expect(isMemsnapError(e) ? e.code : e).toBe(code);
  if (msg) expect(e!.message).toMatch(msg);
  expect(readdirSync(a.out)).toEqual([]);
}

// ------------------------------------------------------------------------------ canonical JSON

describe("agentlog canonical JSON", () => {
  const c = (text: string): string => canonicalize(parseLossless(text));

  it("the published test vector", () => {
    expect(c('{"hello":"world"}')).toBe('{"hello":"world"}');
    expect(agentlogId(parseLossless('{"hello":"world"}'))).toBe("sha256:93a23971a914e5eacbf0a8d25154cda309c3c1c72fbb9914d47c60f3cb681588");
    expect(agentlogId(parseLossless(' { "hello" : "world" } '))).toBe("sha256:93a23971a914e5eacbf0a8d25154cda309c3c1c72fbb9914d47c60f3cb681588");
  });

  it("sorts keys at every depth and drops whitespace", () => {
    const v = '{ "b": {"z": [3, {"y": 1, "x": 2}], "a": null}, "a": [true, false] }';
    expect(c(v)).toBe('{"a":[true,false],"b":{"a":null,"z":[3,{"x":2,"y":1}]}}');
    expect(agentlogId(parseLossless(v))).toBe(`sha256:${sha('{"a":[true,false],"b":{"a":null,"z":[3,{"x":2,"y":1}]}}')}`);
  });

  it("sorts keys by UTF-8 bytes, not UTF-16 code units", () => {
    // U+FF61 is EF BD A1 in UTF-8, U+1F600 is F0 9F 98 80; in UTF-16 the emoji (D83D …) sorts first.
    expect(c('{"\u{1F600}":1,"\uFF61":2,"a":3}')).toBe('{"a":3,"\uFF61":2,"\u{1F600}":1}');
  });

  it("NFC-normalises keys and strings; keys equal after NFC are an error", () => {
    expect(c('{"e\\u0301":"cafe\\u0301"}')).toBe('{"\u00e9":"caf\u00e9"}');
    expect(agentlogId(parseLossless('{"e\\u0301":"x"}'))).toBe(agentlogId(parseLossless('{"\u00e9":"x"}')));
    expect(() => c('{"e\\u0301":1,"\\u00e9":2}')).toThrow(/duplicate key/);
    expect(() => parseLossless('{"a":1,"a":2}')).toThrow(/duplicate key/);
  });

  it("writes short escapes, \\u00xx for other controls, literal non-ASCII, escaped lone surrogates", () => {
    expect(c('"a\\nb\\t\\"\\\\\\/\\u0001\\u001F\\b\\f\\r"')).toBe('"a\\nb\\t\\"\\\\/\\u0001\\u001f\\b\\f\\r"');
    expect(c('"\\u00e9\\u4e2d\\ud83d\\ude00"')).toBe('"\u00e9\u4e2d\u{1F600}"');
    expect(c('"\\ud800x"')).toBe('"\\ud800x"');
    expect(c('"\\u2028"')).toBe('"\u2028"');
  });

  it("prints numbers as exact decimals without exponents", () => {
    expect(canonicalNumber("1.5e-7")).toBe("0.00000015");
    expect(c("[1.5e-7]")).toBe("[0.00000015]");
    expect(canonicalNumber("1E3")).toBe("1000");
    expect(canonicalNumber("1.50")).toBe("1.5");
    expect(canonicalNumber("1.0")).toBe("1");
    expect(canonicalNumber("-0")).toBe("0");
    expect(canonicalNumber("-0.0e5")).toBe("0");
    expect(canonicalNumber("0.1")).toBe("0.1");
    expect(canonicalNumber("-12.5e1")).toBe("-125");
    expect(canonicalNumber("123.456e-2")).toBe("1.23456");
    expect(canonicalNumber("2.5E+2")).toBe("250");
    expect(canonicalNumber("100")).toBe("100");
    expect(() => canonicalNumber("1e999999")).toThrow(/canonical range/);
  });

  it("keeps integers beyond 2^53 digit for digit", () => {
    const text = '{"time_unix_nano":1718000000123456789,"big":-123456789012345678901234567890}';
    const v = parseLossless(text) as Map<string, unknown>;
    expect((v.get("time_unix_nano") as JsonNumber).toBigInt()).toBe(1718000000123456789n);
    expect(c(text)).toBe('{"big":-123456789012345678901234567890,"time_unix_nano":1718000000123456789}');
    expect(agentlogId(v as never)).toBe(`sha256:${sha('{"big":-123456789012345678901234567890,"time_unix_nano":1718000000123456789}')}`);
    expect(JSON.parse(text).time_unix_nano).not.toBe(1718000000123456789n); // why a lossless parser is needed
  });

  it("re-serialises faithfully: key order and number spelling kept", () => {
    const text = '{"z":1.0e2,"a":[1718000000123456789,"x\\u00e9"],"m":{}}';
    expect(serializeFaithful(parseLossless(text))).toBe('{"z":1.0e2,"a":[1718000000123456789,"x\u00e9"],"m":{}}');
  });

  it("rejects invalid JSON", () => {
    for (const bad of ["", "{", '{"a":}', "[1,]", "01", "1.", "+1", '"\u0001"', '"\\x"', "nul", "{} x", "NaN", '{"a" 1}']) {
      expect(() => parseLossless(bad), bad).toThrow();
    }
  });
});

// ------------------------------------------------------------------------------ validator

describe("trace validator", () => {
  it("accepts a valid trace split at every byte boundary", async () => {
    const { text } = sampleTrace();
    const b = Buffer.from(text);
    for (let cut = 1; cut < b.length; cut += 7) {
      expect(await validateTrace((async function* () {
        yield b.subarray(0, cut);
        yield b.subarray(cut);
      })())).toBe(5);
    }
  });

  it("counts lines and hands back the last one without a newline", () => {
    const s = new LineSplitter();
    expect([...s.push(Buffer.from("a\nb"))].map((l) => [l.line.toString(), l.no])).toEqual([["a", 1]]);
    expect([...s.push(Buffer.from("c\n\nd"))].map((l) => [l.line.toString(), l.no])).toEqual([["bc", 2], ["", 3]]);
    expect(s.end()).toEqual({ line: Buffer.from("d"), no: 4 });
  });

  it("a later metadata record may start a new chain", () => {
    const v = new TraceValidator();
    const m = rec("metadata", { a: 1 }, null);
    const m2 = rec("metadata", { a: 2 }, null);
    const x = rec("chunk", { t: "x" }, m2.id);
    v.check(Buffer.from(m.line), 1);
    v.check(Buffer.from(m2.line), 2);
    v.check(Buffer.from(x.line), 3);
    expect(v.records).toBe(3);
    expect(() => v.check(Buffer.from(rec("chunk", { t: "y" }, null).line), 4)).toThrow(/only a metadata record may start a chain/);
  });
});

// ------------------------------------------------------------------------------ end to end

describe("trace: round trips", () => {
  it("captures, verifies deep and restores byte for byte", async () => {
    const a = agent();
    const { text } = sampleTrace();
    writeFileSync(join(a.dir, "traces", "s1.agentlog"), text);
    mkdirSync(join(a.dir, "traces", "old"));
    writeFileSync(join(a.dir, "traces", "old", "s0.agentlog"), text.trimEnd()); // no final newline
    writeFileSync(join(a.dir, "traces", "notes.txt"), "not a trace");
    const r = await snap(a);
    expect(r.manifest.layers[0]!.meta).toMatchObject({ files: 2, records: 10 });
    expect(r.manifest.index!.map((e) => [e.path, e.kind])).toEqual([["t/old/s0.agentlog", "agentlog"], ["t/s1.agentlog", "agentlog"]]);
    const v = await verifyBundle(r.path, { deep: true });
    expect(v.findings).toEqual([]);
    const to = join(a.dir, "restored");
    await restoreToDir(r.path, to);
    expect(readFileSync(join(to, "t", "s1.agentlog"), "utf8")).toBe(text);
    expect(readFileSync(join(to, "t", "old", "s0.agentlog"), "utf8")).toBe(text.trimEnd());
    for (const e of r.manifest.index!) expect(sha(readFileSync(join(to, e.path)))).toBe(e.sha256);
  });

  it("big integers and odd number spellings survive byte for byte", async () => {
    const a = agent();
    const m = rec("metadata", { agent: "demo" }, null);
    const payloadText = '{ "time_unix_nano": 1718000000123456789, "ratio": 1.50e-7, "n": -0, "e": "caf\\u00e9" }';
    const canonical = '{"e":"caf\u00e9","n":0,"ratio":0.00000015,"time_unix_nano":1718000000123456789}';
    const h = rec("harness_event", null, m.id, { payloadText, canonical });
    const text = `${m.line}\n${h.line}\n`;
    writeFileSync(join(a.dir, "traces", "big.agentlog"), text);
    const r = await snap(a, { path: "traces/big.agentlog" });
    const to = join(a.dir, "restored");
    await restoreToDir(r.path, to);
    expect(readFileSync(join(to, "t", "big.agentlog"), "utf8")).toBe(text);
    expect(readFileSync(join(to, "t", "big.agentlog"), "utf8")).toContain("1718000000123456789");
  });

  it("captures a live trace up to its last complete record", async () => {
    const a = agent();
    const { text } = sampleTrace();
    const f = join(a.dir, "traces", "live.agentlog");
    const tail = '{"version":"0.1","id":"sha256:';
    writeFileSync(f, `${text}${tail}`);
    const r = await snap(a);
    expect(r.manifest.layers[0]!.meta).toMatchObject({ records: 5, partial_tail_bytes: { "live.agentlog": tail.length } });
    const to = join(a.dir, "restored");
    await restoreToDir(r.path, to);
    expect(readFileSync(join(to, "t", "live.agentlog"), "utf8")).toBe(text);
  });

  it("an empty trace file is captured as is", async () => {
    const a = agent();
    writeFileSync(join(a.dir, "traces", "empty.agentlog"), "");
    const r = await snap(a);
    expect(r.manifest.index!.map((e) => [e.path, e.size])).toEqual([["t/empty.agentlog", 0]]);
  });
});

describe("trace: broken traces are refused with MEMSNAP_TRACE_INVALID and leave nothing", () => {
  const { recs } = sampleTrace();
  const [m, q, r] = recs as [Rec, Rec, Rec, Rec, Rec];
  const cases: [string, () => string, RegExp][] = [
    ["a wrong id", () => [m.line, q.line.replace(q.id, `sha256:${"0".repeat(64)}`)].join("\n"),
      /line 2: record id sha256:0{64} does not match its payload \(the canonical payload hashes to sha256:[0-9a-f]{64}\)/],
    ["an edited payload", () => [m.line, q.line.replace('"hello"', '"hellO"')].join("\n"), /line 2: record id .* does not match its payload/],
    ["a parent pointing forward", () => [m.line, rec("chat_request", { x: 1 }, r.id).line, r.line].join("\n"),
      /line 2: parent sha256:[0-9a-f]{64} is not an earlier record \(parents point backwards\)/],
    ["a parent pointing nowhere", () => [m.line, rec("chunk", { x: 1 }, `sha256:${"a".repeat(64)}`).line].join("\n"), /line 2: parent .* is not an earlier record/],
    ["a first record that is not metadata", () => rec("chat_request", { x: 1 }, null).line, /line 1: the first record must be kind "metadata", not "chat_request"/],
    ["a first record with a parent", () => rec("metadata", { x: 1 }, m.id).line, /line 1: the first record's parent must be null/],
    ["a null parent on a non-metadata record", () => [m.line, rec("chunk", { x: 1 }, null).line].join("\n"), /line 2: parent is null/],
    ["an unknown kind", () => [m.line, rec("mystery", { x: 1 }, m.id).line].join("\n"), /line 2: unknown kind "mystery"/],
    ["a wrong version", () => m.line.replace('"0.1"', '"0.2"'), /line 1: version "0.2" is not "0.1"/],
    ["a missing payload", () => m.line.replace(/,"payload":.*\}$/, "}"), /line 1: "payload" is missing/],
    ["bad JSON", () => [m.line, "{not json"].join("\n"), /line 2: not valid JSON/],
    ["an empty line", () => [m.line, "", q.line].join("\n"), /line 2: empty line/],
    ["invalid UTF-8", () => `${m.line}\n\uFFFD`, /line 2: not valid UTF-8|line 2: not valid JSON/],
    ["duplicate keys", () => m.line.replace('"kind":"metadata"', '"kind":"metadata","kind":"metadata"'), /line 1: not valid JSON \(duplicate key "kind"/],
  ];
  for (const [what, make, msg] of cases) {
    it(what, async () => {
      const a = agent();
      const f = join(a.dir, "traces", "bad.agentlog");
      writeFileSync(f, `${make()}\n`);
      if (what === "invalid UTF-8") writeFileSync(f, Buffer.concat([Buffer.from(`${m.line}\n`), Buffer.from([0x22, 0xff, 0x22, 0x0a])]));
      await expectRefused(a, snap(a), "MEMSNAP_TRACE_INVALID", msg);
    });
  }

  it("names the file in the error", async () => {
    const a = agent();
    writeFileSync(join(a.dir, "traces", "bad.agentlog"), `${rec("chunk", {}, null).line}\n`);
    const e = (await snap(a).then(() => null, (x: unknown) => x)) as { message: string; path?: string; hint?: string };
    expect(e.message).toContain(join(a.dir, "traces", "bad.agentlog"));
    expect(e.path).toBe(join(a.dir, "traces", "bad.agentlog"));
    expect(e.hint).toMatch(/canonical payload/);
  });

  it("the same checks run when redaction re-seals the trace", async () => {
    const a = agent();
    writeFileSync(join(a.dir, "traces", "bad.agentlog"), `${[m.line, q.line.replace(q.id, `sha256:${"1".repeat(64)}`)].join("\n")}\n`);
    redactorHook.current = () => new StubRedactor();
    try {
      await expectRefused(a, snap(a, {}, true), "MEMSNAP_TRACE_INVALID", /line 2: record id/);
    } finally {
      redactorHook.current = undefined;
    }
  });
});

describe("trace: redaction re-seals", () => {
  it("rewrites secrets, recomputes ids, rewrites parents, keeps untouched records' bytes, and records it", async () => {
    const a = agent();
    const { recs, text } = sampleTrace(true);
    const spaced = text.replace(recs[2]!.line, recs[2]!.line.replace('"content":"hi"', '"content": "hi"')); // odd spacing, same payload
    writeFileSync(join(a.dir, "traces", "s.agentlog"), spaced);
    const stub = new StubRedactor();
    redactorHook.current = () => stub;
    let r;
    try {
      r = await snap(a, {}, true);
    } finally {
      redactorHook.current = undefined;
    }
    expect(stub.artifactsSeen).toEqual([]); // the pipeline's generic JSONL redaction is not used: it would break the ids
    expect(stub.redacted).toEqual({ "t/s.agentlog": { "stub-api-key": 2 } });
    expect(r.manifest.layers[0]!.meta).toMatchObject({
      records: 5, resealed_records: 1, parents_rewritten: 2, resealed: { "s.agentlog": { records: 1, parents_rewritten: 2 } },
    });
    const to = join(a.dir, "restored");
    await restoreToDir(r.path, to);
    const out = readFileSync(join(to, "t", "s.agentlog"), "utf8");
    expect(out).not.toContain("sk-live-");
    const lines = out.trimEnd().split("\n");
    expect(lines).toHaveLength(5);
    expect(await validateTrace((async function* () { yield Buffer.from(out); })())).toBe(5);
    const [m, q, resp, tool, res] = lines.map((l) => JSON.parse(l) as { id: string; parent: string | null; payload: unknown; meta?: { note: string } });
    expect(lines[0]).toBe(recs[0]!.line); // untouched: exact bytes
    expect(q!.id).not.toBe(recs[1]!.id);
    expect(q!.id).toBe(idOf(q!.payload));
    expect(q!.parent).toBe(m!.id);
    expect(resp!.parent).toBe(q!.id);
    expect(res!.parent).toBe(q!.id);
    expect(tool!.id).toBe(recs[3]!.id); // payload untouched, id kept…
    expect(tool!.meta!.note).toBe("[REDACTED:stub-api-key]"); // …meta redacted
    expect(lines[2]).toContain('"content":"hi"'); // rewritten (new parent), compact
    const v = await verifyBundle(r.path, { deep: true });
    expect(v.findings).toEqual([]);
  });

  it("re-seals byte-exact numbers in rewritten records", async () => {
    const a = agent();
    const m = rec("metadata", { agent: "demo" }, null);
    const payloadText = '{"time_unix_nano":1718000000123456789,"x":1.0e2,"key":"sk-live-ABCDEFGHIJKLMNOPQRST"}';
    const canonical = '{"key":"sk-live-ABCDEFGHIJKLMNOPQRST","time_unix_nano":1718000000123456789,"x":100}';
    const h = rec("harness_event", null, m.id, { payloadText, canonical });
    writeFileSync(join(a.dir, "traces", "n.agentlog"), `${m.line}\n${h.line}\n`);
    redactorHook.current = () => new StubRedactor();
    let r;
    try {
      r = await snap(a, {}, true);
    } finally {
      redactorHook.current = undefined;
    }
    const to = join(a.dir, "restored");
    await restoreToDir(r.path, to);
    const line = readFileSync(join(to, "t", "n.agentlog"), "utf8").split("\n")[1]!;
    expect(line).toContain('"payload":{"time_unix_nano":1718000000123456789,"x":1.0e2,"key":"[REDACTED:stub-api-key]"}');
    expect(line).toContain(`"id":"sha256:${sha('{"key":"[REDACTED:stub-api-key]","time_unix_nano":1718000000123456789,"x":100}')}"`);
  });

  it("leaves a trace without secrets byte for byte and counts nothing", async () => {
    const a = agent();
    const { text } = sampleTrace(false);
    writeFileSync(join(a.dir, "traces", "s.agentlog"), text);
    redactorHook.current = () => new StubRedactor();
    let r;
    try {
      r = await snap(a, {}, true);
    } finally {
      redactorHook.current = undefined;
    }
    expect(r.manifest.layers[0]!.meta).toMatchObject({ records: 5, resealed_records: 0, parents_rewritten: 0, resealed: {} });
    const to = join(a.dir, "restored");
    await restoreToDir(r.path, to);
    expect(readFileSync(join(to, "t", "s.agentlog"), "utf8")).toBe(text);
    expect(readdirSync(a.out)).toEqual(["b.memsnap"]); // the spool went with the work dir
  });
});

describe("trace: deep verify", () => {
  it("names the artifact and the line", async () => {
    const a = agent();
    const { recs } = sampleTrace();
    mkdirSync(join(a.dir, "raw"));
    writeFileSync(join(a.dir, "raw", "ok.agentlog"), `${recs[0]!.line}\n`);
    writeFileSync(join(a.dir, "raw", "bad.agentlog"), `${recs[0]!.line}\n${recs[1]!.line.replace("hello", "HELLO")}\n${recs[2]!.line}\n`);
    const c = parseConfig({ agent: "a1", redaction: { enabled: false }, sources: [{ kind: "files", name: "t", path: "raw" }] }, null, a.dir);
    c.sources[0]!.impl = { ...SOURCE_KINDS.files!, kind: "trace", schemaVersion: 1 } as SourceKind<{ name: string }>;
    const r = await snapshot({ config: c, out: join(a.out, "b.memsnap") });
    const v = await verifyBundle(r.path, { deep: true });
    expect(v.findings).toEqual([{
      code: "MEMSNAP_DEEP_VERIFY_FAILED", path: "t/bad.agentlog",
      message: expect.stringMatching(/^t\/bad\.agentlog: line 2: record id sha256:[0-9a-f]{64} does not match its payload/),
    }]);
    expect(v.checks.find((x) => x.name === "artifacts")?.status).toBe("passed");
  });
});

describe("trace: a record is checked within a memory budget, not per value", () => {
  const MAXRSS = join(REPO, "test", "helpers", "maxrss.cjs");
  const head = (payload: string): string => `{"version":"0.1","id":"sha256:${"0".repeat(64)}","kind":"metadata","ts":1,"parent":null,"payload":${payload}}`;

  it("values past the budget, and numbers whose canonical form runs long, are refused by the parser", () => {
    expect(() => parseLossless("[0,0,0,0]", { budget: 4 * VALUE_COST })).toThrow(JsonBudgetError);
    expect(parseLossless("[0,0,0]", { budget: 4 * VALUE_COST })).toHaveLength(3);
    expect(() => parseLossless('{"a":1,"b":2}', { budget: 4 * VALUE_COST })).toThrow(JsonBudgetError); // keys count too
    expect(() => parseLossless("[1e3000,1e3000]", { expansion: 5000 })).toThrow(/canonical form would add more than 5000 digits/);
    expect(() => parseLossless("[1e3000]", { expansion: 5000 })).not.toThrow();
    const v = new TraceValidator();
    const small = rec("metadata", { big: 1 }, null, { payloadText: '{"big":1e4000}', canonical: `{"big":1${"0".repeat(4000)}}` });
    expect(v.check(Buffer.from(small.line), 1).id).toBe(small.id); // one long number in a small record is fine
    expect(() => new TraceValidator().check(Buffer.from(head(`[${"1e4000,".repeat(2000)}1]`)), 1)).toThrow(/would expand past/);
  });

  /** `memsnap verify --deep --json` on a bundle whose trace layer holds `text`: its findings and peak RSS. */
  async function deepVerify(text: string): Promise<{ code: number | null; findings: { code: string; message: string }[]; rssMiB: number; ms: number }> {
    const a = agent();
    mkdirSync(join(a.dir, "raw"));
    writeFileSync(join(a.dir, "raw", "t.agentlog"), text);
    const c = parseConfig({ agent: "a1", redaction: { enabled: false }, sources: [{ kind: "files", name: "t", path: "raw" }] }, null, a.dir);
    c.sources[0]!.impl = { ...SOURCE_KINDS.files!, kind: "trace", schemaVersion: 1 } as SourceKind<{ name: string }>;
    const r = await snapshot({ config: c, out: join(a.out, "b.memsnap") });
    const t0 = Date.now();
    const res = await runCli(["verify", r.path, "--deep", "--json"], { env: { NODE_OPTIONS: `--require=${MAXRSS}` }, timeoutMs: 120_000 });
    const ms = Date.now() - t0;
    const kib = /memsnap-test-maxrss-kib=(\d+)/.exec(res.stderr);
    expect(kib, res.stderr).not.toBeNull();
    const out = JSON.parse(res.stdout) as { findings: { code: string; message: string }[] };
    return { code: res.code, findings: out.findings, rssMiB: Number(kib![1]) / 1024, ms };
  }

  it("verify --deep refuses a 20 MB record of ten million array elements with bounded memory", async () => {
    const r = await deepVerify(`${head(`{"a":[${"0,".repeat(10_000_000)}0]}`)}\n`);
    expect(r.code).toBe(3);
    expect(r.findings).toEqual([{ code: "MEMSNAP_DEEP_VERIFY_FAILED", path: "t/t.agentlog", message: expect.stringMatching(/line 1: record is over the 256 MiB memory budget/) }]);
    // Unbounded, this record took ~0.9 GiB (a 120 MB one 3.7 GiB); within the budget ~0.3 GiB.
    expect(r.rssMiB).toBeLessThan(600);
  }, 180_000);

  it("verify --deep refuses 120,000 numbers like 1e4000 (0.8 MB) with bounded memory", async () => {
    const r = await deepVerify(`${head(`{"a":[${"1e4000,".repeat(120_000)}0]}`)}\n`);
    expect(r.code).toBe(3);
    expect(r.findings).toEqual([{ code: "MEMSNAP_DEEP_VERIFY_FAILED", path: "t/t.agentlog", message: expect.stringMatching(/line 1: record's numbers would expand past \d+ digits/) }]);
    // Unbounded: ~1.5 GiB.
    expect(r.rssMiB).toBeLessThan(200);
  }, 180_000);

  it("a record over the budget is MEMSNAP_TRACE_INVALID at capture, also as the unterminated last line", async () => {
    const a = agent();
    const many = `${head(`[${"1e4000,".repeat(2000)}1]`)}`;
    const m = rec("metadata", { agent: "demo" }, null);
    writeFileSync(join(a.dir, "traces", "s.agentlog"), `${m.line}\n${many}`);
    await expect(snap(a)).rejects.toMatchObject({ code: "MEMSNAP_TRACE_INVALID", message: expect.stringMatching(/line 2: record's numbers would expand past/) });
  });
});

describe("trace: config", () => {
  it("takes include/exclude and rejects unknown keys", async () => {
    const a = agent();
    const { text } = sampleTrace();
    writeFileSync(join(a.dir, "traces", "a.jsonl"), text);
    writeFileSync(join(a.dir, "traces", "b.agentlog"), text);
    const r = await snap(a, { include: ["*.jsonl"] });
    expect(r.manifest.index!.map((e) => e.path)).toEqual(["t/a.jsonl"]);
    expect(() => config(a, { bogus: true })).toThrow(/unknown key "bogus"/);
    appendFileSync(join(a.dir, "traces", "b.agentlog"), "garbage\n");
    rmSync(r.path);
    await expect(snap(a, { exclude: ["b.agentlog"] }).then(() => "ok")).resolves.toBe("ok");
  });
});
