/**
 * verify: check a bundle and collect every problem before failing once.
 *
 * Without a key it checks the container, the manifest (version, shape, seal), the layer
 * schema versions, that the payload is what the manifest says it is (age vs zstd), and
 * the payload's SHA-256 and size. For an unencrypted bundle it also checks every artifact,
 * since no key is needed for that. With a key it decrypts, decompresses and checks every
 * artifact's size and SHA-256, missing/extra/duplicate entries, and the index's binding to
 * the manifest. Checks it could not run are reported as `skipped`, never as passed.
 */
import type { Finding } from "./errors.js";
import { MemsnapError, isMemsnapError, ERROR_CODES } from "./errors.js";
import { readLayout, type BundleLayout } from "./format/container.js";
import { basesOf, encodeIndex, parseManifest, type Manifest } from "./format/manifest.js";
import { createHash } from "node:crypto";
import { AGE_MAGIC } from "./codecs/age/common.js";
import {
  compareWithIndex,
  hashStoredPayload,
  readPayload,
  type EntryHandler,
  type EntryInfo,
  type Keys,
} from "./read/read-payload.js";
import { ZSTD_MAGIC } from "./codecs/zstd.js";
import { checkSignature } from "./sign.js";
import { checkManifest, signatureFindings } from "./read/preflight.js";
import { checkEntryName } from "./format/safe-path.js";
import {
  checkReferencedLayers,
  extractReferenced,
  extractStored,
  openBases,
  References,
  type OpenBase,
} from "./read/bases.js";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { sourceKind } from "./sources/registry.js";
import type { KeyObject } from "node:crypto";

export type CheckStatus = "passed" | "failed" | "skipped";

export interface Check {
  name: string;
  status: CheckStatus;
  detail?: string;
}

export interface VerifyReport {
  ok: boolean;
  path: string;
  manifest: Manifest | null;
  encrypted: boolean | null;
  checks: Check[];
  findings: Finding[];
}

export interface VerifyOptions {
  keys?: Keys;
  /** Public keys whose signature proves who made the bundle; when given, an unsigned or untrusted bundle fails. */
  trusted?: KeyObject[];
  /** Also run each layer's own checks (JSON parse, SQLite integrity_check, git bundle verify). */
  deep?: boolean;
  signal?: AbortSignal;
  /** Called as stored payload bytes are read. */
  onProgress?: (bytes: number, total: number) => void;
}

/** Check the payload's first bytes against the declared encryption. */
function checkMagic(m: Manifest, head: Buffer): Finding | null {
  const isAge = head.subarray(0, AGE_MAGIC.length).equals(AGE_MAGIC);
  const isZstd = head.subarray(0, 4).equals(ZSTD_MAGIC);
  if (m.payload.encryption && !isAge) {
    return {
      code: "MEMSNAP_PAYLOAD_MISLABELED",
      message:
        `the manifest says the payload is age-encrypted but ` +
        `it ${isZstd ? "is plaintext zstd" : "is not an age file"}`,
    };
  }
  if (!m.payload.encryption && !isZstd) {
    return {
      code: "MEMSNAP_PAYLOAD_MISLABELED",
      message:
        `the manifest says the payload is plaintext zstd but ` +
        `it ${isAge ? "is age-encrypted" : "is not a zstd stream"}`,
    };
  }
  return null;
}

/** Verify a bundle; never throws for a problem with the bundle (those are findings). */
export async function verifyBundle(path: string, opts: VerifyOptions = {}): Promise<VerifyReport> {
  const checks: Check[] = [];
  const findings: Finding[] = [];
  const report = (): VerifyReport => ({
    ok: findings.length === 0,
    path,
    manifest,
    encrypted: manifest ? manifest.payload.encryption !== null : null,
    checks,
    findings,
  });
  const add = (name: string, fs: Finding[], detail?: string): void => {
    findings.push(...fs);
    checks.push({
      name,
      status: fs.length ? "failed" : "passed",
      ...(fs.length ? { detail: fs.map((x) => x.message).join("; ") } : detail ? { detail } : {}),
    });
  };
  const skip = (name: string, detail: string): void => {
    checks.push({ name, status: "skipped", detail });
  };
  let manifest: Manifest | null = null;
  let layout: BundleLayout;
  try {
    layout = await readLayout(path);
    add("container", []);
    manifest = parseManifest(layout.manifestBytes);
    add("manifest", [], `manifest_version ${manifest.manifest_version}`);
  } catch (e) {
    if (!isMemsnapError(e)) throw e;
    add(checks.length ? "manifest" : "container", [{ code: e.code, message: e.message }]);
    return report();
  }
  const mf = checkManifest(manifest, layout);
  const sig = checkSignature(manifest, opts.trusted ?? []);
  const sigFindings: Finding[] = signatureFindings(sig, (opts.trusted?.length ?? 0) > 0);
  add(
    "seal",
    mf.filter((x) => x.code === "MEMSNAP_SEAL_MISMATCH"),
  );
  add(
    "layers",
    mf.filter((x) => x.code === "MEMSNAP_UNSUPPORTED_LAYER"),
  );
  const labelF = mf.filter((x) => x.code === "MEMSNAP_PAYLOAD_MISLABELED");
  const magic = labelF.length ? null : checkMagic(manifest, layout.payloadHead);
  add("payload-label", magic ? [magic] : labelF);
  const sizeFindings = mf.filter((x) => x.code === "MEMSNAP_PAYLOAD_HASH_MISMATCH");
  const encrypted = manifest.payload.encryption !== null;
  if (!encrypted && manifest.index) {
    const h = createHash("sha256")
      .update(encodeIndex({ format: "memsnap-index", snapshot_id: manifest.snapshot_id, artifacts: manifest.index }))
      .digest("hex");
    add(
      "index-binding",
      h === manifest.payload.index_sha256
        ? []
        : [{ code: "MEMSNAP_INDEX_MISMATCH", message: "the manifest's index does not hash to payload.index_sha256" }],
    );
  } else if (!encrypted && manifest.manifest_version < 3) {
    // Since version 3 a plaintext manifest leaves out an index of over MANIFEST_INDEX_MAX artifacts.
    add("index-binding", [
      { code: "MEMSNAP_MANIFEST_CORRUPT", message: "an unencrypted bundle's manifest has no index" },
    ]);
  }
  // An incremental bundle (manifest_version 2): its bases must be beside it, sealed as recorded.
  let bases: OpenBase[] | null = null;
  const incremental = basesOf(manifest).length > 0;
  if (incremental) {
    try {
      bases = await openBases(path, manifest);
      add("bases", [], `${bases.length} base(s) beside it, sealed as recorded`);
    } catch (e) {
      if (!isMemsnapError(e)) throw e;
      add("bases", [{ code: e.code, message: e.message }]);
    }
  }
  const keys = opts.keys ?? {};
  const haveKey = (keys.identities?.length ?? 0) + (keys.passphrases?.length ?? 0) > 0;
  const labelBad = labelF.length > 0 || magic !== null;
  const layersBad = mf.some((x) => x.code === "MEMSNAP_UNSUPPORTED_LAYER");
  if ((encrypted && !haveKey) || labelBad || layersBad) {
    const stored = await hashStoredPayload(layout, opts.onProgress);
    const ok = stored.sha256 === manifest.payload.sha256 && stored.size === manifest.payload.stored_size;
    add(
      "payload-sha256",
      ok
        ? sizeFindings
        : [
            ...sizeFindings,
            {
              code: "MEMSNAP_PAYLOAD_HASH_MISMATCH",
              message: "the payload bytes do not hash to the manifest's SHA-256",
            },
          ],
    );
    const why = labelBad
      ? "not run: the payload is mislabeled"
      : layersBad
        ? "not run: unsupported layer"
        : "needs the key (--identity or --passphrase-file)";
    if (encrypted) {
      skip("decrypt", why);
      skip("index-binding", why);
    }
    skip("artifacts", why);
    if (incremental) skip("references", why);
    if (opts.deep) skip("deep", why);
    finishSignature();
    return report();
  }
  // Full pass: decrypt (if needed), decompress, hash every entry, optionally deep-check.
  const deepProblems: Finding[] = [];
  let deepChecked = 0;
  let deepOwn = 0;
  const unsafe: Finding[] = [];
  const layerKinds = new Map(manifest.layers.map((l) => [l.name, l.kind]));
  const layerEntries = new Map(manifest.layers.map((l) => [l.name, l]));
  const refs = new References();
  try {
    const layerNames = new Set(manifest.layers.map((l) => l.name));
    /** `--deep`: the source's own check of an artifact, this bundle's or a referenced one in its base. */
    const deepCheck = async (info: EntryInfo, chunks: AsyncIterable<Buffer>): Promise<void> => {
      const kind = layerKinds.get(info.layer);
      const impl = kind ? sourceKind(kind) : undefined;
      if (!impl?.deepVerify) return;
      deepChecked++;
      // Copies: a checker may keep chunks past the next one, when the reader reuses their memory.
      const problem = await impl.deepVerify({
        entry: { path: info.name, layer: info.layer },
        bytes: copies(chunks),
        layer: layerEntries.get(info.layer),
      });
      if (problem) deepProblems.push({ code: "MEMSNAP_DEEP_VERIFY_FAILED", message: problem, path: info.name });
    };
    const r = await readPayload(
      layout,
      manifest,
      keys,
      async (info, chunks) => {
        try {
          checkEntryName(info.name, layerNames);
        } catch (e) {
          if (!isMemsnapError(e)) throw e;
          unsafe.push({ code: e.code, message: e.message, path: info.name });
          return;
        }
        if (opts.deep) await deepCheck(info, chunks);
      },
      {
        streamIndex: true,
        onRef: refs.add,
        ...(opts.signal ? { signal: opts.signal } : {}),
        ...(opts.onProgress ? { onStored: opts.onProgress } : {}),
      },
    );
    const cmp = compareWithIndex(manifest, r);
    const payloadF = cmp.filter((x) => x.code === "MEMSNAP_PAYLOAD_HASH_MISMATCH");
    add("payload-sha256", [...sizeFindings, ...payloadF]);
    if (encrypted) add("decrypt", []);
    const indexF = cmp.filter((x) => x.code === "MEMSNAP_INDEX_MISMATCH");
    if (encrypted)
      add(
        "index-binding",
        indexF.filter((x) => x.path === ".memsnap/index.json"),
      );
    add(
      "artifacts",
      [
        ...unsafe,
        ...cmp.filter(
          (x) =>
            x.code === "MEMSNAP_ARTIFACT_HASH_MISMATCH" ||
            (x.code === "MEMSNAP_INDEX_MISMATCH" && (!encrypted || x.path !== ".memsnap/index.json")),
        ),
      ],
      `${r.entries.length} artifacts`,
    );
    // A chunked artifact's payload entry holds only its stored ranges: its deep check runs once it is reassembled.
    for (const p of refs.chunked.keys()) {
      for (let i = deepProblems.length - 1; i >= 0; i--) if (deepProblems[i]!.path === p) deepProblems.splice(i, 1);
      if (opts.deep && sourceKind(layerKinds.get(p.slice(0, p.indexOf("/"))) ?? "")?.deepVerify) deepChecked--;
    }
    deepOwn = deepChecked;
    if (incremental || refs.count)
      await checkReferences(
        layout,
        manifest,
        bases,
        refs,
        keys,
        opts.signal,
        add,
        skip,
        opts.deep ? deepCheck : undefined,
      );
    if (opts.deep)
      add(
        "deep",
        deepProblems,
        `${deepChecked} artifact(s) checked${
          deepChecked > deepOwn ? `, ${deepChecked - deepOwn} of them referenced, in bases` : ""
        }`,
      );
  } catch (e) {
    if (!isMemsnapError(e)) throw e;
    const stored = await hashStoredPayload(layout);
    const ok = stored.sha256 === manifest.payload.sha256 && stored.size === manifest.payload.stored_size;
    add(
      "payload-sha256",
      ok
        ? sizeFindings
        : [
            ...sizeFindings,
            {
              code: "MEMSNAP_PAYLOAD_HASH_MISMATCH",
              message: "the payload bytes do not hash to the manifest's SHA-256",
            },
          ],
    );
    const keyErr = ERROR_CODES[e.code].class === "key";
    if (encrypted) add("decrypt", keyErr ? [{ code: e.code, message: e.message }] : []);
    if (!keyErr) add("artifacts", [{ code: e.code, message: e.message }]);
    else skip("artifacts", "not run: the payload could not be decrypted");
  }
  finishSignature();
  return report();

  function finishSignature(): void {
    const payloadBad = findings.some((x) => x.code === "MEMSNAP_PAYLOAD_HASH_MISMATCH");
    if (sig.state === "valid" && payloadBad) {
      sigFindings.push({
        code: "MEMSNAP_SIGNATURE_INVALID",
        message: "the payload does not match the SHA-256 the signature commits to",
      });
    }
    if (sig.state === "unsigned" && !sigFindings.length) skip("signature", "the bundle is unsigned");
    else
      add(
        "signature",
        sigFindings,
        sig.state === "valid"
          ? `signed by ${sig.key_id}${
              sig.trusted ? " (trusted)" : " (not checked against a trusted key: pass --trust)"
            }`
          : undefined,
      );
  }
}

/**
 * The references of an incremental bundle: they match what its layers declare, and each base
 * holds every artifact referenced from it with the recorded size and SHA-256, its own payload
 * checked whole against its index (nothing is written). With `deep`, each referenced artifact
 * gets its source's deep check as it is read from the base.
 */
async function checkReferences(
  layout: BundleLayout,
  manifest: Manifest,
  bases: OpenBase[] | null,
  refs: References,
  keys: Keys,
  signal: AbortSignal | undefined,
  add: (name: string, fs: Finding[], detail?: string) => void,
  skip: (name: string, detail: string) => void,
  deep?: EntryHandler,
): Promise<void> {
  if (!bases) {
    skip("references", "not run: a base is missing or is not the one recorded");
    return;
  }
  // Chunked artifacts are reassembled in a private temp directory (0700, removed after) and
  // hashed whole, as a restore does; their stored ranges are read from the payload a second time.
  let tmp: string | null = null;
  try {
    checkReferencedLayers(manifest, refs);
    const files = new Map<string, string>();
    if (refs.chunked.size) {
      tmp = await mkdtemp(join(tmpdir(), "memsnap-verify-"));
      let n = 0;
      for (const p of refs.chunked.keys()) files.set(p, join(tmp, `c${n++}`));
      await extractStored(layout, manifest, refs, (e) => files.get(e.path)!, keys, signal);
    }
    await extractReferenced(bases, refs, () => null, {
      keys,
      ...(signal ? { signal } : {}),
      ...(deep ? { peek: deep, assembled: deep } : {}),
      chunkFile: (e) => files.get(e.path) ?? null,
    });
    const chunked = refs.chunked.size ? `, ${refs.chunked.size} of them chunked and reassembled` : "";
    add("references", [], `${refs.count} artifacts in ${bases.length} base(s)${chunked}`);
  } catch (e) {
    if (!isMemsnapError(e)) throw e;
    add("references", [{ code: e.code, message: e.message, ...(e.path ? { path: e.path } : {}) }]);
  } finally {
    if (tmp) await rm(tmp, { recursive: true, force: true });
  }
}

/** The error verify's CLI raises for a failed report: the single finding's code, or MEMSNAP_VERIFY_FAILED. */
export function reportError(r: VerifyReport): MemsnapError {
  const codes = [...new Set(r.findings.map((f) => f.code))];
  const classes = new Set(codes.map((c) => ERROR_CODES[c].class));
  const code = codes.length === 1 || classes.size === 1 ? codes[0]! : "MEMSNAP_VERIFY_FAILED";
  const first = r.findings[0]!;
  const msg = r.findings.length === 1 ? first.message : `${r.findings.length} problems found, first: ${first.message}`;
  const hint =
    code === "MEMSNAP_SOURCE_MISSING"
      ? "no file is at that path: check it (nothing is wrong with any bundle)"
      : code === "MEMSNAP_BASE_MISSING"
        ? // nothing is wrong with the bundle itself: a base it needs was not copied along
          "copy the base bundle next to it (memsnap export copies a snapshot with its bases); the bundle itself may " +
          "be intact"
        : code === "MEMSNAP_SIGNATURE_REQUIRED" || code === "MEMSNAP_SIGNATURE_UNTRUSTED"
          ? "only a bundle signed by a --trust key proves who made it; check the key, or drop --trust"
          : code === "MEMSNAP_SIGNATURE_INVALID"
            ? "the manifest or the payload changed after signing; do not restore it"
            : ERROR_CODES[code].class === "key"
              ? "check that --identity names a key this bundle was encrypted to"
              : ERROR_CODES[code].class === "malformed"
                ? "the file is not a bundle this memsnap can read (damaged, not a bundle, or from a newer memsnap)"
                : "the bundle is damaged or was altered; do not restore it, use another copy";
  return new MemsnapError(code, msg, { findings: r.findings, path: r.path, hint });
}

/** Each chunk as a copy of its own. */
async function* copies(chunks: AsyncIterable<Buffer>): AsyncGenerator<Buffer> {
  for await (const c of chunks) yield Buffer.from(c);
}
