/**
 * JSON and JSONL: only string contents change, the document stays valid, other bytes stay
 * where they were, and a match never spans a string boundary.
 */
import { readFileSync } from "node:fs";
import { afterAll, describe, expect, it } from "vitest";
import { isJsonArtifact } from "../../src/redact/index.js";
import { jsonEndState, jsonUnits, snapToEscapes } from "../../src/redact/json.js";
import { redactBytes, redactor, removeTempDirs } from "./helpers/redactor.js";

const FIX = "fixtures/redaction";
afterAll(removeTempDirs);

/** Replace every string literal's content by `S` (the structure around strings). */
const skeleton = (line: string): string => line.replace(/"(?:[^"\\]|\\.)*"/g, '"S"');

/** Every string value/key of a parsed JSON value, in order. */
function strings(v: unknown, out: string[] = []): string[] {
  if (typeof v === "string") out.push(v);
  else if (Array.isArray(v)) for (const x of v) strings(x, out);
  else if (v && typeof v === "object") for (const [k, x] of Object.entries(v)) { out.push(k); strings(x, out); }
  return out;
}

describe("JSONL and JSON documents", () => {
  it("session.jsonl: valid, same structure byte for byte, only secret-bearing strings changed", async () => {
    const r = await redactor();
    const input = readFileSync(`${FIX}/session.jsonl`);
    const out = (await redactBytes(r, "session.jsonl", input)).toString();
    expect(out).toBe(readFileSync(`${FIX}/expected/session.jsonl`, "utf8"));
    const inLines = input.toString().split("\n");
    const outLines = out.split("\n");
    expect(outLines).toHaveLength(inLines.length);
    inLines.forEach((line, i) => {
      const o = outLines[i]!;
      if (!line) return expect(o).toBe("");
      expect(skeleton(o)).toBe(skeleton(line));
      const a = strings(JSON.parse(line));
      const b = strings(JSON.parse(o));
      expect(b).toHaveLength(a.length);
      a.forEach((s, k) => {
        if (b[k] !== s) expect(b[k]).toContain("[REDACTED:");
      });
    });
    expect(out).not.toContain("fake-hunter2");
    expect(out).not.toContain("fake-quoted-pass");
    expect(out).not.toContain("sk-proj-");
  });

  it("a pretty-printed GCP service-account file keeps its layout", async () => {
    const r = await redactor();
    const input = readFileSync(`${FIX}/gcp-service-account.json`);
    const out = (await redactBytes(r, "sa.json", input)).toString();
    expect(out).toBe(readFileSync(`${FIX}/expected/gcp-service-account.json`, "utf8"));
    const doc = JSON.parse(out) as Record<string, string>;
    expect(doc.private_key).toBe("[REDACTED:memsnap/gcp-service-account-key]");
    expect(doc.client_email).toBe("fake-sa@fake-project.iam.gserviceaccount.com");
  });

  it("a secret behind an escaped quote inside a JSON string", async () => {
    const r = await redactor();
    const line = '{"note":"run: export PASSWORD=\\"fake-hunter2\\" && go","n":1}\n';
    const out = (await redactBytes(r, "a.jsonl", Buffer.from(line))).toString();
    expect(out).toBe('{"note":"run: export PASSWORD=\\"[REDACTED:memsnap/password-assignment]\\" && go","n":1}\n');
    expect(JSON.parse(out)).toEqual({ note: 'run: export PASSWORD="[REDACTED:memsnap/password-assignment]" && go', n: 1 });
  });

  it("escape sequences next to or inside a match stay whole", async () => {
    const r = await redactor();
    const line = '["token\\tghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000\\nnext", {"password": "fa\\u006be-\\"pass\\\\"}]\n';
    const out = (await redactBytes(r, "a.json", Buffer.from(line))).toString();
    expect(out).toBe('["token\\t[REDACTED:@secretlint/secretlint-rule-github]\\nnext", {"password": "[REDACTED:memsnap/password-assignment]"}]\n');
    JSON.parse(out);
  });

  it("the letter of an escape does not hide a token after it (\\nAKIA…, \\tghp_…)", async () => {
    const r = await redactor();
    const line = '{"log":"line one\\nAKIAI44QH8DHBEXAMPLE\\r\\nnext\\tghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000"}\n';
    const out = (await redactBytes(r, "log.jsonl", Buffer.from(line))).toString();
    expect(JSON.parse(out)).toEqual({ log: "line one\n[REDACTED:@secretlint/secretlint-rule-aws]\r\nnext\t[REDACTED:@secretlint/secretlint-rule-github]" });
    // the same JSON inside a markdown file (plain text)
    expect(await r.redactText(`log: ${line}`, "md")).toBe(`log: ${out}`);
  });

  it("a match never spans a string boundary (minified, URL next to a token)", async () => {
    const r = await redactor();
    const line = '{"db":"postgres://fakeuser:fake-p4ssw0rd@db.example.net/app","gh":"ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000","x":"postgres://fakeuser:fake-p4ssw0rd@db2.example.net/b"}';
    const out = (await redactBytes(r, "a.json", Buffer.from(line))).toString();
    expect(JSON.parse(out)).toEqual({
      db: "[REDACTED:@secretlint/secretlint-rule-database-connection-string]",
      gh: "[REDACTED:@secretlint/secretlint-rule-github]",
      x: "[REDACTED:@secretlint/secretlint-rule-database-connection-string]",
    });
  });

  it("keys give the context: \"password\": value, \"api_key\": value; numbers and short values stay", async () => {
    const r = await redactor();
    const line = '{"password":"fake-hunter2","api_key":"fake-api-key-1234","token":4096,"secret":"abc","password_hint":"pet name"}\n';
    const out = (await redactBytes(r, "a.jsonl", Buffer.from(line))).toString();
    expect(JSON.parse(out)).toEqual({
      password: "[REDACTED:memsnap/password-assignment]", api_key: "[REDACTED:memsnap/secret-assignment]",
      token: 4096, secret: "abc", password_hint: "pet name",
    });
  });

  it("a damaged or commented JSON file is still redacted between strings", async () => {
    const r = await redactor();
    const text = '{\n  // deploy key: ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000\n  "a": 1\n}\n';
    const out = (await redactBytes(r, "conf.json", Buffer.from(text))).toString();
    expect(out).toBe('{\n  // deploy key: [REDACTED:@secretlint/secretlint-rule-github]\n  "a": 1\n}\n');
  });

  it("is chosen by kind json/jsonl or by extension", () => {
    expect(isJsonArtifact({ kind: "json", path: "x.txt" })).toBe(true);
    expect(isJsonArtifact({ kind: "jsonl", path: "x" })).toBe(true);
    for (const p of ["a.json", "b/c.JSONL", "d.ndjson"]) expect(isJsonArtifact({ kind: "file", path: p })).toBe(true);
    for (const p of ["a.md", "b.txt", "json"]) expect(isJsonArtifact({ kind: "file", path: p })).toBe(false);
  });

  it("a JSON line far longer than a block, cut inside a string and inside an escape, stays valid", async () => {
    const r = await redactor();
    // one 3 MiB line: a huge string full of escapes, then key/value pairs with secrets
    const filler = 'x\\"y\\\\'.repeat(300_000); // JSON-escaped content: x"y\ repeated
    const obj = `{"blob":"${filler}","password":"fake-hunter2","blob2":"${filler}","k":"ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000"}\n`;
    const bytes = Buffer.from(obj);
    // chunk sizes that put cuts at odd places (inside escapes) without a newline anywhere before the end
    for (const chunk of [65_537, 1 << 20, 999_983]) {
      const out = (await redactBytes(r, "big.jsonl", bytes, { chunk })).toString();
      const doc = JSON.parse(out) as Record<string, string>;
      expect(doc.password).toBe("[REDACTED:memsnap/password-assignment]");
      expect(doc.k).toBe("[REDACTED:@secretlint/secretlint-rule-github]");
      expect(doc.blob).toBe('x"y\\'.repeat(300_000));
      expect(out.length).toBe(obj.length - "fake-hunter2".length - 40 + "[REDACTED:memsnap/password-assignment]".length + "[REDACTED:@secretlint/secretlint-rule-github]".length);
    }
  });
});

describe("redactText", () => {
  it("a text that is one JSON document (a JSON column) stays valid JSON", async () => {
    const r = await redactor();
    const cell = '{"db":"postgres://fakeuser:fake-p4ssw0rd@db.example.net/app","note":"x\\nAKIAI44QH8DHBEXAMPLE","password":"fake-hunter2"}';
    expect(JSON.parse(await r.redactText(cell, "t"))).toEqual({
      db: "[REDACTED:@secretlint/secretlint-rule-database-connection-string]",
      note: "x\n[REDACTED:@secretlint/secretlint-rule-aws]",
      password: "[REDACTED:memsnap/password-assignment]",
    });
    // not JSON: plain text rules
    expect(await r.redactText("{ password=hunter2-fake }", "t")).toBe("{ password=[REDACTED:memsnap/password-assignment] }");
  });
});

describe("tokenizer", () => {
  it("units: strings, key/value pairs (matches kept inside the value), gaps", () => {
    const line = '{"password": "p4ss-word", "list": ["AKIAI44QH8DHBEXAMPLE"], bad token: ghp_x}';
    const units = jsonUnits(line, 0);
    const pair = units.find((u) => u.text.startsWith('"password"'))!;
    expect(pair.text.slice(pair.a, pair.b)).toBe("p4ss-word");
    expect(units.some((u) => u.text === "AKIAI44QH8DHBEXAMPLE" && u.json)).toBe(true);
    expect(units.some((u) => !u.json && u.text.includes("token:"))).toBe(true);
  });

  it("state across a cut: inside a string, right after a backslash", () => {
    expect(jsonEndState('{"a": "abc', 0)).toBe(1);
    expect(jsonEndState('{"a": "abc\\', 0)).toBe(2);
    expect(jsonEndState('{"a": "abc"', 0)).toBe(0);
    expect(jsonEndState('bc", "d": "e', 1)).toBe(1);
    expect(jsonEndState('"still inside', 2)).toBe(1); // the first quote was escaped
    const units = jsonUnits('"x AKIAI44QH8DHBEXAMPLE", "y": 1', 2);
    expect(units[0]!.text).toBe('"x AKIAI44QH8DHBEXAMPLE');
  });

  it("snapToEscapes widens to whole escapes only", () => {
    const t = 'ab\\"cd\\u0041ef\\\\';
    expect(snapToEscapes(t, 0, t.length, 3, 5)).toEqual([2, 5]); // starts inside \"
    expect(snapToEscapes(t, 0, t.length, 0, 3)).toEqual([0, 4]); // ends inside \"
    expect(snapToEscapes(t, 0, t.length, 9, 10)).toEqual([6, 12]); // inside \u0041
    expect(snapToEscapes(t, 0, t.length, 0, 2)).toEqual([0, 2]);
    expect(snapToEscapes(t, 0, t.length, 15, 16)).toEqual([14, 16]); // inside \\
  });
});
