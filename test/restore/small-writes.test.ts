/**
 * A restore's small files written in batches on the thread pool (native/directio writeFiles,
 * src/read/small-writes.ts): the same files as the synchronous path (`MEMSNAP_NATIVE=0`),
 * new files only (an existing one is a conflicting entry, never overwritten), errors reported,
 * and a restore of 1,000 notes byte for byte either way.
 */
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { isMemsnapError, parseConfig, restoreToDir, snapshot } from "../../src/index.js";
import { SmallFileWriter } from "../../src/read/small-writes.js";
import { nativeFs } from "../../src/util/native-fs.js";
import { tempDir } from "../helpers/cli.js";

const saved = process.env.MEMSNAP_NATIVE;
afterEach(() => {
  if (saved === undefined) delete process.env.MEMSNAP_NATIVE;
  else process.env.MEMSNAP_NATIVE = saved;
});

const describeNative = nativeFs() ? describe : describe.skip;

describeNative("SmallFileWriter", () => {
  it("writes 700 files over several batches, byte for byte, as new 0600 files", async () => {
    const dir = tempDir("memsnap-sw-");
    const w = SmallFileWriter.create()!;
    const want = new Map<string, Buffer>();
    for (let i = 0; i < 700; i++) {
      const body = Buffer.from(`file ${i} `.repeat(i % 300));
      const dest = join(dir, `f${i}`);
      want.set(dest, body);
      // split in two parts, as an entry that spans the decoder's chunks comes
      const wait = w.add(dest, `m/f${i}`, [body.subarray(0, body.length >> 1), body.subarray(body.length >> 1)], body.length);
      if (wait) await wait;
    }
    await w.flush();
    for (const [dest, body] of want) {
      expect(readFileSync(dest).equals(body), dest).toBe(true);
      expect(statSync(dest).mode & 0o777).toBe(0o600);
    }
  });

  it("never overwrites: an existing file is a conflicting entry (MEMSNAP_UNSAFE_PATH), and it keeps its bytes", async () => {
    const dir = tempDir("memsnap-sw-");
    writeFileSync(join(dir, "taken"), "mine");
    const w = SmallFileWriter.create()!;
    w.add(join(dir, "fine"), "m/fine", [Buffer.from("ok")], 2);
    w.add(join(dir, "taken"), "m/taken", [Buffer.from("theirs")], 6);
    const e = await w.flush().catch((x: unknown) => x);
    expect(isMemsnapError(e) && e.code).toBe("MEMSNAP_UNSAFE_PATH");
    expect(String((e as Error).message)).toContain("m/taken");
    expect(readFileSync(join(dir, "taken"), "utf8")).toBe("mine");
    expect(readFileSync(join(dir, "fine"), "utf8")).toBe("ok");
  });

  it("a file it cannot create is a destination error, not a crash", async () => {
    const dir = tempDir("memsnap-sw-");
    const w = SmallFileWriter.create()!;
    w.add(join(dir, "no-such-dir", "f"), "m/no-such-dir/f", [Buffer.from("x")], 1);
    const e = await w.flush().catch((x: unknown) => x);
    expect(isMemsnapError(e) && e.code).toMatch(/^MEMSNAP_DEST_/);
  });
});

describe("a restore of 1,000 notes", () => {
  it("gives the same files with the batched writes and without", async () => {
    const home = tempDir("memsnap-sw-");
    mkdirSync(join(home, "notes"));
    for (let i = 0; i < 1000; i++) {
      mkdirSync(join(home, "notes", `d${i % 7}`), { recursive: true });
      writeFileSync(join(home, "notes", `d${i % 7}`, `n${i}.md`), `note ${i}\n`.repeat(1 + (i % 40)));
    }
    const config = parseConfig({ agent: "a1", sources: [{ kind: "files", name: "notes", path: "notes" }] }, null, home);
    const r = await snapshot({ config, out: join(home, "b.memsnap") });
    for (const mode of ["native", "node"]) {
      if (mode === "node") process.env.MEMSNAP_NATIVE = "0";
      const to = join(home, `restored-${mode}`);
      await restoreToDir(r.path, to);
      for (let i = 0; i < 1000; i++) {
        const rel = join(`d${i % 7}`, `n${i}.md`);
        expect(readFileSync(join(to, "notes", rel), "utf8"), `${mode} ${rel}`).toBe(`note ${i}\n`.repeat(1 + (i % 40)));
      }
      expect(existsSync(join(to, "notes", "d0", "n0.md"))).toBe(true);
    }
  });
});
