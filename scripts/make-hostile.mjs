#!/usr/bin/env node
// Build the hostile bundles in fixtures/hostile/ (run after `npm run build`). Each is a valid
// container with a sealed manifest whose payload hash matches, so only the payload's content
// is hostile: restore must refuse each with an unsafe-bundle code before writing outside staging.
import { createHash } from "node:crypto";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { compress } from "zstd-napi";
import { computeSeal } from "../dist/index.js";
import { encodeHeader as containerHeader } from "../dist/format/tar-header.js";

const out = new URL("../fixtures/hostile/", import.meta.url).pathname;
const sha = (b) => createHash("sha256").update(b).digest("hex");
const pad = (n) => (512 - (n % 512)) % 512;

/** A ustar header with any type flag and link name (the container codec only writes files). */
function header(name, size, type = "0", linkname = "") {
  const b = Buffer.alloc(512);
  b.write(name, 0, 100, "utf8");
  b.write("0000644\0", 100);
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

function tarOf(entries) {
  const parts = [];
  for (const e of entries) {
    const data = Buffer.from(e.data ?? "");
    parts.push(header(e.name, e.size ?? data.length, e.type ?? "0", e.link ?? ""), data, Buffer.alloc(pad(data.length)));
  }
  parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

function bundle(file, entries, { tarSize, indexSizes = {}, zstd, layer = { name: "memory", kind: "files" }, layers = [layer] } = {}) {
  const files = entries.filter((e) => (e.type ?? "0") === "0");
  const id = "01JHOSTILE0000000000000000";
  const artifacts = files.map((e) => ({
    path: e.name, layer: layers.length > 1 ? e.name.split("/")[0] : layer.name, kind: "file", size: indexSizes[e.name] ?? Buffer.byteLength(e.data ?? ""),
    sha256: sha(Buffer.from(e.data ?? "")), mode: 420, mtime: "2026-01-01T00:00:00.000Z",
  }));
  const indexDoc = { artifacts, format: "memsnap-index", snapshot_id: id };
  const canon = (v) => v === null || typeof v !== "object" ? JSON.stringify(v) : Array.isArray(v) ? `[${v.map(canon).join(",")}]`
    : `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canon(v[k])}`).join(",")}}`;
  const indexBytes = Buffer.from(canon(indexDoc));
  const tar = tarOf([...entries, { name: ".memsnap/index.json", data: indexBytes }]);
  const payload = zstd ?? compress(tar);
  const body = {
    format: "memsnap", manifest_version: 1, snapshot_id: id, created_at: "2026-01-01T00:00:00.000Z", created_by: "api",
    label: "hostile", tenant: "default", agent: "victim", host: "attacker", tool: { name: "memsnap", version: "0.1.0" }, parent: null,
    layers: layers.map((l) => {
      const own = artifacts.filter((a) => a.layer === l.name);
      return { name: l.name, kind: l.kind, schema_version: l.schema_version ?? 1, artifacts: own.length, bytes: own.reduce((n, a) => n + a.size, 0) };
    }),
    payload: {
      member: "payload.tar.zst", compression: { codec: "zstd", level: 3 }, encryption: null, stored_size: payload.length,
      sha256: sha(payload), tar_size: tarSize ?? tar.length, index_sha256: sha(indexBytes), artifacts: artifacts.length,
      bytes: artifacts.reduce((n, a) => n + a.size, 0),
    },
    index: artifacts, redaction: { policy: "off" },
  };
  const manifest = Buffer.from(JSON.stringify({ ...body, seal: computeSeal(body) }, null, 1) + "\n");
  const now = new Date("2026-01-01T00:00:00Z");
  const file0 = Buffer.concat([
    containerHeader("payload.tar.zst", payload.length, now, 0o600), payload, Buffer.alloc(pad(payload.length)),
    containerHeader("manifest.json", manifest.length, now, 0o644), manifest, Buffer.alloc(pad(manifest.length)), Buffer.alloc(1024),
  ]);
  writeFileSync(join(out, file), file0);
}

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
const ok = { name: "memory/ok.md", data: "harmless\n" };
bundle("absolute-path.memsnap", [ok, { name: "/tmp/memsnap-hostile-abs/evil", data: "pwned\n" }]);
bundle("dotdot.memsnap", [ok, { name: "memory/../../memsnap-hostile-dotdot", data: "pwned\n" }]);
bundle("symlink-then-write.memsnap", [ok, { name: "memory/link", type: "2", link: "/tmp" }, { name: "memory/link/memsnap-hostile-through-link", data: "pwned\n" }]);
bundle("symlink-outside.memsnap", [ok, { name: "memory/escape", type: "2", link: "../../../../etc" }]);
bundle("hardlink-outside.memsnap", [ok, { name: "memory/passwd", type: "1", link: "/etc/passwd" }]);
bundle("device-node.memsnap", [ok, { name: "memory/tty", type: "3" }]);
bundle("fifo.memsnap", [ok, { name: "memory/pipe", type: "6" }]);
bundle("duplicate-path.memsnap", [ok, { name: "memory/ok.md", data: "second copy\n" }]);
bundle("longer-than-declared.memsnap", [ok, { name: "memory/big.md", data: "x".repeat(4096) }], { indexSizes: { "memory/big.md": 16 } });
bundle("unknown-layer.memsnap", [ok, { name: "elsewhere/evil", data: "pwned\n" }]);
// A KV layer whose artifacts include the name restore uses for its page spool.
bundle("kv-spool-collision.memsnap", [
  { name: `kv/pages/${sha(Buffer.from("page\n"))}`, data: "page\n" },
  { name: "kv/.memsnap-spool", data: "not a spool\n" },
], { layer: { name: "kv", kind: "kv" } });
// A KV layer whose artifacts include a name restore uses for a spool part.
bundle("kv-spool-part-collision.memsnap", [
  { name: `kv/pages/${sha(Buffer.from("page\n"))}@0.0`, data: "page\n" },
  { name: "kv/.memsnap-spool-0", data: "not a spool part\n" },
], { layer: { name: "kv", kind: "kv", schema_version: 2 } });
// A KV page placed 1 TiB into its file: restore would make a huge sparse file.
bundle("kv-place-past-end.memsnap", [
  { name: `kv/pages/${sha(Buffer.from("page\n"))}@0.${2 ** 40}`, data: "page\n" },
], { layer: { name: "kv", kind: "kv", schema_version: 2 } });
// A layer's entries split by another layer's: restore materializes a layer once it has passed it.
bundle("layers-interleaved.memsnap", [
  { name: "memory/a.md", data: "a\n" }, { name: "notes/b.md", data: "b\n" }, { name: "memory/c.md", data: "c\n" },
], { layers: [{ name: "memory", kind: "files" }, { name: "notes", kind: "files" }] });
// zstd bomb: 64 MiB of zeros in the tar entry while the manifest declares a 2 KiB tar.
{
  const big = Buffer.alloc(64 * 1024 * 1024);
  bundle("zstd-bomb.memsnap", [ok, { name: "memory/zeros", data: big }], { tarSize: 2048 });
}
// A container whose manifest header claims 100 MiB: refused before anything is read.
{
  const now = new Date("2026-01-01T00:00:00Z");
  const payload = compress(tarOf([]));
  writeFileSync(join(out, "manifest-over-cap.memsnap"), Buffer.concat([
    containerHeader("payload.tar.zst", payload.length, now, 0o600), payload, Buffer.alloc(pad(payload.length)),
    containerHeader("manifest.json", 100 * 1024 * 1024, now, 0o644), Buffer.alloc(1024),
  ]));
}
writeFileSync(join(out, "README.md"), `# hostile bundles

Made by \`scripts/make-hostile.mjs\` (\`npm run build && node scripts/make-hostile.mjs\`). Each is a valid
container whose manifest is sealed and whose payload hash matches, so keyless checks pass; the
payload itself is hostile. \`test/restore/hostile.test.ts\` requires restore (both \`--to\` and in place)
to refuse every one with exit code 9 (\`MEMSNAP_UNSAFE_PATH\` or \`MEMSNAP_UNSAFE_BUNDLE\`), to write
nothing outside staging, and to remove staging.
`);
console.log("wrote fixtures/hostile/");
