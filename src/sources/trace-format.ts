/**
 * The agentlog record format the `trace` source checks (./trace.ts): a record is
 * `{version:"0.1", id, kind, ts, parent, meta?, payload}`, `id` the `sha256:` hex SHA-256 of
 * the canonical JSON of `payload`, the first record `metadata` with `parent: null` and every
 * other's parent an earlier record's id. The limits a record is parsed under, the validator
 * that holds the ids seen, and the line splitter a trace streams through.
 */
import {
  agentlogId,
  JsonBudgetError,
  JsonNumber,
  JsonSyntaxError,
  parseLossless,
  VALUE_COST,
  type JsonObject,
  type JsonValue,
  type ParseLimits,
} from "../util/canonical-agentlog.js";

/** The agentlog version every record carries. */
export const AGENTLOG_VERSION = "0.1";
/** The record kinds an agentlog trace may hold. */
export const AGENTLOG_KINDS: ReadonlySet<string> = new Set([
  "metadata",
  "chat_request",
  "chat_response",
  "tool_call",
  "tool_result",
  "error",
  "replay_summary",
  "chunk",
  "harness_event",
  "blob_ref",
]);
const ID = /^sha256:[0-9a-f]{64}$/;
/** Longest record line memsnap parses. */
export const MAX_RECORD_BYTES = 256 * 1024 * 1024;
/**
 * Memory one record may take to check: its bytes plus {@link VALUE_COST} for every value and
 * key it holds (what the parsed tree costs, whatever the text's spelling). A record past it (a
 * 20 MB array of ten million numbers would take gigabytes) is refused, not parsed on: a trace
 * memsnap cannot check with bounded memory is an invalid trace.
 */
export const RECORD_BUDGET = 256 * 1024 * 1024;
/** Digits the canonical form of one record's numbers may add beyond its own length (exponents written out). */
export const EXPANSION_SLACK = 64 * 1024;

/** The limits a record of `bytes` bytes is parsed under. */
export function recordLimits(bytes: number): ParseLimits {
  return { budget: Math.max(0, RECORD_BUDGET - bytes), expansion: bytes + EXPANSION_SLACK };
}

/** A record that breaks the format, with its line number. */
export class TraceRecordError extends Error {
  constructor(
    readonly line: number,
    readonly why: string,
  ) {
    super(`line ${line}: ${why}`);
  }
}

/** A record as checked: the parsed object and its id, kind, parent and payload. */
export interface TraceRecord {
  obj: JsonObject;
  id: string;
  kind: string;
  parent: string | null;
  payload: JsonValue;
}

/** The strict UTF-8 decoder records are read with (a malformed byte is an error, not U+FFFD). */
export const decoder = new TextDecoder("utf-8", { fatal: true });
/** A set key for an id: its 32 raw bytes as a latin1 string (half the memory of the hex). */
const idKey = (id: string): string => Buffer.from(id.slice(7), "hex").toString("latin1");
const show = (v: JsonValue | undefined): string =>
  JSON.stringify(v instanceof JsonNumber ? v.text : v instanceof Map ? "{…}" : (v ?? null));

/** Checks records in order; holds the ids seen so far (for parent links). */
export class TraceValidator {
  private readonly seen = new Set<string>();
  records = 0;

  /** Parse and check one line (without its newline). Throws TraceRecordError. */
  check(line: Buffer, lineNo: number): TraceRecord {
    const fail = (why: string): never => {
      throw new TraceRecordError(lineNo, why);
    };
    if (line.length === 0) fail("empty line (one JSON record per line)");
    if (line.length > MAX_RECORD_BYTES) fail(`record over ${MAX_RECORD_BYTES} bytes`);
    let text = "";
    try {
      text = decoder.decode(line);
    } catch {
      fail("not valid UTF-8");
    }
    let v: JsonValue = null;
    try {
      v = parseLossless(text, recordLimits(line.length));
    } catch (e) {
      if (e instanceof JsonBudgetError) {
        fail(
          e.what === "budget"
            ? `record is over the ${RECORD_BUDGET / 1024 / 1024} MiB memory budget for checking one record (its ` +
                `bytes plus ${VALUE_COST} per value: too many values)`
            : `record's numbers would expand past ${e.limit} digits in canonical form (exponents like 1e4000)`,
        );
      }
      fail(`not valid JSON (${e instanceof JsonSyntaxError ? e.message : String(e)})`);
    }
    if (!(v instanceof Map)) return fail("a record must be a JSON object");
    const obj = v;
    const version = obj.get("version");
    if (version !== AGENTLOG_VERSION) fail(`version ${show(version)} is not "${AGENTLOG_VERSION}"`);
    const id = obj.get("id");
    if (typeof id !== "string" || !ID.test(id)) return fail('"id" must be "sha256:" + 64 lowercase hex digits');
    const kind = obj.get("kind");
    if (typeof kind !== "string" || !AGENTLOG_KINDS.has(kind)) return fail(`unknown kind ${show(kind)}`);
    const ts = obj.get("ts");
    if (typeof ts !== "string" && !(ts instanceof JsonNumber)) fail('"ts" must be a string or a number');
    if (!obj.has("parent")) fail('"parent" is missing (null for the first record)');
    const parent = obj.get("parent");
    if (parent !== null && (typeof parent !== "string" || !ID.test(parent)))
      return fail('"parent" must be null or a record id');
    if (obj.has("meta") && !(obj.get("meta") instanceof Map)) fail('"meta" must be an object');
    if (!obj.has("payload")) fail('"payload" is missing');
    const payload = obj.get("payload")!;
    let computed = "";
    try {
      computed = agentlogId(payload);
    } catch (e) {
      fail(`the payload has no canonical form (${(e as Error).message})`);
    }
    if (computed !== id)
      fail(`record id ${id} does not match its payload (the canonical payload hashes to ${computed})`);
    if (this.records === 0) {
      if (kind !== "metadata") fail(`the first record must be kind "metadata", not "${kind}"`);
      if (parent !== null) fail("the first record's parent must be null");
    } else if (parent === null) {
      if (kind !== "metadata") fail(`parent is null, but only a metadata record may start a chain (kind "${kind}")`);
    } else if (!this.seen.has(idKey(parent))) {
      fail(`parent ${parent} is not an earlier record (parents point backwards)`);
    }
    this.seen.add(idKey(id));
    this.records++;
    return { obj, id, kind, parent, payload };
  }
}

/** Splits a byte stream into lines, counting them. */
export class LineSplitter {
  private parts: Buffer[] = [];
  private pending = 0;
  line = 0;

  /** Feed a chunk; yields every complete line (without `\n`). */
  *push(chunk: Buffer): Generator<{ line: Buffer; no: number }> {
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      if (nl < 0) break;
      const piece = chunk.subarray(start, nl);
      const line = this.parts.length ? Buffer.concat([...this.parts, piece]) : piece;
      this.parts = [];
      this.pending = 0;
      start = nl + 1;
      yield { line, no: ++this.line };
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      this.pending += rest.length;
      if (this.pending > MAX_RECORD_BYTES)
        throw new TraceRecordError(this.line + 1, `record over ${MAX_RECORD_BYTES} bytes`);
      this.parts.push(rest);
    }
  }

  /** The last line when the stream did not end with `\n`, or null. */
  end(): { line: Buffer; no: number } | null {
    if (this.parts.length === 0) return null;
    const line = Buffer.concat(this.parts);
    this.parts = [];
    return { line, no: ++this.line };
  }
}

/** Check a whole trace as it streams; resolves with the record count or throws TraceRecordError. */
export async function validateTrace(bytes: AsyncIterable<Buffer>): Promise<number> {
  const v = new TraceValidator();
  const s = new LineSplitter();
  for await (const c of bytes) for (const l of s.push(c)) v.check(l.line, l.no);
  const last = s.end();
  if (last) v.check(last.line, last.no);
  return v.records;
}
