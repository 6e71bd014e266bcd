/** Deep verification of a git bundle: git unbundles it into a scratch repository (or isomorphic-git indexes it). */
import { dirname, join } from "node:path";
import { readBundleHeader } from "./format.js";
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
  const repo = join(dirname(path), "r");
  const g: GitCtx = { cwd: dirname(path), env: gitEnv({ GIT_DIR: repo }) };
  const step = async (args: string[]): Promise<string | null> => {
    const r = await runGit(args, g);
    return r.code === 0 ? null : `git ${args.slice(0, 2).join(" ")} failed: ${said(r.stderr)}`;
  };
  const format = h.objectFormat !== "sha1" ? [`--object-format=${h.objectFormat}`] : [];
  return (await step(["init", "-q", "--bare", "--template=", ...format, repo]))
    ?? (await step(["bundle", "verify", "-q", path]))
    // Unbundling indexes the packfile (every object inflated and hashed) and checks that each
    // ref's history is complete.
    ?? (await step(["fetch", "-q", "--no-write-fetch-head", "--no-tags", path, "refs/*:refs/*"]))
    ?? (await (async () => {
      for (const r of h.refs) {
        const bad = await step(["cat-file", "-e", r.oid]);
        if (bad) return `${r.name} points at ${r.oid}, which the bundle lacks`;
      }
      return null;
    })());
}
