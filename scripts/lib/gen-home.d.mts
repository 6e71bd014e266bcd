/** Types for gen-home.mjs (a realistic agent home: paged KV dump, SQLite with a hot WAL, git memdir, JSONL, JSON). */
export declare const GEN_HOME_VERSION: 1;
export interface GeneratedHome {
  dir: string;
  scale: number;
  seed: number;
  version: number;
  bytes: number;
  parts: {
    kv: {
      pages: number; distinct: number; zeroPages: number; pageBytes: number; files: number;
      expected: { pagesTotal: number; pagesUnique: number; pagesZero: number; storedBytes: number };
    };
    sqlite: Record<string, Record<string, number>>;
    wal: { file: string; frames: number; pageSize: number };
    git: { head: string; commits: number; notes: number };
    traces: { files: number; lines: number };
    state: { files: number };
  };
}
export declare function generateHome(opts: { dir: string; scale?: number; seed?: number; log?: (m: string) => void }): Promise<GeneratedHome>;
