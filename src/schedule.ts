/**
 * Scheduled auto-snapshots: a foreground service that snapshots on a cron expression or an
 * interval (with jitter), then prunes by the retention policy, logging one JSON line per event.
 *
 * It holds the agent's schedule lock for its whole life, so a second scheduler for the same
 * agent refuses to start, and each snapshot takes the agent lock, so it never overlaps a
 * restore. Missed runs (the host slept past one or more ticks): policy `run-once` takes one
 * snapshot at wake-up, `skip` waits for the next tick. SIGTERM/SIGINT abort the in-flight
 * snapshot (which removes its temp file) and stop cleanly.
 */
import type { KeyObject } from "node:crypto";
import type { MemsnapConfig } from "./config.js";
import { MemsnapError, isMemsnapError } from "./errors.js";
import { runHook } from "./hooks.js";
import { snapshot } from "./snapshot/snapshot.js";
import { acquireLock } from "./agent/lock.js";
import { parseDuration } from "./util/duration.js";
import { pruneStore } from "./store/ops.js";
import { hasRules, type RetentionPolicy } from "./store/prune.js";

/** A parsed 5-field cron expression: minute hour day-of-month month day-of-week. */
export interface Cron {
  source: string;
  minute: Set<number>;
  hour: Set<number>;
  dom: Set<number>;
  month: Set<number>;
  dow: Set<number>;
  domStar: boolean;
  dowStar: boolean;
}

function field(spec: string, min: number, max: number, name: string): Set<number> {
  const out = new Set<number>();
  for (const part of spec.split(",")) {
    const m = /^(\*|(\d+)(?:-(\d+))?)(?:\/(\d+))?$/.exec(part);
    if (!m)
      throw new MemsnapError("MEMSNAP_USAGE", `cron ${name} field "${spec}" is not valid`, {
        hint: "use numbers, ranges a-b, lists a,b, steps */n",
      });
    const lo = m[1] === "*" ? min : Number(m[2]);
    const hi = m[1] === "*" ? max : m[3] !== undefined ? Number(m[3]) : m[4] !== undefined ? max : lo;
    const step = m[4] !== undefined ? Number(m[4]) : 1;
    if (lo < min || hi > max || lo > hi || step < 1)
      throw new MemsnapError("MEMSNAP_USAGE", `cron ${name} field "${spec}" is out of range ${min}-${max}`);
    for (let v = lo; v <= hi; v += step) out.add(name === "day-of-week" && v === 7 ? 0 : v);
  }
  return out;
}

/** Parse a 5-field cron expression (UTC). Throws MEMSNAP_USAGE. */
export function parseCron(expr: string): Cron {
  const f = expr.trim().split(/\s+/);
  if (f.length !== 5)
    throw new MemsnapError("MEMSNAP_USAGE", `cron expression "${expr}" needs 5 fields`, {
      hint: 'e.g. "0 * * * *" for hourly (times are UTC)',
    });
  return {
    source: expr,
    minute: field(f[0]!, 0, 59, "minute"),
    hour: field(f[1]!, 0, 23, "hour"),
    dom: field(f[2]!, 1, 31, "day-of-month"),
    month: field(f[3]!, 1, 12, "month"),
    dow: field(f[4]!, 0, 7, "day-of-week"),
    domStar: f[2] === "*",
    dowStar: f[4] === "*",
  };
}

/**
 * The first minute strictly after `after` that matches (UTC); day-of-month and day-of-week combine with OR when both
 * are restricted, as in cron.
 */
export function nextCron(c: Cron, after: Date): Date {
  const t = new Date(after.getTime());
  t.setUTCSeconds(0, 0);
  t.setUTCMinutes(t.getUTCMinutes() + 1);
  for (let i = 0; i < 366 * 24 * 60; i++) {
    const domOk = c.dom.has(t.getUTCDate());
    const dowOk = c.dow.has(t.getUTCDay());
    const dayOk = c.domStar && c.dowStar ? true : c.domStar ? dowOk : c.dowStar ? domOk : domOk || dowOk;
    if (c.minute.has(t.getUTCMinutes()) && c.hour.has(t.getUTCHours()) && c.month.has(t.getUTCMonth() + 1) && dayOk)
      return t;
    t.setUTCMinutes(t.getUTCMinutes() + 1);
  }
  throw new MemsnapError("MEMSNAP_USAGE", `cron expression "${c.source}" never matches`);
}

export interface ScheduleOptions {
  config: MemsnapConfig;
  store: string;
  /** Exactly one of these. */
  everyMs?: number;
  cron?: Cron;
  jitterMs?: number;
  missed?: "run-once" | "skip";
  retention?: RetentionPolicy;
  recipients?: string[];
  /** Stop after this many ticks (tests, one-shot runs). */
  maxRuns?: number;
  /** Take incremental snapshots (unchanged artifacts referenced in earlier bundles; see snapshot/incremental.ts). */
  incremental?: boolean;
  /** Sign each snapshot's manifest with this Ed25519 key. */
  signKey?: KeyObject;
  /** Take the first snapshot at start (default), not one interval (or cron time) later. */
  runAtStart?: boolean;
  /**
   * Let the prune decide over every snapshot of the agent, not only those a schedule made (and expired safety
   * snapshots).
   */
  pruneAll?: boolean;
  signal: AbortSignal;
  log: (event: Record<string, unknown>) => void;
}

function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve(false);
    const t = setTimeout(
      () => {
        signal.removeEventListener("abort", onAbort);
        resolve(true);
      },
      Math.max(0, ms),
    );
    const onAbort = (): void => {
      clearTimeout(t);
      resolve(false);
    };
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * Run the scheduler until `signal` aborts (or maxRuns ticks). Throws MEMSNAP_LOCKED when another scheduler runs for
 * this agent.
 */
export async function runSchedule(o: ScheduleOptions): Promise<{ runs: number }> {
  if (!!o.everyMs === !!o.cron) throw new MemsnapError("MEMSNAP_USAGE", "give exactly one of --every and --cron");
  const lock = await acquireLock(o.config.baseDir, { command: "schedule", name: "schedule.lock" });
  const { config } = o;
  const next = (from: Date): Date => (o.cron ? nextCron(o.cron, from) : new Date(from.getTime() + o.everyMs!));
  let runs = 0;
  try {
    o.log({
      event: "started",
      agent: `${config.tenant}/${config.agent}`,
      every_ms: o.everyMs ?? null,
      cron: o.cron?.source ?? null,
      jitter_ms: o.jitterMs ?? 0,
      missed: o.missed ?? "run-once",
      pid: process.pid,
    });
    let due = o.runAtStart === false ? next(new Date()) : new Date();
    while (!o.signal.aborted && (o.maxRuns === undefined || runs < o.maxRuns)) {
      const jitter = o.jitterMs ? Math.floor(Math.random() * o.jitterMs) : 0;
      if (!(await sleep(due.getTime() + jitter - Date.now(), o.signal))) break;
      const now = new Date();
      const period = o.everyMs ?? 60_000;
      if (now.getTime() - due.getTime() - jitter > period + 1000) {
        // Woke up after one or more whole periods (suspend, clock jump).
        const missedFrom = due.toISOString();
        if (o.missed === "skip") {
          o.log({ event: "missed", since: missedFrom, action: "skipped" });
          due = next(now);
          continue;
        }
        o.log({ event: "missed", since: missedFrom, action: "run-once" });
      }
      runs++;
      o.log({ event: "tick", run: runs });
      try {
        const r = await snapshot({
          config,
          store: o.store,
          createdBy: "schedule",
          label: "scheduled",
          recipients: o.recipients ?? config.recipients,
          signal: o.signal,
          ...(o.incremental ? { incremental: true } : {}),
          ...(o.signKey ? { signKey: o.signKey } : {}),
        });
        const meta = {
          snapshot_id: r.id,
          path: r.path,
          tenant: config.tenant,
          agent: config.agent,
          bytes: r.inputBytes,
          bundle_bytes: r.bundleBytes,
          created_by: "schedule",
          signed: r.manifest.signature !== undefined,
        };
        o.log({
          event: "snapshot",
          ...meta,
          duration_ms: Math.round(r.durationMs),
          ...(r.incremental ? { referenced: r.incremental.referenced, bases: r.incremental.bases } : {}),
          ...(r.notices.length ? { warnings: r.notices } : {}),
        });
        const h = await runHook(config.hooks, "on_created", meta, config.baseDir);
        if (h) o.log({ ...h, hook: h.event, event: "hook" });
        if (o.retention && hasRules(o.retention)) {
          // A schedule decides only over its own snapshots (and safety snapshots past their time)
          // unless told otherwise; labelled and recent safety snapshots are protected either way.
          const policy: RetentionPolicy = o.pruneAll
            ? o.retention
            : { ...o.retention, createdBy: ["schedule", "pre-restore"] };
          const pr = await pruneStore(o.store, policy, { tenant: config.tenant, agent: config.agent });
          o.log({
            event: "prune",
            removed: pr.flatMap((p) => p.removed),
            orphans: pr.flatMap((p) => p.orphans),
            removed_ids: pr.flatMap((p) => p.decisions.filter((d) => !d.keep).map((d) => d.snapshot.id)),
          });
        }
      } catch (e) {
        if (o.signal.aborted) {
          o.log({ event: "aborted", run: runs });
          break;
        }
        const err = isMemsnapError(e) ? e.toJSON() : { code: "MEMSNAP_INTERNAL", message: String(e) };
        // A scheduled snapshot is encrypted to the config's recipients only: say so, not -r.
        if (isMemsnapError(e, "MEMSNAP_UNREDACTED_SECRETS") || isMemsnapError(e, "MEMSNAP_PLAINTEXT_PROCESS_MEMORY")) {
          err.hint =
            `name recipients in ${config.file ?? "the config"} ("recipients": ["age1…"]): ` +
            "scheduled snapshots are encrypted to those";
        }
        o.log({ event: isMemsnapError(e, "MEMSNAP_LOCKED") ? "skipped" : "failed", run: runs, error: err });
        const h = await runHook(
          config.hooks,
          "on_failed",
          { tenant: config.tenant, agent: config.agent, error: err, created_by: "schedule" },
          config.baseDir,
        );
        if (h) o.log({ ...h, hook: h.event, event: "hook" });
      }
      due = next(new Date(Math.max(Date.now(), due.getTime())));
    }
    o.log({ event: "stopped", runs });
    return { runs };
  } finally {
    await lock.release();
  }
}

export interface UnitOptions {
  /** The command that runs memsnap, as argv (its bin script, or node and the script). */
  bin: string[];
  configPath: string;
  every?: string;
  cron?: string;
  jitter?: string;
  missed?: string;
  store?: string;
  incremental?: boolean;
  /** Retention options as given (`--keep-last`, `24`, …). */
  pruneArgs: string[];
  /** The signing key file (absolute), passed on to every snapshot. */
  signKey?: string;
  /** Prune over every snapshot of the agent (schedule --prune-all). */
  pruneAll?: boolean;
  /** Do not take a snapshot at start (systemd: schedule --no-run-at-start). */
  noRunAtStart?: boolean;
  agent: string;
}

/**
 * One argument for a crontab line (sh) or a systemd ExecStart= line, quoted only when it must
 * be. cron turns an unescaped `%` into a newline (`\%` is a `%`); systemd expands `%` and `$`
 * (`%%` and `$$` are themselves).
 */
function quoteArg(a: string, kind: "systemd" | "cron"): string {
  if (kind === "cron") {
    const sh = /^[\w@+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\\''")}'`;
    return sh.replace(/%/g, "\\%");
  }
  if (/^[\w@+=:,./-]+$/.test(a)) return a;
  return `"${a
    .replace(/(["\\])/g, "\\$1")
    .replace(/\$/g, "$$$$")
    .replace(/%/g, "%%")}"`;
}

/**
 * A cron schedule for `--every`: minutes that divide an hour, hours that divide a day, or a
 * day (at 03:00); anything else cannot be said in cron's fields. Throws MEMSNAP_USAGE.
 */
export function cronForInterval(every: string): string {
  const ms = parseDuration(every);
  const min = ms / 60_000;
  const h = ms / 3_600_000;
  if (Number.isInteger(min) && min >= 1 && min < 60 && 60 % min === 0)
    return min === 1 ? "* * * * *" : `*/${min} * * * *`;
  if (Number.isInteger(h) && h >= 1 && h < 24 && 24 % h === 0) return h === 1 ? "0 * * * *" : `0 */${h} * * *`;
  if (ms === 86_400_000) return "0 3 * * *";
  throw new MemsnapError("MEMSNAP_USAGE", `cron cannot run every ${every}`, {
    hint: 'give --cron EXPR (e.g. "0 */6 * * *"), an interval that divides an hour or a day, or use --print systemd',
  });
}

/**
 * Unit files for the host's scheduler. systemd runs `memsnap schedule` as a service with
 * every option given (jitter, missed runs, store, retention); cron runs `memsnap snapshot`
 * then `memsnap prune` at each time, after a random sleep of up to the jitter.
 */
export function printUnits(kind: "systemd" | "cron", o: UnitOptions): string {
  const q = (args: string[]): string => args.map((a) => quoteArg(a, kind)).join(" ");
  const bin = q(o.bin);
  const store = o.store ? ["--store", o.store] : [];
  const sign = o.signKey ? ["--sign-key", o.signKey] : [];
  if (kind === "cron") {
    const when = o.cron ?? cronForInterval(o.every ?? "1h");
    const jitterS = o.jitter ? Math.floor(parseDuration(o.jitter) / 1000) : 0;
    // cron turns an unescaped % into a newline: \% is a literal % for sh.
    const sleep = jitterS > 0 ? `sleep $(( $(od -An -N2 -tu2 /dev/urandom) \\% ${jitterS + 1} )) && ` : "";
    const snap = `${bin} ${q([
      "snapshot",
      "-c",
      o.configPath,
      ...store,
      "--scheduled",
      "--label",
      "scheduled",
      "--wait",
      "5m",
      ...(o.incremental ? ["--incremental"] : []),
      ...sign,
    ])}`;
    const prune = o.pruneArgs.length
      ? ` && ${bin} ${q([
          "prune",
          "-c",
          o.configPath,
          ...store,
          ...(o.pruneAll ? [] : ["--scheduled-only"]),
          ...o.pruneArgs,
        ])}`
      : "";
    // The log's directory may not exist yet; the redirection covers every command of the run.
    const log = `~/.local/state/memsnap-${quoteArg(o.agent, "cron")}.log`;
    return (
      `# memsnap auto-snapshots for ${o.agent} (crontab -e; times are the host's cron time zone)\n` +
      `${when} mkdir -p ~/.local/state && { ${sleep}${snap}${prune}; } >> ${log} 2>&1\n`
    );
  }
  const args = q([
    "schedule",
    "-c",
    o.configPath,
    ...(o.every ? ["--every", o.every] : ["--cron", o.cron ?? ""]),
    ...(o.jitter && parseDuration(o.jitter) > 0 ? ["--jitter", o.jitter] : []),
    ...(o.missed && o.missed !== "run-once" ? ["--missed", o.missed] : []),
    ...store,
    ...(o.incremental ? ["--incremental"] : []),
    ...sign,
    ...(o.noRunAtStart ? ["--no-run-at-start"] : []),
    ...(o.pruneAll ? ["--prune-all"] : []),
    ...o.pruneArgs,
  ]);
  return (
    `# ~/.config/systemd/user/memsnap-${o.agent}.service — then: ` +
    `systemctl --user daemon-reload && systemctl --user enable --now memsnap-${o.agent}
[Unit]
Description=memsnap scheduled snapshots of ${o.agent}
After=local-fs.target

[Service]
Type=simple
ExecStart=${bin} ${args}
Restart=on-failure
RestartSec=30
KillSignal=SIGTERM
TimeoutStopSec=120

[Install]
WantedBy=default.target
`
  );
}
