/**
 * memsnap's library: atomic, verifiable snapshots of an AI agent's memory. It exports the verbs and the types
 * they take and return, nothing else (docs/API.md); internals are reached by path inside this package only.
 */
export { MemsnapError, isMemsnapError, ERROR_CODES, type ErrorCode, type ErrorClass, type Finding } from "./errors.js";
export { TOOL_NAME, TOOL_VERSION } from "./version.js";

// Configuration: memsnap.json, and what `memsnap init` detects in an agent's home.
export { loadConfig, parseConfig, type MemsnapConfig, type ConfiguredSource } from "./config.js";
export { detectAgent } from "./init/detect.js";
export { renderConfig } from "./init/render.js";
export type { Detection, DetectedSource } from "./init/types.js";

// Keys: age identities, recipients and passphrases; manifest signing keys.
export { generateIdentity, identityFileText } from "./codecs/age/keys.js";
export { loadIdentities, loadRecipients, loadPassphrase, onKeyFileWarning, type KeyFileWarning } from "./keys.js";
export { generateSigningKey, loadSigningKey, loadTrusted, type SignatureStatus } from "./sign.js";
export type { Keys } from "./read/read-payload.js";

// Snapshot, verify, restore.
export { snapshot, type SnapshotOptions, type SnapshotResult, type SnapshotProgress } from "./snapshot/snapshot.js";
export { verifyBundle, type VerifyOptions, type VerifyReport, type Check, type CheckStatus } from "./verify.js";
export { restoreToDir, type RestoreToDirOptions, type RestoreToDirResult } from "./restore/to-dir.js";
export {
  restoreInPlace,
  recoverAgent,
  type RestoreInPlaceOptions,
  type RestoreInPlaceResult,
} from "./restore/in-place.js";
export type { RestorePlan, LayerPlan } from "./restore/plan.js";

// The store: list, find, export, delete, prune, diff, rekey, browse; the scheduler.
export { listSnapshots, findSnapshot, exportSnapshot, deleteSnapshots, type StoredSnapshot } from "./store/store.js";
export type { RetentionPolicy, PruneDecision } from "./store/prune.js";
export {
  pruneStore,
  diffSnapshots,
  type PruneResult,
  type LayerDiff,
  type GitDiff,
  type SqliteDiff,
} from "./store/ops.js";
export { rekeyBundles, type RekeyOptions, type RekeyResult, type RekeyOutcome } from "./store/rekey.js";
export { openSnapshot, catArtifact, type OpenedSnapshot } from "./browse/index.js";
export { runSchedule, type ScheduleOptions } from "./schedule.js";

// What a bundle's manifest holds.
export {
  MANIFEST_VERSION,
  type Manifest,
  type IndexEntry,
  type LayerEntry,
  type PayloadInfo,
  type CreatedBy,
} from "./format/manifest.js";
