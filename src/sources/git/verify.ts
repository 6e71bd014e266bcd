/** Deep verification of a git bundle: git unbundles it into a scratch repository (or isomorphic-git indexes it). */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream, createWriteStream, rmSync } from "node:fs";
import { mkdtemp, readFile, rename, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { LayerEntry } from "../../format/manifest.js";
import type { ChainLink } from "./chain.js";
import { checkPackTrailer, readBundleHeader, type BundleHeader } from "./format.js";
import { checkAndCopyPack } from "./pack-index.js";
import { isoVerifyBundle } from "./iso.js";
import { gitEnv, gitImpl, runGit, said, type GitCtx } from "./run.js";

/** What a check of bundles found: a problem, or none, and the SHA-256 of the first bundle's pack index when asked for. */
export interface ChainCheck {
  problem: string | null;
  /** Hex SHA-256 of the index git writes for the first bundle's pack (with `withIndex`). */
  indexSha256?: string;
}

/**
 * Why the bundle file at `path` is not a complete, sound git bundle, or null; with
 * `withIndex`, also the SHA-256 of the pack index git writes for it (see verifyChainFiles).
 */
export async function verifyBundleFile(path: string, withIndex = false): Promise<ChainCheck> {
  if (gitImpl() === "isomorphic-git") return { problem: await isoVerifyBundle(path) };
  const h = await readBundleHeader(path);
  if (typeof h === "string") return { problem: h };
  if (h.prerequisites.length) {
    return { problem: `needs ${h.prerequisites.length} prerequisite commit(s); memsnap writes complete bundles` };
  }
  return verifyChainFiles([[path, "repo.bundle"]], join(dirname(path), "r"), withIndex);
}

/**
 * Index the pack of the whole bundle at `path` into the scratch repository `repo` as restore
 * installs one with its stored index (./pack-index.ts), but with the index git writes for it
 * (`git index-pack`: every object inflated and hashed): the checks restore makes, then its refs
 * created. Returns the index's SHA-256, which the stored one must match, or a problem.
 */
async function indexWholeBundle(
  g: GitCtx,
  repo: string,
  path: string,
  h: BundleHeader,
): Promise<{ sha256: string } | string> {
  const packDir = join(repo, "objects", "pack");
  const pack = join(packDir, "tmp_verify.pack");
  const idx = join(packDir, "tmp_verify.idx");
  const child = spawn("git", ["index-pack", "--stdin", "-o", idx, pack], {
    cwd: dirname(repo),
    env: g.env,
    stdio: ["pipe", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.on("data", (b: Buffer) => {
    if (out.length < 1024) out += b.toString("latin1");
  });
  let err = "";
  child.stderr.on("data", (b: Buffer) => {
    if (err.length < 64 * 1024) err += b.toString("utf8");
  });
  const code = new Promise<number>((res) => {
    child.on("error", () => res(-1));
    child.on("close", (c) => res(c ?? -1));
  });
  await pipeline(createReadStream(path, { start: h.packOffset, highWaterMark: 1 << 20 }), child.stdin).catch(
    () => undefined,
  );
  if ((await code) !== 0) return `git index-pack failed: ${said(err)}`;
  const facts = await checkAndCopyPack(path, h.packOffset, idx, h.objectFormat === "sha256" ? 32 : 20, null);
  if (typeof facts === "string") return facts;
  const sha256 = createHash("sha256").update(await readFile(idx)).digest("hex");
  // index-pack says the pack's name (its checksum); the checks above agree where they ran.
  const hex = /([0-9a-f]{40}([0-9a-f]{24})?)\s*$/.exec(out)?.[1];
  if (!hex || (facts && facts.packName !== hex)) return `git index-pack named the pack ${JSON.stringify(out.trim())}`;
  await rename(pack, join(packDir, `pack-${hex}.pack`));
  await rename(idx, join(packDir, `pack-${hex}.idx`));
  const refs = h.refs.filter((r) => r.name.startsWith("refs/"));
  if (refs.length) {
    const r = await runGit(["update-ref", "-z", "--stdin"], g, refs.map((x) => `create ${x.name}\0${x.oid}\0`).join(""));
    if (r.code !== 0) return `git update-ref failed: ${said(r.stderr)}`;
  }
  return { sha256 };
}

/**
 * Why the chain of bundle files (`[path, artifact]`, in chain order) is not sound, or null:
 * each is unbundled into one scratch repository at `repo` in turn, after `git bundle verify`
 * checked that the bundles before it hold its prerequisites; every ref of the last must then
 * be in the repository. Without the git binary each bundle's header and packfile checksum only.
 */
export async function verifyChainFiles(
  files: Array<[string, string]>,
  repo: string,
  withIndex = false,
): Promise<ChainCheck> {
  const inner = await checkChain(files, repo, withIndex);
  return typeof inner === "string" || inner === null ? { problem: inner } : { problem: null, indexSha256: inner.sha256 };
}

async function checkChain(
  files: Array<[string, string]>,
  repo: string,
  withIndex: boolean,
): Promise<string | null | { sha256: string }> {
  const headers = [];
  for (const [i, [path, name]] of files.entries()) {
    const h = await readBundleHeader(path);
    if (typeof h === "string") return `${name}: ${h}`;
    if (i === 0 && h.prerequisites.length) return `${name}, the chain's first bundle, needs prerequisite commits`;
    headers.push(h);
  }
  if (gitImpl() === "isomorphic-git") {
    for (const [i, [path, name]] of files.entries()) {
      const bad = await checkPackTrailer(path, headers[i]!.packOffset);
      if (bad) return `${name}: ${bad}`;
    }
    return null;
  }
  const g: GitCtx = { cwd: dirname(repo), env: gitEnv({ GIT_DIR: repo }) };
  const step = async (args: string[], name?: string): Promise<string | null> => {
    const r = await runGit(args, g);
    return r.code === 0
      ? null
      : `${name ? `${name}: ` : ""}git ${args.slice(0, 2).join(" ")} failed: ${said(r.stderr)}`;
  };
  const format = headers[0]!.objectFormat !== "sha1" ? [`--object-format=${headers[0]!.objectFormat}`] : [];
  const init = await step(["init", "-q", "--bare", "--template=", ...format, repo]);
  if (init) return init;
  let indexed: { sha256: string } | null = null;
  for (const [i, [path, name]] of files.entries()) {
    if (i === 0 && withIndex) {
      const r = await indexWholeBundle(g, repo, path, headers[0]!);
      if (typeof r === "string") return files.length > 1 ? `${name}: ${r}` : r;
      indexed = r;
      continue;
    }
    const need = headers[i]!.prerequisites;
    if (need.length) {
      const r = await runGit(["cat-file", "--batch-check=%(objecttype)"], g, `${need.join("\n")}\n`);
      const types = r.stdout.toString("latin1").split("\n");
      const lacking = need.find((_, k) => types[k] !== "commit");
      if (lacking) return `${name} needs commit ${lacking}, which the bundles before it do not hold`;
    }
    const bad =
      (await step(["bundle", "verify", "-q", path], files.length > 1 ? name : undefined)) ??
      // Unbundling indexes the packfile (every object inflated and hashed) and checks that each
      // ref's history is complete.
      (await step(
        ["fetch", "-q", "--no-write-fetch-head", "--no-tags", path, "refs/*:refs/*"],
        files.length > 1 ? name : undefined,
      ));
    if (bad) return bad;
  }
  for (const r of headers.at(-1)!.refs) {
    const bad = await step(["cat-file", "-e", r.oid]);
    if (bad) return `${r.name} points at ${r.oid}, which the bundle${files.length > 1 ? "s lack" : " lacks"}`;
  }
  // Installed, not fetched: the walk a fetch makes (every ref's history complete) is made here.
  if (indexed) {
    const bad = await step(["rev-list", "--objects", "--quiet", "--all"]);
    if (bad) return bad;
  }
  return indexed;
}

/** A chain's bundles as verify --deep reads them (in any order, some from bases), per layer of one verify. */
const pending = new WeakMap<LayerEntry, { dir: Promise<string>; got: Set<string> }>();
const scratchDirs = new Set<string>();
let exitHook = false;

/**
 * verify --deep of one bundle of a chain (`chain`, in order): its bytes are kept in a scratch
 * directory until the layer's last bundle arrives, then the whole chain is checked (and the
 * problem, if any, is reported on that bundle).
 */
export async function deepVerifyChainBundle(
  layer: LayerEntry,
  chain: ChainLink[],
  name: string,
  bytes: AsyncIterable<Buffer>,
  withIndex = false,
): Promise<ChainCheck> {
  let st = pending.get(layer);
  if (!st) {
    const dir = mkdtemp(join(tmpdir(), "memsnap-gitchain-"));
    st = { dir, got: new Set() };
    pending.set(layer, st);
    dir.then(
      (d) => scratchDirs.add(d),
      () => undefined,
    );
    if (!exitHook) {
      exitHook = true; // a verify that stops before the last bundle leaves its scratch: removed on exit
      process.once("exit", () => {
        for (const d of scratchDirs) rmSync(d, { recursive: true, force: true });
      });
    }
  }
  const dir = await st.dir;
  await pipeline(Readable.from(bytes), createWriteStream(join(dir, name), { mode: 0o600 }));
  st.got.add(name);
  if (!chain.every((l) => st.got.has(l.artifact))) return { problem: null };
  pending.delete(layer);
  try {
    return await verifyChainFiles(
      chain.map((l) => [join(dir, l.artifact), l.artifact]),
      join(dir, ".r"),
      withIndex,
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
    scratchDirs.delete(dir);
  }
}
