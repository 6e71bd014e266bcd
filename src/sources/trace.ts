/**
 * The `trace` source: agentlog traces (`*.agentlog`, JSONL), every record validated.
 *
 * A record is `{version:"0.1", id, kind, ts, parent, meta?, payload}`. `id` is `sha256:` + hex
 * SHA-256 of the canonical JSON of `payload` (src/util/canonical-agentlog.ts). The first record
 * is `metadata` with `parent: null`; every other record's parent is the id of an earlier record
 * (a later `metadata` record may start a new chain with `parent: null`). Any record that breaks
 * this is MEMSNAP_TRACE_INVALID and no bundle is written.
 *
 * Without redaction the file's bytes are packed as they are, each record checked as it streams
 * by. A trace that is being appended is captured up to its last complete record (a partial
 * last line is left out and counted in the meta); growth during the capture is allowed,
 * shrinking is MEMSNAP_SOURCE_CHANGED.
 *
 * With redaction on, string values in `payload` and `meta` go through the redactor; a record
 * whose payload changed gets a new id (its canonical hash), and later records' parent links are
 * rewritten to the new ids (a map old id → new id), so the bundled trace verifies. Records memsnap
 * did not change keep their exact bytes; rewritten ones keep key order and number spelling.
 * The result is spooled to the capture's temp dir, record by record. The layer meta says how
 * many records were re-sealed, per artifact.
 *
 * The record format and its validator are ./trace-format.ts; this file is the capture.
 */
import { createReadStream, type Stats } from "node:fs";
import { mkdtemp, open, rm, stat } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import { MemsnapError } from "../errors.js";
import type { Redactor } from "../redact/types.js";
import {
  agentlogId,
  JsonBudgetError,
  mapStrings,
  parseLossless,
  serializeFaithful,
  type JsonObject,
} from "../util/canonical-agentlog.js";
import { optStringArray, rejectUnknownKeys, reqString } from "../util/config-check.js";
import type { Artifact, SourceKind } from "./types.js";
import { pathTarget } from "./live-target.js";
import {
  completeLinesPrefix,
  fileArtifact,
  sourceChanged,
  sourceError,
  walkFiles,
  walkNotices,
  type FoundFile,
} from "./walk.js";
import { consumeAll } from "../util/streams.js";
import {
  decoder,
  LineSplitter,
  MAX_RECORD_BYTES,
  recordLimits,
  TraceRecordError,
  TraceValidator,
  validateTrace,
} from "./trace-format.js";

export {
  AGENTLOG_KINDS,
  AGENTLOG_VERSION,
  EXPANSION_SLACK,
  LineSplitter,
  MAX_RECORD_BYTES,
  RECORD_BUDGET,
  recordLimits,
  TraceRecordError,
  TraceValidator,
  validateTrace,
  type TraceRecord,
} from "./trace-format.js";

export interface TraceConfig {
  kind: "trace";
  name: string;
  path: string;
  include?: string[];
  exclude?: string[];
}

// ---- capture ------------------------------------------------------------------------------

function invalid(file: string, e: TraceRecordError): MemsnapError {
  return new MemsnapError("MEMSNAP_TRACE_INVALID", `trace ${file}: ${e.message}`, {
    path: file,
    hint: "the trace was damaged or edited by hand (ids are SHA-256 of the canonical payload); fix or exclude the file",
  });
}

/**
 * How much of a trace to capture: everything up to the last complete record. A last line
 * without `\n` counts when it parses as JSON (a finished file without a final newline), and is
 * left out when it does not (a record being written).
 */
function completePrefix(abs: string, size: number): Promise<{ size: number; tail: number }> {
  return completeLinesPrefix(
    abs,
    size,
    (tail) => {
      try {
        parseLossless(decoder.decode(tail), recordLimits(tail.length));
        return true;
      } catch (e) {
        // Over budget is a whole record that the validator then refuses; anything else is a
        // record still being written.
        return e instanceof JsonBudgetError;
      }
    },
    MAX_RECORD_BYTES,
  );
}

/** The trace's first `size` bytes, checked record by record as they stream into the bundle. */
function plainArtifact(f: FoundFile, size: number, onRecords: (n: number) => void): Artifact {
  return {
    path: f.rel,
    kind: "agentlog",
    size,
    mode: f.stats.mode & 0o7777,
    mtime: f.stats.mtime,
    text: false, // redaction would break the ids; this source redacts and re-seals itself
    rereadable: true, // each open() reads and checks the file again (an incremental snapshot may read its prefix twice)
    chunking: { mode: "append" }, // a trace is only ever appended to: an incremental snapshot stores the new records
    open: () =>
      (async function* () {
        const v = new TraceValidator();
        const s = new LineSplitter();
        if (size === 0) return;
        const src = createReadStream(f.abs, { start: 0, end: size - 1, highWaterMark: 1 << 20 });
        try {
          for await (const chunk of src) {
            for (const l of s.push(chunk as Buffer)) v.check(l.line, l.no);
            yield chunk as Buffer;
          }
          const last = s.end();
          if (last) v.check(last.line, last.no);
          onRecords(v.records);
        } catch (e) {
          if (e instanceof TraceRecordError) throw invalid(f.abs, e);
          if ((e as NodeJS.ErrnoException).code === "ENOENT") throw sourceChanged(f.abs, "it was removed");
          throw sourceError(e, f.abs);
        } finally {
          src.destroy();
        }
      })(),
    check: async () => {
      let now: Stats;
      try {
        now = await stat(f.abs);
      } catch {
        throw sourceChanged(f.abs, "it was removed");
      }
      if (now.size < size)
        throw sourceChanged(f.abs, `it shrank from ${size} to ${now.size} bytes (a trace may only grow)`);
    },
  };
}

interface ResealStats {
  records: number;
  resealed: number;
  parents: number;
}

/** Validate, redact and re-seal one trace into `spool`. */
async function resealTrace(
  f: FoundFile,
  size: number,
  spool: string,
  redactor: Redactor,
  payloadPath: string,
): Promise<ResealStats> {
  const out = await open(spool, "wx", 0o600);
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  const flush = async (): Promise<void> => {
    if (pendingBytes === 0) return;
    const b = Buffer.concat(pending);
    pending = [];
    pendingBytes = 0;
    await out.write(b);
  };
  const write = async (b: Buffer | string): Promise<void> => {
    const buf = typeof b === "string" ? Buffer.from(b, "utf8") : b;
    pending.push(buf);
    pendingBytes += buf.length;
    if (pendingBytes >= 1 << 20) await flush();
  };
  const v = new TraceValidator();
  const s = new LineSplitter();
  const remap = new Map<string, string>();
  const stats: ResealStats = { records: 0, resealed: 0, parents: 0 };
  const redact = async (x: string): Promise<string> =>
    redactor.candidate(x) ? redactor.redactText(x, payloadPath) : x;
  const one = async (line: Buffer, no: number, newline: boolean): Promise<void> => {
    const r = v.check(line, no);
    stats.records++;
    const payload = await mapStrings(r.payload, redact);
    const metaV = r.obj.get("meta");
    const meta = metaV === undefined ? null : await mapStrings(metaV, redact);
    let id = r.id;
    if (payload.changed) {
      id = agentlogId(payload.value);
      if (id !== r.id) {
        stats.resealed++;
        if (!remap.has(r.id)) remap.set(r.id, id);
      }
    }
    const parent = r.parent === null ? null : (remap.get(r.parent) ?? r.parent);
    if (parent !== r.parent) stats.parents++;
    if (!payload.changed && !meta?.changed && parent === r.parent) {
      await write(line);
    } else {
      const obj: JsonObject = new Map(r.obj);
      obj.set("id", id);
      obj.set("parent", parent);
      obj.set("payload", payload.value);
      if (meta) obj.set("meta", meta.value);
      await write(serializeFaithful(obj));
    }
    if (newline) await write("\n");
  };
  const src = size > 0 ? createReadStream(f.abs, { start: 0, end: size - 1, highWaterMark: 1 << 20 }) : null;
  let read = 0;
  try {
    if (src) {
      for await (const chunk of src) {
        read += (chunk as Buffer).length;
        for (const l of s.push(chunk as Buffer)) await one(l.line, l.no, true);
      }
    }
    if (read !== size) throw sourceChanged(f.abs, `it shrank from ${size} to ${read} bytes (a trace may only grow)`);
    const last = s.end();
    if (last) await one(last.line, last.no, false);
    await flush();
    await out.close();
  } catch (e) {
    src?.destroy();
    await out.close().catch(() => undefined);
    if (e instanceof TraceRecordError) throw invalid(f.abs, e);
    if (e instanceof MemsnapError) throw e;
    throw sourceError(e, f.abs);
  }
  return stats;
}

/** agentlog traces; see the module comment. */
export const traceSource: SourceKind<TraceConfig> = {
  kind: "trace",
  schemaVersion: 1,
  restoresAttributes: true,
  parseConfig(raw, where) {
    rejectUnknownKeys(raw, ["kind", "name", "path", "include", "exclude"], where);
    const cfg: TraceConfig = {
      kind: "trace",
      name: reqString(raw, "name", where),
      path: reqString(raw, "path", where),
    };
    const include = optStringArray(raw, "include", where);
    const exclude = optStringArray(raw, "exclude", where);
    if (include) cfg.include = include;
    if (exclude) cfg.exclude = exclude;
    return cfg;
  },
  async liveTarget(cfg, baseDir, layer) {
    // Like a files layer: the traces the globs select are replaced, those the bundle lacks
    // removed, other files left alone. Bundles before root_is_file: one trace whose captured
    // root is a file of the configured name.
    const abs = resolve(baseDir, cfg.path);
    const m = layer.meta ?? {};
    const isFile =
      typeof m.root_is_file === "boolean"
        ? m.root_is_file
        : m.files === 1 && typeof m.root === "string" && basename(m.root) === basename(abs) && /\.agentlog$/i.test(abs);
    return pathTarget(abs, isFile, {
      include: cfg.include ?? ["*.agentlog"],
      ...(cfg.exclude ? { exclude: cfg.exclude } : {}),
    });
  },
  async capture(cfg, ctx) {
    const root = resolve(ctx.baseDir, cfg.path);
    const walked = await walkFiles(root, {
      include: cfg.include ?? ["*.agentlog"],
      ...(cfg.exclude ? { exclude: cfg.exclude } : {}),
    });
    const { files, skipped } = walked;
    const prefixes: { f: FoundFile; size: number; tail: number }[] = [];
    for (const f of files) {
      try {
        prefixes.push({ f, ...(await completePrefix(f.abs, f.stats.size)) });
      } catch (e) {
        throw sourceError(e, f.abs);
      }
    }
    const redactor = ctx.redactor;
    let spoolDir: string | null = null;
    const partial: Record<string, number> = {};
    const resealed: Record<string, { records: number; parents_rewritten: number }> = {};
    let records = 0;
    let resealedTotal = 0;
    let parentsTotal = 0;
    for (const p of prefixes) if (p.tail > 0) partial[p.f.rel] = p.tail;
    return {
      estimatedBytes: prefixes.reduce((n, p) => n + p.size, 0),
      notices: () => walkNotices(walked),
      artifacts: (async function* (): AsyncGenerator<Artifact> {
        let i = 0;
        for (const { f, size } of prefixes) {
          if (!redactor) {
            // (counted once however many times it is read)
            let counted = 0;
            yield plainArtifact(f, size, (n) => {
              records += n - counted;
              counted = n;
            });
            continue;
          }
          spoolDir ??= await mkdtemp(join(ctx.tmpDir, `trace-${cfg.name}-`));
          const spool = join(spoolDir, `${i++}.agentlog`);
          const st = await resealTrace(f, size, spool, redactor, `${cfg.name}/${f.rel}`);
          records += st.records;
          resealedTotal += st.resealed;
          parentsTotal += st.parents;
          if (st.resealed || st.parents) resealed[f.rel] = { records: st.resealed, parents_rewritten: st.parents };
          const a = fileArtifact({ abs: spool, rel: f.rel, stats: await stat(spool) }, "agentlog", f.rel);
          a.mode = f.stats.mode & 0o7777;
          a.mtime = f.stats.mtime;
          a.text = false;
          a.chunking = { mode: "append" };
          yield a;
        }
      })(),
      finish: async () => ({
        root,
        root_is_file: prefixes.length === 1 && prefixes[0]!.f.abs === root,
        files: prefixes.length,
        skipped,
        records,
        ...(redactor ? { resealed_records: resealedTotal, parents_rewritten: parentsTotal, resealed } : {}),
        ...(Object.keys(partial).length ? { partial_tail_bytes: partial } : {}),
      }),
      cleanup: async () => {
        if (spoolDir) await rm(spoolDir, { recursive: true, force: true });
      },
    };
  },
  async deepVerify({ entry, bytes }) {
    return consumeAll(bytes, async (b) => {
      try {
        await validateTrace(b);
        return null;
      } catch (e) {
        if (e instanceof TraceRecordError) return `${entry.path}: ${e.message}`;
        throw e;
      }
    });
  },
};
