/**
 * The git layer of incremental snapshots: a chain of bundles (src/sources/git/chain.ts). After a
 * commit, the snapshot stores a bundle of only the new objects and references the last one's;
 * restore rebuilds the same repository (refs, objects, fsck) from the chain, --to and in place;
 * verify (keyless, keyed, --deep) follows it; rewritten history, the link bound and the size
 * bound write a full bundle again; a damaged chain is refused. Real git, real age encryption.
 */
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeEach, describe, expect, it } from "vitest";
import {
  generateIdentity, parseConfig, restoreInPlace, restoreToDir, snapshot, verifyBundle, type MemsnapConfig,
} from "../../src/index.js";
import { MAX_LINKS } from "../../src/sources/git/chain.js";
import { commitAll, fastImportRepo, git, initRepo, repoRefs, statusSummary, writeFiles } from "../helpers/git.js";

const work = mkdtempSync(join(tmpdir(), "memsnap-git-incremental-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface Link { artifact: string; fingerprint: string; bytes: number; after?: string }
interface GitMeta {
  bundle_chain?: Link[]; bundle_tips?: string[]; bundle_bytes?: number; bundle_reused?: boolean;
  history_scan: { objects: number } | null;
}
type Snap = Awaited<ReturnType<typeof snapshot>>;

let dir = "";
let root = "";
let store = "";
let config: MemsnapConfig;
let keys: { identities: string[] };
let recipient = "";

beforeEach(async () => {
  dir = mkdtempSync(join(work, "agent-"));
  store = join(dir, "store");
  root = initRepo(join(dir, "mem"));
  // Notes of text that does not compress away: the full bundle is ~50 KB, a link a few hundred bytes.
  const notes = Object.fromEntries(Array.from({ length: 300 }, (_, i) => [
    `notes/n${i}.md`, `# note ${i}\n${createHash("sha256").update(`note ${i}`).digest("hex").repeat(3)}\n`,
  ]));
  writeFiles(root, { "facts.md": "# facts\nthe sky is blue\n", "notes/a.md": "a\n".repeat(500), ...notes });
  commitAll(root, "first memories");
  writeFiles(root, { "notes/b.md": "b\n".repeat(500) });
  commitAll(root, "more memories");
  git(root, ["tag", "-a", "v1", "-m", "tagged"]);
  git(root, ["branch", "old", "HEAD~1"]);
  config = parseConfig({ agent: "inc", sources: [{ kind: "git", name: "mem", path: "mem" }] }, null, dir);
  const id = await generateIdentity();
  keys = { identities: [id.identity] };
  recipient = id.recipient;
});

const snap = (o: { redact?: boolean } = {}): Promise<Snap> =>
  snapshot({ config, store, recipients: [recipient], incremental: true, ...(o.redact === false ? { redact: false } : {}) });
const layer = (s: Snap) => s.manifest.layers.find((l) => l.name === "mem")!;
const meta = (s: Snap): GitMeta => layer(s).meta as unknown as GitMeta;
/** The index entries of the layer's bundles: stored here or referenced (and from which base). */
async function bundleEntries(s: Snap): Promise<Record<string, string>> {
  const { readPayload } = await import("../../src/read/read-payload.js");
  const { readLayout } = await import("../../src/format/container.js");
  const out: Record<string, string> = {};
  await readPayload(await readLayout(s.path), s.manifest, keys, async (info) => {
    if (/\.(bundle|idx)$/.test(info.name)) out[info.name] = "stored";
  }, { streamIndex: true, onRef: (e) => { if (/\.(bundle|idx)$/.test(e.path)) out[e.path] = `ref ${e.ref}`; } });
  return out;
}

/** Refs, every reachable object, and a clean fsck: two repositories hold the same history. */
function history(repo: string): { refs: unknown; objects: string[]; fsck: string } {
  const objects = git(repo, ["rev-list", "--objects", "--all"]).split("\n").filter(Boolean).sort();
  const fsck = git(repo, ["fsck", "--full", "--strict", "--no-dangling"]);
  return { refs: git(repo, ["for-each-ref", "--format=%(objectname) %(objecttype) %(refname)"]), objects, fsck };
}

async function restoredMatches(s: Snap, name: string): Promise<void> {
  const out = join(dir, name);
  await restoreToDir(s.path, out, { keys });
  expect(history(join(out, "mem"))).toEqual(history(root));
  expect(repoRefs(join(out, "mem"))).toEqual(repoRefs(root));
  expect(statusSummary(join(out, "mem"))).toEqual(statusSummary(root));
}

describe("git chains in incremental snapshots", () => {
  it("a commit stores a bundle of the new objects only; restore and verify follow the chain", async () => {
    const first = await snap();
    expect(meta(first).bundle_chain!.map((l) => l.artifact)).toEqual(["repo.bundle"]);
    // A single bundle with its pack's index: schema 3 (a memsnap that knows no index refuses it).
    expect(layer(first).schema_version).toBe(3);
    expect(await bundleEntries(first)).toEqual({ "mem/repo.bundle": "stored", "mem/repo.idx": "stored" });
    expect(meta(first).bundle_index_bytes).toBeGreaterThan(1024 + 8);

    writeFiles(root, { "notes/c.md": "one new note\n" });
    commitAll(root, "remember c");
    const second = await snap();
    const m2 = meta(second);
    expect(m2.bundle_chain!.map((l) => [l.artifact, l.after])).toEqual([["repo.bundle", undefined], ["repo.1.bundle", "repo.bundle"]]);
    expect(layer(second).schema_version).toBe(3);
    expect(layer(second).referenced).toBe(2); // the full bundle and its index
    expect(await bundleEntries(second)).toEqual({
      "mem/repo.bundle": `ref ${first.id}`, "mem/repo.idx": `ref ${first.id}`, "mem/repo.1.bundle": "stored",
    });
    expect(meta(second).bundle_index_bytes).toBe(meta(first).bundle_index_bytes);
    const link = m2.bundle_chain![1]!;
    expect(link.bytes).toBeLessThan(1024); // a commit, a tree or two and a blob
    expect(link.bytes).toBeLessThan(m2.bundle_chain![0]!.bytes / 2);
    expect(m2.bundle_bytes).toBe(m2.bundle_chain![0]!.bytes + link.bytes);
    expect(m2.history_scan!.objects).toBeGreaterThan(meta(first).history_scan!.objects); // the scan covers the chain
    await restoredMatches(second, "r2");

    // A third: a merged branch deleted, a new one, a commit; the chain grows by one, each base
    // referenced where it is.
    git(root, ["branch", "-D", "old"]);
    git(root, ["branch", "side"]);
    writeFiles(root, { "facts.md": "# facts\nthe sky is blue\nwater is wet\n", "scratch.md": "not committed\n" });
    commitAll(root, "water");
    writeFiles(root, { "scratch.md": "uncommitted\n" });
    const third = await snap();
    expect(meta(third).bundle_chain!.map((l) => l.artifact)).toEqual(["repo.bundle", "repo.1.bundle", "repo.2.bundle"]);
    expect(await bundleEntries(third)).toEqual({
      "mem/repo.bundle": `ref ${first.id}`, "mem/repo.idx": `ref ${first.id}`,
      "mem/repo.1.bundle": `ref ${second.id}`, "mem/repo.2.bundle": "stored",
    });
    expect(third.manifest.bases!.map((b) => b.snapshot_id).sort()).toEqual([first.id, second.id].sort());
    await restoredMatches(third, "r3"); // refs/heads/old is gone again (the full bundle had it)

    for (const deep of [false, true]) {
      const v = await verifyBundle(third.path, { keys, deep });
      expect(v.ok, JSON.stringify(v.findings)).toBe(true);
      if (deep) expect(v.checks.find((c) => c.name === "deep")?.detail).toMatch(/3 of them referenced/); // the full bundle, its index, link 1
    }
    const keyless = await verifyBundle(third.path, {});
    expect(keyless.ok, JSON.stringify(keyless.findings)).toBe(true);

    // Nothing moved: every bundle of the chain is referenced, none written.
    const fourth = await snap();
    expect(meta(fourth).bundle_reused).toBe(true);
    expect(meta(fourth).bundle_chain).toEqual(meta(third).bundle_chain);
    expect(await bundleEntries(fourth)).toEqual({
      "mem/repo.bundle": `ref ${first.id}`, "mem/repo.idx": `ref ${first.id}`,
      "mem/repo.1.bundle": `ref ${second.id}`, "mem/repo.2.bundle": `ref ${third.id}`,
    });
    await restoredMatches(fourth, "r4");

    // In place: the live repository goes back to the third snapshot's state.
    const want = history(root);
    writeFiles(root, { "late.md": "later\n" });
    commitAll(root, "later");
    git(root, ["branch", "-D", "side"]);
    await restoreInPlace(third.path, config, { keys, safetySnapshot: false });
    expect(history(root)).toEqual(want);
  });

  it("rewritten history, a deleted unmerged branch or a deleted tag write a full bundle again", async () => {
    await snap();
    writeFiles(root, { "notes/c.md": "c\n" });
    commitAll(root, "c");
    const second = await snap();
    expect(meta(second).bundle_chain).toHaveLength(2);
    git(root, ["reset", "-q", "--hard", "HEAD~1"]); // the commit of the link is dropped
    writeFiles(root, { "notes/d.md": "d\n" });
    commitAll(root, "d instead");
    const third = await snap();
    expect(meta(third).bundle_chain!.map((l) => l.artifact)).toEqual(["repo.bundle"]);
    expect(layer(third).referenced ?? 0).toBe(0);
    expect(layer(third).schema_version).toBe(3);
    await restoredMatches(third, "r3");

    git(root, ["checkout", "-q", "-b", "wip"]);
    writeFiles(root, { "wip.md": "wip\n" });
    commitAll(root, "wip");
    git(root, ["checkout", "-q", "main"]);
    const fourth = await snap();
    expect(meta(fourth).bundle_chain).toHaveLength(2);
    git(root, ["branch", "-D", "wip"]);
    const fifth = await snap();
    expect(meta(fifth).bundle_chain).toHaveLength(1);
    await restoredMatches(fifth, "r5");
    // An annotated tag deleted: its tag object is no longer part of the history.
    writeFiles(root, { "e.md": "e\n" });
    commitAll(root, "e");
    expect(meta(await snap()).bundle_chain).toHaveLength(2);
    git(root, ["tag", "-d", "v1"]);
    const seventh = await snap();
    expect(meta(seventh).bundle_chain).toHaveLength(1);
    await restoredMatches(seventh, "r7");
  });

  it("the chain is bounded: past MAX_LINKS links, a full bundle", async () => {
    const plain = (): Promise<Snap> => snapshot({ config, store, recipients: [], incremental: true, redact: false });
    await plain();
    for (let i = 1; i <= MAX_LINKS + 1; i++) {
      writeFiles(root, { [`n/${i}.md`]: `note ${i}\n` });
      commitAll(root, `note ${i}`);
      const s = await plain();
      expect(meta(s).bundle_chain, `snapshot ${i}`).toHaveLength(i <= MAX_LINKS ? i + 1 : 1);
      if (i === MAX_LINKS) {
        await restoredMatches(s, "rmax");
        const v = await verifyBundle(s.path, { deep: true });
        expect(v.ok, JSON.stringify(v.findings)).toBe(true);
      }
    }
  }, 120_000);

  it("verify --deep finds a chain whose links need commits the bundles before them lack, or that is a cycle", async () => {
    const hostile = new URL("../../fixtures/hostile/", import.meta.url).pathname;
    const cases: Array<[string, RegExp]> = [
      ["git-chain-prerequisite-unmet.memsnap", /repo\.1\.bundle needs commit [0-9a-f]{40}, which the bundles before it do not hold/],
      ["git-chain-out-of-order.memsnap", /repo\.1\.bundle needs commit [0-9a-f]{40}/],
      ["git-chain-cycle.memsnap", /in a cycle of bundles/],
      ["git-chain-first-needs-commits.memsnap", /needs 1 prerequisite commit/],
    ];
    for (const [file, why] of cases) {
      const shallow = await verifyBundle(join(hostile, file), {});
      expect(shallow.ok, file).toBe(true); // every byte is as indexed: only the git layer's own check sees it
      const v = await verifyBundle(join(hostile, file), { deep: true });
      expect(v.ok, file).toBe(false);
      expect(v.findings.map((f) => f.message).join("; "), file).toMatch(why);
    }
  });

  it("links past half the full bundle's bytes: a full bundle", async () => {
    await snap();
    const big = Array.from({ length: 3000 }, (_, i) => `line ${i} ${Math.sin(i)} ${i * 7919 % 104729}\n`).join("");
    writeFiles(root, { "big.md": big });
    commitAll(root, "big");
    const second = await snap();
    expect(meta(second).bundle_chain).toHaveLength(2);
    expect(meta(second).bundle_chain![1]!.bytes).toBeGreaterThan(meta(second).bundle_chain![0]!.bytes / 2);
    writeFiles(root, { "small.md": "small\n" });
    commitAll(root, "small");
    const third = await snap();
    expect(meta(third).bundle_chain).toHaveLength(1);
  });

  it("after one commit to a memdir of 2,000 notes and 300 commits, the new bundle is a few KB", async () => {
    rmSync(root, { recursive: true, force: true });
    mkdirSync(root);
    fastImportRepo(root, { files: 2000, commits: 300 });
    const first = await snap({ redact: false });
    writeFiles(root, { "notes/d0000/n000001.md": "# note 1\n\nrevised\n" });
    commitAll(root, "one more");
    const second = await snap({ redact: false });
    const chain = meta(second).bundle_chain!;
    expect(chain).toHaveLength(2);
    expect(chain[0]!.bytes).toBeGreaterThan(100_000);
    expect(chain[1]!.bytes).toBeLessThan(8 * 1024);
    expect(second.bundleBytes).toBeLessThan(first.bundleBytes / 10);
    await restoredMatches(second, "r2");
  }, 60_000);
});
