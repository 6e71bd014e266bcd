/**
 * Redaction entry point: the `redaction` config, and the redactor the snapshot pipeline and
 * the sources use (contract: ./types.ts).
 *
 *   "redaction": {
 *     "enabled": true,                       // default true; --no-redact overrides
 *     "allow": ["AKIAI44QH8DHBEXAMPLE", "/^sk_test_/"],   // literals or /regex/flags: kept, not redacted
 *     "rules": { "disable": ["memsnap/bearer-token", "@secretlint/secretlint-rule-aws"] }
 *   }
 *
 * Rules: secretlint's recommend preset (AWS id scan on) plus memsnap's own (./rules.ts).
 * Each match becomes `[REDACTED:<rule id>]`; a second pass changes nothing. The report's
 * policy is `default`, or `custom` when the config allows or disables anything.
 */
import { gcPacer } from "../util/gc.js";
import { reusedChunks } from "../util/reused-chunks.js";
import { nativePrefilter } from "./native.js";
import { createHash, randomBytes } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdir, open, rm, type FileHandle } from "node:fs/promises";
import { extname, join } from "node:path";
import { Readable } from "node:stream";
import { getSystemErrorName } from "node:util";
import { destinationError, sourceChanged, sourceError } from "../errors.js";
import type { Artifact, OpenOptions } from "../format/artifact.js";
import { configInvalid, isPlainObject, optBool, optStringArray, rejectUnknownKeys } from "../util/config-check.js";
import { compileAllow, type AllowMatcher } from "./allow.js";
import { Engine } from "./engine.js";
import { escapedCandidate, hidingEscapeAt } from "./json.js";
import { candidate } from "./prefilter.js";
import { ReportBuilder } from "./report.js";
import { ALL_RULE_IDS, MEMSNAP_RULES, SECRETLINT_RULE_IDS } from "./rules.js";
import { createSecretlintScanner } from "./secretlint.js";
import { processText, StreamRedactor } from "./stream.js";
import type { RedactionReport, Redactor, RuleCounts } from "./types.js";

export type { RedactionReport, Redactor, RuleCounts } from "./types.js";
export { candidate } from "./prefilter.js";
export { ALL_RULE_IDS, MEMSNAP_RULE_IDS, SECRETLINT_RULE_IDS } from "./rules.js";

/** Every rule id with what it finds (for docs and `--help` output). */
export function describeRules(): Array<{ id: string; description: string }> {
  return [
    ...MEMSNAP_RULES.map((r) => ({ id: r.id, description: r.description })),
    ...SECRETLINT_RULE_IDS.map((id) => ({
      id,
      description: `secretlint recommend preset: ${id.replace("@secretlint/secretlint-rule-", "")}`,
    })),
  ];
}

export interface RedactionConfig {
  enabled: boolean;
  /** Literal strings or /regex/flags patterns whose matches are never redacted (false positives). */
  allow: string[];
  /** Rule ids switched off (`redaction.rules.disable`). */
  disable?: string[];
}

/** Parse the config's `redaction` object. Throws MEMSNAP_CONFIG_INVALID / _UNKNOWN_KEY. */
export function parseRedactionConfig(raw: Record<string, unknown> | undefined, where: string): RedactionConfig {
  if (raw === undefined) return { enabled: true, allow: [], disable: [] };
  rejectUnknownKeys(raw, ["enabled", "allow", "rules"], where);
  const enabled = optBool(raw, "enabled", where) ?? true;
  const allow = optStringArray(raw, "allow", where) ?? [];
  compileAllow(allow, where); // reject bad regexes now
  let disable: string[] = [];
  if (raw.rules !== undefined) {
    const w = `${where}.rules`;
    if (!isPlainObject(raw.rules)) throw configInvalid(where, '"rules" must be an object');
    rejectUnknownKeys(raw.rules, ["disable"], w);
    disable = optStringArray(raw.rules, "disable", w) ?? [];
    for (const id of disable) {
      if (!ALL_RULE_IDS.includes(id)) {
        throw configInvalid(w, `unknown rule ${JSON.stringify(id)} in "disable" (known: ${ALL_RULE_IDS.join(", ")})`);
      }
    }
  }
  return { enabled, allow, disable };
}

const JSON_EXT = new Set([".json", ".jsonl", ".ndjson"]);

/** JSON-aware redaction for `json`/`jsonl` kinds and .json/.jsonl/.ndjson files. */
export function isJsonArtifact(a: Pick<Artifact, "kind" | "path">): boolean {
  return a.kind === "json" || a.kind === "jsonl" || JSON_EXT.has(extname(a.path).toLowerCase());
}

const JSON_MAX = 16 << 20;

/** One JSON object or array (checked only for texts that could hold a match at all). */
function looksLikeJson(text: string): boolean {
  const t = text.trim();
  if (t.length < 2 || t.length > JSON_MAX || !((t[0] === "{" && t.endsWith("}")) || (t[0] === "[" && t.endsWith("]"))))
    return false;
  if (!candidate(t) && !escapedCandidate(t)) return false;
  try {
    JSON.parse(t);
    return true;
  } catch {
    return false;
  }
}

/** Output up to this size stays in memory; larger output is spooled to a file. */
const MEM_MAX = 1 << 20;

/** A text up to this size is read whole before it is redacted (see redactArtifact). */
const SMALL_TEXT = 64 * 1024;

/** All of a small artifact's bytes, which must be exactly its declared size (MEMSNAP_SOURCE_CHANGED otherwise). */
async function readWhole(a: Artifact, payloadPath: string): Promise<Buffer> {
  const parts: Buffer[] = [];
  let seen = 0;
  for await (const chunk of a.open() as AsyncIterable<Buffer>) {
    seen += chunk.length;
    if (seen > a.size) throw sourceChanged(payloadPath, `grew past its declared ${a.size} bytes`);
    parts.push(chunk);
  }
  if (seen !== a.size) throw sourceChanged(payloadPath, `shrank from ${a.size} to ${seen} bytes`);
  return parts.length === 1 ? parts[0]! : Buffer.concat(parts, seen);
}

/**
 * A stream is scanned through latin1 views of 64 KiB pieces (young-generation strings), but a
 * long line or an open PEM block is carried and viewed whole, and views of 128 KiB or more go
 * to V8's large-object space, where they wait for a full collection: one runs after every
 * 32 MiB of such views. (With 1 MiB pieces every view was large: the bench's 119 MB of JSONL
 * traces peaked at 200 MiB of RSS without this pacer, 192-196 with it.)
 */
const collectLargeViews = gcPacer(32 * 1024 * 1024, "major");

class MemsnapRedactor implements Redactor {
  private readonly report_: ReportBuilder;
  private spoolDir: string | undefined;
  private readonly spools = new Set<string>();
  private seq = 0;

  constructor(
    private readonly engine: Engine,
    private readonly tmpDir: string,
    policy: string,
  ) {
    this.report_ = new ReportBuilder(policy);
  }

  /** The pre-filter, on the text and on the text its JSON escapes decode to (`g\u0068p_…`: ./json.ts). */
  candidate(text: string): boolean {
    return candidate(text) || escapedCandidate(text);
  }

  /**
   * The native pre-filter's negative test on the bytes themselves (./native.ts), and no JSON escape that can hide a
   * secret; false without it.
   */
  clean(bytes: Uint8Array): boolean {
    const native = nativePrefilter();
    return native !== null && native.scan(bytes, 0, bytes.length) === -1 && hidingEscapeAt(bytes) < 0;
  }

  /**
   * A text that is one JSON document (a JSON column, a tool result) is redacted string by string, so it stays valid.
   */
  async redactText(text: string, artifact: string): Promise<string> {
    this.report_.scanned(Buffer.byteLength(text));
    return processText(this.engine, text, looksLikeJson(text), false, (rule, red) =>
      this.report_.add(artifact, rule, red),
    );
  }

  async matches(text: string): Promise<boolean> {
    let n = 0;
    // what scanText finds and what redactText rewrites, minus the report
    const json = looksLikeJson(text);
    await processText(this.engine, text, json, true, () => void n++);
    if (n > 0) return true;
    const out = await processText(this.engine, text, json, false, () => void n++);
    return n > 0 || out !== text;
  }

  async scanText(text: string, artifact: string): Promise<number> {
    this.report_.scanned(Buffer.byteLength(text));
    let n = 0;
    await processText(this.engine, text, looksLikeJson(text), true, (rule) => {
      n++;
      this.report_.add(artifact, rule, false);
    });
    return n;
  }

  /** Redact a whole text the way {@link redactArtifact} redacts a stream (JSON-aware with `json`). */
  async redactDocument(text: string, artifact: string, json: boolean): Promise<string> {
    this.report_.scanned(Buffer.byteLength(text));
    return processText(this.engine, text, json, false, (rule, red) => this.report_.add(artifact, rule, red));
  }

  async redactArtifact(a: Artifact, payloadPath: string): Promise<Artifact> {
    // A small text is read whole first: when the native pre-filter finds that nothing in it can
    // match (most memory notes), it is packed as read, without the stream redactor's machinery
    // (the same bytes it would pass on); otherwise the stream redactor takes those bytes. (Its
    // own function: redactStream's many closures cost an allocation per call, and a memory of
    // 20,000 notes makes 20,000 calls.)
    if (a.size > SMALL_TEXT) return this.redactStream(a, payloadPath, null);
    const whole = await readWhole(a, payloadPath);
    if (!this.clean(whole)) return this.redactStream(a, payloadPath, whole);
    this.report_.scanned(whole.length);
    return {
      path: a.path,
      kind: a.kind,
      size: whole.length,
      mode: a.mode,
      mtime: a.mtime,
      ...(a.text !== undefined ? { text: a.text } : {}),
      ...(a.check ? { check: () => a.check!() } : {}),
      rereadable: true, // (in memory: an incremental snapshot may read a log's prefix, then all of it)
      open: () => (whole.length ? [whole] : []),
    };
  }

  /** Redact `a` through the stream redactor; `whole`: its bytes, already read. */
  private async redactStream(a: Artifact, payloadPath: string, whole: Buffer | null): Promise<Artifact> {
    const mem: Buffer[] = [];
    let memLen = 0;
    let fh: FileHandle | undefined;
    let spool: string | undefined;
    let size = 0;
    // A big text that can be read again (a file) is not kept while nothing in it has been
    // rewritten: the output so far is then the input so far. If the whole text stays unchanged
    // the source itself is packed (read a second time; its check() still catches a change),
    // which saves writing, reading back and removing a spool file (the bench's 125 MB of JSONL
    // traces: ~70 ms of CPU per snapshot). At the first rewritten finding, the unchanged bytes
    // so far are read again from the source into the spool, and the rest follows as before.
    //
    // Reading the source again is safe only if it yields the bytes scanned: the source's check()
    // compares size and mtime, and a same-size rewrite within one tick of the kernel's clock
    // keeps both. So the bytes passed on unkept are hashed as they are scanned; the reread
    // prefix must hash the same here, and the pipeline compares the whole text's hash with the
    // bytes it packs (Artifact.expectSha256). Unscanned bytes never reach a bundle.
    const lazy = a.rereadable === true && a.size > MEM_MAX;
    if (lazy && a.file !== undefined) {
      const digest = await this.scanFileNatively(a, a.file, payloadPath);
      if (digest !== null) {
        // Nothing in the file can match: what the stream below concludes piece by piece (the
        // source packed as it is, its hash to be matched), without a byte of it on this thread.
        this.report_.scanned(a.size);
        a.expectSha256 = digest;
        return a;
      }
    }
    const scanned = lazy ? createHash("sha256") : null;
    let rewritten = 0;
    let unkept = 0;
    const keepPrefix = async (n: number): Promise<void> => {
      let need = n;
      const again = createHash("sha256");
      for await (const c of a.open() as AsyncIterable<Buffer>) {
        const part = c.length <= need ? c : c.subarray(0, need);
        need -= part.length;
        again.update(part);
        await keep([part]);
        if (need === 0) break;
      }
      if (need > 0) throw sourceChanged(payloadPath, `shrank below ${n} bytes while it was redacted`);
      if (again.digest("hex") !== scanned!.digest("hex")) {
        throw sourceChanged(payloadPath, "its first bytes changed while it was redacted (same size and mtime)");
      }
    };
    const write = async (chunks: Buffer[]): Promise<void> => {
      let n = 0;
      for (const c of chunks) n += c.length;
      size += n;
      if (lazy && rewritten === 0 && memLen === 0 && !fh) {
        for (const c of chunks) scanned!.update(c);
        unkept += n;
        return;
      }
      if (unkept > 0) {
        const prefix = unkept;
        unkept = 0;
        await keepPrefix(prefix);
      }
      await keep(chunks);
    };
    const keep = async (chunks: Buffer[]): Promise<void> => {
      if (!fh) {
        for (const c of chunks) {
          mem.push(c.length === c.buffer.byteLength ? c : Buffer.from(c)); // do not pin the source's block
          memLen += c.length;
        }
        if (memLen <= MEM_MAX) return;
        spool = await this.newSpool();
        try {
          fh = await open(spool, "wx", 0o600);
        } catch (e) {
          throw destinationError(e, spool);
        }
        chunks = mem.splice(0);
        memLen = 0;
      }
      await writeAll(fh, chunks, spool!);
    };
    const sr = new StreamRedactor(
      this.engine,
      {
        json: isJsonArtifact(a),
        count: (rule, red) => {
          if (red) rewritten++;
          this.report_.add(payloadPath, rule, red);
        },
        scanned: (n) => this.report_.scanned(n),
        largeView: collectLargeViews,
      },
      write,
    );
    try {
      const src = whole ? [whole] : a.open();
      let seen = 0;
      for await (const chunk of src as AsyncIterable<Buffer>) {
        seen += chunk.length;
        if (seen > a.size) throw sourceChanged(payloadPath, `grew past its declared ${a.size} bytes`);
        await sr.push(chunk);
      }
      if (seen !== a.size) throw sourceChanged(payloadPath, `shrank from ${a.size} to ${seen} bytes`);
      await sr.end();
      if (fh)
        await fh.close().catch((e: unknown) => {
          throw destinationError(e, spool!);
        });
      fh = undefined;
    } catch (e) {
      await sr.settle();
      await fh?.close().catch(() => undefined);
      if (spool) await this.dropSpool(spool);
      throw e;
    }
    if (unkept > 0) {
      // Nothing rewritten and nothing kept: the bytes to pack are the source's own.
      if (rewritten > 0 || size !== a.size)
        throw new Error(`redaction of ${payloadPath} kept no bytes of a text it rewrote or resized`);
      a.expectSha256 = scanned!.digest("hex");
      return a;
    }
    const out: Artifact = {
      path: a.path,
      kind: a.kind,
      size,
      mode: a.mode,
      mtime: a.mtime,
      ...(a.text !== undefined ? { text: a.text } : {}),
      ...(a.check ? { check: () => a.check!() } : {}),
      open: spool === undefined ? memOpen(mem) : this.spoolOpen(spool, size),
      ...(spool === undefined ? { rereadable: true } : {}),
    };
    return out;
  }

  report(): RedactionReport {
    return this.report_.report();
  }

  /**
   * A big text file scanned where it lies, on the thread pool (NativePrefilter.scanFile): its
   * SHA-256 when no scanner can match anywhere in it, null when one may (the stream redactor
   * then reads it) or the addon cannot do it. Measured on the bench's traces (119 MB of JSONL
   * in 9 files, all but one clean): the main thread's read, scan and hash of them went to the
   * pool, ~0.2 s of a thread that paces the snapshot there.
   */
  private async scanFileNatively(a: Artifact, file: string, payloadPath: string): Promise<string | null> {
    const native = nativePrefilter();
    if (native?.scanFile === undefined) return null;
    if (native.scanFileJson !== true) return null; // an older addon: it would not stop at a JSON escape
    let fh: FileHandle;
    try {
      fh = await open(file, "r");
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT") throw sourceChanged(file, "it was removed");
      throw sourceError(e, file);
    }
    try {
      const digest = Buffer.alloc(32);
      const [errno, at, got] = await new Promise<[number, number, number]>((res) => {
        native.scanFile!(fh.fd, a.size, digest, (e, hit, n) => res([e, hit, n]), true);
      });
      if (errno !== 0) {
        const code = getSystemErrorName(-errno);
        throw sourceError(Object.assign(new Error(`${code}: reading ${file}`), { code, errno: -errno }), file);
      }
      if (at !== -1) return null; // (read only up to there)
      if (got < a.size) throw sourceChanged(payloadPath, `shrank from ${a.size} to ${got} bytes`);
      return digest.toString("hex");
    } finally {
      await fh.close();
    }
  }

  recordReused(artifact: string, counts: RuleCounts, redacted = true): void {
    for (const [rule, n] of Object.entries(counts))
      if (Number.isSafeInteger(n) && n > 0) this.report_.add(artifact, rule, redacted, n);
  }

  async cleanup(): Promise<void> {
    this.spools.clear();
    if (this.spoolDir) await rm(this.spoolDir, { recursive: true, force: true });
    this.spoolDir = undefined;
  }

  private async newSpool(): Promise<string> {
    if (!this.spoolDir) {
      const dir = join(this.tmpDir, `redact-${process.pid}-${randomBytes(4).toString("hex")}`);
      try {
        await mkdir(dir, { recursive: true, mode: 0o700 });
      } catch (e) {
        throw destinationError(e, dir);
      }
      this.spoolDir = dir;
    }
    const p = join(this.spoolDir, `${++this.seq}.spool`);
    this.spools.add(p);
    return p;
  }

  private async dropSpool(p: string): Promise<void> {
    this.spools.delete(p);
    await rm(p, { force: true }).catch(() => undefined);
  }

  /**
   * Read the spool; it is removed once read to its end (the pipeline opens an artifact once).
   * With `reuse` (the pipeline packing it) into reused buffers, see Artifact.open.
   */
  private spoolOpen(p: string, size: number): (o?: OpenOptions) => Readable | AsyncIterable<Buffer> {
    const drop = (): Promise<void> => this.dropSpool(p);
    return (o) => {
      if (o?.reuse) {
        return (async function* () {
          const fh = await open(p, "r");
          try {
            yield* reusedChunks(fh, 0, size);
          } finally {
            await fh.close();
          }
          await drop();
        })();
      }
      const s = createReadStream(p, { highWaterMark: 1 << 20 });
      s.once("end", () => void drop());
      return s;
    };
  }
}

function memOpen(bufs: Buffer[]): () => Iterable<Buffer> {
  const whole = bufs.length === 1 ? bufs[0]! : Buffer.concat(bufs);
  // An array, not a Readable: a stream per small artifact was most of the garbage a memory of
  // 20,000 notes made (V8's collections: a fifth of the snapshot's main thread).
  return () => (whole.length ? [whole] : []);
}

async function writeAll(fh: FileHandle, chunks: Buffer[], path: string): Promise<void> {
  try {
    let i = 0;
    while (i < chunks.length) {
      const batch = chunks.slice(i, i + 256);
      const want = batch.reduce((n, c) => n + c.length, 0);
      const { bytesWritten } = await fh.writev(batch);
      if (bytesWritten !== want) {
        // a short write: finish this batch piece by piece
        let skip = bytesWritten;
        for (const c of batch) {
          if (skip >= c.length) {
            skip -= c.length;
            continue;
          }
          let rest = c.subarray(skip);
          skip = 0;
          while (rest.length) {
            const r = await fh.write(rest);
            rest = rest.subarray(r.bytesWritten);
          }
        }
      }
      i += batch.length;
    }
  } catch (e) {
    throw destinationError(e, path);
  }
}

/** Create a redactor for one snapshot; spool files go under `tmpDir`. Undefined when redaction is off. */
export async function createRedactor(cfg: RedactionConfig, tmpDir: string): Promise<Redactor | undefined> {
  if (!cfg.enabled) return undefined;
  const disabled = new Set(cfg.disable ?? []);
  const allow: AllowMatcher = compileAllow(cfg.allow, "redaction");
  const secretlint = await createSecretlintScanner(disabled);
  const rules = MEMSNAP_RULES.filter((r) => !disabled.has(r.id));
  const policy = cfg.allow.length === 0 && disabled.size === 0 ? "default" : "custom";
  return new MemsnapRedactor(new Engine(rules, secretlint, allow), tmpDir, policy);
}

/** The redactor class's extra method, for tests and tools: JSON-aware redaction of a whole text. */
export type DocumentRedactor = Redactor & {
  redactDocument(text: string, artifact: string, json: boolean): Promise<string>;
};
