/**
 * A database whose only redaction candidates are cells the pre-filter flags but no rule matches
 * in (random bytes of an embedding BLOB that read as "Key=", a URL with a user name) is read
 * live, the file itself, not copied to be redacted (issue #38 item 5: every embedding database of
 * a real home has a few); a database with a real secret beside it still takes the copy path and
 * is redacted. Real parts: the CLI, the real redactor, better-sqlite3.
 */
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { expectOk, jsonOut, runCliSync, tempDir } from "../helpers/cli.js";

const Database = createRequire(import.meta.url)("better-sqlite3");
const sha = (p: string): string => createHash("sha256").update(readFileSync(p)).digest("hex");

/** float32 bytes that decode to no candidate, with `inject` (if any) written at byte 100. */
function embedding(seed: number, inject?: Buffer): Buffer {
  const b = Buffer.alloc(1536);
  for (let i = 0; i < 384; i++) b.writeFloatLE(Math.sin(seed * 7.1 + i) * 0.01, i * 4);
  if (inject) inject.copy(b, 100);
  return b;
}

function makeDb(file: string, rows: Array<[string, Buffer]>): void {
  const db = new Database(file);
  db.exec("CREATE TABLE chunks (id INTEGER PRIMARY KEY, text TEXT NOT NULL, embedding BLOB NOT NULL)");
  const ins = db.prepare("INSERT INTO chunks (text, embedding) VALUES (?, ?)");
  db.transaction(() => {
    for (const [t, e] of rows) ins.run(t, e);
  })();
  db.close();
}

type DbMeta = { method: string; live_read_skipped?: string; redaction?: { candidates: number; cells_redacted: number } };

describe("sqlite: candidates the redactor clears", () => {
  it("a database whose candidates no rule matches is read live; one with a secret is copied and redacted", () => {
    const dir = tempDir("memsnap-sqlite-cand-");
    const rows = (n: number): Array<[string, Buffer]> =>
      Array.from({ length: n }, (_, i) => [`note ${i} about the garden`, embedding(i)] as [string, Buffer]);
    const clean = rows(300);
    // random bytes that read "Key=V9" (binary BLOB), and a text cell with a URL user name
    clean[40]![1] = embedding(40, Buffer.from([0xb3, 0x4b, 0x65, 0x79, 0x3d, 0x56, 0x39, 0xf1, 0x00, 0x9a]));
    clean[200]![0] = "clone it from ssh://git@example.com/team/notes";
    makeDb(join(dir, "vectors.db"), clean);
    // the schema's own text is a candidate too (the page walk reads sqlite_schema), and no rule matches it
    const schemaDb = new Database(join(dir, "schema.db"));
    schemaDb.exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, token TEXT CHECK (token = lower(token))); INSERT INTO notes (token) VALUES ('abc')");
    schemaDb.close();
    const secret = rows(300);
    secret[7]![0] = "the deploy password: hunter2";
    makeDb(join(dir, "secret.db"), secret);
    writeFileSync(join(dir, "memsnap.json"), JSON.stringify({
      agent: "cand", sources: [{ kind: "sqlite", name: "db", path: ".", include: ["*.db"] }],
    }));
    const before = sha(join(dir, "vectors.db"));
    const s = runCliSync(["snapshot", "-c", join(dir, "memsnap.json"), "--out", join(dir, "b.memsnap"), "--json"]);
    expectOk(s);
    const insp = runCliSync(["inspect", join(dir, "b.memsnap"), "--json"]);
    expectOk(insp);
    const j = jsonOut(insp);
    const layer = (j.manifest?.layers ?? j.layers).find((l: { name: string }) => l.name === "db");
    const dbs = layer.meta.databases as Record<string, DbMeta>;
    expect(dbs["vectors.db"]).toMatchObject({ method: "live_read", redaction: { candidates: 2, cells_redacted: 0 } });
    expect(dbs["vectors.db"]!.live_read_skipped).toBeUndefined();
    expect(dbs["schema.db"]).toMatchObject({ method: "live_read", redaction: { candidates: 1, cells_redacted: 0 } });
    expect(dbs["secret.db"]).toMatchObject({ method: "vacuum_into", live_read_skipped: "redaction_candidate" });
    expect(dbs["secret.db"]!.redaction!.cells_redacted).toBe(1);

    const out = join(dir, "restored");
    expectOk(runCliSync(["restore", join(dir, "b.memsnap"), "--to", out, "--layout", "layers"]));
    // the live read stores the file itself: byte for byte, the candidate cells as they were
    expect(sha(join(out, "db", "vectors.db"))).toBe(before);
    const r = new Database(join(out, "db", "secret.db"), { readonly: true });
    expect(r.prepare("SELECT text FROM chunks WHERE id = 8").pluck().get()).toBe("the deploy password: [REDACTED:memsnap/password-assignment]");
    r.close();
  });
});
