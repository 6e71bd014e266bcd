/** Scanning the text inside ProcessFork and KV artifacts with the redactor (scan only). */
import { StringDecoder } from "node:string_decoder";
import type { Redactor } from "../../redact/types.js";

/**
 * Where to cut a long text that has no newline (a JSON document on one line): just after its
 * last comma, else its last space or tab, in the final 64 KiB, so that a token or a `"key":
 * "value"` pair is not split between two scans; the whole text when there is none.
 */
function softCut(text: string): number {
  const stop = Math.max(0, text.length - 64 * 1024);
  let space = -1;
  for (let i = text.length - 1; i >= stop; i--) {
    const c = text.charCodeAt(i);
    if (c === 44) return i + 1; // ,
    if (space < 0 && (c === 32 || c === 9)) space = i + 1;
  }
  return space > 0 ? space : text.length;
}

/**
 * Feeds decompressed text to the redactor in pieces cut at line ends (scan only: the
 * content is content-addressed and is never rewritten). Binary-looking content (a NUL byte
 * in its first 8 KiB) is skipped when `sniff` is set.
 */
export class TextScanner {
  readonly #redactor: Redactor;
  readonly #artifact: string;
  readonly #sniff: boolean;
  readonly #dec = new StringDecoder("utf8");
  #pending = "";
  /** Index in #pending just past its last newline, or -1: found in each decoded piece as it arrives. */
  #cut = -1;
  #seen = 0;
  #off = false;

  constructor(redactor: Redactor, artifact: string, sniff = false) {
    this.#redactor = redactor;
    this.#artifact = artifact;
    this.#sniff = sniff;
  }

  async #scan(text: string): Promise<void> {
    if (text && this.#redactor.candidate(text)) await this.#redactor.scanText(text, this.#artifact);
  }

  async push(b: Buffer): Promise<void> {
    if (this.#off) return;
    if (this.#sniff && this.#seen < 8192) {
      const head = b.subarray(0, 8192 - this.#seen);
      if (head.includes(0)) {
        this.#off = true;
        this.#pending = "";
        return;
      }
    }
    this.#seen += b.length;
    // Only the new piece is searched for a newline: lastIndexOf on the whole pending text
    // flattened it on every chunk, and a text without newlines (a dump manifest written as one
    // line) then copied 1 + 2 + … + 8 MiB of string per 8 MiB scanned (measured: the scale-10
    // KV manifest, 16 MiB on one line, grew the heap by ~50 MiB; peak RSS 197 MiB).
    const piece = this.#dec.write(b);
    const nl = piece.lastIndexOf("\n");
    if (nl >= 0) this.#cut = this.#pending.length + nl + 1;
    this.#pending += piece;
    if (this.#pending.length < 1 << 20) return;
    let cut = this.#cut;
    if (cut < 0) {
      if (this.#pending.length < 8 << 20) return;
      cut = softCut(this.#pending);
    }
    const text = this.#pending.slice(0, cut);
    this.#pending = this.#pending.slice(cut);
    this.#cut = -1; // the cut was at the last newline (or took everything)
    await this.#scan(text);
  }

  async end(): Promise<void> {
    if (this.#off) return;
    this.#pending += this.#dec.end();
    const rest = this.#pending;
    this.#pending = "";
    this.#cut = -1;
    await this.#scan(rest);
  }
}
