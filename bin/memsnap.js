#!/bin/sh
":" //; export MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}"
":" //; exec node --max-semi-space-size=2 "$0" "$@"
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
// To node, those lines are strings and comments, so `node bin/memsnap.js …` works too (with the
// defaults).
import { main } from "../dist/cli/main.js";

process.exitCode = await main(process.argv.slice(2));
