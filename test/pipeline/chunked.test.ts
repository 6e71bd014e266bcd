/**
 * Incremental below the file (manifest_version 4, docs/FORMAT.md §6.1): a changed artifact is a
 * chunked entry whose unchanged ranges are read from the entry at its path in a base. Real
 * files, a real SQLite database (better-sqlite3), agentlog traces, real age encryption; every
 * restore is checked byte for byte and every verify (keyless, keyed, deep) must pass.
 */
import { createHash, randomBytes } from "node:crypto";
import { createRequire } from "node:module";
import {
  appendFileSync, closeSync, copyFileSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { afterAll, beforeEach, describe, expect, it, onTestFinished } from "vitest";
import {
  deleteSnapshots, findSnapshot, generateIdentity, listSnapshots, parseConfig, restoreToDir, snapshot, verifyBundle, type MemsnapConfig,
} from "../../src/index.js";
import { readLayout } from "../../src/format/container.js";
import { parseManifest, type IndexEntry, type Manifest } from "../../src/format/manifest.js";
import { POLICY } from "../../src/snapshot/chunking.js";
import { decide } from "../../src/store/prune.js";
import { catArtifact, openSnapshot } from "../../src/browse/index.js";

interface Db { pragma(s: string): unknown; exec(s: string): void; prepare(s: string): { run(...a: unknown[]): unknown; get(): unknown }; close(): void }
const openDatabase = createRequire(import.meta.url)("better-sqlite3") as new (p: string, o?: { readonly?: boolean }) => Db;

const work = mkdtempSync(join(tmpdir(), "memsnap-chunked-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const sha = (b: string | Buffer): string => createHash("sha256").update(b).digest("hex");
const fileSha = (p: string): string => sha(readFileSync(p));

let dir = "";
let store = "";
let keys: { identities: string[] };
let recipient = "";

beforeEach(async () => {
  dir = mkdtempSync(join(work, "agent-"));
  store = join(dir, "store");
  const id = await generateIdentity();
  keys = { identities: [id.identity] };
  recipient = id.recipient;
});

function cfg(sources: Record<string, unknown>[]): MemsnapConfig {
  return parseConfig({ agent: "chunk", sources }, null, dir);
}

async function snap(config: MemsnapConfig, encrypted = false, redact = true) {
  return snapshot({ config, store, incremental: true, ...(encrypted ? { recipients: [recipient] } : {}), ...(redact ? {} : { redact: false }) });
}

/** The index of a bundle (its manifest's, or for an encrypted one, as restore sees it: through the keyed read). */
function entryOf(m: Manifest, path: string): IndexEntry {
  const e = m.index?.find((x) => x.path === path);
  if (!e) throw new Error(`${path} not in the manifest's index`);
  return e;
}

function jsonl(lines: number, from = 0): string {
  let s = "";
  for (let i = from; i < from + lines; i++) s += `${JSON.stringify({ i, role: i % 2 ? "user" : "assistant", text: `message ${i} ${"lorem ipsum ".repeat(8)}` })}\n`;
  return s;
}

async function restoreSha(path: string, rel: string, k?: { identities: string[] }): Promise<string> {
  const to = mkdtempSync(join(dir, "restored-"));
  rmSync(to, { recursive: true });
  await restoreToDir(path, to, k ? { keys: k } : {});
  return fileSha(join(to, rel));
}

describe("append-only logs", () => {
  it("only the appended tail is stored; restore, verify and cat give the whole log; an older reader refuses the bundle", async () => {
    mkdirSync(join(dir, "logs"));
    writeFileSync(join(dir, "logs", "chat.jsonl"), jsonl(8000)); // ~1.1 MB
    const config = cfg([{ kind: "files", name: "logs", path: "logs" }]);
    const first = await snap(config);
    expect(first.manifest.manifest_version).toBe(1);
    const size0 = entryOf(first.manifest, "logs/chat.jsonl").size;
    const tail = jsonl(50, 8000);
    appendFileSync(join(dir, "logs", "chat.jsonl"), tail);
    const second = await snap(config);
    const m = second.manifest;
    expect(m.manifest_version).toBe(4);
    expect(m.bases).toEqual([{ snapshot_id: first.id, seal: first.manifest.seal }]);
    const e = entryOf(m, "logs/chat.jsonl");
    expect(e.size).toBe(size0 + tail.length);
    expect(e.sha256).toBe(fileSha(join(dir, "logs", "chat.jsonl")));
    expect(e.stored_size).toBe(tail.length);
    expect(e.ranges).toEqual([[size0, first.id, 0], [tail.length]]);
    expect(m.layers[0]!.referenced).toBe(1);
    expect(second.incremental).toMatchObject({ chunked: 1, referenced: 1, referencedBytes: size0 });
    expect(second.bundleBytes).toBeLessThan(16 * 1024);
    expect(m.payload.bytes).toBe(e.size);

    expect(await restoreSha(second.path, "logs/chat.jsonl")).toBe(e.sha256);
    const v = await verifyBundle(second.path, { deep: true }); // plaintext: no key needed for any check
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
    expect(v.checks.find((c) => c.name === "references")).toMatchObject({ status: "passed", detail: expect.stringContaining("1 of them chunked and reassembled") });
    const chunks: Buffer[] = [];
    await catArtifact(await openSnapshot(second.path), "logs/chat.jsonl", {}, new Writable({ write: (c, _e, cb) => { chunks.push(c as Buffer); cb(); } }));
    expect(sha(Buffer.concat(chunks))).toBe(e.sha256);

    // A reader of version 3 (memsnap before chunked entries) refuses it before reading anything else.
    const bytes = (await readLayout(second.path)).manifestBytes;
    expect(() => parseManifest(bytes, 3)).toThrow(expect.objectContaining({ code: "MEMSNAP_UNSUPPORTED_VERSION", message: expect.stringMatching(/manifest_version 4 is newer/) }));
    expect(parseManifest(bytes).manifest_version).toBe(4);
  });

  it("encrypted, three generations: every range points at the bundle holding the bytes; prune keeps them, a missing one is refused", async () => {
    mkdirSync(join(dir, "logs"));
    writeFileSync(join(dir, "logs", "chat.jsonl"), jsonl(3000));
    const config = cfg([{ kind: "files", name: "logs", path: "logs" }]);
    const first = await snap(config, true);
    appendFileSync(join(dir, "logs", "chat.jsonl"), jsonl(10, 3000));
    const second = await snap(config, true);
    appendFileSync(join(dir, "logs", "chat.jsonl"), jsonl(10, 3010));
    const third = await snap(config, true);
    expect(third.manifest.manifest_version).toBe(4);
    expect(third.manifest.bases!.map((b) => b.snapshot_id)).toEqual([first.id, second.id]);
    expect(third.incremental!.chunked).toBe(1);
    const want = fileSha(join(dir, "logs", "chat.jsonl"));
    expect(await restoreSha(third.path, "logs/chat.jsonl", keys)).toBe(want);
    const v = await verifyBundle(third.path, { keys, deep: true });
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
    const keyless = await verifyBundle(third.path);
    expect(keyless.ok).toBe(true);
    expect(keyless.checks.find((c) => c.name === "bases")?.status).toBe("passed");

    // Unchanged since: the same ranges again, nothing stored.
    const fourth = await snap(config, true);
    expect(fourth.incremental).toMatchObject({ chunked: 1, referenced: 1 });
    expect(await restoreSha(fourth.path, "logs/chat.jsonl", keys)).toBe(want);

    const d = decide(await listSnapshots(store), { last: 1 });
    for (const s of [first, second, third]) expect(d.find((x) => x.snapshot.id === s.id)).toMatchObject({ keep: true });
    expect(d.find((x) => x.snapshot.id === first.id)!.reasons).toContain(`base of ${fourth.id}`);
    await expect(deleteSnapshots(store, [await findSnapshot(store, second.id)])).rejects.toMatchObject({ code: "MEMSNAP_USAGE" });
    await deleteSnapshots(store, [await findSnapshot(store, second.id)], { force: true });
    const to = join(dir, "after-delete");
    await expect(restoreToDir(fourth.path, to, { keys })).rejects.toMatchObject({ code: "MEMSNAP_BASE_MISSING" });
  });

  it("a log whose first bytes changed is stored whole", async () => {
    mkdirSync(join(dir, "logs"));
    writeFileSync(join(dir, "logs", "chat.jsonl"), jsonl(2000));
    const config = cfg([{ kind: "files", name: "logs", path: "logs" }]);
    await snap(config);
    writeFileSync(join(dir, "logs", "chat.jsonl"), `{"rewritten":true}\n${jsonl(2100).slice(19)}`);
    const second = await snap(config);
    expect(second.incremental!.chunked).toBe(0);
    expect(entryOf(second.manifest, "logs/chat.jsonl").ranges).toBeUndefined();
    expect(await restoreSha(second.path, "logs/chat.jsonl")).toBe(fileSha(join(dir, "logs", "chat.jsonl")));
  });

  it(`chains stay bounded: once a log's bytes are in ${POLICY.maxHolders} bundles it is stored whole again`, async () => {
    mkdirSync(join(dir, "logs"));
    writeFileSync(join(dir, "logs", "chat.jsonl"), jsonl(200));
    const config = cfg([{ kind: "files", name: "logs", path: "logs" }]);
    await snap(config);
    let last = null;
    for (let i = 1; i <= POLICY.maxHolders; i++) {
      appendFileSync(join(dir, "logs", "chat.jsonl"), jsonl(1, 200 + i));
      last = await snap(config);
      const e = entryOf(last.manifest, "logs/chat.jsonl");
      if (i < POLICY.maxHolders) {
        expect(e.ranges, `snapshot ${i}`).toBeDefined();
        expect(last.manifest.bases).toHaveLength(i);
      }
    }
    expect(entryOf(last!.manifest, "logs/chat.jsonl").ranges).toBeUndefined();
    expect(last!.manifest.manifest_version).toBe(1);
    appendFileSync(join(dir, "logs", "chat.jsonl"), jsonl(1, 999));
    const next = await snap(config);
    expect(next.manifest.bases).toEqual([{ snapshot_id: last!.id, seal: last!.manifest.seal }]);
    expect(await restoreSha(next.path, "logs/chat.jsonl")).toBe(fileSha(join(dir, "logs", "chat.jsonl")));
  });

  it("agentlog traces: the new records only", async () => {
    const stable = (v: unknown): string => Array.isArray(v) ? `[${v.map(stable).join(",")}]`
      : v && typeof v === "object" ? `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${stable((v as Record<string, unknown>)[k])}`).join(",")}}` : JSON.stringify(v);
    let parent: string | null = null;
    const rec = (kind: string, payload: unknown): string => {
      const id = `sha256:${sha(stable(payload))}`;
      const line = `{"version":"0.1","id":"${id}","kind":"${kind}","ts":"2024-06-01T00:00:00Z","parent":${parent === null ? "null" : `"${parent}"`},"payload":${JSON.stringify(payload)}}\n`;
      parent = id;
      return line;
    };
    mkdirSync(join(dir, "traces"));
    let text = rec("metadata", { agent: "demo" });
    for (let i = 0; i < 2000; i++) text += rec("chat_request", { n: i, content: `turn ${i} ${"words ".repeat(10)}` });
    writeFileSync(join(dir, "traces", "run.agentlog"), text);
    const config = cfg([{ kind: "trace", name: "traces", path: "traces" }]);
    const first = await snap(config, true);
    expect(first.manifest.layers[0]!.meta).toMatchObject({ records: 2001 });
    let more = "";
    for (let i = 0; i < 5; i++) more += rec("chat_response", { n: i, content: "ok" });
    appendFileSync(join(dir, "traces", "run.agentlog"), more);
    const second = await snap(config, true);
    expect(second.incremental).toMatchObject({ chunked: 1 });
    expect(second.manifest.layers[0]!.meta).toMatchObject({ records: 2006 }); // every record checked, none counted twice
    expect(second.bundleBytes).toBeLessThan(first.bundleBytes / 4);
    expect(await restoreSha(second.path, "traces/run.agentlog", keys)).toBe(fileSha(join(dir, "traces", "run.agentlog")));
    const v = await verifyBundle(second.path, { keys, deep: true });
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
  });
});

describe("SQLite databases: the page is the unit", () => {
  // (live: the pages read and hashed on the thread pool, src/snapshot/page-reader.ts; with MEMSNAP_NATIVE=0, in JS)
  for (const [redact, js] of [[false, false], [false, true], [true, false]] as const) {
  it(`one row inserted (redaction ${redact ? "on: a copy" : `off: the file read live${js ? ", pages hashed in JS" : ""}`}): a few pages stored, the rest referenced; byte-exact, deep verify opens it`, async () => {
    if (js) process.env.MEMSNAP_NATIVE = "0";
    onTestFinished(() => void delete process.env.MEMSNAP_NATIVE);
    mkdirSync(join(dir, "db"));
    const path = join(dir, "db", "facts.db");
    const db = new openDatabase(path);
    db.pragma("journal_mode = DELETE");
    db.exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, e BLOB)");
    const ins = db.prepare("INSERT INTO t (v, e) VALUES (?, ?)");
    db.exec("BEGIN");
    // (seeded bytes: random ones could hold what the redaction scan takes for a candidate)
    for (let i = 0; i < 4000; i++) ins.run(`fact ${i}`, Buffer.concat(Array.from({ length: 25 }, (_, k) => createHash("sha256").update(`${i}:${k}`).digest())));
    // With redaction, a secret in a TEXT cell: the database is copied, the secret redacted in the copy.
    if (redact) ins.run(`deploy with ${"ghp_" + "Zq7Rk2Lm9Xv4Tb8Nc3Wd6Hy1Pf5Gs0Ja2Ke4"}`, Buffer.alloc(0));
    db.exec("COMMIT");
    db.close();
    const config = cfg([{ kind: "sqlite", name: "db", path: "db" }]);
    const first = await snap(config, true, redact);
    const meta = first.manifest.layers[0]!.meta as { databases: Record<string, { method: string; page_size: number }> };
    expect(meta.databases["facts.db"]!.method).toBe(redact ? "vacuum_into" : "live_read");
    const db2 = new openDatabase(path);
    db2.prepare("INSERT INTO t (v, e) VALUES (?, ?)").run("one more fact", Buffer.alloc(100, 7));
    db2.close();
    const copy = join(dir, "facts-after.db");
    copyFileSync(path, copy);
    const second = await snap(config, true, redact);
    expect(second.manifest.manifest_version).toBe(4);
    expect(second.incremental).toMatchObject({ chunked: 1 });
    // ~4 MB of pages; the insert touches the last leaf, its parent and the header page
    expect(second.bundleBytes).toBeLessThan(64 * 1024);
    expect(second.incremental!.referencedBytes).toBeGreaterThan(3_000_000);
    const to = join(dir, "restored");
    await restoreToDir(second.path, to, { keys });
    if (!redact) expect(fileSha(join(to, "db", "facts.db"))).toBe(fileSha(copy)); // (a copy is not the file's bytes)
    const back = new openDatabase(join(to, "db", "facts.db"), { readonly: true });
    expect(back.prepare("SELECT count(*) AS n FROM t").get()).toEqual({ n: redact ? 4002 : 4001 });
    back.close();
    const v = await verifyBundle(second.path, { keys, deep: true });
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
    expect(v.checks.find((c) => c.name === "deep")?.detail).toMatch(/1 artifact\(s\) checked/);
  });
  }
});

describe("other large files: content-defined chunks", () => {
  it("an edit in the middle of a 6 MiB file stores the chunks around it", async () => {
    mkdirSync(join(dir, "blobs"));
    const path = join(dir, "blobs", "model.bin");
    writeFileSync(path, randomBytes(6 * 1024 * 1024));
    const config = cfg([{ kind: "files", name: "blobs", path: "blobs" }]);
    const first = await snap(config);
    expect(first.bundleBytes).toBeGreaterThan(6 * 1024 * 1024);
    const fd = openSync(path, "r+");
    writeSync(fd, Buffer.from("an edit in the middle"), 0, 21, 3 * 1024 * 1024);
    closeSync(fd);
    const second = await snap(config);
    const e = entryOf(second.manifest, "blobs/model.bin");
    expect(e.ranges!.length).toBeGreaterThanOrEqual(3);
    expect(e.stored_size).toBeLessThan(1024 * 1024);
    expect(second.bundleBytes).toBeLessThan(1024 * 1024);
    expect(await restoreSha(second.path, "blobs/model.bin")).toBe(fileSha(path));
    // inserting bytes shifts everything after them: content-defined cuts find the same chunks again
    const before = readFileSync(path);
    writeFileSync(path, Buffer.concat([before.subarray(0, 1_000_000), Buffer.from("inserted"), before.subarray(1_000_000)]));
    const third = await snap(config);
    expect(entryOf(third.manifest, "blobs/model.bin").stored_size).toBeLessThan(1024 * 1024);
    expect(await restoreSha(third.path, "blobs/model.bin")).toBe(fileSha(path));
    const v = await verifyBundle(third.path, { deep: true });
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
  });
});

describe("the hostile corpus's control case", () => {
  it("chunked-valid.memsnap and chunked-valid-encrypted.memsnap restore the appended log byte for byte", async () => {
    const hostile = new URL("../../fixtures/hostile/", import.meta.url).pathname;
    for (const [file, k] of [["chunked-valid.memsnap", undefined], ["chunked-valid-encrypted.memsnap", { identities: [readFileSync(join(hostile, "victim.key"), "utf8").split("\n").find((l) => l.startsWith("AGE-SECRET-KEY-"))!] }]] as const) {
      const to = join(dir, file);
      await restoreToDir(join(hostile, file), to, k ? { keys: k } : {});
      const text = readFileSync(join(to, "memory", "log.jsonl"), "utf8");
      expect(text.split("\n")).toHaveLength(202);
      expect(text.endsWith('{"line":200,"text":"appended"}\n')).toBe(true);
      expect(text.split("\n")[199]).toBe('{"line":199,"text":"the base\'s record number 199"}');
    }
  });
});
