/**
 * The full rule set over regions: memsnap's rules and secretlint (batched, one lint call per
 * batch of regions), then the allow-list, then overlap resolution. Pure: no report, no I/O.
 */
import type { AllowMatcher } from "./allow.js";
import { decodeJsonEscapes, escapeView, jsonUnits, snapToEscapes, type JsonState, type Unit } from "./json.js";
import { secretlintCandidate } from "./prefilter.js";
import { applyFindings, resolveOverlaps, type Candidate, type Finding, type MemsnapRule } from "./rules.js";
import type { SecretlintScanner } from "./secretlint.js";

export interface RegionText {
  text: string;
  /** JSON line(s): only string contents are rewritten. */
  json: boolean;
  /** JSON tokenizer state at the region start (non-zero only for a line continued from a forced cut). */
  state?: JsonState;
}

/** Passes of {@link Engine.redact} at most (each replaces at least one character of non-redacted text). */
const MAX_PASSES = 8;

export interface Redacted {
  text: string;
  /** Every finding of every pass (for the counts). */
  findings: Finding[];
}

/** A unit with an escape that decoding changes beyond {@link escapeView}: the rules read it decoded too. */
const DECODE = /\\[u\/]/;

/** Already-redacted spans; a match that touches one is dropped, so a second pass finds nothing new. */
const MARKER = /\[REDACTED:[^\]\s]{1,200}\]/g;

export class Engine {
  constructor(
    private readonly rules: readonly MemsnapRule[],
    private readonly secretlint: SecretlintScanner | null,
    private readonly allow: AllowMatcher,
  ) {}

  /**
   * Rewrite each region until no rule matches any more. One pass is not always enough: a
   * replacement changes its neighbours' context (`AKIA…EXAMPLEhttps://u:p@h` — the key id is
   * not at a word boundary until the URL next to it has become `[REDACTED:…]`), and a second
   * redaction of the output must change nothing.
   */
  async redact(regions: readonly RegionText[]): Promise<Redacted[]> {
    const out: Redacted[] = regions.map((r) => ({ text: r.text, findings: [] }));
    let todo = regions.map((_, i) => i);
    for (let pass = 0; pass < MAX_PASSES && todo.length > 0; pass++) {
      const found = await this.find(todo.map((i) => ({ ...regions[i]!, text: out[i]!.text })));
      const next: number[] = [];
      todo.forEach((i, k) => {
        const f = found[k]!;
        if (f.length === 0) return;
        const o = out[i]!;
        o.findings.push(...f);
        o.text = applyFindings(o.text, f);
        next.push(i);
      });
      todo = next;
    }
    return out;
  }

  /** Findings per region, in region offsets (sorted, disjoint): one pass, nothing rewritten. */
  async find(regions: readonly RegionText[]): Promise<Finding[][]> {
    const units: Array<{ u: Unit; r: number }> = [];
    regions.forEach((reg, r) => {
      if (reg.json) for (const u of jsonUnits(reg.text, reg.state ?? 0)) units.push({ u, r });
      else units.push({ u: { text: reg.text, base: 0, a: 0, b: reg.text.length, json: false }, r });
    });
    // What the rules read: each unit's text with its escapes as whitespace (same offsets), and
    // for a unit with `\u` or `\/` escapes also its decoded text (./json.ts: `g\u0068p_…` is
    // a GitHub token), whose matches are mapped back onto the escaped text and widened to whole
    // escapes. Replacements use the escaped text; allow-lists see the text the rules matched.
    const scans: Array<{ unit: number; view: string; text: string; at: Int32Array | null }> = [];
    units.forEach(({ u }, i) => {
      scans.push({ unit: i, view: escapeView(u.text), text: u.text, at: null });
      if (DECODE.test(u.text)) {
        const d = decodeJsonEscapes(u.text);
        if (d) scans.push({ unit: i, view: d.text, text: d.text, at: d.at });
      }
    });
    let sl: Candidate[][] = [];
    const slScans: number[] = [];
    if (this.secretlint) {
      scans.forEach((sc, i) => {
        if (secretlintCandidate(sc.text)) slScans.push(i);
      });
      sl = await this.secretlint.scan(slScans.map((i) => scans[i]!.view));
    }
    const perRegion: Candidate[][] = regions.map(() => []);
    let k = 0;
    scans.forEach(({ unit, view, text, at }, i) => {
      const { u, r } = units[unit]!;
      const cands: Candidate[] = [];
      for (const rule of this.rules) rule.find(view, cands);
      if (slScans[k] === i) cands.push(...sl[k++]!);
      if (cands.length === 0) return;
      const markers: Array<[number, number]> = [];
      MARKER.lastIndex = 0;
      for (let m = MARKER.exec(view); m; m = MARKER.exec(view)) markers.push([m.index, m.index + m[0].length]);
      const out = perRegion[r]!;
      const raw = (p: number): number => (at ? at[p]! : p);
      for (const c of cands) {
        if (markers.some(([s, e]) => c.start < e && s < c.end)) continue;
        if (this.allow(text.slice(c.start, c.end), text.slice(c.ctxStart, c.ctxEnd))) continue;
        let s = Math.max(raw(c.start), u.a);
        let e = Math.min(raw(c.end), u.b);
        if (e <= s) continue;
        if (u.json || at) [s, e] = snapToEscapes(u.text, u.a, u.b, s, e);
        out.push({
          ...c,
          start: s + u.base,
          end: e + u.base,
          ctxStart: raw(c.ctxStart) + u.base,
          ctxEnd: raw(c.ctxEnd) + u.base,
        });
      }
    });
    return perRegion.map(resolveOverlaps);
  }
}
