/**
 * Properties (fast-check): redaction is idempotent on any text with secrets at any offset; a
 * secret standing on its own never survives; JSON and JSONL stay valid and idempotent.
 */
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { redactor, removeTempDirs } from "./helpers/redactor.js";

afterAll(removeTempDirs);

const PEM = "-----BEGIN PRIVATE KEY-----\nMIIEFAKEKEYFORTESTS0FAKEKEYFORTESTS0FAKEKEYFORTESTS0FAKEKEYFORT\nFAKEKEYFORTESTS0FAKEKEYFORTESTS0FAKEKEYFORTESTS0FAKEKEYFORTESTS0\n-----END PRIVATE KEY-----";
/** [text inserted, the part that must not survive when it stands alone] */
const SECRETS: Array<[string, string]> = [
  ["AKIAI44QH8DHBEXAMPLE", "AKIAI44QH8DHBEXAMPLE"],
  ["aws_secret_access_key = je7MtGbClwBF/2Zp9Utk/h3yCo8nvbEXAMPLEKEY", "je7MtGbClwBF"],
  ["ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000", "ghp_FAKE"],
  ["xoxb-0000000000-0000000000-FAKEFAKEFAKEFAKEFAKEFAKE", "xoxb-0000"],
  ["password=hunter2-fake", "hunter2-fake"],
  ["secret: fake-s3cr3t-value", "fake-s3cr3t-value"],
  ["ASIAIOSFODNN7EXAMPLE", "ASIAIOSFODNN7EXAMPLE"],
  ["eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJmYWtlLXRlc3QtdXNlciJ9.ZmFrZS1zaWduYXR1cmU", "eyJzdWIi"],
  ["sk_live_FAKEFAKEFAKEFAKE0000", "sk_live_FAKE"],
  ["postgres://fakeuser:fake-p4ssw0rd@db.example.net:5432/app", "fake-p4ssw0rd"],
  ["https://fakeuser:fakepass123@example.net/path", "fakepass123"],
  ["redis://:fake-redis-pass@cache.example.net:6379", "fake-redis-pass"],
  [PEM, "FAKEKEYFORTESTS0"],
  ["Authorization: Bearer fake0token0for0tests0only", "fake0token0"],
  ['api_key: "fake-api-key-1234"', "fake-api-key-1234"],
  ["github_pat_11FAKEFAKE0_FAKEFAKEFAKEFAKEFAKEFAKE", "github_pat_11FAKE"],
  ["sk-proj-FAKEFAKEFAKEFAKEFAKEFAKE0000", "sk-proj-FAKE"],
  ["dapi0123456789abcdef0123456789abcdef", "dapi0123"],
];
const ALPHABET = fc.constantFrom(..."abcxyzAKZ0179 _-.:=\"'\\/@\n\r\t{}[](),;$<>*#`|~é東".split(""));
const noise = fc.string({ unit: ALPHABET, maxLength: 24 });
const secret = fc.constantFrom(...SECRETS.map(([s]) => s));

describe("idempotence", () => {
  it("redact(redact(x)) = redact(x) for random text with secrets at random offsets", async () => {
    const r = await redactor();
    await fc.assert(fc.asyncProperty(fc.array(fc.oneof(noise, secret), { maxLength: 14 }), async (parts) => {
      const once = await r.redactText(parts.join(""), "p");
      expect(await r.redactText(once, "p")).toBe(once);
    }), { numRuns: 4000 });
  }, 180_000);

  it("a secret standing alone (between spaces or newlines) never survives", async () => {
    const r = await redactor();
    const sep = fc.constantFrom(" ", "\n", "\n\n", " \t");
    const word = fc.string({ unit: fc.constantFrom(..."abcdefghij ".split("")), maxLength: 20 });
    await fc.assert(fc.asyncProperty(fc.array(fc.tuple(fc.oneof(word, fc.constantFrom(...SECRETS.map((_, i) => i))), sep), { maxLength: 10 }), async (parts) => {
      const text = parts.map(([p, s]) => (typeof p === "number" ? SECRETS[p]![0] : p) + s).join("");
      const once = await r.redactText(text, "p");
      for (const [p] of parts) if (typeof p === "number") expect(once).not.toContain(SECRETS[p]![1]);
    }), { numRuns: 1500 });
  }, 180_000);
});

describe("JSON", () => {
  it("JSON documents and JSONL stay valid, idempotent, and lose standalone secrets", async () => {
    const r = await redactor();
    const str = fc.array(fc.oneof(noise, secret, fc.constant(" ")), { maxLength: 5 }).map((a) => a.join(""));
    const key = fc.oneof(fc.constantFrom("password", "api_key", "token", "note", "private_key", "aws_secret_access_key", "url", "content"), fc.string({ maxLength: 6 }));
    const value = fc.oneof(str, fc.integer(), fc.constant(null), fc.array(str, { maxLength: 3 }));
    const doc = fc.array(fc.dictionary(key, fc.oneof(value, fc.dictionary(key, value, { maxKeys: 3 })), { maxKeys: 5 }), { minLength: 1, maxLength: 4 });
    await fc.assert(fc.asyncProperty(doc, fc.boolean(), async (objs, pretty) => {
      const x = pretty ? JSON.stringify(objs, null, 2) + "\n" : objs.map((o) => JSON.stringify(o)).join("\n") + "\n";
      const once = await r.redactDocument(x, "p", true);
      const docs = pretty ? [once] : once.split("\n").filter(Boolean);
      for (const d of docs) expect(() => JSON.parse(d)).not.toThrow();
      expect(await r.redactDocument(once, "p", true)).toBe(once);
      // a string holding exactly one secret loses it
      const strings: string[] = [];
      JSON.parse(pretty ? once : `[${docs.join(",")}]`, (_k, v: unknown) => (typeof v === "string" && strings.push(v), v));
      for (const [s] of SECRETS) expect(strings).not.toContain(s);
    }), { numRuns: 2500 });
  }, 180_000);
});
