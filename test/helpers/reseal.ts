/**
 * Tamper with a real bundle as an attacker would: change its (plaintext) manifest, compute the
 * seal again and write the container back around the untouched payload member, so every keyless
 * check passes and only the changed manifest fields are hostile. Works for encrypted bundles too.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { type Manifest } from "../../src/index.js";
import { readLayout } from "../../src/format/container.js";
import { computeSeal } from "../../src/format/manifest.js";
import { encodeHeader } from "../../src/format/tar-header.js";

const pad = (n: number): number => (512 - (n % 512)) % 512;

/** Rewrite `bundle`'s manifest with `mutate` (which changes it in place) into `out` (default: over it). */
export async function reseal(bundle: string, mutate: (m: Manifest) => void, out = bundle): Promise<string> {
  const layout = await readLayout(bundle);
  const file = readFileSync(bundle);
  const payload = file.subarray(layout.payloadOffset, layout.payloadOffset + layout.payloadSize);
  const m = JSON.parse(layout.manifestBytes.toString("utf8")) as Manifest;
  mutate(m);
  const { seal: _old, ...body } = m;
  const manifest = Buffer.from(`${JSON.stringify({ ...body, seal: computeSeal(body) }, null, 1)}\n`);
  const now = new Date("2026-01-01T00:00:00Z");
  writeFileSync(out, Buffer.concat([
    encodeHeader(layout.payloadMember, payload.length, now, 0o600), payload, Buffer.alloc(pad(payload.length)),
    encodeHeader("manifest.json", manifest.length, now, 0o644), manifest, Buffer.alloc(pad(manifest.length)), Buffer.alloc(1024),
  ]));
  return out;
}
