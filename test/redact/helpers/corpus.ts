/** Deterministic agent-memory-like text for the redaction tests and the throughput benchmark. */
const WORDS = (
  "the a an and or but if then when while because so that this these those it its they them their we our you your " +
  "he she his her i me my is are was were be been being have has had do does did will would can could should may " +
  "might must not no yes all some any each every more most less few many much other another same such only own just " +
  "also very too again still already never always often sometimes now later today tomorrow yesterday before after " +
  "user assistant agent tool memory context window token tokens prompt reply answer question task goal plan step " +
  "steps result results error errors file files folder path config setting settings database table row rows column " +
  "index query search vector embedding model cache session trace log event message note summary topic project " +
  "deadline meeting email calendar document report code function test build release branch commit review issue bug " +
  "fix feature request response customer team manager friend travel flight hotel budget invoice payment account " +
  "password preference habit schedule reminder list idea draft version remember secret key keys api desk task-based " +
  "risk-free Alice Bob Carol Dave Berlin Paris Tokyo Python TypeScript Rust SQLite Postgres Docker Linux GitHub Slack"
).split(" ");

/** sfc32-like small PRNG. */
export class Rng {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0 || 1;
  }
  next(): number {
    let x = this.s;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    this.s = x >>> 0;
    return this.s;
  }
  int(n: number): number {
    return this.next() % n;
  }
  pick<T>(a: readonly T[]): T {
    return a[this.int(a.length)]!;
  }
}

function sentence(r: Rng): string {
  const n = 5 + r.int(14);
  let s = r.pick(WORDS);
  s = s[0]!.toUpperCase() + s.slice(1);
  for (let i = 1; i < n; i++) s += (r.int(13) === 0 ? ", " : " ") + r.pick(WORDS);
  return s + (r.int(10) === 0 ? "?" : ".");
}

/** Markdown notes of about `bytes` bytes (ASCII). */
export function markdown(bytes: number, seed = 1): string {
  const r = new Rng(seed);
  const parts: string[] = [];
  let n = 0;
  while (n < bytes) {
    const k = r.int(4);
    const s = k === 0 ? `## ${sentence(r)}\n\n` : k === 1 ? `- ${sentence(r)}\n- ${sentence(r)}\n\n` : Array.from({ length: 2 + r.int(4) }, () => sentence(r)).join(" ") + "\n\n";
    parts.push(s);
    n += s.length;
  }
  return parts.join("");
}

/** JSONL conversation-trace lines of about `bytes` bytes (ASCII). */
export function jsonl(bytes: number, seed = 2): string {
  const r = new Rng(seed);
  const parts: string[] = [];
  let n = 0;
  let turn = 0;
  while (n < bytes) {
    turn++;
    const k = r.int(10);
    const ts = new Date(Date.UTC(2024, 4, 1) + turn * 7000).toISOString();
    const line = k < 7
      ? { ts, session: "s-0001-a1b2c3", turn, role: k < 3 ? "user" : "assistant", content: Array.from({ length: 1 + r.int(6) }, () => sentence(r)).join(" "), tool_id: null, usage: { input_tokens: r.int(60000), output_tokens: r.int(2000) } }
      : { ts, session: "s-0001-a1b2c3", turn, role: "tool", content: JSON.stringify({ status: "ok", items: [{ id: r.next(), score: r.int(1000) / 1000, text: sentence(r) }] }), tool_id: `call_${r.next().toString(36)}`, name: "read_file" };
    const s = JSON.stringify(line) + "\n";
    parts.push(s);
    n += s.length;
  }
  return parts.join("");
}
