// Modes, keys and signatures (issue 35 items 8, 9, 10, 15):
// - index modes with every special bit (0777, 04755, 02755, 01777, 07777) in files, state,
//   trace and sqlite layers: restore gives each file `mode & 0o777 & ~umask` (check "custom":
//   test/restore/attributes.test.ts restores them under umask 022 and 077);
// - passphrase bundles whose age header asks for an scrypt work factor over the cap (2^18 by
//   default, 2^20 at most): refused before any scrypt work (the header is hand-built: the
//   bundle need not decrypt, the cap is checked before the MAC can be);
// - an unsigned bundle and one signed by the attacker's own key, which `restore --trust`
//   refuses as `verify --trust` does (check "custom": test/restore/modes-keys.test.ts).
import { createPrivateKey } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { computeSeal } from "../../dist/format/manifest.js";
import { signManifest } from "../../dist/sign.js";
import { agentlogId, parseLossless } from "../../dist/util/canonical-agentlog.js";
import { HOSTILE_ID } from "../lib/hostile-bundle.mjs";

/** The modes every "special bits" case carries, by file name. */
export const SPECIAL_MODES = { "wide.sh": 0o777, "setuid.sh": 0o4755, "setgid.sh": 0o2755, "sticky.md": 0o1777, "all.sh": 0o7777, "group.md": 0o664, "private.md": 0o600 };

/** An Ed25519 key from a fixed seed (the attacker's signing key: deterministic signatures). */
export function attackerSigningKey() {
  const der = Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), Buffer.alloc(32, 0x5a)]);
  return createPrivateKey({ key: der, format: "der", type: "pkcs8" });
}

function trace(agent) {
  const meta = { agent };
  const first = { version: "0.1", id: agentlogId(parseLossless(JSON.stringify(meta))), kind: "metadata", ts: "2024-06-01T00:00:00Z", parent: null, payload: meta };
  return `${JSON.stringify(first)}\n`;
}

/** A small real SQLite database (better-sqlite3, as the sqlite kind uses). */
function sqliteBytes() {
  const require = createRequire(import.meta.url);
  const Database = require("better-sqlite3");
  const dir = mkdtempSync(join(tmpdir(), "memsnap-hostile-db-"));
  try {
    const db = new Database(join(dir, "app.db"));
    db.pragma("journal_mode = DELETE");
    db.exec("CREATE TABLE notes(body TEXT); INSERT INTO notes VALUES ('hello')");
    db.close();
    return readFileSync(join(dir, "app.db"));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const b64 = (b) => b.toString("base64").replace(/=+$/, "");

/**
 * An age v1 file with one scrypt stanza of work factor `logN` (a string: any digits), a
 * 32-byte body and a MAC that match nothing, a nonce and one sealed chunk: what an attacker
 * writes to make the victim's memsnap spend 2^logN·1 KiB before the MAC can fail.
 */
function scryptAge(logN, extraStanza = "") {
  const header = `age-encryption.org/v1\n-> scrypt ${b64(Buffer.alloc(16, 0x11))} ${logN}\n${b64(Buffer.alloc(32, 0x22))}\n${extraStanza}--- ${b64(Buffer.alloc(32, 0x33))}\n`;
  return Buffer.concat([Buffer.from(header, "latin1"), Buffer.alloc(16, 0x44), Buffer.alloc(64 + 16, 0x55)]);
}

export default function ({ bundle, container, sha, tarOf, compress }) {
  const special = (layer, body) => Object.entries(SPECIAL_MODES).map(([f, mode]) => ({ name: `${layer}/${f}`, data: body(f), indexMode: mode, mode }));
  const files = special("memory", (f) => `${f}\n`);
  const state = special("state", (f) => `{"file":${JSON.stringify(f)}}\n`).map((e) => ({ ...e, name: e.name + ".json" }));
  const traces = special("traces", (f) => trace(f)).map((e) => ({ ...e, name: e.name + ".agentlog" }));
  const db = sqliteBytes();
  const custom = (file, note, extra = {}) => ({ exit: 0, code: "", check: "custom", note, file, ...extra });

  /** A container with `payload` as an age payload to a passphrase, its manifest sealed (the tar inside is not readable: no key opens it). */
  const scryptBundle = (payload) => {
    const data = "harmless\n";
    const artifacts = [{ path: "memory/ok.md", layer: "memory", kind: "file", size: data.length, sha256: sha(Buffer.from(data)), mode: 420, mtime: "2026-01-01T00:00:00.000Z" }];
    const indexBytes = Buffer.from(JSON.stringify({ artifacts, format: "memsnap-index", snapshot_id: HOSTILE_ID }));
    const tar = tarOf([{ name: "memory/ok.md", data }, { name: ".memsnap/index.json", data: indexBytes }]);
    const body = {
      format: "memsnap", manifest_version: 1, snapshot_id: HOSTILE_ID, created_at: "2026-01-01T00:00:00.000Z", created_by: "api",
      label: "hostile", tenant: "default", agent: "victim", host: "attacker", tool: { name: "memsnap", version: "0.1.0" }, parent: null,
      layers: [{ name: "memory", kind: "files", schema_version: 1, artifacts: 1, bytes: data.length }],
      payload: {
        member: "payload.tar.zst.age", compression: { codec: "zstd", level: 3 }, encryption: { scheme: "age", recipients: [{ type: "scrypt" }] },
        stored_size: payload.length, sha256: sha(payload), tar_size: tar.length, index_sha256: sha(indexBytes), artifacts: 1, bytes: data.length,
      },
      redaction: { policy: "off" },
    };
    void compress;
    const manifest = Buffer.from(JSON.stringify({ ...body, seal: computeSeal(body) }, null, 1) + "\n");
    return container(payload, manifest, { encrypted: true });
  };
  const pw = { MEMSNAP_PASSPHRASE: "any passphrase" };

  /** A KV layer of verbatim files only, whose own kv-index gives each file a mode (restored by the KV rebuild, not the payload index). */
  const kvLayer = (encrypt) => {
    const names = Object.keys(SPECIAL_MODES);
    const kvIndex = Buffer.from(JSON.stringify({
      format: "memsnap-kv-index", version: 1, source_format: "memsnap", dtype: "bf16", page_bytes: 8192, shuffle: { applied: false, elem_bytes: 2 },
      contents: [], pages: [],
      files: names.map((f) => ({ path: f, bytes: f.length + 1, mode: SPECIAL_MODES[f], mtime: "2024-06-01T12:00:00.000Z", artifact: `files/${f}` })),
    }));
    return bundle([...names.map((f) => ({ name: `kv/files/${f}`, data: `${f}\n` })), { name: "kv/kv-index.json", data: kvIndex, kind: "json" }], {
      layer: { name: "kv", kind: "kv", schema_version: 2, meta: { format: "memsnap", dtype: "bf16", page_bytes: 8192, index_sha256: sha(kvIndex), bytes_total: 0, shuffle: { applied: false, elem_bytes: 2 } } },
      encrypt,
    });
  };

  return [
    // --- modes: restored as mode & 0o777 & ~umask (test/restore/attributes.test.ts)
    custom("modes-files-special-bits.memsnap", "files layer whose index gives 0777, 04755, 02755, 01777, 07777: restored mode & 0o777 & ~umask",
      { bytes: bundle(files) }),
    custom("modes-files-special-bits-encrypted.memsnap", "the same, encrypted to the victim's key (the modes come from the streamed index)",
      { bytes: bundle(files, { encrypt: true }), key: true }),
    custom("modes-state-special-bits.memsnap", "state layer with special-bit modes",
      { bytes: bundle(state, { layer: { name: "state", kind: "state" } }) }),
    custom("modes-trace-special-bits.memsnap", "trace layer with special-bit modes",
      { bytes: bundle(traces, { layer: { name: "traces", kind: "trace" } }) }),
    custom("modes-sqlite-special-bits.memsnap", "sqlite layer whose database the index gives 04777: restored 0777 & ~umask after materialize",
      {
        bytes: bundle([{ name: "db/app.db", data: db, indexMode: 0o4777, kind: "sqlite" }], {
          layer: { name: "db", kind: "sqlite", meta: { root: "/attacker/db", root_is_file: false, databases: { "app.db": { journal_mode: "delete", tables: { notes: 1 } } } } },
        }),
      }),
    custom("modes-three-layers-encrypted.memsnap", "files, state and trace layers with special-bit modes in one encrypted bundle",
      {
        bytes: bundle([...files, ...state, ...traces], {
          layers: [{ name: "memory", kind: "files" }, { name: "state", kind: "state" }, { name: "traces", kind: "trace" }], encrypt: true,
        }),
        key: true,
      }),
    custom("modes-kv-special-bits.memsnap", "kv layer whose own kv-index gives its files 0777, 04755, 02755, 01777, 07777: the rebuild masks them",
      { bytes: kvLayer(false) }),
    custom("modes-kv-special-bits-encrypted.memsnap", "the same, encrypted to the victim's key", { bytes: kvLayer(true), key: true }),

    // --- scrypt work factor over the cap: refused before any scrypt work
    { file: "scrypt-logn22.memsnap", bytes: scryptBundle(scryptAge("22")), exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE", env: pw,
      note: "age header with scrypt work factor 2^22 (4 GiB): refused at once, not after 20 s and 4 GiB" },
    { file: "scrypt-logn22-raised-cap.memsnap", bytes: scryptBundle(scryptAge("22")), exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE",
      env: { ...pw, MEMSNAP_SCRYPT_MAX_LOG_N: "20" }, note: "2^22 stays refused with the cap raised to its most, 2^20" },
    { file: "scrypt-logn20.memsnap", bytes: scryptBundle(scryptAge("20")), exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE", env: pw,
      note: "2^20 (1 GiB) is over the default cap of 2^18" },
    { file: "scrypt-logn19.memsnap", bytes: scryptBundle(scryptAge("19")), exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE", env: pw,
      note: "2^19 (512 MiB) is over the default cap of 2^18" },
    { file: "scrypt-logn-huge.memsnap", bytes: scryptBundle(scryptAge("99999999999999999999")), exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE", env: pw,
      note: "a work factor of 2^99999999999999999999" },
    { file: "scrypt-logn22-no-passphrase.memsnap", bytes: scryptBundle(scryptAge("22")), exit: 4, code: "MEMSNAP_DECRYPT_FAILED", key: true,
      note: "only an identity given: no scrypt is run, the bundle needs a passphrase" },
    { file: "scrypt-logn22-with-x25519.memsnap", bytes: scryptBundle(scryptAge("22", `-> X25519 ${b64(Buffer.alloc(32, 9))}\n${b64(Buffer.alloc(32, 0x66))}\n`)),
      exit: 4, code: "MEMSNAP_DECRYPT_FAILED", env: pw, note: "an scrypt stanza beside another: malformed, refused before any scrypt work" },
    { file: "scrypt-logn18-wrong-mac.memsnap", bytes: scryptBundle(scryptAge("18")), exit: 4, code: "MEMSNAP_DECRYPT_FAILED", env: pw,
      note: "2^18, the default cap, is tried (256 MiB) and fails as a wrong passphrase does" },
    { file: "scrypt-logn-leading-zero.memsnap", bytes: scryptBundle(scryptAge("022")), exit: 4, code: "MEMSNAP_DECRYPT_FAILED", env: pw,
      note: "a work factor written 022: not canonical, malformed" },
    { file: "scrypt-two-stanzas.memsnap", bytes: scryptBundle(scryptAge("22", `-> scrypt ${b64(Buffer.alloc(16, 0x12))} 22\n${b64(Buffer.alloc(32, 0x23))}\n`)),
      exit: 4, code: "MEMSNAP_DECRYPT_FAILED", env: pw, note: "two scrypt stanzas: malformed, no scrypt work" },

    // --- restore --trust (test/restore/modes-keys.test.ts)
    custom("trust-unsigned.memsnap", "an unsigned bundle: restore --trust KEY refuses it (MEMSNAP_SIGNATURE_REQUIRED), as verify --trust does",
      { bytes: bundle([{ name: "memory/ok.md", data: "harmless\n" }]) }),
    custom("trust-signed-by-attacker.memsnap", "signed by the attacker's own key: restore --trust VICTIM_KEY refuses it (MEMSNAP_SIGNATURE_UNTRUSTED)",
      {
        bytes: bundle([{ name: "memory/ok.md", data: "signed by someone else\n" }], {
          mutate: (body) => ({ ...body, signature: signManifest(body, attackerSigningKey()) }),
        }),
      }),
  ];
}
