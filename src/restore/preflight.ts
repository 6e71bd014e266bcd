/** Checks a restore makes on the manifest before it writes anything. */
import type { KeyObject } from "node:crypto";
import { MemsnapError, type Finding } from "../errors.js";
import type { Manifest } from "../format/manifest.js";
import { checkSignature } from "../sign.js";
import { signatureFindings } from "../verify.js";
export { checkManifest } from "../verify.js";

/** Throw the first manifest finding as an error (restore refuses before touching anything). */
export function checkManifestFindings(findings: Finding[]): void {
  const f = findings[0];
  if (!f) return;
  throw new MemsnapError(f.code, f.message, {
    findings,
    hint: f.code === "MEMSNAP_UNSUPPORTED_LAYER" ? "upgrade memsnap to restore this bundle" : "the bundle is damaged or was altered; nothing was restored",
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
    hint: f.code === "MEMSNAP_SIGNATURE_INVALID" ? "the manifest was altered after signing; do not restore it"
      : trusting ? "only a bundle signed by a --trust key is restored once --trust is given; check the key, or drop --trust (and --require-signature)"
      : "pass --trust with the signer's public key (memsnap-ed25519:…), or drop --require-signature",
  });
}
