/**
 * Secrets in SQLite BLOB cells, through the real snapshot pipeline and the real redactor, on
 * real databases (better-sqlite3), both ways a database is captured (the live read, whose
 * page walk must now see BLOB values, and the copy):
 *  - a BLOB that is text (valid UTF-8, no control bytes: JSON or notes stored as bytes) is
 *    redacted as a TEXT cell is, stays a BLOB, and no byte of the secret is in the payload
 *    (decompressed with the real zstd binary);
 *  - a binary BLOB (NUL bytes, floats) is never rewritten: its findings are reported as
 *    unredacted, so a plaintext snapshot is refused (MEMSNAP_UNREDACTED_SECRETS, exit 2 from
 *    the CLI) unless --allow-unredacted, an encrypted one passes with the findings in the
 *    manifest's report, and the restored BLOB is byte for byte the original.
 */
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { generateIdentity, isMemsnapError, parseConfig, restoreToDir, snapshot } from "../../src/index.js";
import type { RedactionReport } from "../../src/redact/types.js";
import { isTextBlob } from "../../src/sources/sqlite/redact-copy.js";
import type { SqliteDbMeta } from "../../src/sources/sqlite/meta.js";
import { expectCliError, expectOk, jsonOut, readBundle, runCli } from "../helpers/cli.js";
import { seededBlob } from "../helpers/seeded-blob.js";
import { requireTool } from "../helpers/tools.js";
import { redactor, removeTempDirs, tempDir } from "./helpers/redactor.js";

interface Stmt { run(...a: unknown[]): unknown; get(...a: unknown[]): unknown }
interface Db { prepare(s: string): Stmt; exec(s: string): void; close(): void }
const Database = createRequire(import.meta.url)("better-sqlite3") as new (p: string, o?: { readonly?: boolean }) => Db;

afterAll(removeTempDirs);

// Fake AWS credentials in the shapes the rules detect (an access key id and a 40-character secret).
const KEY_ID = "AKIA" + "QX3MZ7RT2KLV9WBN";
const SECRET_KEY = "Zt8kQ2vLp9XmR4sN7y" + "B1cD6fH3jW0aE5gU8iO2qT";
const CREDS = `aws_access_key_id = ${KEY_ID}\naws_secret_access_key = ${SECRET_KEY}\n`;

/** A serialized record as an agent framework might store it: a binary header with NULs, the credentials, then a float32 embedding. */
function binaryRecord(): Buffer {
  const emb = Buffer.alloc(4 * 64);
  for (let i = 0; i < 64; i++) emb.writeFloatLE(Math.sin(i) * 0.25, i * 4);
  return Buffer.concat([Buffer.from([0x93, 0x01, 0x00, 0x00, 0x00, CREDS.length, 0x00, 0x00]), Buffer.from(CREDS), Buffer.from([0x00, 0x40, 0x00, 0x00]), emb]);
}

function makeDb(path: string, secretBlob: Buffer): void {
  const db = new Database(path);
  db.exec("CREATE TABLE memories (id INTEGER PRIMARY KEY, title TEXT, body BLOB); CREATE INDEX memories_title ON memories (title)");
  const ins = db.prepare("INSERT INTO memories (title, body) VALUES (?, ?)");
  for (let i = 0; i < 40; i++) ins.run(`memory ${i}`, seededBlob(96, i + 1));
  ins.run("imported credentials", secretBlob);
  for (let i = 40; i < 60; i++) ins.run(`memory ${i}`, seededBlob(96, i + 1));
  db.close();
}

function blobOf(path: string): Buffer {
  const db = new Database(path, { readonly: true });
  try {
    const r = db.prepare("SELECT typeof(body) AS t, body FROM memories WHERE title = 'imported credentials'").get() as { t: string; body: Buffer };
    expect(r.t).toBe("blob");
    return r.body;
  } finally {
    db.close();
  }
}

function agent(liveRead: boolean, blob: Buffer): { dir: string; config: ReturnType<typeof parseConfig> } {
  const dir = tempDir("memsnap-sqlite-blob-");
  makeDb(join(dir, "mem.db"), blob);
  const config = parseConfig({ agent: "blob-test", sources: [{ kind: "sqlite", name: "db", path: "mem.db", ...(liveRead ? {} : { live_read: false }) }] }, null, dir);
  return { dir, config };
}

function payloadTar(bundle: string): Buffer {
  const r = spawnSync("zstd", ["-dc"], { input: readBundle(bundle).payload, maxBuffer: 1 << 30 });
  expect(r.status, r.stderr?.toString()).toBe(0);
  return r.stdout;
}

const dbMeta = (m: { layers: Array<{ meta?: unknown }> }): SqliteDbMeta =>
  (m.layers[0]!.meta as { databases: Record<string, SqliteDbMeta> }).databases["mem.db"]!;

describe("isTextBlob", () => {
  it("text is UTF-8 without control bytes but tab and line breaks", () => {
    expect(isTextBlob(Buffer.from(CREDS))).toBe(true);
    expect(isTextBlob(Buffer.from('{"note":"café ☕","k":"v"}\r\n\t'))).toBe(true);
    expect(isTextBlob(binaryRecord())).toBe(false);
    expect(isTextBlob(Buffer.from([0x41, 0xc3]))).toBe(false); // cut UTF-8
    expect(isTextBlob(Buffer.from("a\x1bb"))).toBe(false);
  });
  it("the fake credentials are what the rules detect", async () => {
    const r = await redactor();
    const out = await r.redactText(CREDS, "x");
    expect(out).not.toContain(KEY_ID);
    expect(out).not.toContain(SECRET_KEY);
  });
});

describe.each([["live read (default)", true], ["copy (live_read: false)", false]] as const)("sqlite BLOB cells, %s", (_name, liveRead) => {
  it("a BLOB that is text is redacted in the bundle and stays a BLOB; the payload holds no byte of the secret", async (ctx) => {
    if (!requireTool(["zstd"], ctx)) return;
    const { dir, config } = agent(liveRead, Buffer.from(`imported from ~/.aws/credentials\n${CREDS}`));
    const res = await snapshot({ config, out: join(dir, "text.memsnap") });
    const rep = res.manifest.redaction as unknown as RedactionReport;
    expect(rep.total_unredacted).toBe(0);
    expect(rep.redacted["db/mem.db"]).toBeDefined();
    expect(Object.values(rep.redacted["db/mem.db"]!).reduce((a, b) => a + b, 0)).toBeGreaterThanOrEqual(2);
    const meta = dbMeta(res.manifest);
    expect(meta.method).not.toBe("live_read");
    if (liveRead) expect(meta.live_read_skipped).toBe("redaction_candidate");
    expect(meta.redaction!.blob_cells).toEqual({ scanned: 61, redacted: 1, unredacted: 0 });

    const tar = payloadTar(res.path);
    expect(tar.includes(KEY_ID)).toBe(false);
    expect(tar.includes(SECRET_KEY)).toBe(false);
    expect(tar.includes(SECRET_KEY.slice(0, 20))).toBe(false);

    await restoreToDir(res.path, join(dir, "out"));
    const body = blobOf(join(dir, "out", "db", "mem.db")).toString("utf8");
    expect(body).toContain("imported from ~/.aws/credentials\n");
    expect(body).toContain("[REDACTED:");
    expect(body).not.toContain(KEY_ID);
  }, 60_000);

  it("a binary BLOB is kept byte for byte and reported: plaintext refused, allowed with allowUnredacted, encrypted passes", async () => {
    const blob = binaryRecord();
    const { dir, config } = agent(liveRead, blob);
    let err: unknown;
    try {
      await snapshot({ config, out: join(dir, "plain.memsnap") });
    } catch (e) {
      err = e;
    }
    expect(isMemsnapError(err, "MEMSNAP_UNREDACTED_SECRETS"), String(err)).toBe(true);
    expect((err as Error).message).toContain("db/mem.db");

    const allowed = await snapshot({ config, out: join(dir, "allowed.memsnap"), allowUnredacted: true });
    const rep = allowed.manifest.redaction as unknown as RedactionReport;
    expect(rep.total_redacted).toBe(0);
    expect(rep.unredacted["db/mem.db"]).toBeDefined();
    expect(rep.total_unredacted).toBeGreaterThanOrEqual(2); // the key id and the secret
    expect(dbMeta(allowed.manifest).redaction!.blob_cells).toEqual({ scanned: 61, redacted: 0, unredacted: 1 });
    await restoreToDir(allowed.path, join(dir, "allowed"));
    expect(blobOf(join(dir, "allowed", "db", "mem.db")).equals(blob)).toBe(true);

    const { identity, recipient } = await generateIdentity();
    const enc = await snapshot({ config, out: join(dir, "enc.memsnap"), recipients: [recipient] });
    const erep = readBundle(enc.path).manifest.redaction as RedactionReport; // the plaintext manifest, as written
    expect(erep.unredacted["db/mem.db"]).toEqual(rep.unredacted["db/mem.db"]);
    await restoreToDir(enc.path, join(dir, "enc"), { keys: { identities: [identity] } });
    expect(blobOf(join(dir, "enc", "db", "mem.db")).equals(blob)).toBe(true);
  }, 60_000);
});

describe("sqlite BLOB cells through the CLI", () => {
  it("a plaintext snapshot of a database with a secret in a binary BLOB exits 2 with MEMSNAP_UNREDACTED_SECRETS; --allow-unredacted writes it", async () => {
    const dir = tempDir("memsnap-sqlite-blob-cli-");
    makeDb(join(dir, "mem.db"), binaryRecord());
    writeFileSync(join(dir, "memsnap.json"), JSON.stringify({ tenant: "t", agent: "a", sources: [{ kind: "sqlite", name: "db", path: "mem.db" }] }));
    const refused = await runCli(["snapshot", "--config", join(dir, "memsnap.json"), "--out", join(dir, "s.memsnap")], { cwd: dir });
    expectCliError(refused, 2, "MEMSNAP_UNREDACTED_SECRETS");
    expect(refused.stderr).toContain("db/mem.db");
    const ok = await runCli(["snapshot", "--config", join(dir, "memsnap.json"), "--out", join(dir, "s.memsnap"), "--allow-unredacted", "--json"], { cwd: dir });
    expectOk(ok);
    expect(jsonOut(ok)).toBeDefined();
    expect(readBundle(join(dir, "s.memsnap")).manifest.redaction.unredacted["db/mem.db"]).toBeDefined();
  }, 60_000);
});
