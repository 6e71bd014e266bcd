/**
 * A big text read from a file (rereadable) and left unchanged by redaction is packed from the
 * file itself, not spooled; one with a finding anywhere — at its start, past the first MiB, at
 * its very end — comes out exactly as the in-memory redaction of the same text, its unchanged
 * head read again from the file; a file that changes in between is reported by check().
 */
import { readdirSync, statSync, utimesSync, writeFileSync, appendFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import type { Artifact } from "../../src/sources/types.js";
import { fileArtifact } from "../../src/sources/walk.js";
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
});
