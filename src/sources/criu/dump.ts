/** Running `criu check` and `criu dump` for a criu source that names a pid. */
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { MemsnapError } from "../../errors.js";
import type { CriuConfig } from "./config.js";

const CRIU_TIMEOUT_MS = 10 * 60 * 1000;

function run(bin: string, args: string[], signal?: AbortSignal): Promise<{ ok: boolean; out: string; why: string }> {
  return new Promise((res) => {
    const opts = { timeout: CRIU_TIMEOUT_MS, maxBuffer: 4 << 20, ...(signal ? { signal } : {}) };
    execFile(bin, args, opts, (err, stdout, stderr) => {
      const text = `${stderr}\n${stdout}`.trim();
      if (!err) return res({ ok: true, out: text, why: "" });
      const e = err as NodeJS.ErrnoException & { code?: unknown };
      const why =
        e.code === "ENOENT"
          ? `${bin} not found`
          : e.code === "EACCES"
            ? `${bin} is not executable`
            : text.split("\n").filter(Boolean).slice(-3).join(" / ") || e.message;
      res({ ok: false, out: text, why });
    });
  });
}

/** `criu check`, then `criu dump --leave-running` of `pid` into `images`. */
export async function criuDump(
  cfg: CriuConfig,
  baseDir: string,
  images: string,
  work: string,
  signal?: AbortSignal,
): Promise<string> {
  const bin = cfg.criu_bin ? (cfg.criu_bin.includes("/") ? resolve(baseDir, cfg.criu_bin) : cfg.criu_bin) : "criu";
  const chk = await run(bin, ["check"], signal);
  if (!chk.ok) {
    const why = `criu dump needs a working criu (criu check failed: ${chk.why})`;
    throw new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", why, {
      hint:
        "install CRIU ≥ 4.1 (3.17 fails on kernel ≥ 6.13) and run with the rights criu needs " +
        '(root or CAP_CHECKPOINT_RESTORE), or capture an existing images directory with "path" and no "pid"',
    });
  }
  const args = ["dump", "-t", String(cfg.pid), "-D", images, "-W", work, "-o", "dump.log", "--leave-running"];
  const dumped = await run(bin, args, signal);
  if (!dumped.ok) {
    const log = await readFile(join(work, "dump.log"), "utf8").catch(() => "");
    const tail = log.trim().split("\n").slice(-3).join(" / ");
    throw new MemsnapError("MEMSNAP_SOURCE_UNREADABLE", `criu dump of pid ${cfg.pid} failed: ${tail || dumped.why}`, {
      path: images,
      hint:
        `see ${join(work, "dump.log")} while the snapshot runs, ` +
        'or run criu dump by hand and capture the directory with "path"',
    });
  }
  return bin;
}
