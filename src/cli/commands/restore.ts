import type { Command } from "commander";
import { existsSync } from "node:fs";
import { parseDuration } from "../../util/duration.js";
import {
  loadConfig,
  bundleArg,
  collect,
  defaultStore,
  errorJson,
  hook,
  type GlobalOpts,
  withAbort,
} from "../common.js";
import { MemsnapError } from "../../errors.js";
import type { Manifest } from "../../format/manifest.js";
import { runHook } from "../../hooks.js";
import { loadIdentities, loadPassphrase } from "../../keys.js";
import { scryptMaxLogN } from "../../codecs/age/scrypt.js";
import { listSome, summarizeRedaction, type RedactedSummary } from "../../redact/report.js";
import { recoverAgent, restoreInPlace } from "../../restore/in-place.js";
import type { RestorePlan } from "../../restore/plan.js";
import { restoreToDir, type RestoreToDirOptions } from "../../restore/to-dir.js";
import { loadTrusted } from "../../sign.js";
import { resolveStore } from "../../store/paths.js";
import { describeProcess, type LiveProcess } from "../../agent/live-procs.js";
import { fmtBytes, fmtRate, printJson, Progress } from "../output.js";

interface RestoreOpts {
  to?: string;
  config: string;
  identity: string[];
  passphraseFile?: string;
  only: string[];
  asAgent?: boolean;
  safetySnapshot: boolean;
  store?: string;
  wait?: string;
  dryRun?: boolean;
  requireSignature?: boolean;
  trust: string[];
  scryptMaxLogN?: string;
  ignoreOpenFiles?: boolean;
  path: string[];
  layout?: string;
}

/**
 * A redacted bundle restores placeholders, not the secrets it held: say so (an agent whose API
 * key in memory comes back as `[REDACTED:…]` fails in ways far from the restore).
 */
function redactedNote(r: RedactedSummary, safety: { id: string } | null): string {
  const what = `${r.total} value${r.total === 1 ? "" : "s"} in ${listSome(r.artifacts)}`;
  return (
    `${what} ${r.total === 1 ? "was" : "were"} redacted when this snapshot was taken: ` +
    "the restored files hold [REDACTED:<rule>] placeholders, not the secrets" +
    (safety ? ` (the safety snapshot ${safety.id} keeps the live values)` : "")
  );
}

/** The redactions in the layers a restore writes. */
function redactedIn(m: Manifest, layers: readonly string[]): RedactedSummary {
  return summarizeRedaction(m.redaction, new Set(layers));
}

const redactedJson = (r: RedactedSummary): { total: number; artifacts: string[]; rules: string[] } => ({
  total: r.total,
  artifacts: r.artifacts,
  rules: r.rules,
});

function printPlan(plan: RestorePlan, redacted: RedactedSummary, procs: readonly LiveProcess[]): void {
  const out: string[] = [`plan for restoring ${plan.snapshot_id} in place (nothing was changed):`];
  for (const l of plan.layers) {
    out.push(`  ${l.layer} (${l.kind}) → ${l.target}  ${fmtBytes(l.bytes)}`);
    if (plan.file_level && l.mode === "files") {
      out.push(
        `    ${l.added.length} added, ${l.changed.length} changed, ` +
          `${l.removed.length} removed, ${l.unchanged} unchanged`,
      );
      for (const f of l.added.slice(0, 20)) out.push(`    + ${f}`);
      for (const f of l.changed.slice(0, 20)) out.push(`    ~ ${f}`);
      for (const f of l.removed.slice(0, 20)) out.push(`    - ${f}`);
    }
    for (const n of l.notes) out.push(`    ${n}`);
  }
  if (!plan.file_level) out.push("  (file-level changes need the key: pass --identity)");
  if (redacted.total) out.push(`  note: ${redactedNote(redacted, null)}`);
  if (procs.length) {
    const one = procs.length === 1;
    out.push(
      `  ${procs.length} process${one ? " uses" : "es use"} live files this restore would replace ` +
        `(it would refuse; stop ${one ? "it" : "them"}, or pass --ignore-open-files):`,
    );
    for (const p of procs) out.push(`    ${describeProcess(p)}`);
  }
  process.stdout.write(out.join("\n") + "\n");
}

export function registerRestore(program: Command, global: () => GlobalOpts): void {
  program
    .command("restore <bundle>")
    .description(
      "restore a bundle in place over the live agent (journaled, locked, safety snapshot first), " +
        "or into a new directory with --to",
    )
    .option("--to <dir>", "restore into this new or empty directory instead of the live agent")
    .option("-c, --config <file>", "the agent's memsnap.json (in-place restore)", "memsnap.json")
    .option("-i, --identity <file>", "age identity file (repeatable)", collect, [])
    .option("--passphrase-file <file>", "passphrase on the first line of this file (or set MEMSNAP_PASSPHRASE)")
    .option("--only <layer>", "restore only this layer (repeatable)", collect, [])
    .option(
      "--path <glob>",
      "restore only the files this path or glob selects, as 'memsnap ls' shows them: <layer>/<path> (repeatable)",
      collect,
      [],
    )
    .option(
      "--layout <config|layers>",
      "with --to: put each layer where the config's source path puts it " +
        "(config; the default when -c is given or ./memsnap.json exists), or under its layer name (layers)",
    )
    .option("--as-agent", "restore a bundle of another tenant/agent into this config's agent")
    .option("--no-safety-snapshot", "skip the automatic snapshot of the live state taken before restoring")
    .option(
      "--store <dir>",
      "store for the safety snapshot (default: $MEMSNAP_STORE, the config's store, ~/.local/share/memsnap/store)",
    )
    .option("--wait <duration>", "wait this long for the agent's lock (e.g. 30s, 2m) instead of failing at once")
    .option("--dry-run", "print what would change and touch nothing")
    .option("--require-signature", "refuse unsigned bundles and bundles not signed by a --trust key")
    .option(
      "--trust <pubkey|file>",
      "require a valid signature by this public key, as verify --trust does " +
        "(memsnap-ed25519:… or a file of them; repeatable)",
      collect,
      [],
    )
    .option(
      "--scrypt-max-log-n <n>",
      "open a passphrase bundle whose scrypt work factor is up to 2^n " +
        "(default 18, or $MEMSNAP_SCRYPT_MAX_LOG_N; at most 20)",
    )
    .option(
      "--ignore-open-files",
      "restore in place even while other processes hold live files open or work inside a live directory " +
        "(their later writes are lost)",
    )
    .addHelpText(
      "after",
      `
BUNDLE is a path, or a snapshot id (or unique prefix of one) from \`memsnap list\`, looked up in
the store (--store, else the config's; in place, only the config's agent's snapshots unless --as-agent).

Examples:
  $ memsnap restore 01J….memsnap -c agent/memsnap.json -i key.txt --dry-run
  $ memsnap restore 01JD0K7Q -c agent/memsnap.json -i key.txt
  $ memsnap restore 01J….memsnap -c agent/memsnap.json -i key.txt --only memory
  $ memsnap restore 01J….memsnap --to ./restored -i key.txt
  $ memsnap restore 01J….memsnap --to ./restored -i key.txt --only kv
  $ memsnap restore 01JD0K7Q -c agent/memsnap.json -i key.txt --path memory/notes/note3.md
  $ memsnap restore 01JD0K7Q --to ./restored --path 'memory/**/*.md' --layout layers

--path selects files by their payload path (<layer>/<path>): an exact path, a directory prefix,
or a glob (a pattern without / matches a name at any depth). Files, state and trace layers
restore file by file: in place, only the selected files are replaced and nothing else in the
layer is written or removed (even where the patterns select every file: --only LAYER restores a
layer whole, removing the files the snapshot lacks). A git, sqlite or kv layer is rebuilt from all of its artifacts:
select it whole (--path <layer>/) or not at all. Every artifact's hash is still checked. For
an encrypted bundle (or one whose manifest does not list its files) the selection needs the
index at the end of the payload: the payload is read once for it, then again to restore.

With --to, each layer goes where the config (-c, else ./memsnap.json) puts it, relative to DIR:
a SQLite layer of db/memory.db comes back as DIR/db/memory.db. Source paths must be inside the
config's directory. Layers whose places overlap (a git directory holding another layer's
files, two layers with one file) are refused with --layout config, and restored under their
layer names (with a note) when the layout was not asked for. Without a config, or with
--layout layers, each layer goes to DIR/<layer>/.`,
    )
    .action(async (ref: string, o: RestoreOpts, cmd: Command) => {
      const g = global();
      const identities = await loadIdentities(o.identity);
      const passphrase = await loadPassphrase(o.passphraseFile);
      const keys = {
        identities,
        passphrases: passphrase ? [passphrase] : [],
        ...(o.scryptMaxLogN !== undefined ? { scryptMaxLogN: scryptMaxLogN(o.scryptMaxLogN) } : {}),
      };
      const sigPolicy = { requireSignature: !!o.requireSignature, trusted: await loadTrusted(o.trust) };
      const progress = new Progress("restore", !g.json && process.stderr.isTTY === true);
      if (o.to) {
        // A dry run is the in-place restore's plan of what would change in the live agent; a
        // --to restore changes nothing live, and writing a directory on --dry-run would surprise.
        if (o.dryRun) {
          throw new MemsnapError(
            "MEMSNAP_USAGE",
            "--dry-run plans an in-place restore; with --to nothing live changes",
            {
              hint:
                "drop --dry-run (the directory appears only once every hash is checked), " +
                "or run 'memsnap verify' to check the bundle without writing",
            },
          );
        }
        if (o.layout !== undefined && o.layout !== "config" && o.layout !== "layers") {
          throw new MemsnapError("MEMSNAP_USAGE", `--layout ${o.layout}: expected config or layers`, {
            hint: "--layout config (the config's paths) or --layout layers (layer names)",
          });
        }
        const explicitConfig = cmd.getOptionValueSource("config") !== "default";
        let layout: RestoreToDirOptions["layout"] = { kind: "layers" };
        // Without a config (no -c, no ./memsnap.json) the layers go under their names, as the
        // "layer → place" lines and --json's layout say.
        if (o.layout !== "layers" && (explicitConfig || o.layout === "config" || existsSync(o.config))) {
          layout = { kind: "config", config: await loadConfig(o.config), fallback: o.layout !== "config" };
        }
        const bundle = await bundleArg(ref, () => defaultStore(o.store));
        const r = await withAbort((signal) =>
          restoreToDir(bundle, o.to!, {
            ...sigPolicy,
            keys,
            signal,
            only: o.only,
            onProgress: (b, t) => progress.update(b, t),
            ...(o.path.length ? { paths: o.path } : {}),
            layout,
          }),
        );
        progress.done();
        const redacted = redactedIn(
          r.manifest,
          r.placed.map((p) => p.layer),
        );
        if (g.json) {
          printJson({
            ok: true,
            path: r.path,
            snapshot_id: r.manifest.snapshot_id,
            artifacts: r.artifacts,
            bytes: r.bytes,
            duration_ms: Math.round(r.durationMs),
            layout: r.layout,
            layers: r.placed,
            redacted: redactedJson(redacted),
            notes: r.notes,
          });
        } else {
          process.stdout.write(`restored ${r.manifest.snapshot_id} into ${r.path}\n`);
          for (const p of r.placed) process.stdout.write(`  ${p.layer} → ${p.path === "." ? "./" : `${p.path}/`}\n`);
          const secs = (r.durationMs / 1000).toFixed(2);
          process.stdout.write(
            `  ${r.artifacts} artifacts, ${fmtBytes(r.bytes)}, every hash checked, ` +
              `in ${secs} s (${fmtRate(r.bytes, r.durationMs)})\n`,
          );
          for (const n of r.notes) process.stderr.write(`memsnap: note: ${n}\n`);
          if (redacted.total) process.stderr.write(`memsnap: note: ${redactedNote(redacted, null)}\n`);
        }
        return;
      }
      if (o.layout !== undefined) {
        throw new MemsnapError(
          "MEMSNAP_USAGE",
          "--layout applies to a restore --to DIR; in place, each layer goes where the config puts it",
          { hint: "drop --layout, or pass --to DIR" },
        );
      }
      const config = await loadConfig(o.config);
      const bundle = await bundleArg(
        ref,
        async () => resolveStore(o.store, config.store),
        o.asAgent ? {} : { tenant: config.tenant, agent: config.agent },
      );
      let r;
      try {
        r = await withAbort((signal) =>
          restoreInPlace(bundle, config, {
            ...sigPolicy,
            keys,
            only: o.only,
            ...(o.path.length ? { paths: o.path } : {}),
            asAgent: !!o.asAgent,
            safetySnapshot: o.safetySnapshot,
            store: resolveStore(o.store, config.store),
            ...(o.wait ? { waitMs: parseDuration(o.wait) } : {}),
            dryRun: !!o.dryRun,
            signal,
            ignoreOpenFiles: !!o.ignoreOpenFiles,
            onProgress: (b, t) => progress.update(b, t),
            beforeRestore: async (layers) => {
              const h = await runHook(
                config.hooks,
                "before_restore",
                { bundle, tenant: config.tenant, agent: config.agent, layers },
                config.baseDir,
              );
              if (h && !h.ok) {
                throw new MemsnapError(
                  "MEMSNAP_HOOK_REFUSED",
                  `the before_restore hook (${h.command.join(" ")}) failed: ${h.error}; nothing was restored`,
                  {
                    hint:
                      "the agent may not have been stopped: fix the hook, " +
                      "or take it out of memsnap.json's hooks to restore without it",
                  },
                );
              }
            },
          }),
        );
      } catch (e) {
        progress.done();
        if (!o.dryRun)
          await hook(
            config.hooks,
            "on_failed",
            { tenant: config.tenant, agent: config.agent, command: "restore", bundle, error: errorJson(e) },
            config.baseDir,
          );
        throw e;
      }
      progress.done();
      if (!o.dryRun) {
        await hook(
          config.hooks,
          "on_restored",
          {
            snapshot_id: r.manifest.snapshot_id,
            bundle,
            tenant: config.tenant,
            agent: config.agent,
            layers: r.layers,
            safety_snapshot_id: r.safetySnapshot?.id ?? null,
          },
          config.baseDir,
        );
      }
      const redacted = redactedIn(r.manifest, r.plan ? r.plan.layers.map((l) => l.layer) : r.layers);
      if (g.json) {
        printJson({
          ok: true,
          snapshot_id: r.manifest.snapshot_id,
          dry_run: !!o.dryRun,
          layers: r.layers,
          swaps: r.swaps,
          bytes: r.bytes,
          safety_snapshot: r.safetySnapshot
            ? {
                id: r.safetySnapshot.id,
                snapshot_id: r.safetySnapshot.id,
                path: r.safetySnapshot.path,
                encrypted: r.safetySnapshot.manifest.payload.encryption !== null,
              }
            : null,
          recovered: r.recovered,
          plan: r.plan ?? null,
          duration_ms: Math.round(r.durationMs),
          redacted: redactedJson(redacted),
          ...(r.processes ? { processes: r.processes } : {}),
          notes: r.notes,
          kept: r.kept,
        });
        return;
      }
      if (r.plan) {
        printPlan(r.plan, redacted, r.processes ?? []);
        return;
      }
      if (r.recovered) process.stdout.write(`finished an interrupted restore first (${r.recovered})\n`);
      if (r.safetySnapshot) {
        const enc = r.safetySnapshot.manifest.payload.encryption;
        const how =
          enc === null
            ? "not encrypted"
            : enc.recipients.some((x) => x.type === "scrypt")
              ? "encrypted with the bundle's passphrase"
              : `encrypted to ${enc.recipients.length} recipient(s)`;
        process.stdout.write(`safety snapshot ${r.safetySnapshot.id} → ${r.safetySnapshot.path} (${how})\n`);
      }
      const secs = (r.durationMs / 1000).toFixed(2);
      process.stdout.write(
        `restored ${r.manifest.snapshot_id} in place: ${r.layers.join(", ")} ` +
          `(${r.swaps} swaps, ${fmtBytes(r.bytes)}, every hash checked) in ${secs} s\n`,
      );
      if (redacted.total)
        process.stderr.write(`memsnap: warning: ${redactedNote(redacted, r.safetySnapshot ?? null)}\n`);
      for (const n of r.notes) process.stderr.write(`memsnap: note: ${n}\n`);
      for (const k of r.kept) {
        process.stderr.write(
          `memsnap: note: kept the live ${k}: a restore never writes the config it runs with ` +
            "(the bundle's copy was left out)\n",
        );
      }
      if (r.safetySnapshot && r.safetySnapshot.manifest.payload.encryption === null) {
        process.stderr.write(
          `memsnap: warning: the safety snapshot ${r.safetySnapshot.id} is not encrypted and not redacted: ` +
            "it keeps the live files as they were, " +
            `secrets included (name recipients in ${config.file ?? "the config"} to encrypt it)\n`,
        );
      }
    });

  program
    .command("recover")
    .description("finish or roll back an interrupted in-place restore")
    .option("-c, --config <file>", "the agent's memsnap.json", "memsnap.json")
    .option("--wait <duration>", "wait this long for the agent's lock")
    .action(async (o: { config: string; wait?: string }) => {
      const config = await loadConfig(o.config);
      const r = await recoverAgent(config, o.wait ? { waitMs: parseDuration(o.wait) } : {});
      if (global().json) printJson({ ok: true, action: r.action, snapshot_id: r.snapshotId });
      else
        process.stdout.write(
          r.action === "none"
            ? "nothing to recover\n"
            : `${r.action === "completed" ? "finished" : "rolled back"} the interrupted restore of ${r.snapshotId}\n`,
        );
    });
}
