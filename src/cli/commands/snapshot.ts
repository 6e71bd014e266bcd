import type { Command } from "commander";
import { parseDuration } from "../../util/duration.js";
import { loadConfig, collect, errorJson, hook, type GlobalOpts, withAbort } from "../common.js";
import { loadPassphrase, loadRecipients } from "../../keys.js";
import { loadSigningKey } from "../../sign.js";
import { snapshot } from "../../snapshot/snapshot.js";
import { resolveStore } from "../../store/paths.js";
import { uncoveredLargeFiles } from "../../init/coverage.js";
import { fmtMiB } from "../../init/render.js";
import { isS3Url } from "../../objstore/location.js";
import { fmtBytes, fmtRate, printJson, Progress, redactionLine } from "../output.js";

interface SnapshotOpts {
  incremental?: boolean;
  config: string;
  out?: string;
  store?: string;
  label?: string;
  recipient: string[];
  recipientsFile: string[];
  passphraseFile?: string;
  encrypt: boolean;
  level?: string;
  redact: boolean;
  allowUnredacted?: boolean;
  allowPlaintextMemory?: boolean;
  wait?: string;
  signKey?: string;
  scheduled?: boolean;
}

export function registerSnapshot(program: Command, global: () => GlobalOpts): void {
  program
    .command("snapshot")
    .description("capture the agent's sources into one bundle")
    .option("-c, --config <file>", "memsnap.json to use", "memsnap.json")
    .option("-o, --out <file>", "write the bundle here instead of the store")
    .option(
      "--store <dir>",
      "store directory (default: $MEMSNAP_STORE, the config's store, ~/.local/share/memsnap/store)",
    )
    .option("-l, --label <text>", "a label recorded in the manifest")
    .option("-r, --recipient <age1…>", "encrypt to this age recipient (repeatable)", collect, [])
    .option("-R, --recipients-file <file>", "encrypt to the recipients in this file (repeatable)", collect, [])
    .option(
      "--passphrase-file <file>",
      "encrypt with the passphrase on the first line of this file (or set MEMSNAP_PASSPHRASE)",
    )
    .option("--no-encrypt", "write a plaintext bundle even if the config names recipients")
    .option("--level <n>", "zstd level 1-19 (default: the config's, else 3)")
    .option("--no-redact", "do not redact secrets in text artifacts (default: the config's redaction.enabled, else on)")
    .option(
      "--sign-key <file>",
      "sign the manifest with this Ed25519 key (memsnap keygen --sign; default: the config's sign_key)",
    )
    .option(
      "--scheduled",
      "record the snapshot as made by a schedule (created_by schedule), " +
        "for cron lines: `prune --scheduled-only` decides over it",
    )
    .option("--wait <duration>", "wait this long for the agent's lock (e.g. 30s) instead of failing at once")
    .option(
      "--allow-unredacted",
      "write a plaintext bundle even if secrets were found in content that cannot be redacted",
    )
    .option(
      "--allow-plaintext-memory",
      "write a plaintext bundle even with a criu layer (process memory cannot be redacted)",
    )
    .option(
      "--incremental",
      "reference the artifacts unchanged since the last --incremental snapshot (in the store) " +
        "instead of storing them again",
    )
    .addHelpText(
      "after",
      `
Examples:
  $ memsnap snapshot --config agent/memsnap.json
  $ memsnap snapshot -c memsnap.json -r age1... --label nightly
  $ memsnap snapshot -c memsnap.json --out /backups/agent.memsnap --json
  $ memsnap snapshot -c memsnap.json --incremental     # unchanged files and KV pages: references to earlier bundles`,
    )
    .action(async (o: SnapshotOpts) => {
      const g = global();
      const config = await loadConfig(o.config);
      let recipients: string[] = [];
      let passphrase: string | undefined;
      if (o.encrypt) {
        passphrase = await loadPassphrase(o.passphraseFile);
        recipients = await loadRecipients(
          [...config.recipients, ...o.recipient],
          [...(config.recipientsFile ? [config.recipientsFile] : []), ...o.recipientsFile],
        );
        if (passphrase && (o.recipient.length || o.recipientsFile.length)) {
          const { MemsnapError } = await import("../../index.js");
          throw new MemsnapError("MEMSNAP_USAGE", "use recipients or a passphrase, not both", {
            hint: "drop --recipient/--recipients-file or --passphrase-file",
          });
        }
        if (passphrase) recipients = [];
      }
      const level = o.level === undefined ? undefined : Number(o.level);
      if (level !== undefined && (!Number.isInteger(level) || level < 1 || level > 19)) {
        const { MemsnapError } = await import("../../index.js");
        throw new MemsnapError("MEMSNAP_USAGE", `--level must be an integer from 1 to 19, got ${o.level}`);
      }
      const signKeyFile = o.signKey ?? config.signKey;
      const signKey = signKeyFile ? await loadSigningKey(signKeyFile) : undefined;
      const createdBy = o.scheduled ? "schedule" : "cli";
      const progress = new Progress("snapshot", !g.json && process.stderr.isTTY === true);
      let r;
      try {
        r = await withAbort((signal) =>
          snapshot({
            config,
            ...(o.out ? { out: o.out } : { store: resolveStore(o.store, config.store) }),
            recipients,
            ...(passphrase ? { passphrase } : {}),
            ...(level !== undefined ? { level } : {}),
            label: o.label ?? null,
            createdBy,
            ...(o.redact === false ? { redact: false } : {}),
            ...(o.allowUnredacted ? { allowUnredacted: true } : {}),
            ...(o.allowPlaintextMemory ? { allowPlaintextMemory: true } : {}),
            ...(o.wait ? { lock: { waitMs: parseDuration(o.wait) } } : {}),
            ...(signKey ? { signKey } : {}),
            ...(o.incremental ? { incremental: true } : {}),
            signal,
            onProgress: (p) => progress.update(p.bytes, p.totalBytes),
          }),
        );
      } catch (e) {
        progress.done();
        await hook(
          config.hooks,
          "on_failed",
          { tenant: config.tenant, agent: config.agent, command: "snapshot", error: errorJson(e) },
          config.baseDir,
        );
        throw e;
      }
      progress.done();
      await hook(
        config.hooks,
        "on_created",
        {
          snapshot_id: r.id,
          path: r.path,
          tenant: config.tenant,
          agent: config.agent,
          label: r.manifest.label,
          created_by: createdBy,
          bytes: r.inputBytes,
          bundle_bytes: r.bundleBytes,
          encrypted: r.manifest.payload.encryption !== null,
        },
        config.baseDir,
      );
      // Large files in the agent's home that no source takes (init would have; a hand-written or old config may not).
      const uncovered = config.file
        ? await uncoveredLargeFiles(
            config.baseDir,
            config.sources.map((s) => ({ ...s.cfg, kind: s.impl.kind })),
            [...(o.out ? [] : [resolveStore(o.store, config.store)].filter((s) => !isS3Url(s)))],
          ).catch(() => [])
        : [];
      if (uncovered.length) {
        const total = fmtMiB(uncovered.reduce((a, u) => a + u.bytes, 0));
        const some = uncovered
          .slice(0, 5)
          .map((u) => `${u.path} (${fmtMiB(u.bytes)})`)
          .join(", ");
        process.stderr.write(
          `memsnap: warning: ${uncovered.length} large file(s) in ${config.baseDir} (${total}) ` +
            `are in no source, so not in this snapshot: ${some}${uncovered.length > 5 ? ", …" : ""}; ` +
            "add a files source for them (memsnap init --print proposes one)\n",
        );
      }
      const m = r.manifest;
      const partial = partialTails(m.layers);
      for (const n of r.notices) process.stderr.write(`memsnap: warning: ${n.layer}: ${n.message}\n`);
      if (g.json) {
        printJson({
          // snapshot_id as in schedule events and hook metadata; id is kept for compatibility.
          ok: true,
          snapshot_id: r.id,
          id: r.id,
          path: r.path,
          input_bytes: r.inputBytes,
          bundle_bytes: r.bundleBytes,
          artifacts: m.payload.artifacts,
          layers: m.layers.map((l) => ({ name: l.name, kind: l.kind, artifacts: l.artifacts, bytes: l.bytes })),
          encrypted: m.payload.encryption !== null,
          signed: m.signature !== undefined,
          duration_ms: Math.round(r.durationMs),
          mb_per_s: Number((r.inputBytes / 1e6 / (r.durationMs / 1000)).toFixed(1)),
          redaction: redactionStats(m.redaction, r.redactionMs),
          ...(r.incremental
            ? {
                incremental: {
                  referenced: r.incremental.referenced,
                  referenced_bytes: r.incremental.referencedBytes,
                  bases: r.incremental.bases,
                  reason: r.incremental.reason,
                  ...(r.incremental.cacheError ? { cache_error: r.incremental.cacheError } : {}),
                },
              }
            : {}),
          ...(partial.size ? { partial_tail_bytes: Object.fromEntries(partial) } : {}),
          ...(r.notices.length ? { warnings: r.notices } : {}),
          ...(uncovered.length ? { uncovered } : {}),
        });
        return;
      }
      const rcpts = m.payload.encryption?.recipients;
      const enc = !rcpts
        ? "not encrypted"
        : `age, ${rcpts.length === 1 && rcpts[0]!.type === "scrypt" ? "passphrase" : `${rcpts.length} recipient(s)`}`;
      const artifacts = m.payload.artifacts;
      const layerCount = `${m.layers.length} layer(s)`;
      const inc = r.incremental;
      const partialBytes = fmtBytes([...partial.values()].reduce((a, b) => a + b, 0));
      const partialSome = [...partial.keys()].slice(0, 3).join(", ");
      process.stdout.write(
        `snapshot ${r.id}\n` +
          `  path     ${r.path}\n` +
          // With references, the bytes read are those of the artifacts packed, not of all of them.
          (r.incremental?.referenced
            ? `  input    ${fmtBytes(r.inputBytes)} read, in ${artifacts - r.incremental.referenced} of ${artifacts} ` +
              `artifacts (the rest referenced), ${layerCount}\n`
            : `  input    ${fmtBytes(r.inputBytes)} in ${artifacts} artifacts, ${layerCount}\n`) +
          `  bundle   ${fmtBytes(r.bundleBytes)} (zstd ${m.payload.compression.level}, ${enc})\n` +
          `  time     ${(r.durationMs / 1000).toFixed(2)} s (${fmtRate(r.inputBytes, r.durationMs)})\n` +
          (inc
            ? `  refs     ${
                inc.referenced
                  ? `${inc.referenced} unchanged artifact(s), ${fmtBytes(inc.referencedBytes)}, ` +
                    `referenced in ${inc.bases.join(", ")}`
                  : `none: ${inc.reason ?? "nothing was unchanged"} ` +
                    `(a full snapshot${isS3Url(r.path) ? "" : "; the next --incremental one builds on it"})`
              }\n`
            : "") +
          // What redaction found, when it found anything (inspect shows it for any bundle).
          (m.redaction.policy !== "off" &&
          (Number(m.redaction.total_redacted) > 0 || Number(m.redaction.total_unredacted) > 0)
            ? `  secrets  ${redactionLine(m.redaction)}\n`
            : "") +
          (partial.size
            ? `  partial  ${partial.size} last line(s) still being written left out (${partialBytes}): ` +
              `${partialSome}${partial.size > 3 ? ", …" : ""}\n`
            : ""),
      );
      if (r.incremental?.cacheError) {
        process.stderr.write(
          `memsnap: warning: the incremental cache was not written (${r.incremental.cacheError}); ` +
            "the next --incremental snapshot builds on an earlier one\n",
        );
      }
    });
}

/**
 * The unterminated last lines an append-only capture left out (trace layers, `files` with `append`),
 * by payload path.
 */
function partialTails(layers: readonly { name: string; meta?: Record<string, unknown> }[]): Map<string, number> {
  const out = new Map<string, number>();
  for (const l of layers) {
    const p = l.meta?.partial_tail_bytes;
    if (p === null || typeof p !== "object") continue;
    for (const [path, n] of Object.entries(p)) if (typeof n === "number") out.set(`${l.name}/${path}`, n);
  }
  return out;
}

function redactionStats(rep: Record<string, unknown>, ms: number): Record<string, unknown> {
  if (rep.policy === "off") return { policy: "off" };
  const scanned = typeof rep.bytes_scanned === "number" ? rep.bytes_scanned : 0;
  return {
    policy: rep.policy,
    total_redacted: rep.total_redacted,
    total_unredacted: rep.total_unredacted,
    bytes_scanned: scanned,
    // Wall time of the redaction calls; they overlap packing, so this is not a throughput figure.
    wall_ms: Math.round(ms),
  };
}
