/**
 * The pre-filter's fast finders against its definition, the regexes in `SCANNERS` (what the
 * pre-filter was before the finders, and what the SQLite worker still runs): on random and
 * adversarial text, every position a regex matches at is found (the finders may never flag
 * fewer), and in fact exactly those positions, so the regions and with them the redacted
 * output cannot change. The last block runs the whole redactor twice, once with the finders
 * and once with the regexes put back in their place, and compares the bytes.
 */
import { readFileSync } from "node:fs";
import fc from "fast-check";
import { afterAll, describe, expect, it, vi } from "vitest";
import { NATIVE_PREFILTER_PATH, nativePrefilter, useNativePrefilter } from "../../src/redact/native.js";
import { candidate, FINDERS, SCANNERS, type Finder } from "../../src/redact/prefilter.js";
import { planRegions } from "../../src/redact/regions.js";
import { memArtifact, readArtifact, removeTempDirs, tempDir } from "./helpers/redactor.js";

afterAll(removeTempDirs);

/** A finder that runs a reference regex (what planRegions did before the finders). */
function regexFinder(re: RegExp): Finder {
  const g = new RegExp(re.source, re.flags.includes("g") ? re.flags : `${re.flags}g`);
  return {
    cursor(text) {
      return (from) => {
        g.lastIndex = from;
        const m = g.exec(text);
        return m ? m.index : -1;
      };
    },
  };
}
const REFERENCE: readonly Finder[] = SCANNERS.map(regexFinder);

function positions(f: Finder, text: string): number[] {
  const next = f.cursor(text);
  const out: number[] = [];
  for (let p = next(0); p >= 0; p = next(p + 1)) out.push(p);
  return out;
}

/** Old and new positions of every scanner; the new ones must include the old (and are equal). */
function checkPositions(text: string): void {
  SCANNERS.forEach((_, i) => {
    const old = positions(REFERENCE[i]!, text);
    const now = positions(FINDERS[i]!, text);
    const missed = old.filter((p) => !now.includes(p));
    expect(missed, `scanner ${i} missed in ${JSON.stringify(text.slice(0, 200))}`).toEqual([]);
    expect(now, `scanner ${i} on ${JSON.stringify(text.slice(0, 200))}`).toEqual(old);
  });
  expect(candidate(text)).toBe(SCANNERS.some((re) => new RegExp(re.source).test(text)));
}

function checkPlans(text: string): void {
  for (const final of [true, false]) {
    for (const windows of [true, false]) {
      expect(planRegions(text, final, windows), `final=${final} windows=${windows}`).toEqual(planRegions(text, final, windows, REFERENCE));
    }
  }
}

const { cases } = JSON.parse(readFileSync("fixtures/redaction/cases.json", "utf8")) as { cases: Array<{ input: string }> };
const FIXTURES = cases.map((c) => c.input);

/** Every literal the scanners look for, with its trigger (the words of each alternative spelled out). */
const TOKEN_PREFIXES = [
  "ghp", "gho", "ghu", "ghs", "ghr", "github_pat", "hf", "npm", "sk_live", "sk_test", "rk_live", "rk_test", "shppa", "shpca",
  "shpat", "shpss", "glc", "glsa", "ops", "gsk", "lin_api", "ntn", "vcp", "vci", "vcr", "vca", "vck", "dckr_pat", "figd",
].map((p) => `${p}_`);
const DASHES = ["-----BEGIN", "x-oauth-basic", "sk-proj-", "sk-svcacct-", "sk-admin-", "sk-ant-", "sk-ABCDEFGHIJabcdefghij1T3BlbkFJ",
  "xoxb-", "xoxp-", "xoxa-", "xoxo-", "xoxr-", "xapp-", "glpat-", "----BEGIN", "sk-", "x-oauth"];
const DOTS = ["SG.", "hvs.", "hvb.", "hvr.", "hooks.", "HOOKS.", "HoOkS.", "hv.", "G.", "s."];
const KEYS = ["password", "passwd", "passphrase", "pwd", "secret", "token", "key", "credential", "credentials", "account", "account_id",
  "accountid", "PASSWORD", "Api_Key", "ToKeN", "acount", "tool_id", "keys", "pass"];
const OPS = [":", "=", ": ", " = ", '":', '" :', "\\\":", "':", "\\':", ":\t", "\u00a0:", "\u2028=", "\n:", "\u3000=", "\ufeff:"];
const OTHERS = ["eyJ", "yJ", "eJ", "AKIA", "ASIA", "A3TX", "A3T", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA", "AKI", "dapi", "dap", "api",
  "bearer", "Bearer", "BEARER", "BEarer", "bEARER", "://", "://u:p@", "://a/b@", "://a b@", "http://x@", ":/", `://${"a".repeat(601)}@`,
  `://${"a".repeat(600)}@`];
const PIECES = [
  ...TOKEN_PREFIXES, ...DASHES, ...DOTS, ...OTHERS,
  ...KEYS.flatMap((k) => OPS.map((o) => k + o)),
];
const ALPHABET = fc.constantFrom(..."abdehiknoprstxyzABEGJKRSX0139 _-.:=\"'\\/@\n\r\t{}[],\u00a0é東\u2028\u3000\u00c2".split(""));
const noise = fc.string({ unit: ALPHABET, maxLength: 12 });
const piece = fc.constantFrom(...PIECES);
const fixture = fc.constantFrom(...FIXTURES);
const text = fc.array(fc.oneof({ arbitrary: noise, weight: 3 }, { arbitrary: piece, weight: 3 }, { arbitrary: fixture, weight: 1 }), { maxLength: 16 })
  .map((parts) => parts.join(""));

describe("pre-filter: fast finders against the reference regexes", () => {
  it("every fixture and every literal, alone and glued to its neighbours", () => {
    for (const t of [...FIXTURES, ...PIECES]) {
      checkPositions(t);
      checkPositions(`x${t}x`);
      checkPositions(`${t}${t}`);
      checkPositions(`é${t}\n${t.toUpperCase()}`);
      checkPositions(t.slice(1));
      checkPositions(t.slice(0, -1));
    }
  });

  it("random text of anchors, near-misses, secrets and noise (JS strings)", () => {
    fc.assert(fc.property(text, (t) => {
      checkPositions(t);
      checkPlans(t);
    }), { numRuns: 5000 });
  });

  it("random text as the latin1 view of its UTF-8 bytes (what the stream scans)", () => {
    fc.assert(fc.property(text, (t) => {
      const view = Buffer.from(t, "utf8").toString("latin1");
      checkPositions(view);
      checkPlans(view);
    }), { numRuns: 2000 });
  });

  it("long lines (windows around hits) and PEM blocks", () => {
    fc.assert(fc.property(fc.array(fc.oneof(text, fc.constant("a".repeat(9000)), fc.constant("b ".repeat(5000))), { maxLength: 8 }), (parts) => {
      const t = parts.join("");
      checkPositions(t);
      checkPlans(t);
    }), { numRuns: 300 });
  });

  it("the mix's kind of text: JSONL agent traces and markdown notes", () => {
    const line = (i: number): string => JSON.stringify({
      ts: "2024-05-01T08:00:33.547Z", session: `s-${i}`, turn: i, role: "tool", tool_id: `call_${i}qwdapi7`,
      content: JSON.stringify({ status: "ok", items: [{ id: i, score: 0.5, text: "Tokens. Keys: the account, hooks and bearer bonds." }] }),
    });
    const jsonl = Array.from({ length: 200 }, (_, i) => line(i)).join("\n");
    const md = "# Notes\n\n_updated: 2024-05-04_\n\n- Seemed that this token like Denver.\n- Key: value, SG and hv.\n".repeat(50);
    for (const t of [jsonl, md, jsonl + "\n" + FIXTURES.join("\n"), md + FIXTURES.join(" ")]) {
      checkPositions(t);
      checkPlans(t);
    }
  });
});

type RedactModule = typeof import("../../src/redact/index.js");

/** The redaction module with the reference regexes in place of the finders (the pipeline as it was). */
async function referenceModule(): Promise<RedactModule> {
  vi.resetModules();
  vi.doMock("../../src/redact/prefilter.js", async (importOriginal) => {
    const real = await importOriginal<typeof import("../../src/redact/prefilter.js")>();
    const tests = real.SCANNERS.map((re) => new RegExp(re.source));
    return { ...real, FINDERS: real.SCANNERS.map(regexFinder), candidate: (t: string) => tests.some((re) => re.test(t)) };
  });
  try {
    return await import("../../src/redact/index.js");
  } finally {
    vi.doUnmock("../../src/redact/prefilter.js");
    vi.resetModules();
  }
}

describe("pre-filter: the whole redactor gives the same bytes", () => {
  it("redactText, JSON documents and streamed artifacts (plain and JSONL), with the finders and with the regexes", async () => {
    const oldMod = await referenceModule();
    const newMod = await import("../../src/redact/index.js");
    const cfg = { enabled: true, allow: [], disable: [] };
    const mk = async (m: RedactModule) => (await m.createRedactor(cfg, tempDir())) as import("../../src/redact/index.js").DocumentRedactor;
    const oldR = await mk(oldMod);
    const newR = await mk(newMod);
    const jsonLine = (t: string): string => JSON.stringify({ role: "user", content: t, note: { k: t.slice(0, 40) } });
    await fc.assert(fc.asyncProperty(fc.array(text, { minLength: 1, maxLength: 6 }), fc.integer({ min: 1, max: 64 }), async (lines, chunk) => {
      const plain = lines.join("\n");
      expect(await newR.redactText(plain, "t")).toBe(await oldR.redactText(plain, "t"));
      const jsonl = lines.map(jsonLine).join("\n") + "\n";
      expect(await newR.redactDocument(jsonl, "j", true)).toBe(await oldR.redactDocument(jsonl, "j", true));
      for (const [path, kind, bytes] of [["a.md", "file", plain], ["a.jsonl", "jsonl", jsonl]] as const) {
        const buf = Buffer.from(bytes, "utf8");
        const got = await readArtifact(await newR.redactArtifact(memArtifact(path, buf, { kind, chunk }), `l/${path}`));
        const want = await readArtifact(await oldR.redactArtifact(memArtifact(path, buf, { kind, chunk }), `l/${path}`));
        expect(got.toString("latin1")).toBe(want.toString("latin1"));
      }
    }), { numRuns: 400 });
    const { policy: _p, ...newRep } = newR.report();
    const { policy: _q, ...oldRep } = oldR.report();
    expect(newRep).toEqual(oldRep);
    expect(newRep.total_redacted).toBeGreaterThan(0);
    await oldR.cleanup();
    await newR.cleanup();
  }, 180_000);
});

describe("native pre-filter (native/prefilter): a superset of the finders, so output cannot change", () => {
  const addon = nativePrefilter();
  /** Could a finder match in b[a, e), as latin1 (the stream) or as the UTF-8 text (SQLite cells)? */
  const jsHit = (b: Buffer, a: number, e: number): boolean => candidate(b.latin1Slice(a, e)) || candidate(b.utf8Slice(a, e));

  it.runIf(process.env.CI)("is built in CI", () => {
    expect(addon, "npm ci builds native/prefilter with node-gyp").not.toBeNull();
    expect(NATIVE_PREFILTER_PATH).toMatch(/memsnap_prefilter\.node$/);
  });

  it.runIf(addon)("never says no where a finder says yes: fixtures, literals, random text and byte ranges", () => {
    const check = (t: string, a?: number, e?: number): void => {
      const b = Buffer.from(t, "utf8");
      const lo = Math.min(a ?? 0, b.length);
      const hi = Math.max(lo, Math.min(e ?? b.length, b.length));
      const what = `${JSON.stringify(t.slice(0, 200))} [${lo}, ${hi})`;
      if (jsHit(b, lo, hi)) expect(addon!.scan(b, lo, hi), what).toBeGreaterThanOrEqual(lo);
      // position by position in the latin1 view: every finder hit is a native hit (or one byte after one)
      const view = b.latin1Slice(lo, hi);
      const native = new Set<number>();
      for (let r = addon!.scan(b, lo, hi); r >= 0; r = addon!.scan(b, lo, hi, r + 1)) native.add(r - lo);
      for (const f of FINDERS) {
        for (const p of positions(f, view)) expect(native.has(p) || native.has(p - 1), `${what}: hit at ${p} ${JSON.stringify(view.slice(p - 12, p + 12))}`).toBe(true);
      }
    };
    for (const t of [...FIXTURES, ...PIECES]) {
      for (const v of [t, `x${t}x`, `${t}${t}`, `é${t}\n${t.toUpperCase()}`, t.slice(1), t.slice(0, -1), `${"x".repeat(70)}${t}${"y".repeat(70)}`]) {
        check(v);
      }
    }
    fc.assert(fc.property(fc.array(text, { maxLength: 12 }), fc.nat(), fc.nat(), (parts, x, y) => {
      const t = parts.join("");
      check(t);
      const n = Buffer.byteLength(t) + 1;
      check(t, x % n, (x % n) + (y % n));
    }), { numRuns: 5000 });
  });

  it.runIf(addon)("from: the search starts there, the look-behinds still reach back to start", () => {
    const b = Buffer.from(`xeyJabc${"q".repeat(100)}`);
    expect(addon!.scan(b, 0, b.length, 2)).toBe(2); // "eyJ" flagged at its 'y', with the 'e' before from
    expect(addon!.scan(b, 0, b.length, 3)).toBe(3);
    expect(addon!.scan(b, 2, b.length, 2)).toBe(-1); // the 'e' is before start
    const k = Buffer.from(`${"q".repeat(70)}password = x`);
    expect(addon!.scan(k, 0, k.length, 75)).toBe(79);
    expect(addon!.scan(k, 75, k.length)).toBe(-1); // "word =" is no key
  });

  it.runIf(addon)("says no on clean traces and notes (it prunes; it is not a constant)", () => {
    const line = (i: number): string => JSON.stringify({
      ts: "2024-05-01T08:00:33.547Z", session: `s-${i}`, turn: i, role: "tool", tool_id: `call_${i}qwdap7`,
      content: JSON.stringify({ status: "ok", items: [{ id: i, score: 0.5, text: "Tokens. Keys of the accounts, hooks and bear bonds." }] }),
    });
    const clean = [
      Array.from({ length: 300 }, (_, i) => line(i)).join("\n"),
      "# Notes\n\n_updated: 2024-05-04_\n\n- Seemed that this token like Denver.\n- Key notes, SG and hv.\n".repeat(80),
      "naïve café 東京 — ☕ ".repeat(500),
    ];
    for (const t of clean) {
      const b = Buffer.from(t);
      expect(jsHit(b, 0, b.length)).toBe(false);
      expect(addon!.scan(b)).toBe(-1);
    }
    // and yes on each of them with a secret anywhere in it (after the vector loop's first 64 bytes too)
    for (const t of clean) {
      for (const s of ["password=hunter2", "AKIAI44QH8DHBEXAMPLE", "ghp_x", "eyJhb", "https://u:p@h", "Bearer x", "dapi1", "xoxb-1"]) {
        for (const at of [0, 1, 63, 64, 65, 1000, t.length]) {
          const u = t.slice(0, at) + s + t.slice(at);
          expect(addon!.scan(Buffer.from(u)), `${s} at ${at}`).toBeGreaterThanOrEqual(0);
        }
      }
    }
  });

  it.runIf(addon)("the stream redactor gives the same bytes with the native pre-filter and without it", async () => {
    const mod = await import("../../src/redact/index.js");
    const r = (await mod.createRedactor({ enabled: true, allow: [], disable: [] }, tempDir())) as import("../../src/redact/index.js").DocumentRedactor;
    const run = async (on: boolean, path: string, kind: "file" | "jsonl", buf: Buffer, chunk: number): Promise<string> => {
      useNativePrefilter(on);
      try {
        return (await readArtifact(await r.redactArtifact(memArtifact(path, buf, { kind, chunk }), `l/${path}`))).toString("latin1");
      } finally {
        useNativePrefilter(true);
      }
    };
    await fc.assert(fc.asyncProperty(fc.array(text, { minLength: 1, maxLength: 8 }), fc.integer({ min: 1, max: 70_000 }), async (lines, chunk) => {
      const plain = Buffer.from(lines.join("\n"), "utf8");
      const jsonl = Buffer.from(lines.map((t) => JSON.stringify({ role: "user", content: t })).join("\n") + "\n", "utf8");
      for (const [path, kind, buf] of [["a.md", "file", plain], ["a.jsonl", "jsonl", jsonl]] as const) {
        expect(await run(true, path, kind, buf, chunk)).toBe(await run(false, path, kind, buf, chunk));
      }
    }), { numRuns: 300 });
    await r.cleanup();
  }, 120_000);
});
