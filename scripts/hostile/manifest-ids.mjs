// Manifest fields that become paths or names: layer names, index entries' layers and paths,
// snapshot ids, parent and base ids, kinds, and how deeply the manifest nests.
//
// Codes: a name that would become a path in the target (a layer name, an index entry's path or
// layer) is MEMSNAP_UNSAFE_PATH (exit 9), the code the same name gets when it is found in the
// payload, so that a plaintext and an encrypted bundle carrying one attack answer alike; any
// other field outside its grammar (ids, kinds, times, nesting) is MEMSNAP_MANIFEST_CORRUPT
// (exit 3). Both are refused by parseManifest, before a key is asked for or a byte is written.
import { compress } from "zstd-napi";
import { computeSeal } from "../../dist/format/manifest.js";
import { spawnSync } from "node:child_process";
import { HOSTILE_ID, sha, tarOf, victimRecipient } from "../lib/hostile-bundle.mjs";

const ok = { name: "memory/ok.md", data: "harmless\n" };
const memory = { name: "memory", kind: "files" };
const seal = `sha256:${"0".repeat(64)}`;

/** A manifest body as the builder writes it, for the hand-written (unsealable) cases. */
function rawBody(payload, indexBytes, encrypted) {
  return {
    format: "memsnap", manifest_version: 1, snapshot_id: HOSTILE_ID, created_at: "2026-01-01T00:00:00.000Z", created_by: "api",
    label: "hostile", tenant: "default", agent: "victim", host: "attacker", tool: { name: "memsnap", version: "0.1.0" }, parent: null,
    layers: [{ name: "memory", kind: "files", schema_version: 1, artifacts: 0, bytes: 0 }],
    payload: {
      member: encrypted ? "payload.tar.zst.age" : "payload.tar.zst", compression: { codec: "zstd", level: 3 },
      encryption: encrypted ? { scheme: "age", recipients: [{ type: "x25519" }] } : null, stored_size: payload.length,
      sha256: sha(payload), tar_size: 2048, index_sha256: sha(indexBytes), artifacts: 0, bytes: 0,
    },
    ...(encrypted ? {} : { index: [] }),
    redaction: { policy: "off" },
  };
}

/** A manifest whose `redaction` nests `depth` levels, written by hand: no seal can be computed over it recursively. */
function deepManifest(container, depth, encrypted) {
  const indexBytes = Buffer.from(`{"artifacts":[],"format":"memsnap-index","snapshot_id":"${HOSTILE_ID}"}`);
  // The payload is never read: the manifest is refused first. An encrypted one needs no real age file.
  const payload = encrypted ? Buffer.from("age-encryption.org/v1\n-> X25519 x\nnot read\n") : compress(tarOf([{ name: ".memsnap/index.json", data: indexBytes }]));
  const body = rawBody(payload, indexBytes, encrypted);
  const text = JSON.stringify({ ...body, redaction: "@DEEP@", seal }).replace('"@DEEP@"', `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`);
  return container(payload, Buffer.from(text + "\n"), { encrypted });
}

/**
 * A sealed bundle whose payload tar holds `entries` and, last, the index written by hand as
 * `indexText` (a hostile payload index: what no builder's canonical JSON would write). With
 * `manifestIndex` a plaintext manifest carries that index copy instead of the payload's.
 */
function rawIndexBundle(container, { entries = [], indexText, encrypted, manifestIndex = [], layers }) {
  const indexBytes = Buffer.from(indexText);
  const tar = tarOf([...entries, { name: ".memsnap/index.json", data: indexBytes }]);
  let payload = compress(tar);
  if (encrypted) {
    const r = spawnSync("age", ["-r", victimRecipient()], { input: payload });
    if (r.status !== 0) throw new Error(`age failed: ${r.stderr}`);
    payload = r.stdout;
  }
  const body = rawBody(payload, indexBytes, encrypted);
  body.payload.tar_size = tar.length;
  const bytes = entries.reduce((n, e) => n + Buffer.byteLength(e.data), 0);
  body.payload.artifacts = entries.length;
  body.payload.bytes = bytes;
  body.layers = layers ?? [{ name: "memory", kind: "files", schema_version: 1, artifacts: entries.length, bytes }];
  if (!encrypted) body.index = manifestIndex;
  return container(payload, Buffer.from(JSON.stringify({ ...body, seal: computeSeal(body) }, null, 1) + "\n"), { encrypted });
}

const deepArray = (depth) => `${"[".repeat(depth)}${"]".repeat(depth)}`;
/** A payload index of one artifact for `ok` with `field` replaced by raw JSON text. */
function indexWith(field, raw) {
  const f = {
    kind: '"file"', layer: '"memory"', mode: "420", mtime: '"2026-01-01T00:00:00.000Z"', path: `"${ok.name}"`, sha256: `"${sha(Buffer.from(ok.data))}"`, size: String(ok.data.length),
  };
  f[field] = raw;
  return `{"artifacts":[{${Object.keys(f).sort().map((k) => `"${k}":${f[k]}`).join(",")}}],"format":"memsnap-index","snapshot_id":"${HOSTILE_ID}"}`;
}

/** A meta value nesting `depth` objects. */
function nested(depth) {
  let v = 1;
  for (let i = 0; i < depth; i++) v = { a: v };
  return v;
}

export default function ({ bundle, container }) {
  const unsafe = { exit: 9, code: "MEMSNAP_UNSAFE_PATH" };
  const corrupt = { exit: 3, code: "MEMSNAP_MANIFEST_CORRUPT" };
  const cases = [
    // snapshot_id feeds the in-place staging tag; it must be a ULID before anything uses it.
    { file: "snapshot-id-not-ulid.memsnap", bytes: bundle([ok], { id: "01JHXST1E0000000000/../../p" }), ...corrupt, note: "snapshot_id is not a ULID (it feeds the staging tag)" },
    { file: "snapshot-id-not-ulid-enc.memsnap", bytes: bundle([ok], { id: "01JHXST1E0000000000/../../p", encrypt: true }), ...corrupt, key: true, note: "encrypted: snapshot_id is not a ULID" },
    { file: "snapshot-id-lowercase.memsnap", bytes: bundle([ok], { id: HOSTILE_ID.toLowerCase() }), ...corrupt, note: "snapshot_id in lowercase (not what memsnap writes)" },
    { file: "snapshot-id-past-2-48.memsnap", bytes: bundle([ok], { id: "8" + HOSTILE_ID.slice(1) }), ...corrupt, note: "snapshot_id starting with 8: past 48 bits of time" },
    { file: "snapshot-id-nul.memsnap", bytes: bundle([ok], { id: `${HOSTILE_ID.slice(0, 25)}\0` }), ...corrupt, note: "snapshot_id with a NUL byte" },
    { file: "snapshot-id-long.memsnap", bytes: bundle([ok], { id: `${HOSTILE_ID}0` }), ...corrupt, note: "snapshot_id of 27 characters" },
    { file: "parent-not-ulid.memsnap", bytes: bundle([ok], { mutate: (b) => { b.parent = "../../../etc/passwd"; } }), ...corrupt, note: "parent is a string that is not a ULID" },
    {
      file: "base-not-ulid.memsnap",
      bytes: bundle([ok], { mutate: (b) => { b.manifest_version = 2; b.bases = [{ snapshot_id: "9ZZZZZZZZZZZZZZZZZZZZZZZZZ", seal: `sha256:${"1".repeat(64)}` }]; } }),
      ...corrupt, note: "a base id in the base32 alphabet that is no ULID (first character past 7)",
    },
    {
      file: "base-path.memsnap",
      bytes: bundle([ok], { mutate: (b) => { b.manifest_version = 2; b.bases = [{ snapshot_id: "../../../../tmp/memsnap-base", seal: `sha256:${"1".repeat(64)}` }]; } }),
      ...corrupt, note: "a base id that is a path (bases are opened as <id>.memsnap beside the bundle)",
    },
    // Layer names: each is a directory in the target.
    {
      file: "layer-name-dotdot.memsnap",
      bytes: bundle([ok], { layers: [memory, { name: "../outside/app", kind: "files" }] }),
      ...unsafe, note: "a layer with no artifacts named ../outside/app: its directory would be made outside staging",
    },
    {
      file: "layer-name-dotdot-sqlite.memsnap",
      bytes: bundle([ok], { layers: [memory, { name: "../outside/app", kind: "sqlite" }] }),
      ...unsafe, note: "a sqlite layer named ../outside/app: its materialize would delete -wal/-shm/-journal files there (test/format/manifest-names.test.ts places a real database there)",
    },
    {
      file: "layer-name-dotdot-sqlite-enc.memsnap",
      bytes: bundle([ok], { layers: [memory, { name: "../outside/app", kind: "sqlite" }], encrypt: true }),
      ...unsafe, key: true, note: "encrypted: a sqlite layer named ../outside/app",
    },
    {
      file: "layer-name-absolute.memsnap",
      bytes: bundle([ok], { layers: [memory, { name: "/tmp/memsnap-hostile-layer-abs", kind: "files" }] }),
      ...unsafe, note: "an absolute layer name",
    },
    {
      file: "layer-name-uppercase.memsnap",
      bytes: bundle([{ name: "Memory/ok.md", data: "harmless\n" }], { layer: { name: "Memory", kind: "files" } }),
      ...unsafe, note: "an uppercase layer name (case-insensitive file systems fold it into another layer's directory)",
    },
    { file: "layer-name-empty.memsnap", bytes: bundle([ok], { layers: [memory, { name: "", kind: "files" }] }), ...unsafe, note: "an empty layer name (the target itself)" },
    { file: "layer-name-dot.memsnap", bytes: bundle([ok], { layers: [memory, { name: ".", kind: "sqlite" }] }), ...unsafe, note: "a layer named . (the whole target)" },
    { file: "layer-name-too-long.memsnap", bytes: bundle([ok], { layers: [memory, { name: "a".repeat(65), kind: "files" }] }), ...unsafe, note: "a layer name of 65 characters" },
    { file: "layer-name-nul.memsnap", bytes: bundle([ok], { layers: [memory, { name: "app\0x", kind: "files" }] }), ...unsafe, note: "a layer name with a NUL byte" },
    {
      file: "layer-name-nul-enc.memsnap",
      bytes: bundle([ok], { layers: [memory, { name: "app\0x", kind: "files" }], encrypt: true }),
      ...unsafe, key: true, note: "encrypted: a layer name with a NUL byte",
    },
    {
      file: "layer-duplicate.memsnap",
      bytes: bundle([ok], { layers: [memory, { name: "memory", kind: "sqlite" }] }),
      ...unsafe, note: "two layers named memory (a files and a sqlite layer sharing one directory)",
    },
    {
      file: "layer-duplicate-enc.memsnap",
      bytes: bundle([ok], { layers: [memory, { name: "memory", kind: "sqlite" }], encrypt: true }),
      ...unsafe, key: true, note: "encrypted: two layers named memory",
    },
    { file: "layer-kind-path.memsnap", bytes: bundle([ok], { layers: [memory, { name: "app", kind: "../sqlite" }] }), ...corrupt, note: "a layer kind that is not an identifier" },
    // Index entries (plaintext bundles carry the index in the manifest).
    {
      file: "index-layer-undeclared.memsnap",
      bytes: bundle([ok], { indexFor: (_e, a) => ({ ...a, layer: "ghost" }) }),
      ...unsafe, note: "an index entry naming a layer the manifest does not declare",
    },
    {
      file: "index-layer-path-escape.memsnap",
      bytes: bundle([ok], { indexFor: (_e, a) => ({ ...a, layer: "../../outside" }) }),
      ...unsafe, note: "an index entry whose layer is a path (restore would set modes and times under it)",
    },
    {
      file: "index-path-not-under-layer.memsnap",
      bytes: bundle([ok, { name: "notes/b.md", data: "b\n" }], {
        layers: [memory, { name: "notes", kind: "files" }], indexFor: (e, a) => (e.name === "notes/b.md" ? { ...a, layer: "memory" } : a),
      }),
      ...unsafe, note: "an index entry whose path is not under the layer it names",
    },
    // Nesting: a manifest 200,000 levels deep overflowed the stack in the seal (MEMSNAP_INTERNAL).
    { file: "manifest-deep-200k.memsnap", bytes: deepManifest(container, 200_000, false), ...corrupt, note: "a manifest nested 200,000 levels deep (hand-written: no seal)" },
    { file: "manifest-deep-200k-enc.memsnap", bytes: deepManifest(container, 200_000, true), ...corrupt, key: true, note: "encrypted: a manifest nested 200,000 levels deep" },
    {
      file: "manifest-deep-meta.memsnap",
      bytes: bundle([ok], { layer: { ...memory, meta: { deep: nested(70) } } }),
      ...corrupt, note: "a layer meta nested 70 levels (sealed): over the 64-level cap",
    },
    // The payload index (the only index of an encrypted bundle): read after the entries, so its
    // fields are checked as it streams, before they are used.
    {
      file: "payload-index-deep-id.memsnap",
      bytes: rawIndexBundle(container, { indexText: `{"artifacts":[],"format":"memsnap-index","snapshot_id":${deepArray(200_000)}}`, encrypted: false }),
      exit: 3, code: "MEMSNAP_INDEX_MISMATCH", note: "the payload index's snapshot_id is an array nested 200,000 deep (naming it in the finding overflowed the stack)",
    },
    {
      file: "payload-index-deep-id-enc.memsnap",
      bytes: rawIndexBundle(container, { indexText: `{"artifacts":[],"format":"memsnap-index","snapshot_id":${deepArray(200_000)}}`, encrypted: true }),
      exit: 3, code: "MEMSNAP_INDEX_MISMATCH", key: true, note: "encrypted: the payload index's snapshot_id is an array nested 200,000 deep",
    },
    {
      file: "payload-index-deep-size-enc.memsnap",
      bytes: rawIndexBundle(container, { entries: [ok], indexText: indexWith("size", deepArray(200_000)), encrypted: true }),
      exit: 3, code: "MEMSNAP_INDEX_MISMATCH", key: true, note: "encrypted: an index artifact's size is an array nested 200,000 deep (a stack overflow, reported as a corrupt payload)",
    },
    {
      file: "payload-index-deep-mtime-enc.memsnap",
      bytes: rawIndexBundle(container, { entries: [ok], indexText: indexWith("mtime", deepArray(200_000)), encrypted: true }),
      exit: 3, code: "MEMSNAP_INDEX_MISMATCH", key: true, note: "encrypted: an index artifact's mtime is an array nested 200,000 deep (Date.parse of it overflowed the stack)",
    },
    {
      file: "payload-index-dotdot-enc.memsnap",
      bytes: rawIndexBundle(container, {
        entries: [ok], encrypted: true,
        indexText: indexWith("path", `"${ok.name}"`).replace('"artifacts":[{', `"artifacts":[{"kind":"file","layer":"memory","mode":420,"mtime":"2026-01-01T00:00:00.000Z","path":"memory/../../outside.fifo","sha256":"${"0".repeat(64)}","size":0},{`),
      }),
      ...unsafe, key: true, note: "encrypted: the payload index lists memory/../../outside.fifo (an in-place dry run listed it as a file to add; test/format/manifest-names.test.ts runs that dry run)",
    },
    {
      file: "payload-index-layer-mismatch-enc.memsnap",
      bytes: bundle([ok, { name: "notes/b.md", data: "b\n" }], {
        layers: [memory, { name: "notes", kind: "files" }], encrypt: true, indexFor: (e, a) => (e.name === ok.name ? { ...a, layer: "notes" } : a),
      }),
      ...unsafe, key: true, note: "encrypted: an index entry whose layer is another declared layer (restore set its mode and mtime under that layer's directory)",
    },
    {
      file: "created-at-not-time.memsnap",
      bytes: bundle([ok], { mutate: (b) => { b.created_at = "yesterday"; } }),
      ...corrupt, note: "created_at that is not a time (prune buckets by it)",
    },
  ];
  return cases;
}
