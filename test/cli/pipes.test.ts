/**
 * A reader that closes its end of memsnap's stdout or stderr early (`memsnap list | head -1`,
 * `… | true`). Before the CLI guarded its streams, node's EPIPE 'error' event went unhandled:
 * exit 1 with a stack trace, thrown wherever the process was, before a command's cleanup ran.
 * Each case runs the real binary under bash with `pipefail`, so memsnap's own exit code is
 * what the pipeline reports, and the reader is `true`, which exits before memsnap writes.
 */
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { BIN, expectNothingLeft, listBundles, makeAgent, tempDir } from "../helpers/cli.js";

const q = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;

/** `bash -o pipefail -c "<memsnap args> | true"` (stderr to the pipe too with `both`). */
function piped(args: string[], opts: { cwd?: string; both?: boolean } = {}): { status: number | null; stderr: string } {
  const cmd = `${[q(BIN), ...args.map(q)].join(" ")} ${opts.both ? "2>&1 " : ""}| true`;
  const r = spawnSync("bash", ["-o", "pipefail", "-c", cmd], { cwd: opts.cwd, encoding: "utf8" });
  return { status: r.status, stderr: r.stderr };
}

describe("stdout or stderr closed by the reader", () => {
  it("--help into a reader that is gone: exit 0, no EPIPE trace", () => {
    const r = piped(["--help"]);
    expect(r.stderr).not.toMatch(/EPIPE|Unhandled 'error'/);
    expect(r.status).toBe(0);
  });

  it("a snapshot whose stdout and stderr are closed still writes its bundle and leaves nothing else", () => {
    const agent = makeAgent();
    const out = tempDir("memsnap-pipes-");
    const bundle = join(out, "a.memsnap");
    const r = piped(["snapshot", "-c", agent.config, "-o", bundle], { both: true });
    expect(r.status).toBe(0);
    expect(listBundles(out)).toEqual(["a.memsnap"]);
    expectNothingLeft(out, { allowBundles: ["a.memsnap"] });
    // the bundle is whole: it verifies
    const v = spawnSync(BIN, ["verify", bundle], { encoding: "utf8" });
    expect(v.stderr).toBe("");
    expect(v.status).toBe(0);
  });

  it("an error's exit code is kept when nobody reads the message", () => {
    const args = ["inspect", join(tempDir(), "missing.memsnap")];
    const direct = spawnSync(BIN, args, { encoding: "utf8" });
    expect(direct.stderr).toContain("memsnap: error:");
    expect(direct.status).not.toBe(0);
    expect(direct.status).not.toBe(1); // 1 is what the unhandled EPIPE gave ("internal")
    expect(piped(args, { both: true }).status).toBe(direct.status);
  });
});
