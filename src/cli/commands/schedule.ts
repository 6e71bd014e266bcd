import type { Command } from "commander";
import { closeSync, openSync, readSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { parseDuration } from "../../util/duration.js";
import { loadConfig } from "../common.js";
import { MemsnapError } from "../../errors.js";
import { parseCron, printUnits, runSchedule } from "../../schedule.js";
import { loadSigningKey } from "../../sign.js";
import { resolveStore } from "../../store/paths.js";
import { addRetentionOptions, policyFrom } from "./store.js";
import type { GlobalOpts } from "../common.js";

export function registerSchedule(program: Command, _global: () => GlobalOpts): void {
  addRetentionOptions(
    program
      .command("schedule")
      .description("run as a foreground service: snapshot on a schedule, then prune; one JSON line per event on stdout")
      .option("-c, --config <file>", "the agent's memsnap.json", "memsnap.json")
      .option("--every <duration>", "interval between snapshots (e.g. 15m, 1h)")
      .option("--cron <expr>", 'cron expression in UTC (e.g. "0 * * * *")')
      .option("--jitter <duration>", "random delay added to each run, up to this long", "0s")
      .option("--missed <policy>", "after sleeping past runs: run-once (one snapshot at wake-up) or skip", "run-once")
      .option("--store <dir>", "store directory")
      .option("--max-runs <n>", "stop after n runs")
      .option(
        "--incremental",
        "take incremental snapshots: unchanged artifacts become references to earlier bundles (pruning keeps those)",
      )
      .option(
        "--sign-key <file>",
        "sign every snapshot's manifest with this Ed25519 key (default: the config's sign_key)",
      )
      .option(
        "--no-run-at-start",
        "wait one interval (or the next cron time) for the first snapshot instead of taking it at start",
      )
      .option(
        "--prune-all",
        "let the keep rules decide over every snapshot of the agent, not only those the schedule made (labelled and " +
          "recent safety snapshots stay protected)",
      )
      .option("--print <kind>", "print unit files for the host's scheduler instead: systemd or cron"),
  )
    .addHelpText(
      "after",
      `
Examples:
  $ memsnap schedule -c agent/memsnap.json --every 1h --jitter 5m --keep-last 24 --keep-daily 7
  $ memsnap schedule -c agent/memsnap.json --cron "*/15 * * * *" --keep-within 48h
  $ memsnap schedule -c agent/memsnap.json --every 1h --keep-daily 7 --print systemd
  $ memsnap schedule -c agent/memsnap.json --every 15m --incremental --keep-last 96
  $ memsnap schedule -c agent/memsnap.json --every 1h --sign-key ~/.config/memsnap/sign.key --keep-last 24

The first snapshot is taken at start (--no-run-at-start: one interval later). The prune after
each snapshot decides only over the snapshots the schedule made and safety snapshots older than
--keep-safety (default 7d); manual and labelled snapshots are kept (--prune-all, --prune-label).`,
    )
    .action(
      async (
        o: Record<string, string | string[] | boolean | undefined> & {
          config: string;
          every?: string;
          cron?: string;
          jitter: string;
          missed: string;
          store?: string;
          maxRuns?: string;
          print?: string;
          signKey?: string;
          runAtStart: boolean;
          pruneAll?: boolean;
          incremental?: boolean;
        },
      ) => {
        if (!!o.every === !!o.cron)
          throw new MemsnapError("MEMSNAP_USAGE", "give exactly one of --every and --cron", {
            hint: "e.g. --every 1h",
          });
        if (o.missed !== "run-once" && o.missed !== "skip")
          throw new MemsnapError("MEMSNAP_USAGE", "--missed must be run-once or skip");
        const everyMs = o.every ? parseDuration(o.every) : undefined;
        if (everyMs !== undefined && everyMs < 100)
          throw new MemsnapError("MEMSNAP_USAGE", "--every must be at least 100ms");
        const cron = o.cron ? parseCron(o.cron) : undefined;
        const retention = policyFrom(o as Record<string, string | string[] | undefined>);
        const config = await loadConfig(o.config);
        const signKeyFile = o.signKey ? resolve(o.signKey) : config.signKey;
        // Load it now: a missing or unreadable key fails at start, not at the first tick.
        const signKey = signKeyFile ? await loadSigningKey(signKeyFile) : undefined;
        if (o.print) {
          if (o.print !== "systemd" && o.print !== "cron")
            throw new MemsnapError("MEMSNAP_USAGE", "--print takes systemd or cron");
          const valued = /^--(keep-|prune-label$)/;
          const pruneArgs = process.argv
            .slice(2)
            .filter((a, i, all) => valued.test(a) || valued.test(all[i - 1] ?? ""));
          process.stdout.write(
            printUnits(o.print, {
              bin: selfCommand(),
              configPath: config.file ?? resolve(o.config),
              ...(o.every ? { every: o.every } : {}),
              ...(o.cron ? { cron: o.cron } : {}),
              jitter: o.jitter,
              missed: o.missed,
              ...(o.store ? { store: resolveStore(o.store, undefined) } : {}),
              pruneArgs,
              agent: config.agent,
              ...(o.incremental ? { incremental: true } : {}),
              // Only a key given here: one from the config is read from the config by the unit's memsnap too.
              ...(o.signKey ? { signKey: resolve(o.signKey) } : {}),
              ...(o.pruneAll ? { pruneAll: true } : {}),
              ...(o.runAtStart === false ? { noRunAtStart: true } : {}),
            }),
          );
          return;
        }
        const ac = new AbortController();
        const stop = (sig: string) => () => {
          process.stdout.write(JSON.stringify({ ts: new Date().toISOString(), event: "signal", signal: sig }) + "\n");
          ac.abort();
        };
        const onTerm = stop("SIGTERM");
        const onInt = stop("SIGINT");
        process.on("SIGTERM", onTerm);
        process.on("SIGINT", onInt);
        try {
          await runSchedule({
            config,
            store: resolveStore(o.store, config.store),
            ...(everyMs !== undefined ? { everyMs } : {}),
            ...(cron ? { cron } : {}),
            jitterMs: parseDuration(o.jitter),
            missed: o.missed,
            retention,
            ...(o.maxRuns ? { maxRuns: Number(o.maxRuns) } : {}),
            ...(o.incremental ? { incremental: true } : {}),
            signal: ac.signal,
            ...(signKey ? { signKey } : {}),
            runAtStart: o.runAtStart !== false,
            ...(o.pruneAll ? { pruneAll: true } : {}),
            log: (e) => process.stdout.write(JSON.stringify({ ts: new Date().toISOString(), ...e }) + "\n"),
          });
        } finally {
          process.off("SIGTERM", onTerm);
          process.off("SIGINT", onInt);
        }
      },
    );
}

/**
 * How a unit file should start memsnap: its bin script itself when that is the executable sh
 * wrapper (it runs node with memsnap's memory flags and malloc arenas: see bin/memsnap.js),
 * else node with this process's flags and the script.
 */
function selfCommand(): string[] {
  const script = resolve(process.argv[1] ?? "memsnap");
  try {
    const st = statSync(script);
    const head = Buffer.alloc(10);
    const fd = openSync(script, "r");
    try {
      readSync(fd, head, 0, head.length, 0);
    } finally {
      closeSync(fd);
    }
    if (st.isFile() && (st.mode & 0o111) !== 0 && head.toString("latin1").startsWith("#!/bin/sh")) return [script];
  } catch {
    // not a file we can read: node and the script below
  }
  return [process.execPath, ...process.execArgv, script];
}
