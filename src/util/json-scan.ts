/**
 * The byte and token layer of the bounded-memory JSON parser (./json-stream.ts): the buffer of
 * the unconsumed tail (the caller's chunk read in place when nothing is pending, else an owned
 * buffer grown geometrically), whitespace skipping, and the structural scan that finds a
 * token's extent (strings with escapes, `{}`/`[]` depth, primitives up to a delimiter) before
 * JSON.parse decodes that slice alone. The grammar of the top-level object is the subclass's.
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

// Bytes.
const TAB = 0x09;
const LF = 0x0a;
const CR = 0x0d;
const SP = 0x20;
export const QUOTE = 0x22;
export const COMMA = 0x2c;
export const COLON = 0x3a;
export const LBRACK = 0x5b;
const BSLASH = 0x5c;
export const RBRACK = 0x5d;
export const LBRACE = 0x7b;
export const RBRACE = 0x7d;

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

/**
 * The scanner a JSON stream parser is built on: push bytes with append() (then detach() before
 * the caller's chunk is reused), peek() past whitespace, begin() a token at pos, scan() it to
 * its end, parseToken() it. Its state is shared with the subclass (protected).
 */
export class TokenScanner {
  protected readonly maxValueBytes: number;

  /** Bytes [0, len) of buf hold the unconsumed tail; buf[0] is byte `base` of the document. */
  protected buf: Buffer = EMPTY;
  protected len = 0;
  protected base = 0;
  /** Whether buf was allocated here (so free space after len may be written). */
  protected owned = false;
  /** Next byte to look at (in a scan state: the scan cursor; may be len + 1 after a trailing backslash). */
  protected pos = 0;
  protected final = false;

  // The token being scanned: its first byte (-1 when none), kind, and container scan state.
  protected tokStart = -1;
  protected tokKind = 0;
  protected depth = 0;
  protected inString = false;

  constructor(maxValueBytes: number) {
    const max = maxValueBytes;
    if (!(max >= 1)) throw new RangeError(`maxValueBytes must be a positive number, got ${max}`);
    this.maxValueBytes = max;
  }

  /** Where the unconsumed tail begins: the token in progress, else the next byte. */
  protected keep(): number {
    return this.tokStart >= 0 ? this.tokStart : Math.min(this.pos, this.len);
  }

  /** Add a chunk after the unconsumed tail, dropping consumed bytes. */
  protected append(chunk: Buffer): void {
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
  protected rebase(buf: Buffer, keep: number, len: number): void {
    this.buf = buf;
    this.owned = true;
    this.base += keep;
    this.len = len;
    this.pos -= keep;
    if (this.tokStart >= 0) this.tokStart -= keep;
  }

  /** Copy the unconsumed tail out of the caller's chunk, which the caller may reuse once push returns. */
  protected detach(): void {
    const keep = this.keep();
    const tail = this.len - keep;
    let next = EMPTY;
    if (tail > 0) {
      next = Buffer.allocUnsafeSlow(Math.max(tail * 2, 4096));
      this.buf.copy(next, 0, keep, this.len);
    }
    this.rebase(next, keep, tail);
  }

  /** Skip whitespace; returns the next byte (pos at it), or -1 when the buffer is used up. */
  protected peek(): number {
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
  protected begin(c: number): void {
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
  protected scan(): boolean {
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
  protected incomplete(i: number): false {
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
  protected parseToken(what: string): unknown {
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

  protected unexpected(c: number, expected: string): JsonStreamError {
    return new JsonStreamError(`unexpected ${describeByte(c)}, expected ${expected},`, this.base + this.pos);
  }
}
