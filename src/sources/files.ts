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
import { CDC_MIN_FILE } from "../format/artifact.js";
import { compileGlobs } from "../util/glob.js";
import { readAhead } from "./prefetch.js";
import {
  completeLinesPrefix,
  fileArtifact,
  fingerprintOf,
  SMALL_FILE,
  sourceError,
  walkNotices,
  walkStream,
  type FoundFile,
} from "./walk.js";
import { pathTarget } from "./live-target.js";

/** Files whose content the pipeline redacts (memory notes, JSON, JSONL, config-like text). */
const TEXT_EXT =
  /\.(md|markdown|txt|text|json|jsonl|ndjson|ya?ml|toml|ini|cfg|conf|env|csv|tsv|log|html?|xml|rst|org)$/i;

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

/** The artifact kind of a file of a files layer. */
function kindOf(rel: string): string {
  return JSONL.test(rel) ? "jsonl" : /\.json$/i.test(rel) ? "json" : "file";
}

/** Files walked before the layer packs; see capture(). */
const EAGER_FILES = 10_000;

function isCompleteJson(tail: Buffer): boolean {
  try {
    JSON.parse(tail.toString("utf8"));
    return true;
  } catch {
    return false;
  }
}

/**
 * Files and directories, captured byte for byte. Symlinks and special files are skipped and counted in the layer meta.
 */
export const filesSource: SourceKind<FilesConfig> = {
  kind: "files",
  schemaVersion: 1,
  independentArtifacts: true,
  distinctPaths: true, // one walk, each path once
  restoresAttributes: true,
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
    return pathTarget(resolve(baseDir, cfg.path), layer.meta?.root_is_file === true, {
      include: cfg.include,
      exclude: cfg.exclude,
    });
  },
  async capture(cfg, ctx) {
    const root = resolve(ctx.baseDir, cfg.path);
    const walk = await walkStream(root, { include: cfg.include, exclude: cfg.exclude });
    const found = walk[Symbol.asyncIterator]();
    // The first EAGER_FILES files are walked now, so a layer of that many or fewer knows its
    // size up front (the progress meter's total and ETA); a bigger one is walked as it packs,
    // holding no list of its files (memory would grow with their number).
    const head: FoundFile[] = [];
    let walked = false;
    while (head.length < EAGER_FILES) {
      const r = await found.next();
      if (r.done) {
        walked = true;
        break;
      }
      head.push(r.value);
    }
    const appendOnly = cfg.append?.length ? compileGlobs(cfg.append) : null;
    let count = 0;
    let first: FoundFile | null = null;
    let appended = 0;
    const partial: Record<string, number> = {};
    return {
      ...(walked ? { estimatedBytes: head.reduce((n, f) => n + f.stats.size, 0) } : {}),
      notices: () => walkNotices(walk),
      artifacts: (async function* () {
        const all = (async function* (): AsyncGenerator<FoundFile> {
          yield* head.splice(0);
          if (!walked) yield* { [Symbol.asyncIterator]: () => found };
        })();
        // Small files are read ahead in batches off the main thread, except append-only logs
        // (their prefix is decided first) and those an incremental snapshot will reference.
        const ahead = readAhead(all, root, (f) => {
          if (f.stats.size >= SMALL_FILE || f.abs === root || appendOnly?.(f.rel)) return null;
          if (ctx.unchanged?.(`${cfg.name}/${f.rel}`, fingerprintOf(f.stats), kindOf(f.rel)) != null) return null;
          return f.stats.size + 1;
        });
        for await (const { f, pre } of ahead) {
          count++;
          first ??= f;
          const kind = kindOf(f.rel);
          let prefix: number | undefined;
          if (appendOnly?.(f.rel)) {
            // An append-only file's size is fixed before any of its bytes is packed: its tar header comes first.
            let p: { size: number; tail: number };
            try {
              p = await completeLinesPrefix(
                f.abs,
                f.stats.size,
                JSONL.test(f.rel) ? isCompleteJson : null,
                MAX_JSON_TAIL,
              );
            } catch (e) {
              throw sourceError(e, f.abs);
            }
            prefix = p.size;
            appended++;
            if (p.tail > 0) partial[f.rel] = p.tail;
          }
          // An append-only file's fingerprint names the prefix too: the same stats give the same
          // bytes, and a file newly declared append-only is read again.
          const fingerprint = fingerprintOf(f.stats) + (prefix === undefined ? "" : `:append:${prefix}`);
          const a = fileArtifact(f, kind, f.rel, prefix, pre);
          a.text = TEXT_EXT.test(f.rel);
          a.fingerprint = fingerprint;
          // An incremental snapshot stores only the tail of a log, the changed chunks of a big file.
          if (prefix !== undefined || kind === "jsonl") a.chunking = { mode: "append" };
          else if (a.size >= CDC_MIN_FILE) a.chunking = { mode: "cdc" };
          yield a;
        }
      })(),
      finish: async () => ({
        root,
        root_is_file: count === 1 && first!.abs === root,
        skipped: walk.skipped,
        ...(appended ? { append_only: appended } : {}),
        ...(Object.keys(partial).length ? { partial_tail_bytes: partial } : {}),
      }),
    };
  },
};
