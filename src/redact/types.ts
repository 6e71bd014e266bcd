/**
 * The redaction contract between the snapshot pipeline, the sources, and the redactor.
 *
 * Text artifacts memsnap owns (memory files, JSON/JSONL, SQLite TEXT cells and BLOB cells
 * that are text, in the copy) are rewritten in the bundle: each match becomes
 * `[REDACTED:<rule>]`, also where a JSON writer escaped it (`"g\u0068p_…"`: the escaped form
 * is replaced). Content that cannot be rewritten without breaking it (git history,
 * content-addressed layers, binary SQLite BLOBs) is scanned and its findings recorded as
 * unredacted. The live files are never touched. The report never holds
 * a secret or a hash of one.
 */
import type { Artifact } from "../format/artifact.js";

/** Per-rule match counts. */
export type RuleCounts = Record<string, number>;

export interface RedactionReport {
  /** `off`, or the policy name (e.g. `default`). */
  policy: string;
  /** Rule ids that fired at least once (redacted or scanned). */
  rules_fired: string[];
  /** Artifacts rewritten: payload path → rule → count. */
  redacted: Record<string, RuleCounts>;
  /** Artifacts scanned but not rewritten (history, content-addressed data): payload path → rule → count. */
  unredacted: Record<string, RuleCounts>;
  /** Total matches rewritten / found-but-kept. */
  total_redacted: number;
  total_unredacted: number;
  /** Throughput of the redaction stage, for the benchmark. */
  bytes_scanned: number;
}

export interface Redactor {
  /**
   * Cheap, synchronous pre-filter: false means `text` certainly holds no secret any rule
   * matches, as it is or with its JSON escapes decoded (`g\u0068p_…`).
   */
  candidate(text: string): boolean;
  /**
   * Optional, cheaper still: true means no rule can match in the text `bytes` decode to as UTF-8
   * (so they need not be decoded at all); false means "do not know", and the caller decodes them
   * and asks {@link candidate}.
   */
  clean?(bytes: Uint8Array): boolean;
  /** Rewrite every match in `text` (idempotent) and record the hits against `artifact` (a payload path). */
  redactText(text: string, artifact: string): Promise<string>;
  /**
   * Optional: whether any rule matches in `text` (as {@link redactText} reads it), recording
   * nothing. The SQLite source asks it about the few cells its pre-filter flags in a database it
   * would otherwise copy to redact; false for all of them lets it read the database as it is.
   */
  matches?(text: string): Promise<boolean>;
  /**
   * Find matches without rewriting and record them against `artifact` as unredacted; resolves
   * to the number found (memsnap's redactor; other implementations may resolve to nothing).
   */
  scanText(text: string, artifact: string): Promise<number | void>;
  /**
   * Redact a text artifact as it streams, spooling the result to a temp file; returns an
   * artifact over the rewritten bytes (its size is the rewritten size). JSON and JSONL
   * (by `artifact.kind` `json`/`jsonl` or file extension) stay valid JSON: only string
   * contents are rewritten.
   */
  redactArtifact(artifact: Artifact, payloadPath: string): Promise<Artifact>;
  /** The report for the manifest. */
  report(): RedactionReport;
  /**
   * Count the findings of an artifact an incremental snapshot references instead of redacting
   * (or scanning) again: values replaced, or with `redacted` false, secrets left in it.
   */
  recordReused?(artifact: string, counts: RuleCounts, redacted?: boolean): void;
  /** Remove spool files. */
  cleanup(): Promise<void>;
}
