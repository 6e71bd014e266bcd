/** Checks a restore makes on the manifest before it writes anything. */
import type { KeyObject } from "node:crypto";
import { MemsnapError, type Finding } from "../errors.js";
import type { BundleLayout } from "../format/container.js";
import { checkSeal, PAYLOAD_MEMBER_ENCRYPTED, PAYLOAD_MEMBER_PLAIN, type Manifest } from "../format/manifest.js";
import { checkSignature, type SignatureStatus } from "../sign.js";
import { sourceKind } from "../sources/registry.js";

/** Throw the first manifest finding as an error (restore refuses before touching anything). */
export function checkManifestFindings(findings: Finding[]): void {
  const f = findings[0];
  if (!f) return;
  throw new MemsnapError(f.code, f.message, {
    findings,
    hint:
      f.code === "MEMSNAP_UNSUPPORTED_LAYER"
        ? "upgrade memsnap to restore this bundle"
        : "the bundle is damaged or was altered; nothing was restored",
  });
}

/** Options shared by both restores for signed manifests. */
export interface SignaturePolicy {
  /** Refuse unsigned bundles and bundles not signed by one of `trusted`. */
  requireSignature?: boolean;
  /** Trusted signers: naming any requires a signature by one of them, as verify does (requireSignature or not). */
  trusted?: KeyObject[];
}

/**
 * Enforce the signature policy before anything is written. An invalid signature always
 * fails (MEMSNAP_SIGNATURE_INVALID); with requireSignature or any trusted key (as `verify
 * --trust`) an unsigned bundle fails (MEMSNAP_SIGNATURE_REQUIRED) and so does one signed by
 * an untrusted key (MEMSNAP_SIGNATURE_UNTRUSTED).
 */
export function enforceSignature(m: Manifest, policy: SignaturePolicy): void {
  const trusting = (policy.trusted?.length ?? 0) > 0;
  const f = signatureFindings(checkSignature(m, policy.trusted ?? []), !!policy.requireSignature || trusting)[0];
  if (!f) return;
  throw new MemsnapError(f.code, `${f.message}; nothing was restored`, {
    hint:
      f.code === "MEMSNAP_SIGNATURE_INVALID"
        ? "the manifest was altered after signing; do not restore it"
        : trusting
          ? "only a bundle signed by a --trust key is restored once --trust is given; check the key, or drop " +
            "--trust (and --require-signature)"
          : "pass --trust with the signer's public key (memsnap-ed25519:…), or drop --require-signature",
  });
}

/** Check the manifest alone: seal, layer kinds and schema versions, member/encryption agreement. */
export function checkManifest(m: Manifest, layout: BundleLayout): Finding[] {
  const f: Finding[] = [];
  if (!checkSeal(m)) f.push({ code: "MEMSNAP_SEAL_MISMATCH", message: "the manifest seal does not match its content" });
  for (const l of m.layers) {
    const k = sourceKind(l.kind);
    if (!k)
      f.push({ code: "MEMSNAP_UNSUPPORTED_LAYER", message: `layer ${l.name}: unknown kind "${l.kind}"`, path: l.name });
    else if (l.schema_version > k.schemaVersion) {
      f.push({
        code: "MEMSNAP_UNSUPPORTED_LAYER",
        message:
          `layer ${l.name}: ${l.kind} schema ${l.schema_version} is newer than this memsnap reads ` +
          `(${k.schemaVersion})`,
        path: l.name,
      });
    }
  }
  const wantMember = m.payload.encryption ? PAYLOAD_MEMBER_ENCRYPTED : PAYLOAD_MEMBER_PLAIN;
  if (m.payload.member !== wantMember || layout.payloadMember !== wantMember) {
    f.push({
      code: "MEMSNAP_PAYLOAD_MISLABELED",
      message:
        `payload member ${layout.payloadMember} does not match the manifest's encryption ` +
        `(${m.payload.encryption ? "age" : "none"})`,
    });
  }
  if (layout.payloadSize !== m.payload.stored_size) {
    f.push({
      code: "MEMSNAP_PAYLOAD_HASH_MISMATCH",
      message: `payload member has ${layout.payloadSize} bytes, manifest says ${m.payload.stored_size}`,
    });
  }
  return f;
}

/** Findings for a signature status; `requireTrust` when the caller named trusted keys. */
export function signatureFindings(sig: SignatureStatus, requireTrust: boolean): Finding[] {
  if (sig.state === "invalid")
    return [{ code: "MEMSNAP_SIGNATURE_INVALID", message: `signature invalid: ${sig.reason}` }];
  if (!requireTrust) return [];
  if (sig.state === "unsigned") return [{ code: "MEMSNAP_SIGNATURE_REQUIRED", message: "the bundle is unsigned" }];
  if (!sig.trusted)
    return [{ code: "MEMSNAP_SIGNATURE_UNTRUSTED", message: `signed by ${sig.key_id}, which is not a trusted key` }];
  return [];
}
