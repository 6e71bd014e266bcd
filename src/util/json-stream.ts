/**
 * Bounded-memory parsing of one JSON document whose top level is an object.
 *
 * Made for large JSON indexes such as a KV dump's manifest: a few top-level members are huge
 * arrays (tens of MB, ~100k small elements) and the rest is small. The named arrays are
 * streamed: each element is handed to a callback as soon as it is complete and is never held
 * together with the others. Every other member is parsed normally.
 *
 * How: a byte-level state machine over the chunks handles the top-level object and the
 * streamed arrays' brackets and commas. For every key, member value and element it finds the
 * extent with a tight structural scan (strings with backslash escapes, `{}`/`[]` depth,
 * primitives up to the next delimiter), then calls JSON.parse on that slice alone, which both
 * decodes and validates it. Only the unconsumed tail (at most one value in progress, bounded by
 * `maxValueBytes`) is kept between chunks, so memory is bounded whatever the document's size.
 *
 * The members kept (all but the streamed arrays) are bounded together too, by
 * `maxRetainedBytes` of their text: a value each under `maxValueBytes` does not let a document
 * of many such members grow the result without bound.
 *
 * Whatever JSON.parse rejects is rejected here too (JsonStreamError, with the byte offset);
 * a streamed key given twice is rejected as well. Callbacks run while parsing, so a document
 * that turns out invalid later may already have delivered some elements.
 *
 * The buffer and the token scan are ./json-scan.ts; this file is the grammar of the top-level
 * object and its streamed arrays.
 */
import { COLON, COMMA, JsonStreamError, LBRACE, LBRACK, QUOTE, RBRACE, RBRACK, TokenScanner } from "./json-scan.js";

export { JsonStreamError } from "./json-scan.js";

/** What streamJson streams, and its memory bounds. */
export interface StreamJsonOptions {
  /**
   * Top-level keys whose value, when it is an array, is streamed: each element is parsed (JSON.parse of its own slice)
   * and passed to the callback with its index.
   */
  arrays: Record<string, (item: unknown, index: number) => void>;
  /** Largest single element or other member value, in bytes (default 16 MiB); larger -> JsonStreamError. */
  maxValueBytes?: number;
  /**
   * Most bytes of text, all together, of the members kept in the result (every member but the
   * streamed arrays; a repeated key counts each time), default 64 MiB; more -> JsonStreamError.
   */
  maxRetainedBytes?: number;
}

const DEFAULT_MAX_VALUE_BYTES = 16 * 1024 * 1024;
const DEFAULT_MAX_RETAINED_BYTES = 64 * 1024 * 1024;

// Parser states.
const START = 0; // before the top-level `{`
const OBJ_FIRST = 1; // after `{`: a key or `}`
const OBJ_NEXT = 2; // after `,` between members: a key
const KEY = 3; // scanning a key string
const AFTER_KEY = 4; // after a key: `:`
const VALUE = 5; // after `:`: a member value
const MEMBER = 6; // scanning a member value
const OBJ_AFTER = 7; // after a member: `,` or `}`
const ARR_FIRST = 8; // after a streamed array's `[`: an element or `]`
const ARR_NEXT = 9; // after `,` in a streamed array: an element
const ELEM = 10; // scanning an element
const ARR_AFTER = 11; // after an element: `,` or `]`
const DONE = 12; // after the top-level `}`: only whitespace

/** The shared core: push(chunk) as bytes arrive, end() at the end of input. */
class StreamParser extends TokenScanner {
  private readonly arrays: Map<string, (item: unknown, index: number) => void>;
  private readonly maxRetainedBytes: number;
  /** Bytes of text of the members kept so far. */
  private retained = 0;
  private readonly result: Record<string, unknown> = {};
  private readonly seenStreamed = new Set<string>();
  private state = START;

  // The current member.
  private key = "";
  private keyOffset = 0;
  private callback: ((item: unknown, index: number) => void) | undefined;
  private index = 0;

  constructor(opts: StreamJsonOptions) {
    const arrays = new Map(Object.entries(opts.arrays));
    super(opts.maxValueBytes ?? DEFAULT_MAX_VALUE_BYTES);
    this.arrays = arrays;
    const retained = opts.maxRetainedBytes ?? DEFAULT_MAX_RETAINED_BYTES;
    if (!(retained >= 1)) throw new RangeError(`maxRetainedBytes must be a positive number, got ${retained}`);
    this.maxRetainedBytes = retained;
  }

  push(chunk: Uint8Array): void {
    if (!(chunk instanceof Uint8Array))
      throw new TypeError("streamJson: chunks must be Uint8Array (bytes), not strings");
    if (chunk.length === 0) return;
    this.append(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
    this.run();
    if (!this.owned) this.detach();
  }

  end(): Record<string, unknown> {
    this.final = true;
    this.run();
    if (this.state !== DONE) {
      const at = this.base + this.len;
      if (this.state === START)
        throw new JsonStreamError(at === 0 ? "empty input" : "no JSON value (only whitespace)", at);
      throw new JsonStreamError("unexpected end of input", at);
    }
    return this.result;
  }
  private run(): void {
    for (;;) {
      switch (this.state) {
        case START:
          if (!this.expect(LBRACE, "'{' (the top-level value must be an object)", OBJ_FIRST)) return;
          break;
        case OBJ_FIRST:
        case OBJ_NEXT: {
          const c = this.peek();
          if (c < 0) return;
          if (c === QUOTE) {
            this.begin(c);
            this.state = KEY;
          } else if (c === RBRACE && this.state === OBJ_FIRST) {
            this.pos++;
            this.state = DONE;
          } else {
            throw this.unexpected(c, this.state === OBJ_FIRST ? "a key or '}'" : "a key");
          }
          break;
        }
        case KEY: {
          if (!this.scan()) return;
          this.keyOffset = this.base + this.tokStart;
          this.key = this.parseToken("key") as string;
          this.state = AFTER_KEY;
          break;
        }
        case AFTER_KEY:
          if (!this.expect(COLON, "':'", VALUE)) return;
          break;
        case VALUE: {
          const c = this.peek();
          if (c < 0) return;
          const callback = this.arrays.get(this.key);
          if (callback !== undefined) {
            if (this.seenStreamed.has(this.key)) {
              throw new JsonStreamError(`duplicate key ${JSON.stringify(this.key)} (a streamed array)`, this.keyOffset);
            }
            this.seenStreamed.add(this.key);
            if (c === LBRACK) {
              this.pos++;
              this.callback = callback;
              this.index = 0;
              this.state = ARR_FIRST;
              break;
            }
          }
          this.begin(c);
          this.state = MEMBER;
          break;
        }
        case MEMBER: {
          if (!this.scan()) return;
          this.retained += this.pos - this.tokStart;
          if (this.retained > this.maxRetainedBytes) {
            throw new JsonStreamError(
              `members other than the streamed arrays take more than maxRetainedBytes (${this.maxRetainedBytes}) in ` +
                `all; the one`,
              this.base + this.tokStart,
            );
          }
          this.set(this.key, this.parseToken("value"));
          this.state = OBJ_AFTER;
          break;
        }
        case OBJ_AFTER: {
          const c = this.peek();
          if (c < 0) return;
          if (c === COMMA) this.state = OBJ_NEXT;
          else if (c === RBRACE) this.state = DONE;
          else throw this.unexpected(c, "',' or '}'");
          this.pos++;
          break;
        }
        case ARR_FIRST:
        case ARR_NEXT: {
          const c = this.peek();
          if (c < 0) return;
          if (c === RBRACK && this.state === ARR_FIRST) {
            this.pos++;
            this.set(this.key, 0);
            this.state = OBJ_AFTER;
          } else {
            this.begin(c);
            this.state = ELEM;
          }
          break;
        }
        case ELEM: {
          if (!this.scan()) return;
          const item = this.parseToken("array element");
          this.callback!(item, this.index++);
          this.state = ARR_AFTER;
          break;
        }
        case ARR_AFTER: {
          const c = this.peek();
          if (c < 0) return;
          if (c === COMMA) {
            this.state = ARR_NEXT;
          } else if (c === RBRACK) {
            this.set(this.key, this.index);
            this.callback = undefined;
            this.state = OBJ_AFTER;
          } else {
            throw this.unexpected(c, "',' or ']'");
          }
          this.pos++;
          break;
        }
        case DONE: {
          const c = this.peek();
          if (c < 0) return;
          throw this.unexpected(c, "nothing after the end of the document");
        }
        default:
          throw new Error(`streamJson: bad state ${this.state}`);
      }
    }
  }

  /** The next byte must be `want`: consume it and go to state `next`. False when more input is needed. */
  private expect(want: number, what: string, next: number): boolean {
    const c = this.peek();
    if (c < 0) return false;
    if (c !== want) throw this.unexpected(c, what);
    this.pos++;
    this.state = next;
    return true;
  }
  private set(key: string, value: unknown): void {
    if (key === "__proto__") {
      // An own data property, as JSON.parse makes it (plain assignment would set the prototype).
      Object.defineProperty(this.result, key, { value, writable: true, enumerable: true, configurable: true });
    } else {
      this.result[key] = value;
    }
  }
}

/**
 * Parse `chunks` (UTF-8 bytes, any chunking, possibly 1-byte chunks) as one JSON document.
 * Returns the top-level object's members except the streamed arrays; for each streamed key present,
 * the returned object holds the number of elements instead (a number). A streamed key whose value is
 * not an array is returned as its parsed value (not streamed) so the caller can report the wrong type.
 * Throws JsonStreamError for anything that JSON.parse would reject (bad syntax anywhere, trailing garbage,
 * empty input, top level not an object), and also for a streamed key that appears twice.
 * Other duplicate keys: last one wins (like JSON.parse).
 * Exceptions thrown by a callback propagate unchanged (not wrapped).
 */
export async function streamJson(
  chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
  opts: StreamJsonOptions,
): Promise<Record<string, unknown>> {
  const parser = new StreamParser(opts);
  if (Symbol.asyncIterator in chunks) {
    for await (const chunk of chunks) parser.push(chunk);
  } else {
    for (const chunk of chunks) parser.push(chunk);
  }
  return parser.end();
}

/** The same, synchronous, for an in-memory or synchronously-read source. */
export function streamJsonSync(chunks: Iterable<Uint8Array>, opts: StreamJsonOptions): Record<string, unknown> {
  const parser = new StreamParser(opts);
  for (const chunk of chunks) parser.push(chunk);
  return parser.end();
}
