/**
 * The `pfimg` source: ProcessFork image stores.
 *
 * A store is content-addressed: `images/<hex>.json` holds an image manifest whose id is the
 * SHA-256 of its bytes exactly as stored, and `blobs/sha256/<xx>/<hex>.zst` holds one zstd
 * frame whose *uncompressed* bytes hash to `<hex>`. The layer bundles each selected image's
 * manifest bytes as stored, and every blob it reaches (model base and diff, the cache page
 * manifest and every K and V page, the world fs tree and its file blobs, env and procs, the
 * effects ledger, the trace; with `with_parents` the parents' too), each compressed frame as
 * stored and once however many images reach it. Every digest is checked while the bytes
 * stream (decompress, hash). Extracted, the layer directory is itself a valid store.
 *
 * Text blobs (trace, effects, env, model diff, text-looking world files) are scanned with
 * the redactor; content-addressed bytes are never rewritten, so findings are recorded as
 * unredacted.
 */
import type { SourceKind } from "../types.js";
import { capturePfimg } from "./capture.js";
import { parsePfimgConfig, type PfimgConfig } from "./config.js";
import { materializeStore } from "./materialize.js";
import { deepVerifyPfimg } from "./verify.js";

export const pfimgSource: SourceKind<PfimgConfig> = {
  kind: "pfimg",
  schemaVersion: 1,
  parseConfig: parsePfimgConfig,
  capture: capturePfimg,
  deepVerify: deepVerifyPfimg,
  materialize: materializeStore,
};
