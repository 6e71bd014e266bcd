/** Checking the key of an encrypted bundle before an in-place restore changes anything. */
import { open } from "node:fs/promises";
import type { BundleLayout } from "../format/container.js";
import type { Manifest } from "../format/manifest.js";
import { AGE_PREFIX_MAX, openAgePrefix } from "../codecs/age/stream-open.js";
import type { Keys } from "../read/read-payload.js";

/**
 * Open the age header of an encrypted bundle's payload with the given identities or
 * passphrase (the payload itself is not read). Throws the key errors reading the payload
 * would (MEMSNAP_DECRYPT_FAILED for a key that does not open it, MEMSNAP_IDENTITY_INVALID,
 * MEMSNAP_PAYLOAD_MISLABELED): an in-place restore calls it before it takes the lock, runs
 * the before_restore hook or takes its safety snapshot, so a wrong key changes nothing (each
 * retry used to add an `auto:pre-restore` snapshot). A plaintext bundle passes.
 */
export async function checkBundleKey(layout: BundleLayout, manifest: Manifest, keys: Keys): Promise<void> {
  if (!manifest.payload.encryption) return;
  const len = Math.min(layout.payloadSize, AGE_PREFIX_MAX);
  const fh = await open(layout.path, "r");
  let prefix: Buffer;
  try {
    const buf = Buffer.alloc(len);
    let got = 0;
    while (got < len) {
      const { bytesRead } = await fh.read(buf, got, len - got, layout.payloadOffset + got);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    prefix = buf.subarray(0, got);
  } finally {
    await fh.close();
  }
  await openAgePrefix(prefix, prefix.length === layout.payloadSize, keys);
}
