/** Everything the CLI prints: results, errors with hints, and TTY progress. The library never prints. */
import { ERROR_CODES, MemsnapError } from "../errors.js";
import { listSome, summarizeRedaction } from "../redact/report.js";
import { EXIT_CODES } from "./exit-codes.js";

export interface OutputOptions {
  json: boolean;
}

/** Human-readable byte count (decimal units, like the MB/s figures). */
export function fmtBytes(n: number): string {
  if (n < 1000) return `${n} B`;
  const units = ["kB", "MB", "GB", "TB"];
  let v = n;
  let i = -1;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i++;
  }
  return `${v.toFixed(v < 10 ? 2 : 1)} ${units[i]}`;
}

/** Throughput in the unit that suits it ("385.5 MB/s", "13.6 kB/s": a small agent's restore is not "0.0 MB/s"). */
export function fmtRate(bytes: number, ms: number): string {
  return ms > 0 ? `${fmtBytes(Math.round(bytes / (ms / 1000)))}/s` : "-";
}

/** `default: 2 values redacted in a/x, b/y (rule, rule); 1 found and kept` */
export function redactionLine(report: Record<string, unknown>): string {
  const policy = typeof report.policy === "string" ? report.policy : "-";
  if (policy === "off") return "off (not scanned)";
  const s = summarizeRedaction(report);
  const kept = s.unredacted
    ? `; ${s.unredacted} found and kept as is (not rewritable: git history, content-addressed data)`
    : "";
  if (!s.total) return `${policy}: nothing redacted${kept}`;
  return (
    `${policy}: ${s.total} value${s.total === 1 ? "" : "s"} replaced by [REDACTED:<rule>] ` +
    `in ${listSome(s.artifacts)} (${s.rules.join(", ")})${kept}`
  );
}

/** Warnings of the command so far that are not a layer's (a key file open to others): `{path, message}`. */
const commandWarnings: { path: string; message: string }[] = [];

/** Report a warning now on stderr, and in the `warnings` of the command's JSON output. */
export function commandWarning(w: { path: string; message: string }): void {
  if (commandWarnings.some((x) => x.path === w.path && x.message === w.message)) return;
  commandWarnings.push(w);
  process.stderr.write(`memsnap: warning: ${w.message}\n`);
}

/** Forget the warnings of an earlier command (main() runs more than once in one process in tests). */
export function resetCommandWarnings(): void {
  commandWarnings.length = 0;
}

/** Print a JSON result object on stdout (with the command's warnings added to its `warnings`). */
export function printJson(obj: unknown): void {
  if (commandWarnings.length && obj !== null && typeof obj === "object" && !Array.isArray(obj)) {
    const o = obj as Record<string, unknown>;
    obj = { ...o, warnings: [...(Array.isArray(o.warnings) ? o.warnings : []), ...commandWarnings] };
  }
  process.stdout.write(JSON.stringify(obj, null, 2) + "\n");
}

/** Print an error the house way and return the exit code for it. */
export function reportError(e: unknown, opts: OutputOptions): number {
  const err =
    e instanceof MemsnapError
      ? e
      : new MemsnapError("MEMSNAP_INTERNAL", (e as Error)?.stack ?? String(e), {
          hint: "this is a bug in memsnap; please report it with the command you ran",
        });
  const exit = EXIT_CODES[ERROR_CODES[err.code].class];
  if (opts.json) {
    printJson({ ok: false, exit_code: exit, error: err.toJSON() });
  } else {
    const lower = (s: string): string => s.replace(/\.$/, "");
    process.stderr.write(`memsnap: error: ${lower(err.message)} [${err.code}]\n`);
    if (err.findings && err.findings.length > 1) {
      for (const f of err.findings) process.stderr.write(`memsnap:   - ${f.message} [${f.code}]\n`);
    }
    if (err.hint) process.stderr.write(`memsnap: hint: ${lower(err.hint)}\n`);
  }
  return exit;
}

/** A one-line progress meter on stderr, shown only on a TTY. */
export class Progress {
  private last = 0;
  private readonly t0 = performance.now();
  private shown = false;
  constructor(
    private readonly label: string,
    private readonly enabled: boolean,
  ) {}

  update(bytes: number, total: number | null): void {
    if (!this.enabled) return;
    const now = performance.now();
    if (now - this.last < 100) return;
    this.last = now;
    const ms = now - this.t0;
    const rate = bytes / (ms / 1000);
    let line = `${this.label} ${fmtBytes(bytes)}`;
    if (total) line += ` / ${fmtBytes(total)}`;
    line += `  ${fmtRate(bytes, ms)}`;
    if (total && rate > 0 && total > bytes) line += `  ETA ${Math.ceil((total - bytes) / rate)}s`;
    process.stderr.write(`\r\x1b[2K${line}`);
    this.shown = true;
  }

  done(): void {
    if (this.shown) process.stderr.write("\r\x1b[2K");
  }
}
