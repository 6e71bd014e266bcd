/** Checks a restore makes on the manifest before it writes anything. */
import { MemsnapError, type Finding } from "../errors.js";
export { checkManifest } from "../verify.js";

/** Throw the first manifest finding as an error (restore refuses before touching anything). */
export function checkManifestFindings(findings: Finding[]): void {
  const f = findings[0];
  if (!f) return;
  throw new MemsnapError(f.code, f.message, {
    findings,
    hint: f.code === "MEMSNAP_UNSUPPORTED_LAYER" ? "upgrade memsnap to restore this bundle" : "the bundle is damaged or was altered; nothing was restored",
  });
}
