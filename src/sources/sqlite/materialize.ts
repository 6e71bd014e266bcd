/** Restoring a sqlite layer: side files removed, each database opened once and its journal mode set back. */
import { rm } from "node:fs/promises";
import { MemsnapError } from "../../errors.js";
import type { LayerEntry } from "../../format/manifest.js";
import { isPlainObject } from "../../util/config-check.js";
import { SqliteJobError, SqliteWorker } from "./worker-host.js";
import { walkFiles } from "../walk.js";
import { SIDE_FILE } from "./config.js";

/** Make the restored databases in `dir` ready to open (see the worker's `materialize` job). */
export async function materializeLayer(dir: string, layer: LayerEntry): Promise<void> {
  const meta = isPlainObject(layer.meta) && isPlainObject(layer.meta.databases) ? layer.meta.databases : {};
  const { files } = await walkFiles(dir);
  // A sqlite layer never holds side files; one here could be replayed into the wrong database.
  for (const f of files) if (SIDE_FILE.test(f.rel)) await rm(f.abs, { force: true });
  const dbs = files.filter((f) => !SIDE_FILE.test(f.rel));
  if (dbs.length === 0) return;
  const w = new SqliteWorker();
  try {
    for (const f of dbs) {
      for (const s of ["-wal", "-shm", "-journal"]) await rm(f.abs + s, { force: true });
      const m = meta[f.rel];
      const jm = isPlainObject(m) && typeof m.journal_mode === "string" ? m.journal_mode : null;
      const name = `${layer.name}/${f.rel}`;
      try {
        await w.call({ op: "materialize", path: f.abs, journalMode: jm });
      } catch (e) {
        const code = e instanceof SqliteJobError ? (e.sqliteCode ?? "") : "";
        if (code === "SQLITE_NOTADB" || code.startsWith("SQLITE_CORRUPT")) {
          const msg = `${name} does not open as an SQLite database: ${(e as Error).message}`;
          throw new MemsnapError("MEMSNAP_DEEP_VERIFY_FAILED", msg, {
            path: name,
            cause: e,
            hint: "run `memsnap verify --deep` on the bundle",
          });
        }
        if (code === "SQLITE_FULL") {
          throw new MemsnapError("MEMSNAP_DEST_FULL", `no space left restoring ${name}`, {
            path: name,
            cause: e,
            hint: "free space on the destination",
          });
        }
        const msg = `cannot open the restored database ${name}: ${(e as Error).message}`;
        throw new MemsnapError("MEMSNAP_DEST_UNWRITABLE", msg, {
          path: name,
          cause: e,
          hint: "check that the destination is writable",
        });
      }
    }
  } finally {
    await w.close();
  }
}
