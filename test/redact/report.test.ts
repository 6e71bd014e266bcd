/** The report: counts per artifact and rule, totals, bytes — never a secret or a hash of one. */
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { afterAll, describe, expect, it } from "vitest";
import { redactBytes, redactor, removeTempDirs } from "./helpers/redactor.js";
import { summarizeRedaction } from "../../src/redact/report.js";

afterAll(removeTempDirs);
const FIX = "fixtures/redaction";
const { cases } = JSON.parse(readFileSync(`${FIX}/cases.json`, "utf8")) as { cases: Array<{ input: string; expected: string }> };

/** The text a redaction removed: what lies between the common prefix and suffix of input and output. */
function removed(input: string, output: string): string {
  let p = 0;
  while (p < input.length && input[p] === output[p]) p++;
  let s = 0;
  while (s < input.length - p && input[input.length - 1 - s] === output[output.length - 1 - s]) s++;
  return input.slice(p, input.length - s);
}

describe("report", () => {
  it("holds no fixture secret, nor its sha256 / sha1 hex", async () => {
    const r = await redactor();
    const secrets: string[] = [];
    for (const [i, c] of cases.entries()) {
      expect(await r.redactText(c.input, `cases/${i}`)).toBe(c.expected);
      secrets.push(removed(c.input, c.expected));
      await r.scanText(c.input, `history/${i}`);
    }
    for (const f of ["memory/MEMORY.md", "session.jsonl", "gcp-service-account.json"]) await redactBytes(r, f, readFileSync(`${FIX}/${f}`));
    const json = JSON.stringify(r.report());
    const lower = json.toLowerCase();
    for (const s of secrets) {
      expect(s.length).toBeGreaterThan(7);
      expect(json).not.toContain(s);
      for (const alg of ["sha256", "sha1", "md5"]) expect(lower).not.toContain(createHash(alg).update(s).digest("hex"));
      // nor a recognisable piece of one
      expect(json).not.toContain(s.slice(0, 12));
    }
    for (const c of cases) expect(lower).not.toContain(createHash("sha256").update(c.input).digest("hex"));
  });

  it("counts per artifact and rule, for rewritten and for scanned-only content; totals and bytes", async () => {
    const r = await redactor();
    const md = "a password=hunter2-fake\nb AKIAI44QH8DHBEXAMPLE and AKIAI44QH8DHBEXAMPLE\n";
    await r.redactText(md, "mem/MEMORY.md");
    await r.scanText("commit: token ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000", "mem/repo.bundle");
    await r.redactText("nothing here", "mem/clean.md");
    expect(r.report()).toEqual({
      policy: "default",
      rules_fired: ["@secretlint/secretlint-rule-aws", "@secretlint/secretlint-rule-github", "memsnap/password-assignment"],
      redacted: { "mem/MEMORY.md": { "@secretlint/secretlint-rule-aws": 2, "memsnap/password-assignment": 1 } },
      unredacted: { "mem/repo.bundle": { "@secretlint/secretlint-rule-github": 1 } },
      total_redacted: 3,
      total_unredacted: 1,
      bytes_scanned: Buffer.byteLength(md) + 54 + 12,
    });
  });

  it("bytes_scanned counts every byte of a stream, with or without candidates", async () => {
    const r = await redactor();
    const bytes = Buffer.from("x".repeat(3_000_000) + "\npassword=hunter2-fake\n" + "y\n".repeat(1000));
    await redactBytes(r, "big.md", bytes, { chunk: 65_536 });
    expect(r.report().bytes_scanned).toBe(bytes.length);
  });
});

describe("summarizeRedaction (a manifest's report, untrusted)", () => {
  it("sums rewritten values per artifact and rule, over the layers asked for", () => {
    const report = {
      policy: "default",
      redacted: { "memory/a.md": { "r/one": 2, "r/two": 1 }, "state/s.json": { "r/one": 1 }, "db/x.db": { "r/three": 0 } },
      unredacted: { "memory/repo.bundle": { "r/one": 4 } },
    };
    expect(summarizeRedaction(report)).toEqual({ total: 4, artifacts: ["memory/a.md", "state/s.json"], rules: ["r/one", "r/two"], unredacted: 4 });
    expect(summarizeRedaction(report, new Set(["state"]))).toEqual({ total: 1, artifacts: ["state/s.json"], rules: ["r/one"], unredacted: 0 });
  });

  it("counts anything malformed as nothing", () => {
    const none = { total: 0, artifacts: [], rules: [], unredacted: 0 };
    for (const bad of [null, "x", [], { redacted: [] }, { redacted: { "m/a": [3] } }, { redacted: { "m/a": { r: -1 } } },
      { redacted: { "m/a": { r: "2" } } }, { redacted: { "m/a": { r: 1.5 } } }, { redacted: { "m/a": null }, unredacted: "x" }]) {
      expect(summarizeRedaction(bad)).toEqual(none);
    }
  });
});
