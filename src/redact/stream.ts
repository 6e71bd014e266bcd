/**
 * Redaction of whole texts and of byte streams.
 *
 * A stream is processed in pieces of about {@link PIECE} bytes, each cut at the last line
 * start that no region crosses; the rest (an incomplete line, an open PEM block) is carried
 * into the next piece, up to {@link CARRY_CAP} bytes, beyond which the piece is processed as
 * it is (a secret straddling that forced cut may be missed; a JSON string cut there is
 * continued correctly). Output goes out in batches of about {@link BLOCK} bytes. The pre-filter runs over a latin1 view
 * of the bytes (a copy at memory
 * speed; offsets are byte offsets); only regions are decoded as UTF-8, and bytes outside the
 * regions are passed on as they are, so text without a candidate costs about one scan.
 *
 * JSON escapes: a line whose `\uXXXX` / `\/` escapes decode to a candidate is a region too
 * (./json.ts, escapedLines), in any text (a .jsonl, a .log of JSON lines, a note with pasted
 * JSON), and the rules read such regions decoded as well (./engine.ts); so a piece the native
 * pre-filter clears still goes through the view when it holds such an escape.
 *
 * Bytes that are not text are never rewritten: an artifact with a NUL byte in its first
 * 8000 bytes (what git calls binary), and any region holding a NUL byte or invalid UTF-8,
 * pass through unchanged, and what the rules find in them is counted as unredacted.
 */
import { isUtf8 } from "node:buffer";
import type { Engine, Redacted, RegionText } from "./engine.js";
import { escapedLines, hidingEscapeAt, jsonEndState, type JsonState } from "./json.js";
import { nativePrefilter } from "./native.js";
import { planRegions, type RegionPlan } from "./regions.js";
import type { Finding } from "./rules.js";

/** Output is written in batches of about this many bytes. */
export const BLOCK = 1 << 20;
/**
 * Input is scanned in pieces of about this many bytes. The latin1 view of a piece is a V8
 * string; at 64 KiB it is a young-generation object that the next scavenge frees, where a view
 * of 128 KiB or more would go to the large-object space and wait for a full collection (see
 * {@link LARGE_VIEW}). Measured on the bench mix (scale 1, 5 alternating runs each): 1 MiB
 * pieces 5.07 / 4.67 s and 8.21 / 7.73 CPU-s per snapshot; 64 KiB 4.64 / 4.50 s and
 * 7.71 / 7.33 CPU-s; 32 KiB 4.61 s, 7.57 CPU-s. Peak RSS unchanged.
 */
export const PIECE = 1 << 16;
/** A view at least this long is a large object in V8 (its large-object space), freed only by a full collection. */
export const LARGE_VIEW = 1 << 17;
/** An unfinished line or open PEM block is carried at most this far; beyond, a piece is cut where it ends. */
export const CARRY_CAP = 1 << 20;
const BINARY_SNIFF = 8000;

export type CountFn = (rule: string, redacted: boolean) => void;

/** Redact (or, with `scanOnly`, only scan) a whole string. */
export async function processText(
  engine: Engine,
  text: string,
  json: boolean,
  scanOnly: boolean,
  count: CountFn,
): Promise<string> {
  const plan = withEscapedLines(planRegions(text, true, !json), text);
  if (plan.regions.length === 0) return text;
  const regions: RegionText[] = plan.regions.map((r) => ({ text: text.slice(r.start, r.end), json }));
  if (scanOnly) {
    for (const f of await engine.find(regions)) for (const x of f) count(x.rule, false);
    return text;
  }
  const done = await engine.redact(regions);
  let out = "";
  let at = 0;
  plan.regions.forEach((r, i) => {
    const d = done[i]!;
    if (d.findings.length === 0) return;
    for (const x of d.findings) count(x.rule, true);
    out += text.slice(at, r.start) + d.text;
    at = r.end;
  });
  return at === 0 && out === "" ? text : out + text.slice(at);
}

/**
 * The plan plus the lines before its cut that are candidates only with their JSON escapes
 * decoded (./json.ts, escapedLines: JSON written by any encoder, in a .json file or a .log),
 * merged in (regions stay sorted and disjoint).
 */
function withEscapedLines(plan: RegionPlan, text: string): RegionPlan {
  const extra = escapedLines(text, plan.cut);
  if (extra.length === 0) return plan;
  const all = [...plan.regions, ...extra].sort((a, b) => a.start - b.start || a.end - b.end);
  const regions: RegionPlan["regions"] = [];
  for (const r of all) {
    const last = regions[regions.length - 1];
    if (last && r.start <= last.end) last.end = Math.max(last.end, r.end);
    else regions.push({ ...r });
  }
  return { regions, cut: plan.cut };
}

export interface StreamOptions {
  json: boolean;
  count: CountFn;
  /** Bytes of input processed, as they are. */
  scanned: (bytes: number) => void;
  /**
   * Called with the length of each latin1 view of at least {@link LARGE_VIEW} bytes (a carried long line), for GC
   * pacing.
   */
  largeView?: (bytes: number) => void;
}

/**
 * Redact a byte stream piece by piece, handing the output to `write` in order, in batches of
 * about {@link BLOCK} bytes; a write runs while the next pieces are scanned, `end()` waits for
 * the last one. Input is scanned in pieces of about {@link PIECE} bytes where they lie, without
 * copying; only a carried unfinished line is joined with the head of the next piece.
 */
export class StreamRedactor {
  private carry: Buffer | null = null;
  private pending: Buffer[] = [];
  private pendingLen = 0;
  private first = true;
  private binary = false;
  private state: JsonState = 0;
  private out: Buffer[] = [];
  private outLen = 0;
  private writing: Promise<void> = Promise.resolve();

  constructor(
    private readonly engine: Engine,
    private readonly opts: StreamOptions,
    private readonly write: (chunks: Buffer[]) => Promise<void>,
  ) {}

  async push(chunk: Buffer): Promise<void> {
    for (let off = 0; off < chunk.length; off += PIECE) await this.pushPiece(chunk.subarray(off, off + PIECE));
  }

  async end(): Promise<void> {
    if (this.carry || this.pendingLen > 0) await this.process(this.take(), true);
    await this.flush();
    await this.writing;
  }

  /** Wait for a write in flight, ignoring its outcome (cleanup after a failure). */
  async settle(): Promise<void> {
    await this.writing.catch(() => undefined);
  }

  private async pushPiece(piece: Buffer): Promise<void> {
    if (this.carry && this.pendingLen === 0 && !this.carry.includes(10)) {
      // finish the carried line with the head of this piece
      const nl = piece.indexOf(10);
      if (nl >= 0) {
        const head = Buffer.concat([this.carry, piece.subarray(0, nl + 1)]);
        this.carry = null;
        await this.process(head, false);
        piece = piece.subarray(nl + 1);
        if (piece.length === 0) return;
      }
    }
    if (!this.carry && this.pendingLen === 0 && piece.length >= PIECE / 2) {
      await this.process(piece, false);
      return;
    }
    this.pending.push(piece);
    this.pendingLen += piece.length;
    // A long carry (a long line, an open PEM block) is re-scanned only after it has doubled.
    const carried = this.carry?.length ?? 0;
    if (carried + this.pendingLen >= Math.max(PIECE, 2 * carried)) await this.process(this.take(), false);
  }

  private take(): Buffer {
    const parts = this.carry ? [this.carry, ...this.pending] : this.pending;
    const len = (this.carry?.length ?? 0) + this.pendingLen;
    this.carry = null;
    this.pending = [];
    this.pendingLen = 0;
    return parts.length === 1 ? parts[0]! : Buffer.concat(parts, len);
  }

  private async emit(chunks: Buffer[]): Promise<void> {
    for (const c of chunks) {
      if (c.length === 0) continue;
      this.out.push(c);
      this.outLen += c.length;
    }
    if (this.outLen >= BLOCK) await this.flush();
  }

  private async flush(): Promise<void> {
    if (this.outLen === 0) return;
    const chunks = this.out;
    this.out = [];
    this.outLen = 0;
    await this.writing;
    this.writing = this.write(chunks);
    this.writing.catch(() => undefined); // observed by the next flush / end / settle
  }

  /** Process `buf` up to its cut; what follows the cut becomes the carry. */
  private async process(buf: Buffer, final: boolean): Promise<void> {
    if (this.first) {
      this.first = false;
      this.binary = buf.subarray(0, BINARY_SNIFF).includes(0);
    }
    if (nativePrefilter()?.scan(buf, 0, buf.length) === -1 && hidingEscapeAt(buf) < 0) {
      // No scanner can match anywhere in the piece (./native.ts), nor behind a JSON escape:
      // what planRegions would say of it (no regions), without a view or the JS finders.
      await this.passThrough(buf, final);
      return;
    }
    const view = buf.toString("latin1");
    if (view.length >= LARGE_VIEW) this.opts.largeView?.(view.length);
    const windows = !this.opts.json;
    let plan: RegionPlan = planRegions(view, final, windows);
    let forced = false;
    if (!final && buf.length - plan.cut > CARRY_CAP) {
      plan = planRegions(view, true, windows);
      forced = true;
    }
    plan = withEscapedLines(plan, view);
    const state0 = this.state;
    await this.processPiece(buf, plan, state0);
    this.opts.scanned(plan.cut);
    if (this.opts.json) {
      if (forced) {
        const nl = view.lastIndexOf("\n");
        this.state = jsonEndState(view.slice(nl + 1), nl < 0 ? state0 : 0);
      } else if (plan.cut > 0) {
        this.state = 0;
      }
    }
    if (plan.cut < buf.length) this.carry = buf.subarray(plan.cut);
  }

  /** {@link process} for a piece with no candidate anywhere: the plan without regions. */
  private async passThrough(buf: Buffer, final: boolean): Promise<void> {
    let cut = final ? buf.length : buf.lastIndexOf(10) + 1;
    const forced = !final && buf.length - cut > CARRY_CAP;
    if (forced) cut = buf.length;
    const state0 = this.state;
    await this.emit(cut > 0 ? [buf.subarray(0, cut)] : []);
    this.opts.scanned(cut);
    if (this.opts.json) {
      if (forced) {
        const nl = buf.lastIndexOf(10);
        this.state = jsonEndState(buf.toString("latin1", nl + 1), nl < 0 ? state0 : 0);
      } else if (cut > 0) {
        this.state = 0;
      }
    }
    if (cut < buf.length) this.carry = buf.subarray(cut);
  }

  private async processPiece(buf: Buffer, plan: RegionPlan, state0: JsonState): Promise<void> {
    const piece = buf.subarray(0, plan.cut);
    if (plan.regions.length === 0) {
      await this.emit(piece.length ? [piece] : []);
      return;
    }
    const texts: RegionText[] = [];
    const rewritable: boolean[] = [];
    for (const r of plan.regions) {
      const bytes = buf.subarray(r.start, r.end);
      rewritable.push(!this.binary && !bytes.includes(0) && isUtf8(bytes));
      texts.push({ text: bytes.toString("utf8"), json: this.opts.json, state: r.start === 0 ? state0 : 0 });
    }
    const ok = texts.filter((_, i) => rewritable[i]);
    const bad = texts.filter((_, i) => !rewritable[i]);
    const done: Redacted[] = ok.length ? await this.engine.redact(ok) : [];
    const scanned: Finding[][] = bad.length ? await this.engine.find(bad) : [];
    const out: Buffer[] = [];
    let at = 0;
    let k = 0;
    let j = 0;
    plan.regions.forEach((r, i) => {
      if (!rewritable[i]) {
        for (const x of scanned[j++]!) this.opts.count(x.rule, false);
        return;
      }
      const d = done[k++]!;
      if (d.findings.length === 0) return;
      for (const x of d.findings) this.opts.count(x.rule, true);
      if (r.start > at) out.push(buf.subarray(at, r.start));
      out.push(Buffer.from(d.text, "utf8"));
      at = r.end;
    });
    if (plan.cut > at) out.push(buf.subarray(at, plan.cut));
    await this.emit(out);
  }
}
