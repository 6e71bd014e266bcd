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
 */

/** A document that is not valid JSON, not an object at the top, or too large in one value. */
export class JsonStreamError extends Error {
  constructor(
    message: string,
    /** Byte offset in the document where the problem was found. */
    readonly offset: number,
  ) {
    super(`${message} at byte offset ${offset}`);
    this.name = "JsonStreamError";
  }
}

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

// Bytes.
const TAB = 0x09;
const LF = 0x0a;
const CR = 0x0d;
const SP = 0x20;
const QUOTE = 0x22;
const COMMA = 0x2c;
const COLON = 0x3a;
const LBRACK = 0x5b;
const BSLASH = 0x5c;
const RBRACK = 0x5d;
const LBRACE = 0x7b;
const RBRACE = 0x7d;

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

// Kinds of token being scanned.
const T_STRING = 1;
const T_CONTAINER = 2;
const T_PRIMITIVE = 3;

const EMPTY = Buffer.alloc(0);

function describeByte(c: number): string {
  return c >= 0x21 && c <= 0x7e ? `'${String.fromCharCode(c)}'` : `byte 0x${c.toString(16).padStart(2, "0")}`;
}

/**
 * Scan string contents from `i` (just past the opening quote, or where an earlier scan stopped):
 * the index just past the closing quote, or `-1 - resume` when the buffer ends first
 * (`resume` is len, or len + 1 when the last byte was a backslash and the next byte is escaped).
 */
function endOfString(buf: Buffer, i: number, len: number): number {
  while (i < len) {
    const c = buf[i++];
    if (c === QUOTE) return i;
    if (c === BSLASH) i++;
  }
  return -1 - i;
}

/** The shared core: push(chunk) as bytes arrive, end() at the end of input. */
class StreamParser {
  private readonly arrays: Map<string, (item: unknown, index: number) => void>;
  private readonly maxValueBytes: number;
  private readonly maxRetainedBytes: number;
  /** Bytes of text of the members kept so far. */
  private retained = 0;
  private readonly result: Record<string, unknown> = {};
  private readonly seenStreamed = new Set<string>();

  /** Bytes [0, len) of buf hold the unconsumed tail; buf[0] is byte `base` of the document. */
  private buf: Buffer = EMPTY;
  private len = 0;
  private base = 0;
  /** Whether buf was allocated here (so free space after len may be written). */
  private owned = false;
  /** Next byte to look at (in a scan state: the scan cursor; may be len + 1 after a trailing backslash). */
  private pos = 0;
  private state = START;
  private final = false;

  // The token being scanned: its first byte (-1 when none), kind, and container scan state.
  private tokStart = -1;
  private tokKind = 0;
  private depth = 0;
  private inString = false;

  // The current member.
  private key = "";
  private keyOffset = 0;
  private callback: ((item: unknown, index: number) => void) | undefined;
  private index = 0;

  constructor(opts: StreamJsonOptions) {
    this.arrays = new Map(Object.entries(opts.arrays));
    const max = opts.maxValueBytes ?? DEFAULT_MAX_VALUE_BYTES;
    if (!(max >= 1)) throw new RangeError(`maxValueBytes must be a positive number, got ${max}`);
    this.maxValueBytes = max;
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

  /** Where the unconsumed tail begins: the token in progress, else the next byte. */
  private keep(): number {
    return this.tokStart >= 0 ? this.tokStart : Math.min(this.pos, this.len);
  }

  /** Add a chunk after the unconsumed tail, dropping consumed bytes. */
  private append(chunk: Buffer): void {
    const keep = this.keep();
    const tail = this.len - keep;
    if (tail === 0) {
      // Nothing pending: read the caller's chunk in place (detach() copies what is left of it).
      this.base += this.len;
      this.buf = chunk;
      this.len = chunk.length;
      this.pos -= keep;
      this.owned = false;
      return;
    }
    // A tail is pending, so buf is owned (see detach()).
    if (this.len + chunk.length <= this.buf.length) {
      chunk.copy(this.buf, this.len);
      this.len += chunk.length;
      return;
    }
    const need = tail + chunk.length;
    let next: Buffer;
    if (need <= this.buf.length) {
      this.buf.copyWithin(0, keep, this.len);
      next = this.buf;
    } else {
      // Grow geometrically so a value arriving in many small chunks is copied O(1) times per byte.
      next = Buffer.allocUnsafeSlow(Math.max(need, tail * 2, 4096));
      this.buf.copy(next, 0, keep, this.len);
    }
    chunk.copy(next, tail);
    this.rebase(next, keep, need);
  }

  /** `buf` (owned) now holds the tail that started at `keep`, `len` bytes in all: shift the offsets. */
  private rebase(buf: Buffer, keep: number, len: number): void {
    this.buf = buf;
    this.owned = true;
    this.base += keep;
    this.len = len;
    this.pos -= keep;
    if (this.tokStart >= 0) this.tokStart -= keep;
  }

  /** Copy the unconsumed tail out of the caller's chunk, which the caller may reuse once push returns. */
  private detach(): void {
    const keep = this.keep();
    const tail = this.len - keep;
    let next = EMPTY;
    if (tail > 0) {
      next = Buffer.allocUnsafeSlow(Math.max(tail * 2, 4096));
      this.buf.copy(next, 0, keep, this.len);
    }
    this.rebase(next, keep, tail);
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
              `members other than the streamed arrays take more than maxRetainedBytes (${this.maxRetainedBytes}) in all; the one`,
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

  /** Skip whitespace; returns the next byte (pos at it), or -1 when the buffer is used up. */
  private peek(): number {
    const buf = this.buf;
    const len = this.len;
    let i = this.pos;
    while (i < len) {
      const c = buf[i]!;
      if (c !== SP && c !== LF && c !== CR && c !== TAB) {
        this.pos = i;
        return c;
      }
      i++;
    }
    this.pos = i;
    return -1;
  }

  /** Start scanning a token whose first byte, `c`, is at pos. */
  private begin(c: number): void {
    if (c === COMMA || c === RBRACK || c === RBRACE || c === COLON) throw this.unexpected(c, "a value");
    this.tokStart = this.pos;
    if (c === QUOTE) {
      this.tokKind = T_STRING;
    } else if (c === LBRACE || c === LBRACK) {
      this.tokKind = T_CONTAINER;
      this.depth = 1;
      this.inString = false;
    } else {
      this.tokKind = T_PRIMITIVE;
    }
    this.pos++;
  }

  /**
   * Advance the scan of the current token. True when it is complete (pos just past it);
   * false when more input is needed.
   */
  private scan(): boolean {
    const buf = this.buf;
    const len = this.len;
    let i = this.pos;
    if (this.tokKind === T_STRING) {
      const e = endOfString(buf, i, len);
      if (e >= 0) {
        this.pos = e;
        return true;
      }
      i = -1 - e;
    } else if (this.tokKind === T_CONTAINER) {
      let depth = this.depth;
      if (this.inString) {
        const e = endOfString(buf, i, len);
        if (e < 0) return this.incomplete(-1 - e);
        i = e;
        this.inString = false;
      }
      while (i < len) {
        const c = buf[i++];
        if (c === QUOTE) {
          const e = endOfString(buf, i, len);
          if (e < 0) {
            this.inString = true;
            i = -1 - e;
            break;
          }
          i = e;
        } else if (c === LBRACE || c === LBRACK) {
          depth++;
        } else if (c === RBRACE || c === RBRACK) {
          if (--depth === 0) {
            this.pos = i;
            return true;
          }
        }
      }
      this.depth = depth;
    } else {
      for (; i < len; i++) {
        const c = buf[i];
        if (c === COMMA || c === RBRACE || c === RBRACK || c === SP || c === LF || c === CR || c === TAB) {
          this.pos = i;
          return true;
        }
      }
      if (this.final) {
        this.pos = len; // a primitive may end the input (the state machine then reports it)
        return true;
      }
    }
    return this.incomplete(i);
  }

  /** The current token needs bytes past the buffer; the scan resumes at `i` (len, or len + 1 after a backslash). */
  private incomplete(i: number): false {
    this.pos = i;
    if (this.final) throw new JsonStreamError("unexpected end of input", this.base + this.len);
    if (this.len - this.tokStart > this.maxValueBytes) {
      throw new JsonStreamError(
        `value longer than maxValueBytes (${this.maxValueBytes}) starting`,
        this.base + this.tokStart,
      );
    }
    return false;
  }

  /** JSON.parse the completed token [tokStart, pos) and release it. */
  private parseToken(what: string): unknown {
    const start = this.tokStart;
    const end = this.pos;
    this.tokStart = -1;
    if (end - start > this.maxValueBytes) {
      throw new JsonStreamError(
        `${what} longer than maxValueBytes (${this.maxValueBytes}) starting`,
        this.base + start,
      );
    }
    const text = this.buf.toString("utf8", start, end);
    try {
      return JSON.parse(text);
    } catch (e) {
      const detail = e instanceof Error ? e.message : String(e);
      throw new JsonStreamError(`invalid JSON ${what} (${detail}) starting`, this.base + start);
    }
  }

  private set(key: string, value: unknown): void {
    if (key === "__proto__") {
      // An own data property, as JSON.parse makes it (plain assignment would set the prototype).
      Object.defineProperty(this.result, key, { value, writable: true, enumerable: true, configurable: true });
    } else {
      this.result[key] = value;
    }
  }

  private unexpected(c: number, expected: string): JsonStreamError {
    return new JsonStreamError(`unexpected ${describeByte(c)}, expected ${expected},`, this.base + this.pos);
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
