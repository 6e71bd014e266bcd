/**
 * Capture: spawn `command… capture`, write one JSON capture request line on stdin, read a tar
 * stream of the layer's files on stdout. Each tar entry becomes one artifact whose declared
 * size is the tar header's size; its bytes stream from the plugin's stdout into the bundle
 * without being buffered (the pipeline pulls one artifact at a time, which is exactly when
 * tar-stream hands over the next entry). stderr is kept (its tail) for error messages.
 */
import { Readable } from "node:stream";
import type tar from "tar-stream";
import { MemsnapError } from "../../errors.js";
import { tarStream } from "../../util/tar-stream.js";
import type { Artifact, CaptureContext, LayerCapture } from "../types.js";
import type { ExecConfig } from "./config.js";
import { pluginEnv, PluginProcess, resolveCommand } from "./process.js";
import {
  DEFAULT_TIMEOUT_MS,
  entryPath,
  EXIT_WAIT_MS,
  PLUGIN_PROTOCOL,
  PLUGIN_RECORD,
  protocolError,
  timeoutError,
  type PluginCaptureRequest,
  type PluginMeta,
} from "./protocol.js";

type TarEntry = tar.ExtractEvents["entry"][1];

const KIND = /^[a-z0-9][a-z0-9_-]{0,31}$/;

/** Run the plugin's capture and turn its tar stream into the layer's artifacts. */
export async function captureLayer(cfg: ExecConfig, ctx: CaptureContext): Promise<LayerCapture> {
  const argv = resolveCommand(cfg.command, ctx.baseDir);
  const timeoutMs = cfg.timeout_ms ?? DEFAULT_TIMEOUT_MS;
  const request: PluginCaptureRequest = {
    protocol: PLUGIN_PROTOCOL,
    op: "capture",
    layer: cfg.name,
    config: cfg.config ?? {},
  };
  const extract = (await tarStream()).extract();
  const entries = extract[Symbol.asyncIterator]();
  const proc = new PluginProcess(argv, "capture", request, {
    cwd: ctx.baseDir,
    env: pluginEnv(cfg.env),
    timeoutMs,
    onTimeout: () => extract.destroy(timeoutError(argv, timeoutMs)),
    signal: ctx.signal,
  });
  const stdout = proc.child.stdout!;
  stdout.pipe(extract);
  let streamBroken = false;
  /** The error to report for a failure of the stream (`e`): timeout, crash, or protocol. */
  const classify = async (e: unknown): Promise<MemsnapError> => {
    if (!streamBroken) {
      streamBroken = true;
      stdout.unpipe(extract);
      stdout.resume(); // keep draining so a still-running plugin is not blocked on a full pipe
    }
    if (!proc.timedOut) await proc.waitExit(EXIT_WAIT_MS);
    if (proc.timedOut) return timeoutError(argv, timeoutMs);
    const st = proc.statusError();
    if (st) return st;
    await proc.kill();
    if (e instanceof MemsnapError && e.code.startsWith("MEMSNAP_PLUGIN_")) return e;
    return protocolError(argv, `malformed tar stream on stdout (${(e as Error)?.message ?? String(e)})`);
  };
  const unsafe = async (why: string): Promise<MemsnapError> => {
    streamBroken = true;
    stdout.unpipe(extract);
    stdout.resume();
    await proc.kill();
    return protocolError(argv, why);
  };
  const recordDoc = { protocol: PLUGIN_PROTOCOL, layer: cfg.name, command: cfg.command, config: cfg.config ?? {} };
  const record = Buffer.from(`${JSON.stringify(recordDoc, null, 2)}\n`);
  const stats = { entries: 0, bytes: 0, directories: 0 };
  const seen = new Set<string>();
  const startedAt = new Date();
  return {
    artifacts: (async function* (): AsyncGenerator<Artifact> {
      yield {
        path: PLUGIN_RECORD,
        kind: "json",
        size: record.length,
        mode: 0o600,
        mtime: startedAt,
        text: true,
        open: () => Readable.from([record]),
      };
      for (;;) {
        let next: IteratorResult<TarEntry>;
        try {
          next = await entries.next();
        } catch (e) {
          throw await classify(e);
        }
        if (next.done) break;
        const entry = next.value;
        const h = entry.header;
        const p = entryPath(h.name);
        if ("bad" in p) throw await unsafe(`entry ${JSON.stringify(h.name)}: ${p.bad}`);
        if (h.type === "directory") {
          stats.directories++;
          entry.resume();
          continue;
        }
        if (h.type !== "file" && h.type !== "contiguous-file") {
          const type = h.type ?? "unknown";
          throw await unsafe(`entry ${JSON.stringify(h.name)} is a ${type} entry; only regular files are allowed`);
        }
        if (p.path === "") throw await unsafe(`entry ${JSON.stringify(h.name)} has no name`);
        if (seen.has(p.path)) throw await unsafe(`entry ${JSON.stringify(p.path)} appears twice`);
        seen.add(p.path);
        const pax = (h.pax ?? {}) as Record<string, string | undefined>;
        const kind = pax["MEMSNAP.kind"] && KIND.test(pax["MEMSNAP.kind"]) ? pax["MEMSNAP.kind"] : "file";
        const size = h.size ?? 0;
        stats.entries++;
        stats.bytes += size;
        yield {
          path: p.path,
          kind,
          size,
          mode: (h.mode ?? 0o644) & 0o777,
          mtime: h.mtime ?? startedAt,
          text: pax["MEMSNAP.text"] === "1",
          open: () =>
            (async function* () {
              let n = 0;
              try {
                for await (const c of entry as AsyncIterable<Buffer>) {
                  n += (c as Buffer).length;
                  yield c as Buffer;
                }
              } catch (e) {
                throw await classify(e);
              }
              if (n !== size) throw await classify(new Error(`entry ${p.path} ended after ${n} of ${size} bytes`));
            })(),
        };
        entry.resume(); // in case the consumer left bytes behind
      }
      await proc.exited;
      if (proc.timedOut) throw timeoutError(argv, timeoutMs);
      const st = proc.statusError();
      if (st) throw st;
    })(),
    finish: async () => ({
      plugin: {
        protocol: PLUGIN_PROTOCOL,
        command: argv,
        cwd: ctx.baseDir,
        timeout_ms: timeoutMs,
      } satisfies PluginMeta,
      entries: stats.entries,
      bytes: stats.bytes,
      ...(stats.directories ? { directories_skipped: stats.directories } : {}),
    }),
    cleanup: async () => {
      if (proc.running) {
        stdout.unpipe(extract);
        stdout.destroy();
        await proc.kill();
      }
      extract.destroy();
    },
  };
}
