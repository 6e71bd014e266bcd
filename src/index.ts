/**
 * memsnap's library entry: atomic, verifiable snapshots of an AI agent's memory.
 * The CLI uses only what this module exports.
 */
export { MemsnapError, ERROR_CODES, isMemsnapError, type ErrorCode, type ErrorClass, type Finding } from "./errors.js";
export { loadConfig, parseConfig, stripJsonComments, type MemsnapConfig, type ConfiguredSource } from "./config.js";
export {
  MANIFEST_VERSION, parseManifest, computeSeal, checkSeal, INDEX_PATH, basesOf, referencedIn,
  type Manifest, type IndexEntry, type LayerEntry, type PayloadInfo, type CreatedBy,
} from "./format/manifest.js";
export { readLayout, type BundleLayout } from "./format/container.js";
export { snapshot, storePath, MANIFEST_INDEX_MAX, type SnapshotOptions, type SnapshotResult, type SnapshotProgress } from "./pipeline/snapshot.js";
export { verifyBundle, reportError as verifyError, type VerifyReport, type Check, type CheckStatus } from "./verify.js";
export { restoreToDir, type RestoreToDirOptions, type RestoreToDirResult } from "./restore/to-dir.js";
export { generateIdentity, identityFileText, parseIdentities, parseRecipients, recipientFingerprint } from "./codecs/age/keys.js";
export { scryptMaxLogN, DEFAULT_SCRYPT_MAX_LOG_N, SCRYPT_MAX_LOG_N_ENV } from "./codecs/age/scrypt.js";
export { loadIdentities, loadRecipients, loadPassphrase, onKeyFileWarning, type KeyFileWarning } from "./keys.js";
export { resolveStore } from "./store/paths.js";
export { SOURCE_KINDS, sourceKind } from "./sources/registry.js";
export type { SourceKind, Artifact, LayerCapture, CaptureContext } from "./sources/types.js";
export type { Keys } from "./pipeline/read-payload.js";
export { TOOL_NAME, TOOL_VERSION } from "./version.js";
export { detectAgent, renderConfig, type Detection, type DetectedSource } from "./init.js";
export { restoreInPlace, recoverAgent, selectLayers, type RestoreInPlaceOptions, type RestoreInPlaceResult } from "./restore/in-place.js";
export type { RestorePlan, LayerPlan } from "./restore/plan.js";
export { acquireLock, parseDuration, controlDir, type AgentLock, type LockInfo } from "./restore/lock.js";
export { readJournal, recoverJournal, journalPath, type Journal, type Swap } from "./restore/journal.js";
export { generateSigningKey, loadSigningKey, loadTrusted, checkSignature, parsePublicKey, publicKeyString, keyId, type ManifestSignature, type SignatureStatus } from "./sign.js";
export { listSnapshots, bundlePaths, findSnapshot, exportSnapshot, deleteSnapshots, agentDir, type StoredSnapshot } from "./store/store.js";
export { decide as decideRetention, hasRules, type RetentionPolicy, type PruneDecision } from "./store/prune.js";
export { pruneStore, diffSnapshots, indexOf, type PruneResult, type LayerDiff, type GitDiff, type SqliteDiff } from "./store/ops.js";
export { removeOrphans } from "./store/orphans.js";
export { runSchedule, parseCron, nextCron, printUnits, cronForInterval, type ScheduleOptions, type Cron, type UnitOptions } from "./schedule.js";
export { summarizeRedaction, listSome, type RedactedSummary } from "./redact/report.js";
export { runHook, parseHooks, type HooksConfig, type HookEvent, type HookResult } from "./hooks.js";
export { rekeyBundles, type RekeyOptions, type RekeyResult, type RekeyOutcome } from "./store/rekey.js";
export { catArtifact, entryOf, loadIndex, openSnapshot, pathFilter, perFileKind, selectPaths, type OpenedSnapshot, type Selection } from "./browse/index.js";
