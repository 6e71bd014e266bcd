/** The table of source kinds this build knows. Later kinds register here. */
import { filesSource } from "./files.js";
import { stateSource } from "./state.js";
import { pfimgSource } from "./pfimg/source.js";
import { kvSource } from "./kv/source.js";
import { sqliteSource } from "./sqlite/source.js";
import { gitSource } from "./git/source.js";
import type { SourceKind } from "./types.js";
import { criuSource } from "./criu/source.js";
import { traceSource } from "./trace.js";
import { execSource } from "./exec/source.js";

export const SOURCE_KINDS: Record<string, SourceKind<{ name: string }>> = {
  files: filesSource as unknown as SourceKind<{ name: string }>,
  state: stateSource as unknown as SourceKind<{ name: string }>,
  git: gitSource as unknown as SourceKind<{ name: string }>,
  sqlite: sqliteSource as unknown as SourceKind<{ name: string }>,
  pfimg: pfimgSource as unknown as SourceKind<{ name: string }>,
  kv: kvSource as unknown as SourceKind<{ name: string }>,
  criu: criuSource as unknown as SourceKind<{ name: string }>,
  trace: traceSource as unknown as SourceKind<{ name: string }>,
  exec: execSource as unknown as SourceKind<{ name: string }>,
};

/** The source kind named `kind`, or undefined. */
export function sourceKind(kind: string): SourceKind<{ name: string }> | undefined {
  return Object.hasOwn(SOURCE_KINDS, kind) ? SOURCE_KINDS[kind] : undefined;
}
