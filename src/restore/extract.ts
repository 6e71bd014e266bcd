/**
 * Extract a bundle's payload into staging directories, one per layer, checking every entry's
 * name, size and SHA-256 as it is written and comparing the whole payload with the index at
 * the end. Nothing is written outside the staging roots: names are checked before any write,
 * and only regular files are created.
 */
import { closeSync, openSync, writeFileSync, writeSync } from "node:fs";
import { mkdir, open } from "node:fs/promises";
import { dirname, join } from "node:path";
import { MemsnapError, destinationError } from "../errors.js";
import type { BundleLayout } from "../format/container.js";
import type { Manifest } from "../format/manifest.js";
import { compareWithIndex, readPayload, type Keys, type PayloadReadResult } from "../pipeline/read-payload.js";
import { crashPoint } from "../util/crash-point.js";
import { checkEntryName } from "./safe-path.js";
import { sourceKind } from "../sources/registry.js";
import { SPOOL_FILE, SPOOL_MAP } from "../sources/types.js";

/** Entries up to this size are written with synchronous calls. */
const SMALL_ENTRY = 256 * 1024;

interface Spool {
  fd: number;
  pos: number;
  map: Record<string, [number, number]>;
  root: string;
}

const WRITE_BATCH = 1 << 20;

export interface ExtractOptions {
  keys?: Keys;
  signal?: AbortSignal;
  onProgress?: (bytes: number, total: number) => void;
}

/**
 * Stream the payload, writing each selected layer's entries under `rootFor(layer)`; entries
 * of layers for which it returns null are hashed and dropped. Throws MEMSNAP_UNSAFE_PATH,
 * MEMSNAP_DEST_*, key and integrity errors; on a throw, what was written stays for the
 * caller to remove (it owns the roots).
 */
export async function extractPayload(
  layout: BundleLayout, manifest: Manifest, rootFor: (layer: string) => string | null, opts: ExtractOptions = {},
): Promise<PayloadReadResult> {
  const layers = new Set(manifest.layers.map((l) => l.name));
  const spoolFor = new Map(manifest.layers.map((l) => [l.name, sourceKind(l.kind)?.restoreSpool]));
  const spools = new Map<string, Spool>();
  const total = manifest.payload.bytes;
  let written = 0;
  const made = new Set<string>();
  const declared = manifest.index ? new Map(manifest.index.map((e) => [e.path, e.size])) : null;
  const conflict = (name: string): MemsnapError =>
    new MemsnapError("MEMSNAP_UNSAFE_PATH", `duplicate or conflicting entry ${name}`, { path: name, hint: "the bundle is malformed or hostile" });
  try {
    const r = await readPayload(layout, manifest, opts.keys ?? {}, async (info, chunks) => {
      checkEntryName(info.name, layers);
      const want = declared?.get(info.name);
      if (want !== undefined && info.size > want) {
        throw new MemsnapError("MEMSNAP_UNSAFE_BUNDLE", `entry ${info.name} is ${info.size} bytes, the index declares ${want}`, {
          path: info.name, hint: "this bundle was not written by memsnap or was tampered with; nothing was restored",
        });
      }
      const root = rootFor(info.layer);
      if (root === null) return;
      const spooled = spoolFor.get(info.layer);
      if (spooled && (info.rel === SPOOL_FILE || info.rel === SPOOL_MAP)) throw conflict(info.name);
      const tooLong = (): MemsnapError => new MemsnapError("MEMSNAP_ARTIFACT_HASH_MISMATCH", `${info.name} is longer than its header declares`, { path: info.name });

      // Spooled artifacts (KV pages): appended to the layer's one spool file, for materialize.
      if (spooled?.(info.rel)) {
        let sp = spools.get(info.layer);
        if (!sp) {
          if (!made.has(root)) {
            await mkdir(root, { recursive: true }).catch((e: unknown) => { throw destinationError(e, root); });
            made.add(root);
          }
          try {
            sp = { fd: openSync(join(root, SPOOL_FILE), "wx", 0o600), pos: 0, map: {}, root };
          } catch (e) {
            if ((e as NodeJS.ErrnoException).code === "EEXIST") throw conflict(`${info.layer}/${SPOOL_FILE}`);
            throw destinationError(e, root);
          }
          spools.set(info.layer, sp);
        }
        if (Object.hasOwn(sp.map, info.rel)) throw conflict(info.name);
        const start = sp.pos;
        try {
          for await (const c of chunks) {
            if (sp.pos - start + c.length > info.size) throw tooLong();
            let off = 0;
            while (off < c.length) off += writeSync(sp.fd, c, off, c.length - off, sp.pos + off);
            sp.pos += c.length;
            written += c.length;
            opts.onProgress?.(written, total);
          }
        } catch (e) {
          if (e instanceof MemsnapError) throw e;
          throw destinationError(e, join(root, SPOOL_FILE));
        }
        sp.map[info.rel] = [start, sp.pos - start];
        crashPoint("restore:staged-entry");
        return;
      }

      const dest = join(root, ...info.rel.split("/"));
      const dir = dirname(dest);
      if (!made.has(dir)) {
        try {
          await mkdir(dir, { recursive: true });
        } catch (e) {
          const code = (e as NodeJS.ErrnoException).code;
          if (code === "EEXIST" || code === "ENOTDIR") throw new MemsnapError("MEMSNAP_UNSAFE_PATH", `entry ${info.name} conflicts with an earlier entry`, { path: info.name });
          throw destinationError(e, dir);
        }
        made.add(dir);
      }
      // Small entries are written synchronously (open, one write, close): three thread-pool
      // round trips per file cost more than the write itself.
      if (info.size <= SMALL_ENTRY) {
        const parts: Buffer[] = [];
        let n = 0;
        for await (const c of chunks) {
          n += c.length;
          if (n > info.size) throw tooLong();
          parts.push(c);
        }
        let fd: number;
        try {
          fd = openSync(dest, "wx", 0o600);
        } catch (e) {
          const code = (e as NodeJS.ErrnoException).code;
          if (code === "EEXIST" || code === "EISDIR") throw conflict(info.name);
          throw destinationError(e, dest);
        }
        try {
          const body = parts.length === 1 ? parts[0]! : Buffer.concat(parts, n);
          let off = 0;
          while (off < body.length) off += writeSync(fd, body, off, body.length - off);
        } catch (e) {
          throw destinationError(e, dest);
        } finally {
          closeSync(fd);
        }
        written += n;
        opts.onProgress?.(written, total);
        crashPoint("restore:staged-entry");
        return;
      }
      let fh;
      try {
        fh = await open(dest, "wx", 0o600);
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code === "EEXIST" || code === "EISDIR") throw conflict(info.name);
        throw destinationError(e, dest);
      }
      try {
        let n = 0;
        // Coalesce the tar parser's small chunks into ~1 MiB writes.
        let batch: Buffer[] = [];
        let batched = 0;
        for await (const c of chunks) {
          n += c.length;
          if (n > info.size) throw tooLong();
          batch.push(c);
          batched += c.length;
          if (batched >= WRITE_BATCH) {
            await fh.writev(batch);
            batch = [];
            batched = 0;
          }
          written += c.length;
          opts.onProgress?.(written, total);
        }
        if (batched) await fh.writev(batch);
      } catch (e) {
        if (e instanceof MemsnapError) throw e;
        throw destinationError(e, dest);
      } finally {
        await fh.close();
      }
      crashPoint("restore:staged-entry");
    }, opts.signal);
    for (const [layer, sp] of spools) {
      try {
        writeFileSync(join(sp.root, SPOOL_MAP), JSON.stringify(sp.map), { mode: 0o600, flag: "wx" });
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === "EEXIST") throw conflict(`${layer}/${SPOOL_MAP}`);
        throw destinationError(e, sp.root);
      }
    }
    const findings = compareWithIndex(manifest, r);
    if (findings.length) {
      const f = findings[0]!;
      throw new MemsnapError(f.code, findings.length === 1 ? f.message : `${findings.length} problems, first: ${f.message}`, {
        findings, hint: "the bundle is damaged or was altered; nothing was restored",
      });
    }
    return r;
  } finally {
    for (const sp of spools.values()) closeSync(sp.fd);
  }
}
