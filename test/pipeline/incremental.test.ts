/**
 * Incremental snapshots (manifest_version 2): artifacts unchanged since the last incremental
 * snapshot are references to the bundle that holds their bytes, and every reader follows them.
 * Real files, a real KV dump (pages referenced by digest, restored through the spool in two
 * passes), real age encryption; tampered, missing and replaced bases; prune, delete and export.
 */
import { execFileSync, spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { randomBytes } from "node:crypto";
import {
  appendFileSync, closeSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, readSync, renameSync, rmSync, statSync,
  writeFileSync, writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeEach, describe, expect, it } from "vitest";
import { deleteSnapshots, findSnapshot, generateIdentity, listSnapshots, parseConfig, restoreInPlace, restoreToDir, snapshot, verifyBundle, type MemsnapConfig } from "../../src/index.js";
import { readLayout } from "../../src/format/container.js";
import { parseManifest } from "../../src/format/manifest.js";
import { reportError as verifyError } from "../../src/verify.js";
import { decide } from "../../src/store/prune.js";
import { treeHashes } from "../helpers/cli.js";

interface Db { pragma(s: string): unknown; exec(s: string): void; prepare(s: string): { run(...a: unknown[]): unknown; get(): unknown }; close(): void }
const openDatabase = createRequire(import.meta.url)("better-sqlite3") as new (p: string, o?: { readonly?: boolean }) => Db;
import { generateKvDump } from "../helpers/kv-dump.js";
import { commitAll, git, initRepo, repoRefs, statusSummary, writeFiles } from "../helpers/git.js";
import { generatePfimgStore } from "../helpers/pfimg-store.js";

const work = mkdtempSync(join(tmpdir(), "memsnap-incremental-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const TOKEN = "ghp_" + "Zq7Rk2Lm9Xv4Tb8Nc3Wd6Hy1Pf5Gs0Ja2Ke4"; // GitHub token shape, not a real one

/** Every regular file under `root`: relative path → SHA-256 of its bytes. */
const tree = (root: string): Record<string, string> => treeHashes(root);

/** tree() of a memory directory without deploy.md (redacted in every bundle, so restored with a placeholder). */
function live(root: string): Record<string, string> {
  const t = tree(root);
  delete t["deploy.md"];
  return t;
}

let dir = "";
let store = "";
let config: MemsnapConfig;
let keys: { identities: string[] };
let recipient = "";

beforeEach(async () => {
  dir = mkdtempSync(join(work, "agent-"));
  store = join(dir, "store");
  mkdirSync(join(dir, "memory"));
  for (let i = 0; i < 40; i++) writeFileSync(join(dir, "memory", `note-${i}.md`), `# note ${i}\n${"the agent remembered something\n".repeat(50 + i)}`);
  writeFileSync(join(dir, "memory", "deploy.md"), `push with ${TOKEN}\n`);
  generateKvDump({ dir: join(dir, "kv"), seed: 7, sequences: 6, prefixBlocks: 2, ownBlocks: 3, hashes: false });
  config = parseConfig({
    agent: "inc",
    sources: [{ kind: "files", name: "memory", path: "memory" }, { kind: "kv", name: "kv", path: "kv", format: "memsnap" }],
  }, null, dir);
  const id = await generateIdentity();
  keys = { identities: [id.identity] };
  recipient = id.recipient;
});

async function snap(extra: { recipients?: string[]; incremental?: boolean; redact?: boolean } = {}) {
  return snapshot({ config, store, recipients: extra.recipients ?? [recipient], incremental: extra.incremental ?? true, ...(extra.redact === false ? { redact: false } : {}) });
}

/** Overwrite `n` bytes at `at` of `file` with random ones (a KV page changes; size and name stay). */
function scribble(file: string, at: number, n: number): void {
  const fd = openSync(file, "r+");
  writeSync(fd, randomBytes(n), 0, n, at);
  closeSync(fd);
}

function kvDataFiles(): string[] {
  return readdirSync(join(dir, "kv", "data")).sort().map((f) => join(dir, "kv", "data", f));
}

describe("incremental snapshots", () => {
  it("references what did not change, stores what did, and restores to the same tree as a full snapshot", async () => {
    const first = await snap();
    expect(first.incremental).toMatchObject({ referenced: 0, bases: [] });
    expect(first.manifest.parent).toBeNull(); // the agent's first snapshot in the store
    expect(first.manifest.manifest_version).toBe(1); // nothing referenced: readable by every memsnap
    appendFileSync(join(dir, "memory", "note-3.md"), "one more line\n");
    writeFileSync(join(dir, "memory", "new.md"), "a new memory\n");
    rmSync(join(dir, "memory", "note-5.md"));
    const data = kvDataFiles();
    expect(data.length).toBeGreaterThan(0);
    scribble(data[0]!, 100, 64); // one page of the first data file
    const second = await snap();
    const m = second.manifest;
    expect(m.parent).toBe(first.id); // the snapshot it follows: the agent's newest in the store
    expect(m.manifest_version).toBe(2);
    expect(m.bases).toEqual([{ snapshot_id: first.id, seal: first.manifest.seal }]);
    const memory = m.layers.find((l) => l.name === "memory")!;
    expect(memory.referenced).toBe(39); // 40 notes + deploy.md, less note-3 (changed) and note-5 (gone)
    expect(m.layers.find((l) => l.name === "kv")!.referenced).toBeGreaterThan(0);
    expect(second.incremental!.referenced).toBe(memory.referenced! + m.layers.find((l) => l.name === "kv")!.referenced!);
    expect(second.bundleBytes).toBeLessThan(first.bundleBytes / 2);
    // the redaction report still names the referenced text's finding
    expect((m.redaction as { redacted: Record<string, unknown> }).redacted["memory/deploy.md"]).toBeTruthy();

    const inc = join(dir, "restored-inc");
    await restoreToDir(second.path, inc, { keys });
    expect(live(join(inc, "memory"))).toEqual(live(join(dir, "memory")));
    const full = await snap({ incremental: false });
    const fullDir = join(dir, "restored-full");
    await restoreToDir(full.path, fullDir, { keys });
    expect(tree(join(inc, "memory"))).toEqual(tree(join(fullDir, "memory")));
    expect(tree(join(inc, "kv"))).toEqual(tree(join(dir, "kv")));
    expect(readFileSync(join(inc, "memory", "deploy.md"), "utf8")).toContain("[REDACTED:");

    const v = await verifyBundle(second.path, { keys });
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
    expect(v.checks.find((c) => c.name === "references")).toMatchObject({ status: "passed" });
    const keyless = await verifyBundle(second.path);
    expect(keyless.checks.find((c) => c.name === "bases")).toMatchObject({ status: "passed" });
    expect(keyless.checks.find((c) => c.name === "references")).toMatchObject({ status: "skipped" });
  });

  it("shuffled KV pages (layer schema 3) are referenced too, and an incremental restore puts them back in place", async () => {
    config = parseConfig({
      agent: "inc",
      sources: [{ kind: "files", name: "memory", path: "memory" }, { kind: "kv", name: "kv", path: "kv", format: "memsnap", shuffle: "on" }],
    }, null, dir);
    const first = await snap();
    const kv1 = first.manifest.layers.find((l) => l.name === "kv")!;
    expect(kv1.schema_version).toBe(3);
    expect((kv1.meta as { shuffle: { applied: boolean } }).shuffle.applied).toBe(true);
    scribble(kvDataFiles()[0]!, 100, 64);
    const second = await snap();
    const kv2 = second.manifest.layers.find((l) => l.name === "kv")!;
    expect(kv2.referenced).toBeGreaterThan(0);
    expect(kv2.schema_version).toBe(3);
    const inc = join(dir, "restored-shuffled");
    await restoreToDir(second.path, inc, { keys });
    expect(tree(join(inc, "kv"))).toEqual(tree(join(dir, "kv")));
    const v = await verifyBundle(second.path, { keys, deep: true });
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
  });

  it("references never chain: a third snapshot references the bundles that hold the bytes", async () => {
    const first = await snap();
    appendFileSync(join(dir, "memory", "note-1.md"), "x\n");
    const second = await snap();
    appendFileSync(join(dir, "memory", "note-2.md"), "y\n");
    const third = await snap();
    expect(third.manifest.bases!.map((b) => b.snapshot_id).sort()).toEqual([first.id, second.id].sort());
    const layout = await readLayout(third.path);
    expect(parseManifest(layout.manifestBytes).bases).toHaveLength(2);
    const out = join(dir, "r3");
    await restoreToDir(third.path, out, { keys });
    expect(live(join(out, "memory"))).toEqual(live(join(dir, "memory")));
    expect(tree(join(out, "kv"))).toEqual(tree(join(dir, "kv")));
  });

  it("a plaintext incremental bundle lists its references in the manifest's index too, and verifies without a key", async () => {
    await snap({ recipients: [], redact: false });
    appendFileSync(join(dir, "memory", "note-1.md"), "x\n");
    const second = await snap({ recipients: [], redact: false });
    const idx = second.manifest.index!;
    expect(idx.filter((e) => e.ref !== undefined).length).toBe(second.incremental!.referenced);
    const v = await verifyBundle(second.path);
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
    expect(v.checks.find((c) => c.name === "references")).toMatchObject({ status: "passed" });
  });

  it("nothing is referenced across other recipients, a passphrase, or other redaction settings", async () => {
    await snap();
    const other = await generateIdentity();
    const r1 = await snap({ recipients: [other.recipient] });
    expect(r1.incremental).toMatchObject({ referenced: 0 });
    expect(r1.incremental!.reason).toMatch(/encrypted differently/);
    const r2 = await snap({ recipients: [other.recipient], redact: false });
    expect(r2.incremental).toMatchObject({ referenced: 0 });
    expect(r2.incremental!.reason).toMatch(/redaction/);
    const r3 = await snapshot({ config, store, passphrase: "correct horse", scryptLogN: 10, incremental: true });
    expect(r3.incremental).toMatchObject({ referenced: 0 });
    expect(r3.incremental!.reason).toMatch(/passphrase/);
    await expect(snapshot({ config, out: join(dir, "x.memsnap"), incremental: true })).rejects.toMatchObject({ code: "MEMSNAP_USAGE" });
  });

  it("a same-size rewrite with the old timestamps is still seen (ctime): packed, not referenced", async () => {
    await snap();
    const f = join(dir, "memory", "note-7.md");
    const stamp = join(dir, "stamp");
    writeFileSync(stamp, "");
    execFileSync("touch", ["-r", f, stamp]);
    const text = readFileSync(f, "utf8");
    writeFileSync(f, text.replace("remembered", "REMEMBERED"));
    execFileSync("touch", ["-r", stamp, f]);
    const second = await snap();
    const e = second.manifest.layers.find((l) => l.name === "memory")!;
    expect(e.referenced).toBe(40); // all but note-7
    const out = join(dir, "r");
    await restoreToDir(second.path, out, { keys });
    expect(readFileSync(join(out, "memory", "note-7.md"), "utf8")).toContain("REMEMBERED");
  });
});

describe("bases: missing, replaced, altered", () => {
  async function pair(): Promise<{ first: Awaited<ReturnType<typeof snap>>; second: Awaited<ReturnType<typeof snap>> }> {
    const first = await snap();
    appendFileSync(join(dir, "memory", "note-1.md"), "x\n");
    const second = await snap();
    expect(second.manifest.bases).toHaveLength(1);
    return { first, second };
  }

  it("a missing base: MEMSNAP_BASE_MISSING before anything is written; verify says which", async () => {
    const { first, second } = await pair();
    renameSync(first.path, `${first.path}.away`);
    const out = join(dir, "r");
    await expect(restoreToDir(second.path, out, { keys })).rejects.toMatchObject({ code: "MEMSNAP_BASE_MISSING" });
    expect(readdirSync(dir).filter((n) => n.startsWith("r") && n !== "restored")).toEqual([]);
    const v = await verifyBundle(second.path, { keys });
    expect(v.ok).toBe(false);
    expect(v.checks.find((c) => c.name === "bases")).toMatchObject({ status: "failed" });
    // what the CLI then says: where the base should be, not that this bundle is damaged
    const e = verifyError(v);
    expect(e.code).toBe("MEMSNAP_BASE_MISSING");
    expect(e.hint).toMatch(/^copy the base bundle next to it/);
    expect(e.hint).not.toMatch(/damaged/);
  });

  it("another bundle under the base's name (a different seal): MEMSNAP_BASE_MISMATCH", async () => {
    const { first, second } = await pair();
    const other = await snap({ incremental: false });
    rmSync(first.path);
    copyFileSync(other.path, first.path);
    await expect(restoreToDir(second.path, join(dir, "r"), { keys })).rejects.toMatchObject({ code: "MEMSNAP_BASE_MISMATCH" });
  });

  it("a base whose payload was altered: the restore fails on the base's own hashes and leaves nothing", async () => {
    const { first, second } = await pair();
    const layout = await readLayout(first.path);
    const fd = openSync(first.path, "r+");
    const b = Buffer.alloc(1);
    const at = layout.payloadOffset + Math.floor(layout.payloadSize / 2);
    readSync(fd, b, 0, 1, at);
    b.writeUInt8(b.readUInt8(0) ^ 0x55, 0);
    writeSync(fd, b, 0, 1, at);
    closeSync(fd);
    const out = join(dir, "r");
    await expect(restoreToDir(second.path, out, { keys })).rejects.toMatchObject({ code: expect.stringMatching(/MEMSNAP_(DECRYPT_FAILED|PAYLOAD_HASH_MISMATCH|ARTIFACT_HASH_MISMATCH)/) });
    expect(() => statSync(out)).toThrow();
    expect(readdirSync(dir).filter((n) => n.includes("memsnap-staging"))).toEqual([]);
    const v = await verifyBundle(second.path, { keys });
    expect(v.ok).toBe(false);
    expect(v.checks.find((c) => c.name === "references")).toMatchObject({ status: "failed" });
  });
});

describe("the incremental cache", () => {
  it("its key holds the secretlint versions installed: other rules redact other text, so nothing is referenced across them", async () => {
    const { incrementalKey } = await import("../../src/snapshot/incremental.js");
    const { secretlintVersions } = await import("../../src/redact/secretlint.js");
    const v = secretlintVersions();
    const req = createRequire(import.meta.url);
    const core = (req("@secretlint/core/package.json") as { version: string }).version;
    expect(v).toContain(`core ${core}`);
    expect(v).not.toContain("unknown");
    const a = incrementalKey("t", "a", [], { settings: null, rules: v });
    const b = incrementalKey("t", "a", [], { settings: null, rules: `${v}.1` });
    expect(a!.redaction).not.toBe(b!.redaction);
  });

  it("a line that is not well formed is skipped, the rest still count", async () => {
    const first = await snap();
    const { ReferenceSet, cachePath } = await import("../../src/snapshot/incremental.js");
    const file = cachePath(dir, "default", "inc");
    const [header, ...lines] = readFileSync(file, "utf8").split("\n").filter(Boolean);
    const h = JSON.parse(header!) as { tenant: string; agent: string; encryption: string; redaction: string };
    const key = { tenant: h.tenant, agent: h.agent, encryption: h.encryption, redaction: h.redaction };
    const good = lines.find((l) => l.startsWith('"memory/note-1.md"'))!;
    const t = good.split("\t");
    const variant = (i: number, v: string): string => t.map((x, j) => (j === i ? v : x)).join("\t");
    const bad = [
      t.slice(0, 5).join("\t"), // a field short
      `${good}\textra`, // a field over
      variant(0, '"memory/unterminated'), // not JSON
      variant(0, "42"), // JSON, not a string
      variant(2, "1e3"), variant(2, "-1"), variant(2, ""), variant(2, "007"), // sizes that are not plain decimals
      variant(3, "zz".repeat(32)), variant(3, "ab".repeat(31)), // digests that are not 64 hex digits
      variant(4, "01NOTABUNDLEINTHESTORE0000"), // a bundle the header does not list
    ];
    writeFileSync(file, [header, good, ...bad.map((l, i) => l.replace('"memory/note-1.md"', `"memory/bad-${i}.md"`)), ""].join("\n"));
    const r = await ReferenceSet.load(file, key, join(store, "default", "inc"));
    expect(r.reason).toBeNull();
    expect(r.size).toBe(1);
    expect(r.from).toBe(first.id);
  });
});

describe("ProcessFork stores in incremental snapshots", () => {
  it("unchanged blobs are referenced, their raw sizes read from the frame headers; the layer meta and the findings stay the same", async () => {
    const g = generatePfimgStore({ root: join(dir, "pf"), forks: 2, pages: 3, zeroPages: 1, secret: true });
    config = parseConfig({ agent: "inc", sources: [{ kind: "pfimg", name: "pf", store: "pf" }] }, null, dir);
    const first = await snap();
    const m1 = first.manifest.layers[0]!.meta as Record<string, unknown>;
    const found1 = (first.manifest.redaction as { unredacted: Record<string, unknown> }).unredacted;
    expect(Object.keys(found1).length).toBeGreaterThan(0); // the store's planted secret, in a text blob

    const second = await snap();
    const l2 = second.manifest.layers[0]!;
    expect(l2.referenced).toBe(g.blobs); // every blob; the image manifests are small and stored again
    expect(l2.meta).toEqual(m1);
    const atSecond = tree(join(dir, "pf"));

    // A frame that does not declare its size (zstd --no-content-size) is packed again, which measures it.
    const blobs = readdirSync(join(dir, "pf", "blobs", "sha256"), { recursive: true, encoding: "utf8" })
      .filter((n) => n.endsWith(".zst")).map((n) => join(dir, "pf", "blobs", "sha256", n));
    const biggest = blobs.sort((a, b) => statSync(b).size - statSync(a).size)[0]!;
    const content = execFileSync("zstd", ["-d", "-c", "-q", biggest]);
    writeFileSync(biggest, execFileSync("zstd", ["-3", "-c", "-q", "--no-content-size"], { input: content }));
    const reencoded = await snap();
    expect(reencoded.manifest.layers[0]!.referenced).toBe(g.blobs - 1); // that file changed
    const fourth = await snap(); // unchanged now, but its size is not declared: packed again
    expect(fourth.manifest.layers[0]!.referenced).toBe(g.blobs - 1);
    const raw = (m: unknown): unknown => {
      const x = m as { raw_bytes: number; bytes_by_layer: Record<string, { raw_bytes: number }> };
      return [x.raw_bytes, Object.fromEntries(Object.entries(x.bytes_by_layer).map(([k, v]) => [k, v.raw_bytes]))];
    };
    expect(raw(fourth.manifest.layers[0]!.meta)).toEqual(raw(m1)); // (its stored size is the new frame's)
    expect((second.manifest.redaction as { unredacted: Record<string, unknown> }).unredacted).toEqual(found1);

    const out = join(dir, "r");
    await restoreToDir(second.path, out, { keys });
    expect(tree(join(out, "pf"))).toEqual(atSecond);
    const v = await verifyBundle(second.path, { keys, deep: true });
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
  });
});

describe("a partial restore (--only) needs only the bases its layers reference", () => {
  for (const encrypted of [true, false]) {
    it(`a layer with no references restores with the base gone; one with references says MEMSNAP_BASE_MISSING and touches nothing (${encrypted ? "encrypted" : "plaintext"})`, async () => {
      mkdirSync(join(dir, "notes"));
      writeFileSync(join(dir, "notes", "a.md"), "first a\n");
      config = parseConfig({
        agent: "inc",
        sources: [{ kind: "files", name: "memory", path: "memory" }, { kind: "files", name: "notes", path: "notes" }],
      }, null, dir);
      const recipients = encrypted ? [recipient] : [];
      const first = await snap({ recipients, redact: false });
      writeFileSync(join(dir, "notes", "a.md"), "second a, rewritten\n"); // every file of notes changes
      const second = await snap({ recipients, redact: false });
      expect(second.manifest.layers.find((l) => l.name === "notes")!.referenced ?? 0).toBe(0);
      expect(second.manifest.layers.find((l) => l.name === "memory")!.referenced).toBe(41);
      renameSync(first.path, `${first.path}.away`);

      writeFileSync(join(dir, "notes", "a.md"), "live, later\n");
      appendFileSync(join(dir, "memory", "note-0.md"), "live, later\n");
      const memoryBefore = tree(join(dir, "memory"));
      const r = await restoreInPlace(second.path, config, { keys, only: ["notes"], safetySnapshot: false });
      expect(r.layers).toEqual(["notes"]);
      expect(readFileSync(join(dir, "notes", "a.md"), "utf8")).toBe("second a, rewritten\n");
      expect(tree(join(dir, "memory"))).toEqual(memoryBefore);

      await expect(restoreInPlace(second.path, config, { keys, only: ["memory"], safetySnapshot: false }))
        .rejects.toMatchObject({ code: "MEMSNAP_BASE_MISSING" });
      expect(tree(join(dir, "memory"))).toEqual(memoryBefore);
      // the whole bundle still needs it, up front
      await expect(restoreInPlace(second.path, config, { keys, safetySnapshot: false })).rejects.toMatchObject({ code: "MEMSNAP_BASE_MISSING" });
      // and into a directory alike
      const notesOnly = join(dir, `notes-only-${encrypted}`);
      await restoreToDir(second.path, notesOnly, { keys, only: ["notes"] });
      expect(readFileSync(join(notesOnly, "notes", "a.md"), "utf8")).toBe("second a, rewritten\n");
      expect(existsSync(join(notesOnly, "memory"))).toBe(false);
      const memoryOnly = join(dir, `memory-only-${encrypted}`);
      await expect(restoreToDir(second.path, memoryOnly, { keys, only: ["memory"] })).rejects.toMatchObject({ code: "MEMSNAP_BASE_MISSING" });
      expect(existsSync(memoryOnly)).toBe(false);
      expect(readdirSync(dir).filter((n) => n.includes("memsnap-staging"))).toEqual([]);

      renameSync(`${first.path}.away`, first.path);
      await restoreInPlace(second.path, config, { keys, only: ["memory"], safetySnapshot: false });
      expect(readFileSync(join(dir, "memory", "note-0.md"), "utf8")).not.toContain("live, later");
      expect(readFileSync(join(dir, "notes", "a.md"), "utf8")).toBe("second a, rewritten\n");
    });
  }
});

describe("the store keeps what incremental snapshots need", () => {
  it("prune keeps a kept snapshot's bases; delete refuses a base unless --force", async () => {
    const first = await snap();
    appendFileSync(join(dir, "memory", "note-1.md"), "x\n");
    const second = await snap();
    const all = await listSnapshots(store);
    const d = decide(all, { last: 1 });
    expect(d.find((x) => x.snapshot.id === second.id)).toMatchObject({ keep: true });
    expect(d.find((x) => x.snapshot.id === first.id)).toMatchObject({ keep: true, reasons: [`base of ${second.id}`] });
    await expect(deleteSnapshots(store, [await findSnapshot(store, first.id)])).rejects.toMatchObject({ code: "MEMSNAP_USAGE", message: expect.stringMatching(/references artifacts in it/) });
    const both = await deleteSnapshots(store, [await findSnapshot(store, first.id), await findSnapshot(store, second.id)], { force: true });
    expect(both).toHaveLength(2);
  });

  it("the cache stays beside the agent, mode 0600, and a snapshot that fails leaves the old one", async () => {
    // what a snapshot killed before its commit left (a dead pid's temp file) is removed
    const deadPid = spawnSync(process.execPath, ["-e", "0"]).pid!;
    mkdirSync(join(dir, ".memsnap"), { recursive: true });
    writeFileSync(join(dir, ".memsnap", `incremental-default-inc.jsonl.tmp-${deadPid}`), "partial");
    const first = await snap();
    expect(readdirSync(join(dir, ".memsnap")).filter((n) => n.includes(".tmp-"))).toEqual([]);
    const cache = join(dir, ".memsnap", "incremental-default-inc.jsonl");
    expect(statSync(cache).mode & 0o777).toBe(0o600);
    const before = readFileSync(cache, "utf8");
    expect(before.split("\n")[0]).toContain(first.id);
    expect(JSON.stringify(readdirSync(store, { recursive: true }))).not.toContain("incremental-");
    // a source that vanishes mid-way fails the snapshot: the cache is the first one's still
    rmSync(join(dir, "kv"), { recursive: true });
    await expect(snap()).rejects.toMatchObject({ code: "MEMSNAP_SOURCE_MISSING" });
    expect(readFileSync(cache, "utf8")).toBe(before);
    expect(readdirSync(join(dir, ".memsnap")).filter((n) => n.includes(".tmp-") || n.includes(".new-"))).toEqual([]);
  });
});

describe("SQLite databases in incremental snapshots", () => {
  async function dbConfig(): Promise<MemsnapConfig> {
    const Database = openDatabase;
    mkdirSync(join(dir, "db"));
    for (const [name, wal] of [["facts.db", false], ["live.db", true]] as const) {
      const db = new Database(join(dir, "db", name));
      if (wal) db.pragma("journal_mode = WAL");
      db.exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)");
      const ins = db.prepare("INSERT INTO t (v) VALUES (?)");
      for (let i = 0; i < 500; i++) ins.run(`row ${i} ${"x".repeat(100)}`);
      db.close(); // a WAL database's close checkpoints: its -wal is empty or gone
    }
    return parseConfig({ agent: "inc", sources: [{ kind: "sqlite", name: "db", path: "db" }] }, null, dir);
  }

  it("an unchanged database read live is referenced without being read again; a written one is stored", async () => {
    config = await dbConfig();
    const first = await snap();
    const m1 = first.manifest.layers[0]!.meta as { databases: Record<string, { method: string }> };
    expect(Object.values(m1.databases).map((d) => d.method)).toEqual(["live_read", "live_read"]);
    const second = await snap();
    expect(second.manifest.layers[0]!.referenced).toBe(2);
    const m2 = second.manifest.layers[0]!.meta as { databases: Record<string, { reused?: boolean; tables: Record<string, number> }> };
    expect(m2.databases["facts.db"]).toMatchObject({ reused: true, tables: { t: 500 } });

    const Database = openDatabase;
    const live = new Database(join(dir, "db", "live.db"));
    live.prepare("INSERT INTO t (v) VALUES ('written after the second snapshot')").run();
    // the writer stays open: its row is in the -wal, not yet in the file
    const third = await snap();
    live.close();
    // facts.db referenced whole; live.db (a copy, its WAL folded in) chunked: its unchanged pages are references
    expect(third.manifest.layers[0]!.referenced).toBe(2);
    expect(third.incremental!.chunked).toBe(1);
    const m3 = third.manifest.layers[0]!.meta as { databases: Record<string, { reused?: boolean; tables: Record<string, number> }> };
    expect(m3.databases["live.db"]!.reused).toBeUndefined();
    expect(m3.databases["live.db"]!.tables.t).toBe(501);
    const out = join(dir, "r");
    await restoreToDir(third.path, out, { keys });
    const back = new Database(join(out, "db", "live.db"), { readonly: true });
    expect(back.prepare("SELECT count(*) AS n FROM t").get()).toEqual({ n: 501 });
    back.close();
    const facts = new Database(join(out, "db", "facts.db"), { readonly: true });
    expect(facts.prepare("SELECT count(*) AS n FROM t").get()).toEqual({ n: 500 });
    facts.close();
    const v = await verifyBundle(third.path, { keys, deep: true });
    expect(v.ok, JSON.stringify(v.findings)).toBe(true);
  });
});

describe("git repositories in incremental snapshots", () => {
  type GitMeta = { bundle_reused?: boolean; bundle_bytes?: number; history_scan: unknown; ref_count: number; head: { oid: string } };
  const layerOf = (m: { layers: { name: string; referenced?: number; meta?: unknown }[] }) => m.layers.find((l) => l.name === "mem")!;
  const unredacted = (m: { redaction?: unknown }) => (m.redaction as { unredacted: Record<string, Record<string, number>> }).unredacted["mem/repo.bundle"];

  function repo(): void {
    const root = initRepo(join(dir, "mem"));
    writeFiles(root, { "facts.md": "# facts\nthe sky is blue\n", "deploy.md": `push with ${TOKEN}\n` });
    commitAll(root, "first memories");
    writeFiles(root, { "deploy.md": "push with the key from the vault\n" }); // the token stays in history only
    commitAll(root, "drop the token");
    config = parseConfig({ agent: "inc", sources: [{ kind: "git", name: "mem", path: "mem" }] }, null, dir);
  }

  for (const impl of ["git", "isomorphic"]) {
    it(`unchanged refs: the last bundle is referenced with its history scan (${impl}); a commit writes a new one`, async () => {
      const before = process.env.MEMSNAP_GIT_IMPL;
      process.env.MEMSNAP_GIT_IMPL = impl;
      try {
        repo();
        const root = join(dir, "mem");
        const first = await snap();
        const m1 = layerOf(first.manifest).meta as GitMeta;
        expect(m1.bundle_bytes).toBeGreaterThan(0);
        expect(m1.bundle_reused).toBeUndefined();
        expect(unredacted(first.manifest)).toBeTruthy(); // the token in the first commit

        // Memory edited, nothing committed: the refs are the same.
        writeFiles(root, { "facts.md": "# facts\nthe sky is blue\nwater is wet\n", "scratch.md": "a thought\n" });
        const second = await snap();
        const l2 = layerOf(second.manifest);
        const m2 = l2.meta as GitMeta;
        expect(m2.bundle_reused).toBe(true);
        expect(m2.bundle_bytes).toBe(m1.bundle_bytes);
        expect(m2.history_scan).toEqual(m1.history_scan);
        expect(m2.head.oid).toBe(m1.head.oid);
        expect(m2.ref_count).toBe(m1.ref_count);
        // (the source never wrote this bundle: packing it instead of referencing it would fail)
        // (with the git binary, the bundle's pack index is referenced with it)
        expect(l2.referenced).toBe(impl === "git" ? 2 : 1);
        expect(second.manifest.bases).toEqual([{ snapshot_id: first.id, seal: first.manifest.seal }]);
        // the findings in the referenced history are still this snapshot's
        expect(unredacted(second.manifest)).toEqual(unredacted(first.manifest));
        const out = join(dir, "r2");
        await restoreToDir(second.path, out, { keys });
        expect(repoRefs(join(out, "mem"))).toEqual(repoRefs(root));
        expect(statusSummary(join(out, "mem"))).toEqual(statusSummary(root));
        expect(readFileSync(join(out, "mem", "facts.md"), "utf8")).toContain("water is wet");

        // A commit moves a ref: a new bundle, scanned again.
        commitAll(root, "remember water");
        const third = await snap();
        const m3 = layerOf(third.manifest).meta as GitMeta;
        expect(m3.bundle_reused).toBeUndefined();
        // everything was committed; with git, the new bundle holds only the commit (a chain:
        // test/sources/git-incremental.test.ts) and the first is referenced, with its index
        expect(layerOf(third.manifest).referenced ?? 0).toBe(impl === "git" ? 2 : 0);
        expect(m3.head.oid).not.toBe(m1.head.oid);
        const out3 = join(dir, "r3");
        await restoreToDir(third.path, out3, { keys });
        expect(repoRefs(join(out3, "mem"))).toEqual(repoRefs(root));
        // A new branch at the same commit changes the refs too.
        git(root, ["branch", "side"]);
        const fourth = await snap();
        expect((layerOf(fourth.manifest).meta as GitMeta).bundle_reused).toBeUndefined();
        const v = await verifyBundle(second.path, { keys, deep: true });
        expect(v.ok, JSON.stringify(v.findings)).toBe(true);
        // the referenced bundle got git's own check too, read from the first snapshot (with the
        // git binary, its pack index too)
        const referenced = impl === "git" ? 2 : 1;
        expect(v.checks.find((c) => c.name === "deep")?.detail).toMatch(new RegExp(`, ${referenced} of them referenced, in bases$`));
      } finally {
        if (before === undefined) delete process.env.MEMSNAP_GIT_IMPL;
        else process.env.MEMSNAP_GIT_IMPL = before;
      }
    });
  }

  it("a plaintext incremental snapshot is still refused for secrets in a referenced history", async () => {
    repo();
    const first = await snapshot({ config, store, recipients: [], incremental: true, allowUnredacted: true });
    expect(unredacted(first.manifest)).toBeTruthy();
    writeFiles(join(dir, "mem"), { "scratch.md": "a thought\n" });
    await expect(snapshot({ config, store, recipients: [], incremental: true })).rejects.toMatchObject({ code: "MEMSNAP_UNREDACTED_SECRETS" });
    const again = await snapshot({ config, store, recipients: [], incremental: true, allowUnredacted: true });
    expect((layerOf(again.manifest).meta as GitMeta).bundle_reused).toBe(true);
    expect(unredacted(again.manifest)).toEqual(unredacted(first.manifest));
  });
});
