/**
 * The `files` source: files and directories, with include/exclude globs.
 *
 * A file that changes while it is captured fails the snapshot (MEMSNAP_SOURCE_CHANGED), except
 * the append-only logs the `append` globs select: each is captured up to the end of its last
 * complete line at the size the walk saw (a JSONL file's last line without `\n` counts when it
 * parses as JSON), and may grow meanwhile; one that shrinks, is replaced or is rewritten
 * without growing still fails. The bytes left out (a line being written) are counted in the
 * layer meta's `partial_tail_bytes`.
 */
import { resolve } from "node:path";
import { optStringArray, rejectUnknownKeys, reqString } from "../util/config-check.js";
import type { SourceKind } from "./types.js";
import { compileGlobs } from "../util/glob.js";
import { completeLinesPrefix, fileArtifact, fingerprintOf, sourceError, walkFiles, walkNotices } from "./walk.js";
import { pathTarget } from "./live-target.js";

/** Files whose content the pipeline redacts (memory notes, JSON, JSONL, config-like text). */
const TEXT_EXT = /\.(md|markdown|txt|text|json|jsonl|ndjson|ya?ml|toml|ini|cfg|conf|env|csv|tsv|log|html?|xml|rst|org)$/i;

export interface FilesConfig {
  kind: "files";
  name: string;
  path: string;
  include?: string[];
  exclude?: string[];
  /** Globs (like `include`) of append-only logs, captured up to their last complete line; see the module comment. */
  append?: string[];
}

/** The longest unterminated last line of a JSONL file that is parsed to tell whether it is complete. */
const MAX_JSON_TAIL = 8 * 1024 * 1024;

const JSONL = /\.(jsonl|ndjson)$/i;

function isCompleteJson(tail: Buffer): boolean {
  try {
    JSON.parse(tail.toString("utf8"));
    return true;
  } catch {
    return false;
  }
}

/** Files and directories, captured byte for byte. Symlinks and special files are skipped and counted in the layer meta. */
export const filesSource: SourceKind<FilesConfig> = {
  kind: "files",
  schemaVersion: 1,
  independentArtifacts: true,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "path", "include", "exclude", "append"], where);
    const append = optStringArray(raw, "append", where);
    return {
      kind: "files",
      name: reqString(raw, "name", where),
      path: reqString(raw, "path", where),
      include: optStringArray(raw, "include", where),
      exclude: optStringArray(raw, "exclude", where),
      ...(append ? { append } : {}),
    };
  },
  async liveTarget(cfg, baseDir, layer) {
    return pathTarget(resolve(baseDir, cfg.path), layer.meta?.root_is_file === true, { include: cfg.include, exclude: cfg.exclude });
  },
  async capture(cfg, ctx) {
    const root = resolve(ctx.baseDir, cfg.path);
    const walked = await walkFiles(root, { include: cfg.include, exclude: cfg.exclude });
    const { files, skipped } = walked;
    const appendOnly = cfg.append?.length ? compileGlobs(cfg.append) : null;
    // An append-only file's size is fixed here, before any byte is packed: a tar header comes first.
    const prefixes = new Map<string, number>();
    const partial: Record<string, number> = {};
    for (const f of files) {
      if (!appendOnly?.(f.rel)) continue;
      let p: { size: number; tail: number };
      try {
        p = await completeLinesPrefix(f.abs, f.stats.size, JSONL.test(f.rel) ? isCompleteJson : null, MAX_JSON_TAIL);
      } catch (e) {
        throw sourceError(e, f.abs);
      }
      prefixes.set(f.rel, p.size);
      if (p.tail > 0) partial[f.rel] = p.tail;
    }
    return {
      estimatedBytes: files.reduce((n, f) => n + (prefixes.get(f.rel) ?? f.stats.size), 0),
      notices: () => walkNotices(walked),
      artifacts: (async function* () {
        for (const f of files) {
          const kind = JSONL.test(f.rel) ? "jsonl" : /\.json$/i.test(f.rel) ? "json" : "file";
          const prefix = prefixes.get(f.rel);
          // An append-only file's fingerprint names the prefix too: the same stats give the same
          // bytes, and a file newly declared append-only is read again.
          const fingerprint = fingerprintOf(f.stats) + (prefix === undefined ? "" : `:append:${prefix}`);
          yield { ...fileArtifact(f, kind, f.rel, prefix), text: TEXT_EXT.test(f.rel), fingerprint };
        }
      })(),
      finish: async () => ({
        root,
        root_is_file: files.length === 1 && files[0]!.abs === root,
        skipped,
        ...(prefixes.size ? { append_only: prefixes.size } : {}),
        ...(Object.keys(partial).length ? { partial_tail_bytes: partial } : {}),
      }),
    };
  },
};
