// Hostile kv layers: a valid-looking kv-index.json (docs/FORMAT.md "kv-index.json") whose
// contents, files or sizes are the attack, with the layer meta's index_sha256 matching it
// unless the case is about that. Each page is 16 bytes (bf16, page_bytes 16).
import { createHash } from "node:crypto";

const sha = (b) => createHash("sha256").update(b).digest("hex");
const PAGE = Buffer.from("0123456789abcdef"); // 16 non-zero bytes: one page
const HP = sha(PAGE);
const ZERO16 = sha(Buffer.alloc(16));
const MTIME = "2026-01-01T00:00:00.000Z";
const MANIFEST = Buffer.from("a dump made by hand\n");

/** The legitimate layer the attacks start from: data.bin = [page, zero page], plus a verbatim README.txt. */
export function baseKv() {
  return {
    contents: [
      { sha256: HP, bytes: 16, zero: false, artifact: `pages/${HP}@0.0` },
      { sha256: ZERO16, bytes: 16, zero: true, artifact: null },
    ],
    pages: [["L0/B0", 0], ["L0/B1", 1]],
    files: [
      { path: "data.bin", bytes: 32, mode: 0o644, mtime: MTIME, tiles: [0, 1] },
      { path: "README.txt", bytes: MANIFEST.length, mode: 0o644, mtime: MTIME, artifact: "files/README.txt" },
    ],
    // Tar entries besides kv-index.json (relative to the layer).
    entries: [{ name: `pages/${HP}@0.0`, data: PAGE, kind: "kv-page" }, { name: "files/README.txt", data: MANIFEST }],
    meta: {},
  };
}

/** The kv-index.json bytes of a layer description. */
export function kvIndexBytes(k) {
  return Buffer.from(JSON.stringify({
    format: "memsnap-kv-index", version: 1, source_format: "memsnap", dtype: "bf16", page_bytes: 16,
    shuffle: { applied: false, elem_bytes: 2 }, contents: k.contents, pages: k.pages, files: k.files,
  }) + "\n");
}

/** A bundle of one kv layer named `kv` (schema 2), from a layer description; `noIndex` leaves kv-index.json out. */
export function kvBundle(bundle, k, { encrypt = false, noIndex = false } = {}) {
  const index = k.indexBytes ?? kvIndexBytes(k);
  const entries = k.entries.map((e) => ({ ...e, name: `kv/${e.name}` }));
  if (!noIndex) entries.push({ name: "kv/kv-index.json", data: index, kind: "json" });
  const pagesTotal = k.pages.length;
  const meta = {
    format: "memsnap", root: "/tmp/dump", engine: null, model: { n_layers: 1, n_kv_heads: 1, head_dim: 4 }, block_size: 1,
    sequences: 0, declared_sha256: 0, skipped: { special: 0, symlinks: 0 }, dtype: "bf16", page_bytes: 16,
    files: { data: 1, verbatim: 1 }, pages_total: pagesTotal, pages_unique: 1, pages_zero: 1, dedup_ratio: 2,
    bytes_total: 32, bytes_stored: 16, shuffle: { mode: "off", applied: false, elem_bytes: 2 }, index_sha256: sha(index),
    ...k.meta,
  };
  return bundle(entries, { layer: { name: "kv", kind: "kv", schema_version: 2, meta }, encrypt });
}

export default function ({ bundle }) {
  const cases = [];
  const add = (file, k, exit, code, note, opts = {}) => {
    cases.push({ file, bytes: kvBundle(bundle, k, opts), exit, code, ...(opts.encrypt ? { key: true } : {}), ...(opts.check ? { check: opts.check } : {}), note });
  };
  const v = (f) => { const k = baseKv(); f(k); return k; };
  const unsafePath = "MEMSNAP_UNSAFE_PATH";
  const unsafe = "MEMSNAP_UNSAFE_BUNDLE";
  const damaged = "MEMSNAP_ARTIFACT_HASH_MISMATCH";

  // Modes: the index asks for setuid/setgid and world-writable; restore masks them (custom: test/sources/kv-hostile.test.ts).
  add("kv-setuid-mode.memsnap", v((k) => { k.files[0].mode = 0o6777; k.files[1].mode = 0o4755; }), 0, "", "setuid/setgid/0777 modes in kv-index files: restored as mode & 0o777 & ~umask", { check: "custom" });
  // Paths.
  /** Another verbatim file, with its own artifact. */
  const verbatim = (k, path, data = "evil\n") => {
    const art = `files/extra${k.entries.length}`;
    k.entries.push({ name: art, data });
    k.files.push({ path, bytes: Buffer.byteLength(data), mode: 0o644, mtime: MTIME, artifact: art });
  };
  add("kv-file-under-file.memsnap", v((k) => verbatim(k, "data.bin/evil")), 9, unsafePath, "a kv-index file under another file (was MEMSNAP_INTERNAL)");
  add("kv-file-under-file-enc.memsnap", v((k) => verbatim(k, "data.bin/evil")), 9, unsafePath, "encrypted: a kv-index file under another file", { encrypt: true });
  add("kv-verbatim-over-dir.memsnap", v((k) => { k.files[0].path = "d/data.bin"; verbatim(k, "d"); }), 9, unsafePath, "a verbatim kv file over the directory of another (was MEMSNAP_INTERNAL)");
  add("kv-duplicate-file.memsnap", v((k) => verbatim(k, "data.bin")), 9, unsafePath, "two kv-index files with one path: the second replaced the first");
  add("kv-file-dotdot.memsnap", v((k) => { k.files[1].path = "../../kv-escape"; }), 9, unsafePath, "a kv-index file path with ..");
  add("kv-file-absolute-enc.memsnap", v((k) => { k.files[1].path = "/tmp/memsnap-hostile-kv-abs"; }), 9, unsafePath, "encrypted: an absolute kv-index file path", { encrypt: true });
  // Sizes.
  add("kv-bytes-max-safe.memsnap", v((k) => { k.files[0].bytes = 2 ** 53 - 1; }), 9, unsafe, "a data file of 2^53-1 bytes (was MEMSNAP_INTERNAL)");
  add("kv-negative-size.memsnap", v((k) => {
    // A -16-byte zero content cancels a 16-byte one: the sum of the tiles still matches bytes.
    k.contents.push({ sha256: ZERO16, bytes: -16, zero: true, artifact: null });
    k.files[0].tiles = [0, 1, 1, 2];
  }), 9, unsafe, "a content of -16 bytes");
  add("kv-negative-file-bytes-enc.memsnap", v((k) => { k.files[0].bytes = -32; }), 9, unsafe, "encrypted: a data file of -32 bytes", { encrypt: true });
  add("kv-tiles-size-mismatch.memsnap", v((k) => { k.files[0].bytes = 48; }), 9, unsafe, "a data file's bytes are not the sum of its tiles");
  {
    // 8 TiB of 64 MiB zero pages: a 131072-tile file. Declared past the layer's bytes_total …
    const big = (k) => {
      k.contents[1] = { sha256: sha(Buffer.alloc(64 * 1024 * 1024)), bytes: 64 * 1024 * 1024, zero: true, artifact: null };
      k.contents.push({ sha256: ZERO16, bytes: 16, zero: true, artifact: null });
      k.files[0].tiles = [0, 2];
      k.files.push({ path: "sparse.bin", bytes: 2 ** 43, mode: 0o644, mtime: MTIME, tiles: new Array(2 ** 17).fill(1) });
    };
    add("kv-sparse-8tib.memsnap", v(big), 9, unsafe, "an 8 TiB sparse data file from a 2 KB bundle, past bytes_total");
    // 512 GiB (under the bound) with bytes_total 32: past what the layer declares.
    add("kv-sparse-past-declared.memsnap", v((k) => { big(k); k.files[2].tiles.length = 2 ** 13; k.files[2].bytes = 2 ** 39; }), 9, unsafe, "a 512 GiB sparse data file in a layer whose bytes_total is 32");
    // … and with bytes_total saying 8 TiB too: past the 1 TiB bound of a layer.
    add("kv-sparse-8tib-declared-enc.memsnap", v((k) => { big(k); k.meta.bytes_total = 2 ** 43 + 32; }), 9, unsafe, "encrypted: an 8 TiB sparse data file that bytes_total declares", { encrypt: true });
  }
  add("kv-content-over-cap.memsnap", v((k) => { k.contents[1].bytes = 2 ** 40; k.files[0].bytes = 2 ** 40 + 16; k.meta.bytes_total = 2 ** 40 + 16; }), 9, unsafe, "a zero content of 1 TiB (pages are at most 64 MiB)");
  // Digests.
  add("kv-zero-digest-lie.memsnap", v((k) => {
    // The page's digest with zero: true: restore would write zeros for a page that is not.
    k.contents.push({ sha256: sha(Buffer.from("fedcba9876543210")), bytes: 16, zero: true, artifact: null });
    k.files[0].tiles = [0, 2];
  }), 3, damaged, "zero: true on a content whose sha256 is not that of zeros (verify --deep passed it)");
  add("kv-zero-digest-lie-enc.memsnap", v((k) => {
    k.contents[1].sha256 = HP;
  }), 3, damaged, "encrypted: a zero content carrying a non-zero page's digest", { encrypt: true });
  add("kv-index-sha-mismatch.memsnap", v((k) => { k.meta.index_sha256 = sha(Buffer.from("another index")); }), 3, damaged, "meta.index_sha256 is not the kv-index's: the rebuild was skipped and the staged artifacts became the dump");
  add("kv-index-sha-mismatch-enc.memsnap", v((k) => { k.meta.index_sha256 = "0".repeat(64); }), 3, damaged, "encrypted: meta.index_sha256 is not the kv-index's", { encrypt: true });
  add("kv-no-index.memsnap", baseKv(), 3, damaged, "a kv layer without kv-index.json: its staged pages were left as the dump", { noIndex: true });
  return cases;
}
