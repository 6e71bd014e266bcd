#!/bin/sh
":" //; export MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}"; unset MEMSNAP_SAVED_EXTRA_CA_CERTS
":" //; [ "${NODE_EXTRA_CA_CERTS+set}" = set ] && export MEMSNAP_SAVED_EXTRA_CA_CERTS="$NODE_EXTRA_CA_CERTS" && unset NODE_EXTRA_CA_CERTS
":" //; exec node --max-semi-space-size=2 --interrupt-budget=262144 "$0" "$@"
// The lines above are for sh, which runs this file when it is executed (`memsnap …`): it
// re-runs it with node, in the same process (exec), with
// - V8's young generation capped at 2 MiB per semi-space. Under a snapshot's or restore's
//   allocation rate the default (16 MiB) grows to ~30 MiB more resident memory for no gain in
//   speed (measured on the bench mix: snapshot peak RSS 193 -> 166-170 MiB at the same wall time);
// - two glibc malloc arenas, not one per thread up to 8 per core: the worker threads' freed
//   stream buffers are reused instead of fragmenting more arenas (measured on a 53k-page KV
//   restore: peak RSS 217 -> 207 MiB). A value already set is kept; other C libraries ignore it.
//   (Raising the trim and mmap thresholds too cut the snapshot's system time by a third but
//   added ~20 MiB to restore and verify: left at glibc's defaults.)
// - V8's interrupt budget at 256 KiB of bytecode (default 66 KiB): a function runs about 4x
//   longer in the lower tiers before TurboFan optimizes it, so it is optimized with complete
//   type feedback instead of being compiled, deoptimized ("insufficient type feedback") and
//   compiled again. A snapshot runs the same hot code in up to five isolates (main, payload
//   worker, sink, two SQLite workers). Measured on the bench mix (scale 1, 6 alternating runs):
//   TurboFan compiles 250 -> 146 and compile time 1.24 -> 0.68 s; snapshot 4.62 -> 4.29 s,
//   8.03 -> 7.44 CPU-s; verify and restore unchanged within noise.
// - NODE_EXTRA_CA_CERTS taken out of node's environment and put back by the first line of
//   JavaScript below: node reads and parses that file at startup, before any code runs (~35 ms
//   per command with Debian's 140-certificate bundle: `node -e 0` 0.05 s, 0.015 s without it),
//   and memsnap makes no TLS connections. Put back, it reaches every process memsnap starts
//   (git, hooks, plugins) as it was set.
// To node, those lines are strings and comments, so `node bin/memsnap.js …` works too (with the
// defaults).
//
// The CLI runs from dist/cli/memsnap.mjs, all of dist/cli/main.js's modules in one file (built by
// `npm run build`, see scripts/bundle-cli.mjs; it saves ~0.1 s of module loading per command).
// When that file is missing or older than dist/cli/main.js (tsc was run alone after a change),
// the modules tsc wrote are loaded instead, so a stale bundle never runs.
if (process.env.MEMSNAP_SAVED_EXTRA_CA_CERTS !== undefined) {
  process.env.NODE_EXTRA_CA_CERTS = process.env.MEMSNAP_SAVED_EXTRA_CA_CERTS;
  delete process.env.MEMSNAP_SAVED_EXTRA_CA_CERTS;
}

import { statSync } from "node:fs";

const mtime = (rel) => statSync(new URL(rel, import.meta.url), { throwIfNoEntry: false })?.mtimeMs ?? -1;
const bundled = mtime("../dist/cli/memsnap.mjs") >= mtime("../dist/cli/main.js");
const { main } = await import(bundled ? "../dist/cli/memsnap.mjs" : "../dist/cli/main.js");

process.exitCode = await main(process.argv.slice(2));
