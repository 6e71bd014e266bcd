/** The `files` source: files and directories, with include/exclude globs. */
import { resolve } from "node:path";
import { optStringArray, rejectUnknownKeys, reqString } from "../util/config-check.js";
import type { SourceKind } from "./types.js";
import { fileArtifact, fingerprintOf, walkFiles } from "./walk.js";
import { pathTarget } from "./live-target.js";

/** Files whose content the pipeline redacts (memory notes, JSON, JSONL, config-like text). */
const TEXT_EXT = /\.(md|markdown|txt|text|json|jsonl|ndjson|ya?ml|toml|ini|cfg|conf|env|csv|tsv|log|html?|xml|rst|org)$/i;

export interface FilesConfig {
  kind: "files";
  name: string;
  path: string;
  include?: string[];
  exclude?: string[];
}

/** Files and directories, captured byte for byte. Symlinks and special files are skipped and counted in the layer meta. */
export const filesSource: SourceKind<FilesConfig> = {
  kind: "files",
  schemaVersion: 1,
  independentArtifacts: true,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "path", "include", "exclude"], where);
    return {
      kind: "files",
      name: reqString(raw, "name", where),
      path: reqString(raw, "path", where),
      include: optStringArray(raw, "include", where),
      exclude: optStringArray(raw, "exclude", where),
    };
  },
  async liveTarget(cfg, baseDir, layer) {
    return pathTarget(resolve(baseDir, cfg.path), layer.meta?.root_is_file === true, { include: cfg.include, exclude: cfg.exclude });
  },
  async capture(cfg, ctx) {
    const root = resolve(ctx.baseDir, cfg.path);
    const { files, skipped } = await walkFiles(root, { include: cfg.include, exclude: cfg.exclude });
    return {
      estimatedBytes: files.reduce((n, f) => n + f.stats.size, 0),
      artifacts: (async function* () {
        for (const f of files) {
          const kind = /\.(jsonl|ndjson)$/i.test(f.rel) ? "jsonl" : /\.json$/i.test(f.rel) ? "json" : "file";
          yield { ...fileArtifact(f, kind), text: TEXT_EXT.test(f.rel), fingerprint: fingerprintOf(f.stats) };
        }
      })(),
      finish: async () => ({ root, root_is_file: files.length === 1 && files[0]!.abs === root, skipped }),
    };
  },
};
