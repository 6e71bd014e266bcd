/**
 * A plaintext bundle's manifest lists the index only up to MANIFEST_INDEX_MAX artifacts; past
 * it the manifest leaves it out and says so with manifest_version 3 (an older reader took a
 * missing index for a damaged manifest, so it must refuse the version instead). Written through
 * the library with the limit lowered; then read back by verify, inspect and restore, by the
 * real `tar` (the manifest stays small), and at the real limit through the CLI.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseConfig, restoreToDir, snapshot, verifyBundle } from "../../src/index.js";
import { MANIFEST_INDEX_MAX } from "../../src/snapshot/snapshot.js";
import { expectOk, jsonOut, runCliSync, tempDir } from "../helpers/cli.js";

function agent(files: number): string {
  const dir = tempDir("memsnap-mindex-");
  mkdirSync(join(dir, "notes"));
  for (let i = 0; i < files; i++) writeFileSync(join(dir, "notes", `n${String(i).padStart(5, "0")}.md`), `note ${i}\n`);
  return dir;
}

describe("the manifest's index of a plaintext bundle", () => {
  it("listed up to the limit (version 1), left out past it (version 3); the index is read from the payload either way", async () => {
    const dir = agent(6);
    const config = parseConfig({ agent: "a1", sources: [{ kind: "files", name: "notes", path: "notes" }] }, null, dir);
    const at = await snapshot({ config, out: join(dir, "at.memsnap"), manifestIndexMax: 6 });
    expect(at.manifest.manifest_version).toBe(1);
    expect(at.manifest.index).toHaveLength(6);
    const past = await snapshot({ config, out: join(dir, "past.memsnap"), manifestIndexMax: 5 });
    expect(past.manifest.manifest_version).toBe(3);
    expect(past.manifest.index).toBeUndefined();
    const manifestText = execFileSync("tar", ["-xOf", join(dir, "past.memsnap"), "manifest.json"], { encoding: "utf8" });
    expect(JSON.parse(manifestText).index).toBeUndefined();

    const v = await verifyBundle(join(dir, "past.memsnap"), { deep: true });
    expect(v.findings).toEqual([]);
    expect(v.checks.find((c) => c.name === "artifacts")?.status).toBe("passed");
    const to = join(dir, "restored");
    await restoreToDir(join(dir, "past.memsnap"), to);
    expect(readFileSync(join(to, "notes", "n00005.md"), "utf8")).toBe("note 5\n");
    const ins = runCliSync(["inspect", join(dir, "past.memsnap")]);
    expectOk(ins);
    expect(ins.stdout).toContain(`index      in the payload only (6 artifacts; the manifest lists at most ${MANIFEST_INDEX_MAX})`);
    const diff = runCliSync(["diff", join(dir, "at.memsnap"), join(dir, "past.memsnap"), "--json"]);
    expectOk(diff); // the file lists come from the payload, no key asked for
    // A dry run lists the files a restore would change, from the payload's index.
    writeFileSync(join(dir, "memsnap.json"), JSON.stringify({ agent: "a1", sources: [{ kind: "files", name: "notes", path: "notes" }] }));
    writeFileSync(join(dir, "notes", "n00001.md"), "edited\n");
    const dry = runCliSync(["restore", join(dir, "past.memsnap"), "-c", join(dir, "memsnap.json"), "--dry-run", "--json"]);
    expectOk(dry);
    expect(JSON.stringify(jsonOut(dry))).toContain("n00001.md");
  });

  it("an encrypted bundle never needs version 3 (its manifest never lists the index)", async () => {
    const dir = agent(3);
    const key = join(dir, "key.txt");
    const k = runCliSync(["keygen", "-o", key]);
    expectOk(k);
    const config = parseConfig({ agent: "a1", sources: [{ kind: "files", name: "notes", path: "notes" }] }, null, dir);
    const r = await snapshot({ config, out: join(dir, "e.memsnap"), recipients: [k.stdout.trim()], manifestIndexMax: 0 });
    expect(r.manifest.manifest_version).toBe(1);
    expect(r.manifest.index).toBeUndefined();
  });

  it(`at the real limit, through the CLI: ${MANIFEST_INDEX_MAX} notes are listed, one more is not`, () => {
    const dir = agent(MANIFEST_INDEX_MAX + 1);
    writeFileSync(join(dir, "memsnap.json"), JSON.stringify({ agent: "a1", sources: [{ kind: "files", name: "notes", path: "notes" }] }));
    const s = runCliSync(["snapshot", "-c", join(dir, "memsnap.json"), "--out", join(dir, "b.memsnap"), "--no-redact", "--json"]);
    expectOk(s);
    const m = JSON.parse(execFileSync("tar", ["-xOf", join(dir, "b.memsnap"), "manifest.json"], { encoding: "utf8", maxBuffer: 1 << 26 }));
    expect(m.manifest_version).toBe(3);
    expect(m.index).toBeUndefined();
    expect(m.payload.artifacts).toBe(MANIFEST_INDEX_MAX + 1);
    expect(execFileSync("tar", ["-xOf", join(dir, "b.memsnap"), "manifest.json"]).length).toBeLessThan(4096);
    const v = runCliSync(["verify", join(dir, "b.memsnap"), "--json"]);
    expectOk(v);
    expect((jsonOut(v) as { ok: boolean }).ok).toBe(true);
  });
});
