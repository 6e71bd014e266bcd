/**
 * The shapes of reading a payload (./read-payload.ts): the keys that open it, what an entry
 * handler is given, and what a read returns. Apart so that the index comparison
 * (./index-compare.ts) uses them without importing the reader.
 */
import type { Finding } from "../errors.js";
import type { IndexDocument } from "../format/manifest.js";
import type { EntryTable } from "./entry-table.js";

/** Identities and passphrases that may open an encrypted bundle. */
export interface Keys {
  identities?: string[];
  passphrases?: string[];
  /** The highest scrypt work factor (log2 N) a passphrase is tried on; default $MEMSNAP_SCRYPT_MAX_LOG_N, else 18. */
  scryptMaxLogN?: number;
}

/** What an entry handler is told about the entry. */
export interface EntryInfo {
  name: string;
  size: number;
  layer: string;
  /** Path inside the layer. */
  rel: string;
}

/**
 * Called for each artifact entry with its bytes. A chunk is a view of the decoder's shared
 * memory, valid until the handler asks for the next chunk or returns: a handler that keeps one
 * longer (a write that completes later, chunks gathered for one write) pins it with
 * `pin` (util/slots.ts) or copies it.
 */
export type EntryHandler = (info: EntryInfo, chunks: AsyncIterable<Buffer>) => Promise<void>;

/** An entry as read: its name, the bytes it held and what they hashed to. */
export interface PayloadEntry {
  name: string;
  size: number;
  sha256: string;
}
/** What reading a payload found: the stored bytes' hash, the entries, the index, the findings. */
export interface PayloadReadResult {
  /** Null when the stored bytes were not hashed (`skipStoredHash` on an age payload). */
  storedSha256: string | null;
  storedSize: number;
  /** Entries in payload order (the index excluded), with what their bytes hashed to. */
  entries: EntryTable;
  /** The parsed index, or null when it was missing, unparseable (a finding says which) or streamed. */
  index: IndexDocument | null;
  /** With `streamIndex`: the index's snapshot id and its comparison with the entries. */
  indexCheck: { snapshotId: unknown; findings: Finding[] } | null;
  indexSha256: string | null;
  findings: Finding[];
  /** How many entries the decoder worker hashed (the main thread hashed the others; a diagnostic). */
  hashedInWorker: number;
}
