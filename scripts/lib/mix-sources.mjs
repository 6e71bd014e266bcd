/**
 * mix-sources.mjs — the memsnap config `sources` for a mix written by scripts/gen-mix.mjs:
 * every class captured by the typed source made for it, as a live agent would configure them.
 *
 *   import { mixSources, MIX_LAYERS } from "./lib/mix-sources.mjs";
 *   const config = { agent: "bench", sources: mixSources("/path/to/mix"), recipients: [...] };
 *
 * Paths are absolute (resolved from dataDir), so the config works wherever it is written.
 * The traces are plain JSONL conversation logs, not agentlog records (the `trace` source checks
 * agentlog record ids and parent links and takes `*.agentlog` by default), so they are a `files`
 * layer.
 */
import path from "node:path";

/**
 * The layers of the mix: name, source kind, the directory under the mix root it captures, where
 * `memsnap restore --to OUT` puts it (relative to OUT), and how bench.mjs compares the two:
 * `bytes` (the same files with the same bytes), `git` (same HEAD, same work tree including
 * uncommitted and untracked files, same status) or `sqlite` (integrity_check, row counts, .dump).
 */
export const MIX_LAYERS = Object.freeze([
  { name: "memory", kind: "git", dir: "memory", restored: "memory", check: "git" },
  { name: "db", kind: "sqlite", dir: "db", restored: "db", check: "sqlite" },
  { name: "state", kind: "state", dir: "state", restored: "state", check: "bytes" },
  { name: "traces", kind: "files", dir: "traces", restored: "traces", check: "bytes" },
  { name: "kv", kind: "kv", dir: "kv", restored: "kv", check: "bytes" },
  { name: "pfimg", kind: "pfimg", dir: "runtime/pfimg", restored: "pfimg", check: "bytes" },
  // a criu layer keeps the dump under images/ (and a parent dump under parent/)
  { name: "criu", kind: "criu", dir: "runtime/criu", restored: "criu/images", check: "bytes" },
]);

/** The memsnap config `sources` array for the mix at `dataDir`. */
export function mixSources(dataDir) {
  const root = path.resolve(dataDir);
  const at = (rel) => path.join(root, rel);
  // Keep in step with MIX_LAYERS (names, kinds, directories).
  return [
    { kind: "git", name: "memory", path: at("memory") },
    { kind: "sqlite", name: "db", path: at("db") },
    { kind: "state", name: "state", path: at("state") },
    { kind: "files", name: "traces", path: at("traces"), include: ["*.jsonl"] },
    { kind: "kv", name: "kv", path: at("kv"), format: "memsnap" },
    { kind: "pfimg", name: "pfimg", store: at("runtime/pfimg") },
    { kind: "criu", name: "criu", path: at("runtime/criu") },
  ];
}
