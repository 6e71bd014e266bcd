// Builders for hand-made hostile bundles (scripts/make-hostile.mjs and scripts/hostile/*.mjs).
// Each bundle is built as an attacker would: a valid container, a manifest whose seal and
// payload hash match, optionally encrypted with the real `age` binary to the victim's key
// (fixtures/hostile/victim.key), so only the content is hostile.
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { compress } from "zstd-napi";
import { computeSeal } from "../../dist/format/manifest.js";
import { encodeHeader as containerHeader } from "../../dist/format/tar-header.js";

export const sha = (b) => createHash("sha256").update(b).digest("hex");
export const pad = (n) => (512 - (n % 512)) % 512;
/** A valid ULID (Crockford base32) used as every hostile bundle's id unless a case changes it. */
export const HOSTILE_ID = "01JHXST1E00000000000000000";
export const VICTIM_KEY = new URL("../../fixtures/hostile/victim.key", import.meta.url).pathname;

/** The victim's age recipient (public half of fixtures/hostile/victim.key). */
export function victimRecipient() {
  const line = readFileSync(VICTIM_KEY, "utf8").split("\n").find((l) => l.startsWith("# public key: "));
  return line.slice("# public key: ".length).trim();
}

/** A ustar header with any type flag, mode and link name (the container codec only writes files). */
export function header(name, size, type = "0", linkname = "", mode = 0o644) {
  const b = Buffer.alloc(512);
  b.write(name, 0, 100, "utf8");
  b.write(mode.toString(8).padStart(7, "0") + "\0", 100);
  b.write("0000000\0", 108);
  b.write("0000000\0", 116);
  b.write(size.toString(8).padStart(11, "0") + "\0", 124);
  b.write("14700000000\0", 136);
  b.write(type, 156);
  b.write(linkname, 157, 100, "utf8");
  b.write("ustar\0", 257);
  b.write("00", 263);
  if (type === "3" || type === "4") { b.write("0000001\0", 329); b.write("0000003\0", 337); }
  b.fill(0x20, 148, 156);
  let s = 0;
  for (const x of b) s += x;
  b.write(s.toString(8).padStart(6, "0") + "\0 ", 148);
  return b;
}

/** A tar stream of entries `{name, data?, size?, type?, link?, mode?}` and the end blocks. */
export function tarOf(entries) {
  const parts = [];
  for (const e of entries) {
    const data = Buffer.from(e.data ?? "");
    parts.push(header(e.name, e.size ?? data.length, e.type ?? "0", e.link ?? "", e.mode ?? 0o644), data, Buffer.alloc(pad(data.length)));
  }
  parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

const canon = (v) => v === null || typeof v !== "object" ? JSON.stringify(v) : Array.isArray(v) ? `[${v.map(canon).join(",")}]`
  : `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canon(v[k])}`).join(",")}}`;

/** The container: payload member, manifest member, end blocks. */
export function container(payload, manifest, { encrypted = false } = {}) {
  const now = new Date("2026-01-01T00:00:00Z");
  return Buffer.concat([
    containerHeader(encrypted ? "payload.tar.zst.age" : "payload.tar.zst", payload.length, now, 0o600), payload, Buffer.alloc(pad(payload.length)),
    containerHeader("manifest.json", manifest.length, now, 0o644), manifest, Buffer.alloc(pad(manifest.length)), Buffer.alloc(1024),
  ]);
}

/**
 * Build a sealed bundle and return its bytes.
 * - entries: payload tar entries; regular files (type "0") become index artifacts.
 * - layer / layers: `{name, kind, schema_version?, meta?}`; with several layers an artifact's
 *   layer is its first path segment.
 * - indexSizes / indexFor(entry, artifact): change what the index says of an artifact.
 * - mutate(body): change the manifest body (before the seal is computed).
 * - encrypt: true to encrypt the payload to the victim's key with the real `age` binary.
 * - zstd: the compressed payload to use as is; tarSize: the tar_size to declare.
 */
export function bundle(entries, {
  tarSize, indexSizes = {}, indexFor, zstd, layer = { name: "memory", kind: "files" }, layers = [layer], mutate, encrypt = false, id = HOSTILE_ID,
} = {}) {
  const files = entries.filter((e) => (e.type ?? "0") === "0" && !e.notInIndex);
  let artifacts = files.map((e) => {
    const a = {
      path: e.name, layer: layers.length > 1 ? e.name.split("/")[0] : layers[0].name, kind: e.kind ?? "file", size: indexSizes[e.name] ?? Buffer.byteLength(e.data ?? ""),
      sha256: e.sha256 ?? sha(Buffer.from(e.data ?? "")), mode: e.indexMode ?? 420, mtime: "2026-01-01T00:00:00.000Z",
    };
    return indexFor ? indexFor(e, a) ?? a : a;
  });
  const indexDoc = { artifacts, format: "memsnap-index", snapshot_id: id };
  const indexBytes = Buffer.from(canon(indexDoc));
  const tar = tarOf([...entries, { name: ".memsnap/index.json", data: indexBytes }]);
  let payload = zstd ?? compress(tar);
  if (encrypt) {
    const r = spawnSync("age", ["-r", victimRecipient()], { input: payload, maxBuffer: 1 << 30 });
    if (r.status !== 0) throw new Error(`age failed: ${r.stderr}`);
    payload = r.stdout;
  }
  let body = {
    format: "memsnap", manifest_version: 1, snapshot_id: id, created_at: "2026-01-01T00:00:00.000Z", created_by: "api",
    label: "hostile", tenant: "default", agent: "victim", host: "attacker", tool: { name: "memsnap", version: "0.1.0" }, parent: null,
    layers: layers.map((l) => {
      const own = artifacts.filter((a) => a.layer === l.name);
      const out = { name: l.name, kind: l.kind, schema_version: l.schema_version ?? 1, artifacts: own.length, bytes: own.reduce((n, a) => n + a.size, 0) };
      if (l.meta) out.meta = l.meta;
      return out;
    }),
    payload: {
      member: encrypt ? "payload.tar.zst.age" : "payload.tar.zst", compression: { codec: "zstd", level: 3 },
      encryption: encrypt ? { scheme: "age", recipients: [{ type: "x25519" }] } : null, stored_size: payload.length,
      sha256: sha(payload), tar_size: tarSize ?? tar.length, index_sha256: sha(indexBytes), artifacts: artifacts.length,
      bytes: artifacts.reduce((n, a) => n + a.size, 0),
    },
    redaction: { policy: "off" },
  };
  if (!encrypt) body.index = artifacts;
  if (mutate) body = mutate(body) ?? body;
  const manifest = Buffer.from(JSON.stringify({ ...body, seal: computeSeal(body) }, null, 1) + "\n");
  return container(payload, manifest, { encrypted: encrypt });
}
