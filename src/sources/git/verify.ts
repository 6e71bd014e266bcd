/** Deep verification of a git bundle: git unbundles it into a scratch repository (or isomorphic-git indexes it). */
import { createWriteStream, rmSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { LayerEntry } from "../../format/manifest.js";
import type { ChainLink } from "./chain.js";
import { checkPackTrailer, readBundleHeader } from "./format.js";
import { isoVerifyBundle } from "./iso.js";
import { gitEnv, gitImpl, runGit, said, type GitCtx } from "./run.js";

/** Why the bundle file at `path` is not a complete, sound git bundle, or null. */
export async function verifyBundleFile(path: string): Promise<string | null> {
  if (gitImpl() === "isomorphic-git") return isoVerifyBundle(path);
  const h = await readBundleHeader(path);
  if (typeof h === "string") return h;
  if (h.prerequisites.length) {
    return `needs ${h.prerequisites.length} prerequisite commit(s); memsnap writes complete bundles`;
  }
  return verifyChainFiles([[path, "repo.bundle"]], join(dirname(path), "r"));
}

/**
 * Why the chain of bundle files (`[path, artifact]`, in chain order) is not sound, or null:
 * each is unbundled into one scratch repository at `repo` in turn, after `git bundle verify`
 * checked that the bundles before it hold its prerequisites; every ref of the last must then
 * be in the repository. Without the git binary each bundle's header and packfile checksum only.
 */
export async function verifyChainFiles(files: Array<[string, string]>, repo: string): Promise<string | null> {
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
  for (const [i, [path, name]] of files.entries()) {
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
  return null;
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
): Promise<string | null> {
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
  if (!chain.every((l) => st.got.has(l.artifact))) return null;
  pending.delete(layer);
  try {
    return await verifyChainFiles(
      chain.map((l) => [join(dir, l.artifact), l.artifact]),
      join(dir, ".r"),
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
    scratchDirs.delete(dir);
  }
}
