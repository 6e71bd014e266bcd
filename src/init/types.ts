/**
 * What `memsnap init` finds under an agent's home: the sources it proposes, the files it leaves
 * out and why, and how many bytes the config captures. Shared by detection (./detect.ts), the
 * accounting of every byte (./account.ts) and the config it writes (./render.ts).
 */

/** A source init proposes: its kind, layer name, path, and the config keys it needs. */
export interface DetectedSource {
  kind: "git" | "sqlite" | "state" | "files" | "trace" | "kv" | "pfimg" | "criu";
  name: string;
  /** Path relative to the agent home, POSIX separators ("." for the home itself). */
  path: string;
  include?: string[];
  exclude?: string[];
  /** A `files` source's append-only logs (globs), captured up to their last complete line. */
  append?: string[];
  /** The config keys other than kind, name, path, include and exclude (`format`, `store`). */
  extra?: Record<string, string>;
  note: string;
}

/** Files init left out of every source, aggregated per directory and reason. */
export interface LeftOut {
  /** Relative path: a file, or a directory (ending in `/`) when several files in it share the reason. */
  path: string;
  bytes: number;
  files: number;
  reason: string;
}

/** What init found under a home: its sources, what they leave out, and the coverage. */
export interface Detection {
  home: string;
  sources: DetectedSource[];
  /** What no source covers (memsnap's own `.memsnap` and `memsnap.json` are not counted). */
  left_out: LeftOut[];
  coverage: { captured_bytes: number; total_bytes: number };
}
