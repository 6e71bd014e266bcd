/**
 * A restore gives files, state and trace files back their permission bits and mtimes (as
 * `tar -x` does; they came back 0600 and stamped with the restore's time): into a new
 * directory, in place, and through an incremental bundle's references. Set-uid, set-gid and
 * sticky bits never come back. Through the CLI, with real files.
 */
import { chmodSync, readFileSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { expectOk, jsonOut, makeAgent, runCliSync, tempDir } from "../helpers/cli.js";

const T = new Date("2024-05-06T07:08:09.123Z");
const T2 = new Date("2023-01-02T03:04:05.678Z");

function agentWithModes() {
  const a = makeAgent({ files: { "run.sh": "#!/bin/sh\necho hi\n", "notes/private.md": "mine\n", "shared.md": "ours\n", "odd.md": "setuid?\n" } });
  chmodSync(join(a.memoryDir, "run.sh"), 0o755);
  chmodSync(join(a.memoryDir, "notes/private.md"), 0o600);
  chmodSync(join(a.memoryDir, "shared.md"), 0o664);
  chmodSync(join(a.memoryDir, "odd.md"), 0o4755);
  for (const f of ["run.sh", "notes/private.md", "shared.md", "odd.md"]) utimesSync(join(a.memoryDir, f), T, T);
  utimesSync(join(a.stateDir, "cursor.json"), T2, T2);
  chmodSync(join(a.stateDir, "cursor.json"), 0o640);
  return a;
}

const modeOf = (p: string): number => statSync(p).mode & 0o7777;
/** A file's mtime as a Date shows it (whole milliseconds), what an index records. */
const msOf = (p: string): number => statSync(p).mtime.getTime();

describe("restored files keep their modes and mtimes", () => {
  it("into a new directory", () => {
    const a = agentWithModes();
    const s = runCliSync(["snapshot", "-c", a.config, "--out", join(a.dir, "b.memsnap"), "--json"]);
    expectOk(s);
    const to = join(tempDir("memsnap-attrs-"), "r");
    expectOk(runCliSync(["restore", join(a.dir, "b.memsnap"), "--to", to]));
    expect(modeOf(join(to, "memory", "run.sh"))).toBe(0o755);
    expect(modeOf(join(to, "memory", "notes/private.md"))).toBe(0o600);
    expect(modeOf(join(to, "memory", "shared.md"))).toBe(0o664);
    expect(modeOf(join(to, "memory", "odd.md"))).toBe(0o755); // no set-uid bit from a bundle
    expect(msOf(join(to, "memory", "run.sh"))).toBe(msOf(join(a.memoryDir, "run.sh")));
    expect(Math.abs(msOf(join(to, "memory", "run.sh")) - T.getTime())).toBeLessThanOrEqual(1);
    expect(modeOf(join(to, "state", "cursor.json"))).toBe(0o640);
    expect(msOf(join(to, "state", "cursor.json"))).toBe(msOf(join(a.stateDir, "cursor.json")));
    expect(Math.abs(msOf(join(to, "state", "cursor.json")) - T2.getTime())).toBeLessThanOrEqual(1);
  });

  it("in place, over files whose modes and times changed since", () => {
    const a = agentWithModes();
    const store = join(a.dir, "store");
    const s = runCliSync(["snapshot", "-c", a.config, "--store", store, "--json"]);
    expectOk(s);
    const shared = msOf(join(a.memoryDir, "shared.md"));
    chmodSync(join(a.memoryDir, "run.sh"), 0o644);
    writeFileSync(join(a.memoryDir, "shared.md"), "edited\n");
    chmodSync(join(a.memoryDir, "shared.md"), 0o600);
    expectOk(runCliSync(["restore", (jsonOut(s) as { path: string }).path, "-c", a.config, "--store", store, "--no-safety-snapshot"]));
    expect(modeOf(join(a.memoryDir, "run.sh"))).toBe(0o755);
    expect(modeOf(join(a.memoryDir, "shared.md"))).toBe(0o664);
    expect(readFileSync(join(a.memoryDir, "shared.md"), "utf8")).toBe("ours\n");
    expect(msOf(join(a.memoryDir, "shared.md"))).toBe(shared);
  });

  it("through an incremental bundle's references (the files read from its base)", () => {
    const a = agentWithModes();
    const store = join(a.dir, "store");
    expectOk(runCliSync(["snapshot", "-c", a.config, "--store", store, "--incremental"]));
    writeFileSync(join(a.memoryDir, "new.md"), "new\n");
    const s = runCliSync(["snapshot", "-c", a.config, "--store", store, "--incremental", "--json"]);
    expectOk(s);
    expect((jsonOut(s) as { incremental: { referenced: number } }).incremental.referenced).toBeGreaterThan(3);
    const to = join(tempDir("memsnap-attrs-"), "r");
    expectOk(runCliSync(["restore", (jsonOut(s) as { path: string }).path, "--to", to]));
    expect(modeOf(join(to, "memory", "run.sh"))).toBe(0o755);
    expect(msOf(join(to, "memory", "run.sh"))).toBe(msOf(join(a.memoryDir, "run.sh")));
    expect(modeOf(join(to, "state", "cursor.json"))).toBe(0o640);
  });
});
