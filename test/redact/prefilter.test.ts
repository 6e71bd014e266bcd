/**
 * The pre-filter's fast finders against its definition, the regexes in `SCANNERS` (what the
 * pre-filter was before the finders, and what the SQLite worker still runs): on random and
 * adversarial text, every position a regex matches at is found (the finders may never flag
 * fewer), and in fact exactly those positions, so the regions and with them the redacted
 * output cannot change. The last block runs the whole redactor twice, once with the finders
 * and once with the regexes put back in their place, and compares the bytes.
 */
import { closeSync, openSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it, vi } from "vitest";
import { NATIVE_PREFILTER_PATH, nativePrefilter, useNativePrefilter } from "../../src/redact/native.js";
import { candidate, FINDERS, SCANNERS, type Finder } from "../../src/redact/prefilter.js";
import { planRegions } from "../../src/redact/regions.js";
import { memArtifact, readArtifact, redactor, removeTempDirs, tempDir } from "./helpers/redactor.js";
import { fileArtifact } from "../../src/sources/walk.js";

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

  it.runIf(addon)("a key, any JS space run, an operator: a hit in both views; other bytes from 0x80 up are no space", () => {
    // every non-ASCII character JS's \s matches, alone, doubled, and after a quote
    const spaces = ["\u00a0", "\u1680", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff"];
    for (let c = 0x2000; c <= 0x200a; c++) spaces.push(String.fromCharCode(c));
    expect(spaces.every((w) => /^\s$/.test(w))).toBe(true);
    for (const key of ["password", "passwd", "passphrase", "pwd", "secret", "token", "key", "credential", "credentials", "account", "account_id", "accountid"]) {
      for (const w of spaces) {
        for (const t of [`${key}${w}= x`, `${key}${w}${w}:x`, `"${key}"${w}: "x"`, `x ${key.toUpperCase()} \t${w}=y`]) {
          const b = Buffer.from(t, "utf8");
          expect(candidate(t), `${JSON.stringify(t)} decoded`).toBe(true);
          expect(candidate(b.latin1Slice(0, b.length)), `${JSON.stringify(t)} latin1 view`).toBe(true);
          expect(addon!.scan(b), JSON.stringify(t)).toBeGreaterThanOrEqual(0);
        }
      }
    }
    // Float32 embeddings: 0x3D ('=') is the exponent byte of values in [1/32, 1/8), and the byte
    // before it is a random mantissa byte; 0xBD (of negative values) is no space, so "key" then
    // 0xBD then '=' is no assignment (any byte from 0x80 up was skipped like a space before)
    for (const hi of [0xbd, 0xbc, 0xff, 0x90, 0xc3]) {
      const b = Buffer.from([0x6b, 0x65, 0x79, hi, 0x3d, 0x78]);
      expect(addon!.scan(b), hi.toString(16)).toBe(-1);
      expect(candidate(b.latin1Slice(0, b.length)), hi.toString(16)).toBe(false);
    }
    // and in the vector loop: a 4 KiB vector of such values says no, with "key" and a space run it says yes
    const v = new Float32Array(1024);
    let x = 12345;
    for (let i = 0; i < v.length; i++) {
      x = (Math.imul(x, 1103515245) + 12345) >>> 0;
      v[i] = ((x / 2 ** 32) * 2 - 1) * 0.12;
    }
    const vec = Buffer.from(v.buffer);
    expect(addon!.scan(vec)).toBe(-1);
    const keyed = Buffer.concat([vec.subarray(0, 2000), Buffer.from("token\u3000\u00a0= ", "utf8"), vec.subarray(2000)]);
    expect(addon!.scan(keyed)).toBe(2000 + Buffer.byteLength("token\u3000\u00a0"));
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

  /** scanFile over `b` written to a file: [errno, at, bytesRead, digest]. */
  const scanFile = async (b: Buffer): Promise<[number, number, number, string]> => {
    const f = join(tempDir(), "f");
    writeFileSync(f, b);
    const fd = openSync(f, "r");
    try {
      const d = Buffer.alloc(32);
      const [e, at, n] = await new Promise<[number, number, number]>((res) => addon!.scanFile!(fd, b.length, d, (...r) => res(r)));
      return [e, at, n, d.toString("hex")];
    } finally {
      closeSync(fd);
    }
  };
  /** Clean JSONL filler of `n` bytes (no trigger test passes anywhere in it). */
  const filler = (n: number, seed: number): string => {
    let t = "";
    for (let i = 0; t.length < n; i++) t += JSON.stringify({ turn: seed + i, role: "tool", text: "the agent read a file and wrote notes" }) + "\n";
    return t.slice(0, n);
  };
  const MiB = 1 << 20;

  it.runIf(addon)("scanFile says nothing can match only where the whole file scans clean (block edges, margins, long key runs)", async () => {
    // Pieces at and around the 1 MiB block edges and the 4 KiB margins, in files of 1-3 MiB;
    // keys whose whitespace run to their ':' crosses a block edge or is longer than a margin
    // (the one look-behind without a bound); URLs whose '@' lies past the block end.
    const edge = fc.constantFrom(0, MiB, 2 * MiB);
    const at = fc.tuple(edge, fc.integer({ min: -4200, max: 4200 })).map(([e, d]) => Math.max(0, e + d));
    const insert = fc.oneof(
      piece, fixture, text,
      fc.tuple(fc.constantFrom("password", "token", "\"secret\"", "key"), fc.integer({ min: 0, max: 9000 }), fc.constantFrom(" ", "\n", "\u3000", "\t"))
        .map(([k, n, sp]) => `${k}${sp.repeat(Math.ceil(n / Buffer.byteLength(sp)))}: x`),
      fc.integer({ min: 0, max: 3000 }).map((n) => `https://${"u".repeat(n)}:p@host`),
    );
    // a key before a block edge and its ':' past the edge's right margin, the run between them
    // longer than both margins (the window that tests the ':' cannot see the key)
    const across = fc.tuple(fc.constantFrom(MiB, 2 * MiB), fc.integer({ min: 0, max: 800 }), fc.integer({ min: 0, max: 800 }), fc.constantFrom(" ", "\n", "\t"))
      .map(([e, d1, d2, sp]): [number, string] => [e - 4700 + d1, `token${sp.repeat(8800 + d2)}: x`]);
    await fc.assert(fc.asyncProperty(fc.integer({ min: MiB + 1, max: 3 * MiB }), fc.array(fc.oneof(fc.tuple(at, insert), across), { maxLength: 3 }), fc.nat(), async (size, inserts, seed) => {
      let t = filler(size, seed);
      for (const [pos, ins] of inserts.sort((x, y) => y[0] - x[0])) {
        const p = Math.min(pos, t.length);
        t = t.slice(0, p) + ins + t.slice(p);
      }
      const b = Buffer.from(t, "utf8");
      const [e, hit, n, digest] = await scanFile(b);
      expect(e).toBe(0);
      const whole = addon!.scan(b, 0, b.length);
      if (whole >= 0) expect(hit, `whole-file hit at ${whole}`).toBeGreaterThanOrEqual(0); // never a "no" where the whole file says maybe
      if (hit === -1) {
        expect(n).toBe(b.length);
        expect(digest).toBe(createHash("sha256").update(b).digest("hex"));
      }
    }), { numRuns: 200 });
    // and it is not a constant: clean files of every size around the edges say no
    for (const size of [0, 1, MiB - 1, MiB, MiB + 1, MiB + 4096, 2 * MiB + 5000]) {
      const b = Buffer.from(filler(size, size), "utf8");
      const [e, hit, n, digest] = await scanFile(b);
      expect([e, hit, n]).toEqual([0, -1, size]);
      expect(digest).toBe(createHash("sha256").update(b).digest("hex"));
    }
    // a key whose whitespace run fills the margin before a block: "maybe", without looking further
    const run = Buffer.from(filler(MiB - 4600, 1) + "password" + " ".repeat(9092) + ": x\n" + filler(MiB, 2), "utf8");
    expect(addon!.scan(run, 0, run.length)).toBeGreaterThanOrEqual(0);
    expect((await scanFile(run))[1]).toBeGreaterThanOrEqual(0);
  }, 120_000);

  it.runIf(addon)("a big text file scanned where it lies comes out as the stream redactor makes it, report included", async () => {
    const dir = tempDir();
    await fc.assert(fc.asyncProperty(fc.array(fc.tuple(fc.integer({ min: 0, max: 2 * MiB }), fc.oneof(piece, fixture, text)), { maxLength: 2 }), fc.nat(), fc.boolean(), async (inserts, seed, jsonl) => {
      let t = filler(MiB + 300_000, seed);
      for (const [pos, ins] of inserts.sort((x, y) => y[0] - x[0])) {
        const p = Math.min(pos, t.length);
        t = t.slice(0, p) + ins + t.slice(p);
      }
      const name = jsonl ? "t.jsonl" : "t.md";
      const abs = join(dir, name);
      writeFileSync(abs, t);
      const one = async (native: boolean): Promise<[string, unknown]> => {
        const r = await redactor({}, tempDir());
        const a = { ...fileArtifact({ abs, rel: name, stats: statSync(abs) }, jsonl ? "jsonl" : "file"), text: true };
        if (!native) delete a.file; // through open(): the stream redactor
        const out = await r.redactArtifact(a, `l/${name}`);
        const bytes = (await readArtifact(out)).toString("latin1");
        const rep = r.report();
        await r.cleanup();
        return [bytes, rep];
      };
      expect(await one(true)).toEqual(await one(false));
    }), { numRuns: 25 });
  }, 120_000);

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
