/**
 * TextScanner (src/sources/pfimg/text-scanner.ts), the scan-only redaction pass over text the KV and
 * ProcessFork sources store as is: it hands the redactor whole lines, about a megabyte at a
 * time, and text without newlines in pieces of at most 8 MiB; every character exactly once.
 */
import { describe, expect, it } from "vitest";
import { TextScanner } from "../../src/sources/pfimg/text-scanner.js";
import type { Redactor } from "../../src/redact/types.js";

function recorder(): { redactor: Redactor; pieces: string[] } {
  const pieces: string[] = [];
  const redactor = {
    candidate: () => true,
    scanText: async (text: string) => { pieces.push(text); },
  } as unknown as Redactor;
  return { redactor, pieces };
}

async function feed(text: string, chunk: number): Promise<string[]> {
  const { redactor, pieces } = recorder();
  const s = new TextScanner(redactor, "layer/file.json");
  const bytes = Buffer.from(text, "utf8");
  for (let i = 0; i < bytes.length; i += chunk) await s.push(bytes.subarray(i, i + chunk));
  await s.end();
  return pieces;
}

describe("TextScanner", () => {
  it("hands over whole lines, ~1 MiB at a time, each character once (multi-byte characters split across chunks)", async () => {
    const line = (i: number): string => `{"n":${i},"note":"café ☕ ${"x".repeat(i % 300)}"}\n`;
    let text = "";
    for (let i = 0; text.length < 5 * 1024 * 1024; i++) text += line(i);
    text += "a last line without a newline";
    const pieces = await feed(text, 65_537);
    expect(pieces.join("")).toBe(text);
    expect(pieces.length).toBeGreaterThan(3);
    for (const p of pieces.slice(0, -1)) {
      expect(p.endsWith("\n")).toBe(true);
      expect(p.length).toBeGreaterThanOrEqual(1 << 20);
      expect(p.length).toBeLessThan((1 << 20) + 70_000);
    }
  });

  it("text without newlines or commas goes in pieces of 8 MiB (and the rest at the end)", async () => {
    const text = "ab".repeat(9 * 1024 * 1024); // 18 MiB on one line
    const pieces = await feed(text, 1 << 20);
    expect(pieces.join("")).toBe(text);
    expect(pieces.map((p) => p.length)).toEqual([8 << 20, 8 << 20, 2 << 20]);
  });

  it("a one-line JSON document is cut after a comma, so a value that straddles 8 MiB is scanned whole", async () => {
    const secret = `"token":"ghp_${"Q".repeat(36)}"`;
    let text = "[";
    while (text.length < (8 << 20) - 20) text += '"filler",';
    text += `${secret},"tail"]`; // the secret starts a few bytes before the 8 MiB mark
    expect(text.indexOf(secret)).toBeLessThan(8 << 20);
    expect(text.indexOf(secret) + secret.length).toBeGreaterThan(8 << 20);
    text += ` ${"c".repeat(1 << 20)}`;
    const pieces = await feed(text, 1 << 20);
    expect(pieces.join("")).toBe(text);
    expect(pieces.some((p) => p.includes(secret))).toBe(true);
    expect(pieces[0]!.endsWith(",")).toBe(true);
  });

  it("a newline late in a long line cuts there", async () => {
    const text = `${"y".repeat(3 * 1024 * 1024)}\n${"z".repeat(100)}`;
    const pieces = await feed(text, 1 << 20);
    expect(pieces).toEqual([`${"y".repeat(3 * 1024 * 1024)}\n`, "z".repeat(100)]);
  });
});
