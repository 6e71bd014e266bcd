import type { Command } from "commander";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { parseDuration } from "../../util/duration.js";
import { loadConfig, collect, type GlobalOpts, withAbort } from "../common.js";
import type { MemsnapConfig } from "../../config.js";
import { MemsnapError } from "../../errors.js";
import { basesOf } from "../../format/manifest.js";
import { loadIdentities, loadPassphrase } from "../../keys.js";
import { diffSnapshots, pruneStore, type LayerDiff } from "../../store/ops.js";
import { resolveStore } from "../../store/paths.js";
import type { RetentionPolicy } from "../../store/prune.js";
import { deleteSnapshots, exportSnapshot, findSnapshot, listSnapshots } from "../../store/store.js";
import { fmtBytes, printJson } from "../output.js";
import { copySnapshots } from "../../store/copy.js";

interface StoreOpts {
  store?: string;
  config?: string;
  tenant?: string;
  agent?: string;
}

async function context(
  o: StoreOpts,
): Promise<{ store: string; filter: { tenant?: string; agent?: string }; config: MemsnapConfig | null }> {
  const cfgPath = o.config ?? (existsSync("memsnap.json") ? "memsnap.json" : undefined);
  const config = cfgPath ? await loadConfig(cfgPath) : null;
  const tenant = o.tenant ?? config?.tenant;
  const agent = o.agent ?? config?.agent;
  return {
    store: resolveStore(o.store, config?.store),
    filter: { ...(tenant ? { tenant } : {}), ...(agent ? { agent } : {}) },
    config,
  };
}

function storeOptions(c: Command): Command {
  return c
    .option(
      "--store <dir>",
      "store directory (default: $MEMSNAP_STORE, the config's store, ~/.local/share/memsnap/store)",
    )
    .option(
      "-c, --config <file>",
      "take the store, tenant and agent from this memsnap.json (default: ./memsnap.json if present)",
    )
    .option("--tenant <id>", "only this tenant")
    .option("--agent <id>", "only this agent");
}

/** Parse the prune options into a policy. */
export function policyFrom(o: Record<string, string | string[] | undefined>): RetentionPolicy {
  const n = (k: string): number | undefined => {
    const v = o[k];
    if (v === undefined) return undefined;
    const x = Number(v);
    if (!Number.isInteger(x) || x < 0)
      throw new Error(`--${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)} must be a non-negative integer`);
    return x;
  };
  const p: RetentionPolicy = {};
  for (const [k, key] of [
    ["keepLast", "last"],
    ["keepHourly", "hourly"],
    ["keepDaily", "daily"],
    ["keepWeekly", "weekly"],
    ["keepMonthly", "monthly"],
    ["keepYearly", "yearly"],
  ] as const) {
    const v = n(k);
    if (v !== undefined) p[key] = v;
  }
  if (typeof o.keepWithin === "string") p.within = parseDuration(o.keepWithin);
  if (Array.isArray(o.keepLabel) && o.keepLabel.length) p.labels = o.keepLabel;
  if (Array.isArray(o.pruneLabel) && o.pruneLabel.length) p.pruneLabels = o.pruneLabel;
  if (typeof o.keepSafety === "string") p.safetyMs = parseDuration(o.keepSafety);
  return p;
}

export function addRetentionOptions(c: Command): Command {
  return c
    .option("--keep-last <n>", "keep the n newest")
    .option("--keep-hourly <n>", "keep the newest of each of the last n hours that have one")
    .option("--keep-daily <n>", "… days")
    .option("--keep-weekly <n>", "… ISO weeks")
    .option("--keep-monthly <n>", "… months")
    .option("--keep-yearly <n>", "… years")
    .option("--keep-within <duration>", "keep everything within this long of the newest (e.g. 48h)")
    .option("--keep-label <glob>", "keep snapshots whose label matches (repeatable)", collect, [])
    .option(
      "--prune-label <glob>",
      "let the keep rules decide over snapshots with a matching label " +
        "(repeatable; without it a labelled snapshot is always kept)",
      collect,
      [],
    )
    .option(
      "--keep-safety <duration>",
      "keep safety snapshots (auto:pre-restore-…, the undo of a restore) this long " +
        "(default 7d; 0 to let the rules decide)",
    );
}

export function registerStore(program: Command, global: () => GlobalOpts): void {
  storeOptions(program.command("list").description("list the snapshots in the store"))
    .addHelpText(
      "after",
      `
Examples:
  $ memsnap list -c agent/memsnap.json
  $ memsnap list --store /backups --json`,
    )
    .action(async (o: StoreOpts) => {
      const { store, filter } = await context(o);
      const bad: string[] = [];
      const snaps = await listSnapshots(store, filter, (p) => bad.push(p));
      if (global().json) {
        printJson({
          ok: true,
          store,
          snapshots: snaps.map((s) => ({
            id: s.id,
            snapshot_id: s.id,
            tenant: s.tenant,
            agent: s.agent,
            created_at: s.created_at,
            label: s.label,
            created_by: s.created_by,
            size: s.size,
            encrypted: s.encrypted,
            signed: s.signed,
            path: s.path,
            bases: basesOf(s.manifest).map((b) => b.snapshot_id),
          })),
          unreadable: bad,
        });
        return;
      }
      if (!snaps.length) process.stdout.write(`no snapshots in ${store}\n`);
      else {
        // BASES: how many earlier bundles an incremental snapshot needs beside it ("-" for a full one).
        const rows = snaps.map((s) => [
          s.id,
          `${s.tenant}/${s.agent}`,
          s.created_at.replace(/\.\d+Z$/, "Z"),
          s.created_by,
          fmtBytes(s.size),
          s.encrypted ? "yes" : "no",
          s.signed ? "yes" : "no",
          basesOf(s.manifest).length ? String(basesOf(s.manifest).length) : "-",
          oneLine(s.label ?? ""),
        ]);
        const head = ["ID", "AGENT", "CREATED", "BY", "SIZE", "ENC", "SIGNED", "BASES", "LABEL"];
        const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
        for (const r of [head, ...rows])
          process.stdout.write(
            r
              .map((c, i) => c.padEnd(w[i]!))
              .join("  ")
              .trimEnd() + "\n",
          );
      }
      for (const p of bad) process.stderr.write(`memsnap: warning: unreadable bundle ${p}\n`);
    });

  storeOptions(program.command("diff <a> <b>").description("what changed between two snapshots, per layer"))
    .option("-i, --identity <file>", "age identity, for encrypted snapshots (repeatable)", collect, [])
    .option("--passphrase-file <file>", "passphrase file")
    .addHelpText(
      "after",
      `
Examples:
  $ memsnap diff 01JD0A 01JD0B                 # ids or unique id prefixes
  $ memsnap diff a.memsnap b.memsnap -i key.txt --json`,
    )
    .action(async (a: string, b: string, o: StoreOpts & { identity: string[]; passphraseFile?: string }) => {
      const { store, filter } = await context(o);
      const [sa, sb] = [await findSnapshot(store, a, filter), await findSnapshot(store, b, filter)];
      const passphrase = await loadPassphrase(o.passphraseFile);
      const diff = await diffSnapshots(sa, sb, {
        identities: await loadIdentities(o.identity),
        passphrases: passphrase ? [passphrase] : [],
      });
      if (global().json) {
        printJson({ ok: true, a: sa.id, b: sb.id, layers: diff });
        return;
      }
      process.stdout.write(diffText(sa.id, sb.id, diff));
    });

  storeOptions(
    program.command("export <id>").description("copy a snapshot out of the store (an incremental one with its bases)"),
  )
    .requiredOption("--to <path>", "destination file (must not exist)")
    .action(async (id: string, o: StoreOpts & { to: string }) => {
      const { store, filter } = await context(o);
      const s = await findSnapshot(store, id, filter);
      // An incremental snapshot is restorable only with its bases beside it: they are copied
      // next to the destination under their own names (one already there must be the same bundle).
      const bases: { id: string; path: string; copied: boolean }[] = [];
      for (const b of basesOf(s.manifest)) {
        const to = join(dirname(o.to), `${b.snapshot_id}.memsnap`);
        if (existsSync(to)) {
          const there = await findSnapshot(store, to);
          if (there.manifest.seal !== b.seal) {
            throw new MemsnapError(
              "MEMSNAP_DEST_EXISTS",
              `${to} exists and is not the base ${b.snapshot_id} that ${s.id} references`,
              {
                path: to,
                hint: "export into another directory",
              },
            );
          }
          bases.push({ id: b.snapshot_id, path: to, copied: false });
          continue;
        }
        bases.push({ id: b.snapshot_id, path: to, copied: true });
      }
      await exportSnapshot(s, o.to);
      for (const b of bases) if (b.copied) await exportSnapshot(await findSnapshot(store, b.id, filter), b.path);
      if (global().json)
        printJson({
          ok: true,
          id: s.id,
          snapshot_id: s.id,
          path: o.to,
          size: s.size,
          bases: bases.map((b) => ({ id: b.id, snapshot_id: b.id, path: b.path })),
        });
      else {
        process.stdout.write(`exported ${s.id} to ${o.to} (${fmtBytes(s.size)})\n`);
        for (const b of bases)
          process.stdout.write(`  base ${b.id} ${b.copied ? "copied to" : "already at"} ${b.path}\n`);
      }
    });

  program
    .command("copy <from> <to> [ids...]")
    .description(
      "copy snapshots between stores (a directory or s3://bucket/prefix), checking hashes; skips those already there",
    )
    .option("--tenant <id>", "only this tenant")
    .option("--agent <id>", "only this agent")
    .addHelpText(
      "after",
      `
Every snapshot of FROM (or the IDS given, with the bases an incremental one needs) is copied to
the same <tenant>/<agent>/<id>.memsnap in TO, streamed, its payload SHA-256 and seal checked on
the way; the copy appears only once complete. A snapshot already in TO with the same seal is
skipped; one with another seal is refused. Bases are copied before what references them.

Examples:
  $ memsnap copy ~/.local/share/memsnap/store s3://backups/memsnap      # ship local snapshots off the host
  $ memsnap copy s3://backups/memsnap /srv/restore-store 01JD0K7Q --agent scribe`,
    )
    .action(async (from: string, to: string, ids: string[], o: { tenant?: string; agent?: string }) => {
      const src = resolveStore(from, undefined);
      const dst = resolveStore(to, undefined);
      if (src === dst)
        throw new MemsnapError("MEMSNAP_USAGE", "FROM and TO are the same store", {
          hint: "copy between two different stores",
        });
      const filter = { ...(o.tenant ? { tenant: o.tenant } : {}), ...(o.agent ? { agent: o.agent } : {}) };
      const json = global().json;
      const items = await withAbort((signal) =>
        copySnapshots(src, dst, ids, filter, {
          signal,
          onItem: (i) => {
            if (json) return;
            process.stdout.write(
              i.action === "copied"
                ? `copied ${i.id} to ${i.to} (${fmtBytes(i.size)})\n`
                : `skipped ${i.id}: already in ${dst} with the same seal\n`,
            );
          },
        }),
      );
      const copied = items.filter((i) => i.action === "copied").length;
      if (json) {
        printJson({
          ok: true,
          from: src,
          to: dst,
          copied,
          skipped: items.length - copied,
          snapshots: items.map((i) => ({
            id: i.id,
            snapshot_id: i.id,
            tenant: i.tenant,
            agent: i.agent,
            action: i.action,
            from: i.from,
            path: i.to,
            size: i.size,
          })),
        });
      } else process.stdout.write(`${items.length} snapshot(s): ${copied} copied, ${items.length - copied} skipped\n`);
    });

  storeOptions(
    program.command("delete <id...>").description("delete snapshots (never an agent's last one without --force)"),
  )
    .option("--force", "allow deleting an agent's last snapshot")
    .action(async (ids: string[], o: StoreOpts & { force?: boolean }) => {
      const { store, filter } = await context(o);
      const targets = [];
      for (const id of ids) targets.push(await findSnapshot(store, id, filter));
      const deleted = await deleteSnapshots(store, targets, { force: !!o.force });
      if (global().json)
        printJson({
          ok: true,
          deleted,
          snapshot_ids: targets.filter((t) => deleted.includes(t.path)).map((t) => t.id),
        });
      else for (const p of deleted) process.stdout.write(`deleted ${p}\n`);
    });

  addRetentionOptions(
    storeOptions(
      program
        .command("prune")
        .description("delete snapshots the retention policy does not keep, and dead processes' leftovers"),
    ),
  )
    .option("--dry-run", "list what would be kept and removed, with the rule or protection that decided each")
    .option(
      "--scheduled-only",
      "decide only over snapshots a schedule made (and safety snapshots past --keep-safety), " +
        "as `schedule` does; keep the others",
    )
    .option(
      "--grace <duration>",
      "s3 stores: delete what a prune condemned only this long after, " +
        "and abort incomplete uploads older than this (default 24h; 0: at once)",
    )
    .addHelpText(
      "after",
      `
Examples:
  $ memsnap prune --keep-last 5 --keep-daily 7 --keep-weekly 4 --dry-run
  $ memsnap prune -c agent/memsnap.json --keep-within 48h --keep-label 'release-*'
  $ memsnap prune --keep-last 5 --prune-label 'tmp-*' --keep-safety 3d

Protected (kept, and not counted by the rules; --dry-run names the protection):
  safety snapshots (auto:pre-restore-…) younger than --keep-safety (default 7d);
  labelled snapshots (a label you set) unless --keep-label or --prune-label names the label;
  with --scheduled-only, snapshots not made by a schedule.
An incremental snapshot's bases are kept as long as it is.`,
    )
    .action(
      async (
        o: StoreOpts &
          Record<string, string | string[] | boolean | undefined> & { dryRun?: boolean; scheduledOnly?: boolean },
      ) => {
        const { store, filter } = await context(o);
        const policy = policyFrom(o as Record<string, string | string[] | undefined>);
        if (o.scheduledOnly) policy.createdBy = ["schedule", "pre-restore"];
        const graceMs = typeof o.grace === "string" ? parseDuration(o.grace) : undefined;
        const res = await pruneStore(store, policy, {
          ...filter,
          dryRun: !!o.dryRun,
          ...(graceMs !== undefined ? { graceMs } : {}),
        });
        if (global().json) {
          printJson({
            ok: true,
            dry_run: !!o.dryRun,
            agents: res.map((r) => ({
              tenant: r.tenant,
              agent: r.agent,
              removed: r.removed,
              orphans: r.orphans,
              ...(r.condemned ? { condemned: r.condemned, uploads_aborted: r.uploads ?? [] } : {}),
              decisions: r.decisions.map((d) => ({
                id: d.snapshot.id,
                snapshot_id: d.snapshot.id,
                keep: d.keep,
                reasons: d.reasons,
                created_at: d.snapshot.created_at,
                created_by: d.snapshot.created_by,
                label: d.snapshot.label,
              })),
            })),
          });
          return;
        }
        for (const r of res) {
          process.stdout.write(`${r.tenant}/${r.agent}:\n`);
          const later = new Set(r.condemned ?? []);
          for (const d of r.decisions) {
            const verb = d.keep
              ? "keep  "
              : o.dryRun
                ? "would remove"
                : later.has(d.snapshot.path)
                  ? "condemn"
                  : "remove";
            const why = d.keep
              ? `  (${d.reasons.join(", ")})`
              : later.has(d.snapshot.path)
                ? "  (no rule keeps it; deleted by a prune once the grace has passed, see --grace)"
                : "  (no rule keeps it)";
            process.stdout.write(`  ${verb} ${d.snapshot.id} ${d.snapshot.created_at}${why}\n`);
          }
          for (const p of r.orphans) process.stdout.write(`  removed leftover ${p}\n`);
          for (const p of r.uploads ?? []) process.stdout.write(`  aborted incomplete upload ${p}\n`);
        }
      },
    );
}

/** The text of `memsnap diff`: one section per layer, ending with a newline. */
export function diffText(a: string, b: string, diff: LayerDiff[]): string {
  const out = [`${a} → ${b}`];
  const list = (sign: string, items: string[], total: number, indent = "    "): void => {
    for (const x of items) out.push(`${indent}${sign} ${oneLine(x)}`);
    if (total > items.length) out.push(`${indent}… and ${total - items.length} more`);
  };
  for (const l of diff) {
    out.push(
      "",
      `${l.layer} (${l.kind}): ${l.added.length} added, ${l.changed.length} changed, ` +
        `${l.removed.length} removed, ${l.unchanged} unchanged artifact(s)`,
    );
    for (const n of l.notes) out.push(`  ${oneLine(n)}`);
    const g = l.git;
    if (g) {
      if (g.note) out.push(`  ${oneLine(g.note)}`);
      const short = (o: string | null): string => (o ?? "-").slice(0, 12);
      if (g.head.from !== g.head.to) {
        out.push(`  commits ${short(g.head.from)}..${short(g.head.to)}: ${g.commits_total}`);
        for (const c of g.commits) out.push(`    ${c.oid.slice(0, 12)} ${oneLine(c.subject)}`);
        if (g.commits_total > g.commits.length) out.push(`    … and ${g.commits_total - g.commits.length} more`);
        if (g.descendant === false) {
          out.push(
            `  ${short(g.head.to)} does not descend from ${short(g.head.from)}: ` +
              `${g.commits_dropped} commit(s) of A's history are not in B's`,
          );
        }
      }
      const t = g.files_total;
      if (t.added + t.changed + t.deleted) {
        out.push(`  files (committed): ${t.added} added, ${t.changed} changed, ${t.deleted} deleted`);
        list("+", g.files.added, t.added);
        list("~", g.files.changed, t.changed);
        list("-", g.files.deleted, t.deleted);
      }
      const w = g.worktree;
      if (w.added.length + w.changed.length + w.removed.length + w.deleted.length) {
        out.push(
          `  uncommitted (work tree): ${w.added.length} added, ${w.changed.length} changed, ` +
            `${w.removed.length} no longer uncommitted, ${w.deleted.length} deleted`,
        );
        list("+", w.added.slice(0, 50), w.added.length);
        list("~", w.changed.slice(0, 50), w.changed.length);
        list("-", w.removed.slice(0, 50), w.removed.length);
        list("x", w.deleted.slice(0, 50), w.deleted.length);
      }
      continue;
    }
    if (l.sqlite) {
      for (const [db, tables] of Object.entries(l.sqlite.databases)) {
        out.push(`  ${oneLine(db)}:`);
        for (const [t, r] of Object.entries(tables)) {
          const by =
            r.changed !== undefined ? `: ${r.added} added, ${r.removed} removed, ${r.changed} changed by rowid` : "";
          out.push(
            `    ${oneLine(t)}: ${r.from} → ${r.to} rows (${r.to - r.from >= 0 ? "+" : ""}${r.to - r.from})${by}`,
          );
        }
      }
    }
    list(
      "+",
      l.added.slice(0, 50).map((x) => `${x.path} (${fmtBytes(x.size)})`),
      l.added.length,
      "  ",
    );
    list(
      "~",
      l.changed.slice(0, 50).map((x) => `${x.path} (${fmtBytes(x.from)} → ${fmtBytes(x.to)})`),
      l.changed.length,
      "  ",
    );
    list(
      "-",
      l.removed.slice(0, 50).map((x) => `${x.path} (${fmtBytes(x.size)})`),
      l.removed.length,
      "  ",
    );
  }
  return out.join("\n") + "\n";
}

/** A label as one table cell: control characters (a newline from an older memsnap) shown as "?". */
function oneLine(label: string): string {
  return label.replace(/[\u0000-\u001f\u007f-\u009f]/g, "?");
}
