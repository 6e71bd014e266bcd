/** Process exit codes, one per failure class. Mirrored in README.md and docs/errors.md. */
import type { ErrorClass } from "../errors.js";

export const EXIT_CODES: Record<"ok" | ErrorClass, number> = {
  ok: 0,
  internal: 1,
  usage: 2,
  integrity: 3,
  key: 4,
  malformed: 5,
  source: 6,
  locked: 7,
  destination: 8,
  unsafe: 9,
  interrupted: 130,
};

/** One line per exit code, for docs and `memsnap --help`. */
export const EXIT_CODE_MEANINGS: Record<number, string> = {
  0: "success",
  1: "internal error (a bug: please report it)",
  2: "usage or configuration error",
  3: "integrity failure: verify found damage or tampering",
  4: "key failure: no identity given, or it does not open the bundle",
  5: "malformed or unsupported bundle (truncated, not a bundle, newer format)",
  6: "source unreadable, missing, invalid, or changed during capture",
  7: "locked by another memsnap process or by a process using live files, or the before_restore hook refused",
  8: "destination not writable, full, exists, or not empty",
  9:
    "unsafe bundle: an entry would escape its target, a layer asks for more than it declares, an untrusted plugin " +
    "or journal",
  130: "interrupted by SIGINT or SIGTERM; nothing half-done is left",
};
