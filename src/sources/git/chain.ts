/**
 * Chains of git bundles: in an incremental snapshot, the git layer stores a bundle of only the
 * objects since the last snapshot's refs (a "link", whose header lists every ref and names the
 * commits it builds on as prerequisites) and references the last snapshot's bundles.
 *
 * The layer meta records the chain (`bundle_chain`: each bundle's artifact, fingerprint and
 * size, and `after`, the bundle whose objects it needs) and the objects its refs and HEAD
 * pointed at (`bundle_tips`), which the next link excludes. Restore fetches the bundles in
 * chain order into a fresh repository, then drops the refs the last bundle does not list.
 *
 * Policy (chains stay bounded): a full bundle, not a link, when
 * - the chain would hold more than MAX_LINKS links after its full bundle;
 * - the links would hold more than half the full bundle's bytes;
 * - a tip of the last snapshot is missing or no longer reachable from a ref or HEAD (history
 *   rewritten or a branch deleted unmerged: a link would carry the dropped objects on);
 * - the last snapshot recorded no chain (more than MAX_TIPS tips, or not incremental), or any
 *   of its bundles will not be referenced.
 */
import { createReadStream, createWriteStream } from "node:fs";
import { once } from "node:events";
import type { ChildProcessWithoutNullStreams } from "node:child_process";
import { mkdir, rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import { pipeline } from "node:stream/promises";
import { MemsnapError } from "../../errors.js";
import { BUNDLE_ARTIFACT, BUNDLE_V2_SIGNATURE, BUNDLE_V3_SIGNATURE } from "./format.js";
import { gitStdin, spawnGit, type GitCtx } from "./run.js";

/** Links (incremental bundles) at most after a chain's full bundle. */
export const MAX_LINKS = 16;
/** The links' bytes at most, as a fraction of the full bundle's, before a full bundle is written again. */
export const LINK_FRACTION = 0.5;
/** Distinct objects the refs and HEAD may point at for the meta to record them (and a chain to start). */
export const MAX_TIPS = 1024;

export interface ChainLink {
  artifact: string;
  fingerprint: string;
  bytes: number;
  /** The bundle this one needs (whose objects hold its prerequisites); absent on the full bundle. */
  after?: string;
}

const OID = /^[0-9a-f]{40}([0-9a-f]{24})?$/;
const LINK_NAME = /^repo\.([1-9][0-9]{0,2})\.bundle$/;

/** The artifact of the chain's `n`th bundle (0: the full one). */
export const linkArtifact = (n: number): string => (n === 0 ? BUNDLE_ARTIFACT : `repo.${n}.bundle`);

/** True for a name a chain's bundle may have. */
export const isBundleName = (name: string): boolean => name === BUNDLE_ARTIFACT || LINK_NAME.test(name);

export function chainInvalid(layer: string, why: string): MemsnapError {
  return new MemsnapError("MEMSNAP_GIT_CHAIN_INVALID", `git layer ${layer}: ${why}`, {
    hint: "the snapshot's git layer is damaged or was altered; nothing was restored, use another snapshot",
  });
}

/**
 * `meta.bundle_chain` in restore order (the full bundle first, then each link after the one it
 * names), or why it is not a chain: not a list of links, a link named twice or outside the
 * bundle names, no full bundle or two, an `after` naming no bundle of the chain, two links
 * after the same one, a cycle, or more than MAX_LINKS links.
 */
export function orderChain(raw: unknown): ChainLink[] | string {
  if (!Array.isArray(raw) || raw.length === 0) return "meta.bundle_chain is not a list of bundles";
  if (raw.length > MAX_LINKS + 1)
    return `meta.bundle_chain has ${raw.length} bundles, over the bound of ${MAX_LINKS + 1}`;
  const byName = new Map<string, ChainLink>();
  for (const l of raw as unknown[]) {
    const o = l as Partial<ChainLink> | null;
    if (
      typeof o !== "object" ||
      o === null ||
      typeof o.artifact !== "string" ||
      !isBundleName(o.artifact) ||
      typeof o.fingerprint !== "string" ||
      o.fingerprint.length > 256 ||
      typeof o.bytes !== "number" ||
      !Number.isSafeInteger(o.bytes) ||
      o.bytes < 0 ||
      (o.after !== undefined && typeof o.after !== "string")
    ) {
      return "meta.bundle_chain holds an entry that is not a bundle";
    }
    if (byName.has(o.artifact)) return `meta.bundle_chain names ${o.artifact} twice`;
    byName.set(o.artifact, {
      artifact: o.artifact,
      fingerprint: o.fingerprint,
      bytes: o.bytes,
      ...(o.after !== undefined ? { after: o.after } : {}),
    });
  }
  const roots = [...byName.values()].filter((l) => l.after === undefined);
  if (roots.length !== 1 || roots[0]!.artifact !== BUNDLE_ARTIFACT) {
    return `meta.bundle_chain must start at one full bundle, ${BUNDLE_ARTIFACT}`;
  }
  const next = new Map<string, ChainLink>();
  for (const l of byName.values()) {
    if (l.after === undefined) continue;
    if (!byName.has(l.after)) return `${l.artifact} builds on ${JSON.stringify(l.after)}, which is not in the chain`;
    if (next.has(l.after)) return `${next.get(l.after)!.artifact} and ${l.artifact} both build on ${l.after}`;
    next.set(l.after, l);
  }
  const out: ChainLink[] = [roots[0]!];
  for (let l = next.get(BUNDLE_ARTIFACT); l; l = next.get(l.artifact)) out.push(l);
  if (out.length !== byName.size) {
    const stray = [...byName.keys()].find((n) => !out.some((l) => l.artifact === n));
    return `${stray} is in a cycle of bundles that never reaches ${BUNDLE_ARTIFACT}`;
  }
  return out;
}

/** `meta.bundle_tips`, checked, or null. */
export function parseTips(raw: unknown): string[] | null {
  if (!Array.isArray(raw) || raw.length === 0 || raw.length > MAX_TIPS) return null;
  return raw.every((t) => typeof t === "string" && OID.test(t)) ? (raw as string[]) : null;
}

/**
 * True when every one of `tips` is in the repository and reachable from a ref or HEAD (the
 * objects the chain holds are all still part of the history): `rev-list --objects` lists
 * nothing, stopped at its first line.
 */
export function tipsReachable(
  root: string,
  g: GitCtx,
  tips: string[],
  children: Set<ChildProcessWithoutNullStreams>,
): Promise<boolean> {
  const s = spawnGit(root, g, ["rev-list", "--objects", "--no-object-names", "--stdin", "--not", "--all"], children);
  s.child.stdin.end(`${tips.join("\n")}\n`);
  let seen = false;
  s.child.stdout.on("data", () => {
    if (!seen) s.child.kill("SIGKILL");
    seen = true;
  });
  return s.done.then(
    () => !seen,
    () => false,
  );
}

/**
 * Write a link: a bundle of the objects reachable from `tips` but not from `exclude`, whose
 * header lists `refLines` (`<oid> <refname>`, every ref) and HEAD, with the boundary commits as
 * prerequisites; the pack is thin (deltas against the prerequisites' objects), as `git bundle
 * create` writes. With nothing excluded it is a whole bundle, the one `git bundle create --all`
 * writes (the capture's full bundle is written so: see ./capture.ts); then, with `index`, git's
 * index of its pack is written to `index.out` too (./pack-index.ts; `index.objects`: the
 * repository's object directory). Returns the bundle's size.
 */
export async function writeLink(
  root: string,
  g: GitCtx,
  out: string,
  objectFormat: string,
  tips: string[],
  exclude: string[],
  refLines: string[],
  headOid: string | null,
  children: Set<ChildProcessWithoutNullStreams>,
  index?: { out: string; objects: string },
): Promise<number> {
  const revs = `${[...tips, ...exclude.map((o) => `^${o}`)].join("\n")}\n`;
  // Nothing excluded (a whole bundle): no boundary, so no prerequisites and no walk for them.
  const boundary = exclude.length
    ? (await gitStdin(root, g, ["rev-list", "--boundary", "--stdin"], revs, [0])).toString("latin1")
    : "";
  const prereqs = boundary
    .split("\n")
    .filter((l) => l.startsWith("-"))
    .map((l) => l.slice(1).trim());
  const head = [
    objectFormat === "sha1" ? BUNDLE_V2_SIGNATURE : `${BUNDLE_V3_SIGNATURE}@object-format=${objectFormat}\n`,
    ...prereqs.map((o) => `-${o}\n`),
    ...refLines.map((l) => `${l}\n`),
    ...(headOid ? [`${headOid} HEAD\n`] : []),
    "\n",
  ].join("");
  const file = createWriteStream(out, { mode: 0o600 });
  const opened = once(file, "open");
  await opened;
  file.write(head);
  if (index !== undefined && exclude.length === 0) {
    // The same pack, written by pack-objects with its index beside it (a whole pack is not thin),
    // then copied in after the header. pack-objects writes its temporary files in the object
    // directory: a scratch one of ours, with the repository's as its alternate (never a file in
    // the repository; the pack is the same, deltas reused from the repository's packs alike).
    const odb = `${out}.odb`;
    await mkdir(join(odb, "pack"), { recursive: true, mode: 0o700 });
    const pg: GitCtx = {
      ...g,
      env: { ...g.env, GIT_OBJECT_DIRECTORY: odb, GIT_ALTERNATE_OBJECT_DIRECTORIES: index.objects },
    };
    const pack = spawnGit(root, pg, ["pack-objects", "--delta-base-offset", "--revs", "-q", join(odb, "p")], children);
    let name = "";
    pack.child.stdout.on("data", (b: Buffer) => {
      name += b.toString("latin1");
    });
    pack.child.stdin.end(revs);
    try {
      await pack.done;
      const hex = name.trim();
      if (!/^[0-9a-f]{40}([0-9a-f]{24})?$/.test(hex)) {
        const said = JSON.stringify(hex.slice(0, 80));
        throw new MemsnapError("MEMSNAP_SOURCE_INVALID", `git pack-objects named no pack in ${root} (said ${said})`, {
          path: root,
          hint: "check the repository with 'git fsck --full' in it",
        });
      }
      await pipeline(createReadStream(join(odb, `p-${hex}.pack`), { highWaterMark: 1 << 20 }), file);
      await rename(join(odb, `p-${hex}.idx`), index.out);
    } finally {
      file.destroy();
      await rm(odb, { recursive: true, force: true });
    }
    return (await stat(out)).size;
  }
  const pack = spawnGit(
    root,
    g,
    ["pack-objects", "--stdout", "--thin", "--delta-base-offset", "--revs", "-q"],
    children,
  );
  pack.child.stdin.end(revs);
  pack.child.stdout.pipe(file);
  await Promise.all([pack.done, once(file, "close")]);
  return (await stat(out)).size;
}
