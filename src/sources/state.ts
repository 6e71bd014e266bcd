/**
 * The `state` source: small JSON files (extractor cursors, dream-run rows). Each file is
 * validated as JSON before it is packed. A state file is read once into memory (capped at
 * STATE_MAX_BYTES) and the same bytes are parsed, hashed and stored, so what is validated is
 * exactly what lands in the bundle.
 */
import { readFile } from "node:fs/promises";
import { resolve } from "node:path";
import { Readable } from "node:stream";
import { MemsnapError } from "../errors.js";
import { optStringArray, rejectUnknownKeys, reqString } from "../util/config-check.js";
import type { Artifact, SourceKind } from "./types.js";
import { sourceChanged, sourceError, walkFiles, walkNotices } from "./walk.js";
import { pathTarget } from "./live-target.js";
import { collect } from "../util/streams.js";

export const STATE_MAX_BYTES = 16 * 1024 * 1024;

export interface StateConfig {
  kind: "state";
  name: string;
  path: string;
  include?: string[];
  exclude?: string[];
}

/** JSON state files; a file that is not valid JSON is MEMSNAP_SOURCE_INVALID. */
export const stateSource: SourceKind<StateConfig> = {
  kind: "state",
  schemaVersion: 1,
  independentArtifacts: true,
  distinctPaths: true, // one walk, each path once
  restoresAttributes: true,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "path", "include", "exclude"], where);
    return {
      kind: "state",
      name: reqString(raw, "name", where),
      path: reqString(raw, "path", where),
      include: optStringArray(raw, "include", where),
      exclude: optStringArray(raw, "exclude", where),
    };
  },
  async liveTarget(cfg, baseDir, layer) {
    return pathTarget(resolve(baseDir, cfg.path), layer.meta?.root_is_file === true, {
      include: cfg.include ?? ["*.json"],
      exclude: cfg.exclude,
    });
  },
  async capture(cfg, ctx) {
    const root = resolve(ctx.baseDir, cfg.path);
    const walked = await walkFiles(root, { include: cfg.include ?? ["*.json"], exclude: cfg.exclude });
    const { files } = walked;
    return {
      estimatedBytes: files.reduce((n, f) => n + f.stats.size, 0),
      notices: () => walkNotices(walked),
      artifacts: (async function* (): AsyncGenerator<Artifact> {
        for (const f of files) {
          if (f.stats.size > STATE_MAX_BYTES) {
            throw new MemsnapError("MEMSNAP_SOURCE_INVALID", `state file ${f.abs} is over ${STATE_MAX_BYTES} bytes`, {
              path: f.abs,
              hint: "capture large files with a files source instead",
            });
          }
          let bytes: Buffer;
          try {
            bytes = await readFile(f.abs);
          } catch (e) {
            throw sourceError(e, f.abs);
          }
          if (bytes.length !== f.stats.size) throw sourceChanged(f.abs, `size ${f.stats.size} → ${bytes.length}`);
          try {
            JSON.parse(bytes.toString("utf8"));
          } catch (e) {
            throw new MemsnapError(
              "MEMSNAP_SOURCE_INVALID",
              `state file ${f.abs} is not valid JSON: ${(e as Error).message}`,
              {
                path: f.abs,
                hint: "fix or remove the file, or exclude it from the state source",
              },
            );
          }
          yield {
            path: f.rel,
            kind: "json",
            text: true,
            size: bytes.length,
            mode: f.stats.mode & 0o7777,
            mtime: f.stats.mtime,
            open: () => Readable.from([bytes]),
          };
        }
      })(),
      finish: async () => ({
        root,
        root_is_file: files.length === 1 && files[0]!.abs === root,
        ...(walked.skipped.unsafe_names ? { skipped: { unsafe_names: walked.skipped.unsafe_names } } : {}),
      }),
    };
  },
  async deepVerify({ entry, bytes }) {
    const buf = await collect(bytes, STATE_MAX_BYTES);
    if (buf === null) return `${entry.path}: state file over ${STATE_MAX_BYTES} bytes`;
    try {
      JSON.parse(buf.toString("utf8"));
      return null;
    } catch (e) {
      return `${entry.path}: not valid JSON (${(e as Error).message})`;
    }
  },
};
