/**
 * Entry-name safety for restore. A bundle is untrusted input: an entry name must be a
 * relative POSIX path of plain segments under a layer the manifest declares, so no entry
 * can write outside its target. Restore never creates symlinks, hard links or special
 * files, so an entry cannot redirect a later one.
 */
import { MemsnapError } from "../errors.js";

function unsafe(name: string, why: string): MemsnapError {
  return new MemsnapError("MEMSNAP_UNSAFE_PATH", `unsafe entry ${JSON.stringify(name)}: ${why}`, {
    path: name,
    hint: "this bundle was not written by memsnap or was tampered with; nothing outside staging was written",
  });
}

/** MEMSNAP_UNSAFE_PATH for an entry whose name was already written, or clashes with one. */
export function conflictingEntry(name: string): MemsnapError {
  return new MemsnapError("MEMSNAP_UNSAFE_PATH", `duplicate or conflicting entry ${name}`, {
    path: name,
    hint: "the bundle is malformed or hostile",
  });
}

/** Throw MEMSNAP_UNSAFE_PATH unless `name` is a safe payload path under one of `layers`. */
export function checkEntryName(name: string, layers: ReadonlySet<string>): void {
  if (name === "") throw unsafe(name, "empty name");
  if (name.includes("\0")) throw unsafe(name, "NUL byte in name");
  if (name.startsWith("/")) throw unsafe(name, "absolute path");
  const parts = name.split("/");
  for (const p of parts) {
    if (p === "..") throw unsafe(name, "'..' segment");
    if (p === "" || p === ".") throw unsafe(name, "empty or '.' segment");
  }
  if (parts.length < 2) throw unsafe(name, "not inside a layer");
  if (!layers.has(parts[0]!)) throw unsafe(name, `layer "${parts[0]}" is not in the manifest`);
}
