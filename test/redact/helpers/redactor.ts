/** Helpers shared by the redaction tests. */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRedactor, type DocumentRedactor, type RedactionConfig } from "../../../src/redact/index.js";
import type { Artifact } from "../../../src/sources/types.js";

const dirs: string[] = [];

export function tempDir(prefix = "memsnap-redact-"): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  dirs.push(d);
  return d;
}

export function removeTempDirs(): void {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
}

/** A redactor with the default policy (or `cfg`), spooling under a fresh temp dir. */
export async function redactor(cfg: Partial<RedactionConfig> = {}, tmp = tempDir()): Promise<DocumentRedactor> {
  const r = await createRedactor({ enabled: true, allow: [], ...cfg }, tmp);
  if (!r) throw new Error("redaction is off");
  return r as DocumentRedactor;
}

/** An artifact over in-memory bytes, yielded in chunks of `chunk` bytes (or the given chunk sizes). */
export function memArtifact(path: string, bytes: Buffer, opts: { kind?: string; chunk?: number | number[]; size?: number; check?: () => Promise<void> } = {}): Artifact {
  return {
    path,
    kind: opts.kind ?? "file",
    size: opts.size ?? bytes.length,
    mode: 0o640,
    mtime: new Date("2024-06-01T12:00:00Z"),
    text: true,
    ...(opts.check ? { check: opts.check } : {}),
    open: () => (async function* () {
      const sizes = opts.chunk ?? 1 << 20;
      let off = 0;
      let i = 0;
      while (off < bytes.length) {
        const n = typeof sizes === "number" ? sizes : sizes[i++ % sizes.length]!;
        yield bytes.subarray(off, Math.min(bytes.length, off + Math.max(1, n)));
        off += Math.max(1, n);
      }
    })(),
  };
}

/** Read an artifact's bytes. */
export async function readArtifact(a: Artifact): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of a.open() as AsyncIterable<Buffer>) parts.push(Buffer.from(c));
  return Buffer.concat(parts);
}

/** Redact bytes as an artifact stream; returns the output bytes. */
export async function redactBytes(r: DocumentRedactor, path: string, bytes: Buffer, opts: Parameters<typeof memArtifact>[2] = {}): Promise<Buffer> {
  const out = await r.redactArtifact(memArtifact(path, bytes, opts), `layer/${path}`);
  const got = await readArtifact(out);
  if (got.length !== out.size) throw new Error(`artifact size ${out.size} but ${got.length} bytes`);
  return got;
}
