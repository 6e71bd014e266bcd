/**
 * The `files` source's append-only logs (`append` globs): each captured up to its last complete
 * line as the walk saw it, growth during the capture allowed, and anything else (shrinking,
 * replacing, rewriting) still MEMSNAP_SOURCE_CHANGED. On real files through the source, then
 * end to end with a real writer process appending (in two writes per line, so lines are often
 * half written) while snapshots with redaction run.
 */
import { spawn } from "node:child_process";
import { appendFileSync, mkdirSync, readFileSync, renameSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { isMemsnapError, parseConfig, restoreToDir, snapshot } from "../../src/index.js";
import { filesSource, type FilesConfig } from "../../src/sources/files.js";
import type { Artifact } from "../../src/sources/types.js";
import { tempDir } from "../helpers/cli.js";

const TOKEN = "ghp_" + "Zq7Rk2Lm9Xv4Tb8Nc3Wd6Hy1Pf5Gs0Ja2Ke4"; // GitHub token shape, not a real one

async function bytesOf(chunks: AsyncIterable<Buffer>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of chunks) parts.push(Buffer.from(c)); // reused chunks must be copied
  return Buffer.concat(parts);
}

/** Capture `root`: walked, then `between()` (a change after the walk), then the artifacts listed (small files are read ahead then). */
async function capture(root: string, extra: Partial<FilesConfig> = {}, between?: () => void) {
  const cfg: FilesConfig = { kind: "files", name: "logs", path: root, append: ["**/*.jsonl", "**/*.log"], ...extra };
  const cap = await filesSource.capture(cfg, { baseDir: root, tmpDir: tempDir("memsnap-append-tmp-") });
  between?.();
  const arts = new Map<string, Artifact>();
  for await (const a of cap.artifacts) arts.set(a.path, a);
  return { arts, meta: await cap.finish!() };
}

async function changedBy(a: Artifact, reuse: boolean): Promise<string | null> {
  try {
    await bytesOf(a.open(reuse ? { reuse: true } : undefined) as AsyncIterable<Buffer>);
    await a.check!();
    return null;
  } catch (e) {
    return isMemsnapError(e) ? e.code : String(e);
  }
}

/** A captured log ends on a whole line: a \n, or (JSONL's rule) a last line that parses without one. */
function endsWhole(text: string): boolean {
  if (text.endsWith("\n")) return true;
  const last = text.slice(text.lastIndexOf("\n") + 1);
  try {
    JSON.parse(last);
    return true;
  } catch {
    return false;
  }
}

const line = (i: number, pad = 40): string => `${JSON.stringify({ i, text: "x".repeat(pad) })}\n`;

describe("files: what an append-only file's capture takes", () => {
  it("up to the last complete line; a JSONL last line without \\n counts when it parses", async () => {
    const root = tempDir("memsnap-append-");
    const whole = `${line(1)}${line(2)}`;
    writeFileSync(join(root, "partial.jsonl"), `${whole}{"i":3,"te`);
    writeFileSync(join(root, "unterminated.jsonl"), `${whole}{"i":3}`);
    writeFileSync(join(root, "unterminated.log"), "started\nstopped"); // not JSON: cannot tell it is whole
    writeFileSync(join(root, "oneline.log"), "no newline yet");
    writeFileSync(join(root, "empty.jsonl"), "");
    writeFileSync(join(root, "notes.md"), "not append-only, no newline");
    const { arts, meta } = await capture(root);
    const got: Record<string, string> = {};
    for (const [p, a] of arts) {
      const b = await bytesOf(a.open() as AsyncIterable<Buffer>);
      expect(b.length, p).toBe(a.size);
      got[p] = b.toString();
    }
    expect(got).toEqual({
      "empty.jsonl": "",
      "notes.md": "not append-only, no newline",
      "oneline.log": "",
      "partial.jsonl": whole,
      "unterminated.jsonl": `${whole}{"i":3}`,
      "unterminated.log": "started\n",
    });
    expect(meta).toMatchObject({
      append_only: 5,
      partial_tail_bytes: { "partial.jsonl": '{"i":3,"te'.length, "unterminated.log": "stopped".length, "oneline.log": "no newline yet".length },
    });
  });

  it("a last line longer than the 64 KiB blocks read backwards is found", async () => {
    const root = tempDir("memsnap-append-");
    const head = line(1);
    writeFileSync(join(root, "long.jsonl"), `${head}{"blob":"${"y".repeat(200_000)}`);
    const { arts, meta } = await capture(root);
    expect(arts.get("long.jsonl")!.size).toBe(head.length);
    expect(meta).toMatchObject({ partial_tail_bytes: { "long.jsonl": 200_000 + '{"blob":"'.length } });
  });
});

describe("files: an append-only file may grow during the capture, and nothing else", () => {
  // Small (one synchronous read), big (stream / reused 1 MiB buffers).
  for (const [label, lines] of [["small", 20], ["big", 40_000]] as const) {
    it(`${label}: growth after the walk is not captured, and is no error; the same growth fails a plain file`, async () => {
      const root = tempDir("memsnap-append-");
      let text = "";
      for (let i = 0; i < lines; i++) text += line(i);
      writeFileSync(join(root, "a.jsonl"), text);
      writeFileSync(join(root, "plain.json"), text);
      const { arts } = await capture(root, {}, () => {
        appendFileSync(join(root, "a.jsonl"), `${line(-1)}{"half":`);
        appendFileSync(join(root, "plain.json"), line(-1));
      });
      for (const reuse of [false, true]) {
        const a = arts.get("a.jsonl")!;
        expect((await bytesOf(a.open(reuse ? { reuse: true } : undefined) as AsyncIterable<Buffer>)).toString()).toBe(text);
        await a.check!();
        expect(await changedBy(arts.get("plain.json")!, reuse)).toBe("MEMSNAP_SOURCE_CHANGED");
      }
    });
  }

  it("shrunk, replaced or rewritten without growing: MEMSNAP_SOURCE_CHANGED", async () => {
    const root = tempDir("memsnap-append-");
    const text = `${line(1)}${line(2)}`;
    const cases: Record<string, (f: string) => void> = {
      "shrunk.jsonl": (f) => writeFileSync(f, line(1)),
      "replaced.jsonl": (f) => {
        writeFileSync(`${f}.new`, `${text}${line(3)}`);
        renameSync(`${f}.new`, f); // a rotated log: a new file at the path
      },
      "rewritten.jsonl": (f) => {
        writeFileSync(f, text.replace('"i":1', '"i":7'));
        const t = statSync(f).mtimeMs / 1000 + 5;
        utimesSync(f, t, t);
      },
    };
    for (const name of Object.keys(cases)) writeFileSync(join(root, name), text);
    const { arts } = await capture(root);
    for (const [name, change] of Object.entries(cases)) {
      change(join(root, name));
      expect(await changedBy(arts.get(name)!, false), name).toBe("MEMSNAP_SOURCE_CHANGED");
    }
  });

  it("the config's append must be a list of globs", () => {
    expect(() => parseConfig({ agent: "a1", sources: [{ kind: "files", name: "l", path: ".", append: "*.jsonl" }] }, null, "/tmp"))
      .toThrow(/append/);
  });
});

describe("files: snapshots of logs a real process is appending to", () => {
  it("every snapshot succeeds, with whole lines only, redacted, restorable", async () => {
    const home = tempDir("memsnap-append-");
    mkdirSync(join(home, "logs"));
    const big = join(home, "logs", "big.jsonl"); // > 1 MiB: the redactor scans it where it lies
    const small = join(home, "logs", "small.jsonl"); // a secret: the stream redactor rewrites it
    let seed = "";
    for (let i = 0; i < 30_000; i++) seed += line(i, 60);
    writeFileSync(big, seed);
    writeFileSync(small, `${JSON.stringify({ token: TOKEN })}\n`);
    // Each line in two writes with a pause between, so a snapshot often sees half a line.
    const writer = spawn(process.execPath, ["-e", `
      const fs = require("node:fs");
      const fds = process.argv.slice(1).map((p) => fs.openSync(p, "a"));
      const pause = new Int32Array(new SharedArrayBuffer(4));
      for (let i = 0; ; i++) {
        for (const fd of fds) {
          const l = JSON.stringify({ i, text: "w".repeat(i % 300) }) + "\\n";
          const cut = 1 + (i % (l.length - 1));
          fs.writeSync(fd, l.slice(0, cut));
          Atomics.wait(pause, 0, 0, 1);
          fs.writeSync(fd, l.slice(cut));
        }
        if (i === 20) process.stdout.write("writing\\n");
      }`, big, small], { stdio: ["ignore", "pipe", "inherit"] });
    try {
      await new Promise<void>((res, rej) => {
        writer.stdout.once("data", () => res());
        writer.once("exit", (c) => rej(new Error(`writer exited ${c}`)));
      });
      const config = parseConfig({
        agent: "a1", redaction: { enabled: true },
        sources: [{ kind: "files", name: "logs", path: "logs", append: ["**/*.jsonl"] }],
      }, null, home);
      const bundles: string[] = [];
      const sizes: number[] = [];
      for (let n = 0; n < 5; n++) {
        sizes.push(statSync(big).size);
        const r = await snapshot({ config, out: join(home, `b${n}.memsnap`) });
        bundles.push(r.path);
        await new Promise((res) => setTimeout(res, 20));
      }
      writer.kill("SIGKILL");
      await new Promise((res) => writer.once("exit", res));
      expect(statSync(big).size).toBeGreaterThan(sizes[0]!); // it did write all along
      const liveBig = readFileSync(big);
      const liveSmall = readFileSync(small, "utf8").split("\n");
      let last = 0;
      for (const [n, b] of bundles.entries()) {
        const to = join(home, `restored${n}`);
        await restoreToDir(b, to);
        const gotBig = readFileSync(join(to, "logs", "big.jsonl"));
        expect(gotBig.length).toBeGreaterThanOrEqual(Math.max(last, seed.length));
        last = gotBig.length;
        expect(liveBig.subarray(0, gotBig.length).equals(gotBig), `bundle ${n}: a prefix of the log`).toBe(true);
        expect(endsWhole(gotBig.toString("utf8")), `bundle ${n}: big ends on a whole line`).toBe(true);
        const gotSmall = readFileSync(join(to, "logs", "small.jsonl"), "utf8");
        expect(endsWhole(gotSmall), `bundle ${n}: small ends on a whole line`).toBe(true);
        expect(gotSmall).not.toContain(TOKEN);
        // The writer's first half of a line can be all of it but its \n: such a last line parses, so it counts.
        const lines = gotSmall.endsWith("\n") ? gotSmall.split("\n").slice(0, -1) : gotSmall.split("\n");
        expect(lines[0]).toContain("[REDACTED:");
        for (const [i, l] of lines.entries()) {
          expect(() => JSON.parse(l), `bundle ${n} line ${i + 1}`).not.toThrow();
          if (i > 0) expect(l).toBe(liveSmall[i]);
        }
      }
    } finally {
      writer.kill("SIGKILL");
    }
  }, 60_000);
});
