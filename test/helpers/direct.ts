import { closeSync, constants, existsSync, openSync, unlinkSync } from "node:fs";
import { join } from "node:path";

/** True when files in `dir` can be opened with O_DIRECT (Linux, and a file system that takes it). */
export function directOk(dir: string): boolean {
  if (constants.O_DIRECT === undefined) return false;
  const p = join(dir, `.probe-${process.pid}`);
  try {
    closeSync(openSync(p, constants.O_WRONLY | constants.O_CREAT | constants.O_DIRECT, 0o600));
    return true;
  } catch {
    return false;
  } finally {
    if (existsSync(p)) unlinkSync(p);
  }
}
