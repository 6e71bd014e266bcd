/**
 * A big text read from a file (rereadable) and left unchanged by redaction is packed from the
 * file itself, not spooled; one with a finding anywhere — at its start, past the first MiB, at
 * its very end — comes out exactly as the in-memory redaction of the same text, its unchanged
 * head read again from the file; a file that changes in between is reported by check(), and
 * one rewritten with the same size and timestamps (which check() cannot see) by the hash of
 * the bytes scanned, before a byte of it reaches a bundle.
 */
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { readdirSync, readFileSync, statSync, utimesSync, writeFileSync, appendFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseConfig, snapshot } from "../../src/index.js";
import type { Artifact } from "../../src/sources/types.js";
import { fileArtifact } from "../../src/sources/walk.js";
import { nativePrefilter } from "../../src/redact/native.js";
import { readArtifact, redactor, removeTempDirs, tempDir } from "./helpers/redactor.js";

afterAll(() => removeTempDirs());

const TOKEN = "ghp_" + "Zq7Rk2Lm9Xv4Tb8Nc3Wd6Hy1Pf5Gs0Ja2Ke4"; // GitHub token shape, not a real one

/** ~3 MiB of JSONL agent records with no secret in them. */
function cleanJsonl(lines = 24_000): string {
  const out: string[] = [];
  for (let i = 0; i < lines; i++) out.push(JSON.stringify({ id: i, kind: "step", note: `the agent read file ${i % 97} and wrote a summary: café ✓`, n: i * 7 }));
  return out.join("\n") + "\n";
}

function fileAt(dir: string, name: string, text: string): Artifact {
  const abs = join(dir, name);
  writeFileSync(abs, text);
  return { ...fileArtifact({ abs, rel: name, stats: statSync(abs) }, "jsonl"), text: true };
}

/** Spool files the redactor has under `tmp` right now. */
function spools(tmp: string): string[] {
  const out: string[] = [];
  for (const d of readdirSync(tmp)) if (d.startsWith("redact-")) for (const f of readdirSync(join(tmp, d))) out.push(f);
  return out;
}

describe("redaction of big rereadable texts", () => {
  it("an unchanged text: the artifact returned is the source's own, and no spool is written", async () => {
    const tmp = tempDir();
    const dir = tempDir();
    const r = await redactor({}, tmp);
    const text = cleanJsonl();
    expect(Buffer.byteLength(text)).toBeGreaterThan(2 * 1024 * 1024);
    const a = fileAt(dir, "clean.jsonl", text);
    const out = await r.redactArtifact(a, "traces/clean.jsonl");
    expect(out).toBe(a);
    expect(out.expectSha256).toBe(createHash("sha256").update(text).digest("hex")); // what the pipeline must pack
    expect(existsSync(tmp) ? spools(tmp) : []).toEqual([]);
    expect((await readArtifact(out)).toString("utf8")).toBe(text);
    await out.check!();
    expect(r.report().total_redacted).toBe(0);
  });

  for (const [where, at] of [["first line", 0], ["past the first MiB", 12_000], ["last line", -1]] as const) {
    it(`a token on the ${where}: the same bytes as redacting the whole text in memory`, async () => {
      const tmp = tempDir();
      const dir = tempDir();
      const r = await redactor({}, tmp);
      const lines = cleanJsonl().split("\n");
      const i = at < 0 ? lines.length - 2 : at;
      lines[i] = JSON.stringify({ id: i, kind: "tool", note: `pushed with ${TOKEN} as the token` });
      const text = lines.join("\n");
      const a = fileAt(dir, "dirty.jsonl", text);
      const out = await r.redactArtifact(a, "traces/dirty.jsonl");
      expect(out).not.toBe(a);
      const got = (await readArtifact(out)).toString("utf8");
      const want = await (await redactor({}, tempDir())).redactDocument(text, "x", true);
      expect(got).not.toContain(TOKEN);
      expect(got.length).toBe(want.length);
      expect(got === want).toBe(true);
      expect(out.size).toBe(Buffer.byteLength(want));
      expect(r.report().total_redacted).toBe(1);
    });
  }

  it("a file that changes between the scan and the pack: check() reports it", async () => {
    const tmp = tempDir();
    const dir = tempDir();
    const r = await redactor({}, tmp);
    const a = fileAt(dir, "live.jsonl", cleanJsonl());
    const out = await r.redactArtifact(a, "traces/live.jsonl");
    expect(out).toBe(a);
    appendFileSync(join(dir, "live.jsonl"), JSON.stringify({ id: -1, note: TOKEN }) + "\n");
    await expect(out.check!()).rejects.toMatchObject({ code: "MEMSNAP_SOURCE_CHANGED" });
    // the same size, a new mtime: also reported
    const b = fileAt(dir, "same-size.jsonl", cleanJsonl());
    const outB = await r.redactArtifact(b, "traces/same-size.jsonl");
    utimesSync(join(dir, "same-size.jsonl"), new Date(), new Date(Date.now() + 5000));
    await expect(outB.check!()).rejects.toMatchObject({ code: "MEMSNAP_SOURCE_CHANGED" });
  });

  /** Rewrite `abs` with `text` (the same size), then give it back its exact timestamps (ns), as `touch -r` copies them. */
  function rewriteKeepingStat(abs: string, text: string): void {
    const stamp = `${abs}.stamp`;
    writeFileSync(stamp, "");
    execFileSync("touch", ["-r", abs, stamp]);
    const before = statSync(abs, { bigint: true });
    expect(Buffer.byteLength(text)).toBe(Number(before.size));
    writeFileSync(abs, text);
    execFileSync("touch", ["-r", stamp, abs]);
    const after = statSync(abs, { bigint: true });
    expect([after.size, after.mtimeNs]).toEqual([before.size, before.mtimeNs]);
  }

  // The scan reads the file through open() (the stream redactor), or where it lies (the native
  // scan on the thread pool, for an artifact that names its file); the pack reads it through
  // open() either way, and the rewrite comes right before that.
  for (const [how, native] of [["through open()", false], ["where it lies (native scan)", true]] as const) {
    it(`a same-size rewrite that keeps the mtime, after the scan ${how}: check() passes, the snapshot still refuses it`, async () => {
      const dir = tempDir();
      const clean = cleanJsonl();
      const lines = clean.split("\n");
      // Line 5 with a token in it, the same number of bytes: swapped in after the redactor read the file.
      lines[5] = withToken(lines[5]!);
      const swapped = lines.join("\n");
      const abs = join(dir, "notes.jsonl");
      writeFileSync(abs, clean);
      const base = { ...fileArtifact({ abs, rel: "notes.jsonl", stats: statSync(abs) }, "jsonl"), text: true };
      if (native) expect(nativePrefilter()?.scanFile).toBeTypeOf("function");
      const scanOpens = native ? 0 : 1;
      let opens = 0;
      const artifact: Artifact = {
        ...base,
        open: (o) => {
          // Opens up to scanOpens are the redactor's scan; the next is the pipeline's pack.
          if (++opens === scanOpens + 1) rewriteKeepingStat(abs, swapped);
          return base.open(o);
        },
      };
      if (!native) delete artifact.file;
      // Against the file alone, the rewrite is invisible: the size and mtime are those captured.
      const probe = fileArtifact({ abs, rel: "notes.jsonl", stats: statSync(abs) }, "jsonl");

      mkdirIn(dir, "a");
      const config = parseConfig({ agent: "lazy", sources: [{ kind: "files", name: "a", path: "a" }] }, null, dir);
      config.sources = config.sources.map((s) => ({ cfg: s.cfg, impl: { ...s.impl, capture: async () => ({ artifacts: (async function* () { yield artifact; })() }) } }));
      mkdirIn(dir, "out");
      const out = join(dir, "out", "s.memsnap");
      await expect(snapshot({ config, out })).rejects.toMatchObject({ code: "MEMSNAP_SOURCE_CHANGED" });
      expect(opens).toBe(scanOpens + 1);
      expect(readFileSync(abs, "utf8")).toContain(TOKEN);
      await probe.check!(); // check() alone would have let the swapped bytes through
      expect(readdirSync(join(dir, "out"))).toEqual([]); // no bundle, no temp file
    });
  }

  it("a text whose head is rewritten (same size) before a later finding is kept: the reread head is refused", async () => {
    const lines = cleanJsonl().split("\n");
    lines[20_000] = JSON.stringify({ id: 20_000, kind: "tool", note: `pushed with ${TOKEN} as the token` });
    const first = Buffer.from(lines.join("\n"));
    lines[3] = withToken(lines[3]!);
    const second = Buffer.from(lines.join("\n"));
    expect(second.length).toBe(first.length);
    let opens = 0;
    const a: Artifact = {
      path: "t.jsonl", kind: "jsonl", size: first.length, mode: 0o644, mtime: new Date(), text: true, rereadable: true,
      open: () => {
        const bytes = ++opens === 1 ? first : second;
        return (async function* () { for (let o = 0; o < bytes.length; o += 1 << 20) yield bytes.subarray(o, o + (1 << 20)); })();
      },
    };
    const r = await redactor({}, tempDir());
    await expect(r.redactArtifact(a, "traces/t.jsonl")).rejects.toMatchObject({ code: "MEMSNAP_SOURCE_CHANGED" });
    expect(opens).toBe(2);
  });
});

/** `line` with the token over its first ASCII characters of note text: the same number of bytes. */
function withToken(line: string): string {
  const at = line.indexOf("the agent read file");
  const out = line.slice(0, at) + TOKEN + line.slice(at + TOKEN.length);
  expect(Buffer.byteLength(out)).toBe(Buffer.byteLength(line));
  return out;
}

function mkdirIn(dir: string, name: string): void {
  execFileSync("mkdir", ["-p", join(dir, name)]);
}
