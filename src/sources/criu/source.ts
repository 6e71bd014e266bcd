/**
 * The `criu` source: CRIU process dumps (images directories), validated and captured byte
 * for byte.
 *
 * memsnap ingests images directories it did not make (CRIU cannot dump on every kernel:
 * criu 3.17 fails on kernel ≥ 6.13), so every dump is checked before a byte is packed:
 * inventory present, every framed image with known magics and frames ending exactly at EOF,
 * `size(pages-N.img) == 4096 × Σ nr_pages` of the PE_PRESENT entries not in the parent, every
 * pstree pid with its core-/mm-/pagemap- images, and an incremental dump's `parent` link
 * resolving inside the captured dump series. A `procs.criu.v1` blob (one JSON header line,
 * `\n`, a tar of the images directory) is unpacked to the capture's temp dir and checked the
 * same way. `criu dump` runs only when the config names a pid and `criu check` passes.
 *
 * Layer layout: `images/<name>` for the dump, `parent/<name>` for its parent (and
 * `parent/parent/…` further up the chain). Restore recreates `images/parent → ../parent`.
 * Process memory cannot be redacted: the kind is marked `processMemory`, so a plaintext
 * bundle with a criu layer is refused unless explicitly allowed.
 */
import { basename, join } from "node:path";
import { lstat, readlink, realpath, symlink } from "node:fs/promises";
import { MemsnapError } from "../../errors.js";
import {
  classifyImage,
  decodePagemapEntry,
  decodePagemapHead,
  decodePstreePid,
  ImageFormatError,
  PAGE_SIZE,
  scanImage,
} from "./format.js";
import type { SourceKind } from "../types.js";
import { captureCriu } from "./capture.js";
import { parseCriuConfig, type CriuConfig } from "./config.js";
import { consumeAll } from "../../util/streams.js";

/** CRIU dumps; see the module comment. */
export const criuSource: SourceKind<CriuConfig> = {
  kind: "criu",
  schemaVersion: 1,
  processMemory: true,
  parseConfig: parseCriuConfig,
  capture: captureCriu,
  async deepVerify({ entry, bytes }) {
    return consumeAll(bytes, async (b) => {
      const name = basename(entry.path);
      const cls = classifyImage(name);
      if (cls === null) return `${entry.path}: not a CRIU image name`;
      if (cls === "pages" || cls === "raw") {
        let n = 0;
        for await (const c of b) n += c.length;
        return cls === "pages" && n % PAGE_SIZE !== 0
          ? `${entry.path}: ${n} bytes is not a whole number of ${PAGE_SIZE}-byte pages`
          : null;
      }
      const decode = name === "pstree.img" || name.startsWith("pagemap-");
      try {
        const r = await scanImage(cls, b, decode);
        if (name === "pstree.img") r.collected.forEach(decodePstreePid);
        else if (decode) {
          const [head, ...entries] = r.collected;
          if (!head) throw new ImageFormatError("no pagemap head");
          decodePagemapHead(head);
          entries.forEach(decodePagemapEntry);
        }
        return null;
      } catch (e) {
        if (e instanceof ImageFormatError) return `${entry.path}: ${e.message}`;
        throw e;
      }
    });
  },
  async materialize(dir) {
    // The parent chain was captured as `parent/…` (real directories). CRIU finds a dump's
    // parent through `images/parent`; recreate it as the fixed relative link `../parent`,
    // never a target taken from the bundle, so it cannot point outside the layer.
    const parent = join(dir, "parent");
    const images = join(dir, "images");
    const pst = await lstat(parent).catch(() => null);
    if (!pst) return;
    const ist = await lstat(images).catch(() => null);
    if (!pst.isDirectory() || !ist?.isDirectory()) {
      const why = `criu layer ${basename(dir)}: parent/ and images/ must both be directories`;
      throw new MemsnapError("MEMSNAP_UNSAFE_PATH", why, {
        path: `${basename(dir)}/parent`,
        hint: "the bundle was not written by memsnap or was tampered with",
      });
    }
    const link = join(images, "parent");
    const lst = await lstat(link).catch(() => null);
    if (lst) {
      if (lst.isSymbolicLink() && (await readlink(link)) === "../parent") return; // already made
      const why = `criu layer ${basename(dir)}: images/parent exists in the bundle; it is reserved for the parent link`;
      throw new MemsnapError("MEMSNAP_UNSAFE_PATH", why, {
        path: `${basename(dir)}/images/parent`,
        hint: "the bundle was not written by memsnap or was tampered with",
      });
    }
    await symlink("../parent", link);
    const real = await realpath(link);
    if (real !== (await realpath(parent))) {
      const why = `criu layer ${basename(dir)}: images/parent does not resolve to the layer's parent/`;
      throw new MemsnapError("MEMSNAP_UNSAFE_PATH", why, { path: `${basename(dir)}/images/parent` });
    }
  },
};
