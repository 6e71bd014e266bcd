#!/bin/sh
":" //; export MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}"; unset MEMSNAP_SAVED_EXTRA_CA_CERTS
":" //; [ "${NODE_EXTRA_CA_CERTS+set}" = set ] && export MEMSNAP_SAVED_EXTRA_CA_CERTS="$NODE_EXTRA_CA_CERTS" && unset NODE_EXTRA_CA_CERTS
":" //; exec node --max-semi-space-size=2 --interrupt-budget=262144 "$0" "$@"
// The lines above are for sh, which runs this file when it is executed (`memsnap …`): it
// re-runs it with node, in the same process (exec), with
// - V8's young generation capped at 2 MiB per semi-space: less resident memory, same speed;
// - two glibc malloc arenas (a value already set is kept): worker threads' freed buffers are
//   reused instead of fragmenting more arenas;
// - V8's interrupt budget at 256 KiB of bytecode: hot code is optimized once, with full type
//   feedback, instead of compiled, deoptimized and compiled again;
// - NODE_EXTRA_CA_CERTS out of node's environment (node parses that file before any code runs;
//   memsnap makes no TLS connections), put back below for the processes memsnap starts.
// What each was measured to do: docs/BENCHMARK.md, "Node flags in bin/memsnap.js". To node,
// those lines are strings and comments, so `node bin/memsnap.js …` works too (with the defaults).
//
// The CLI runs from dist/cli/memsnap.mjs, dist/cli/main.js's modules bundled into one file by
// `npm run build`. When it is missing or older than dist/cli/main.js (tsc was run alone), tsc's
// modules are loaded instead, so a stale bundle never runs.
if (process.env.MEMSNAP_SAVED_EXTRA_CA_CERTS !== undefined) {
  process.env.NODE_EXTRA_CA_CERTS = process.env.MEMSNAP_SAVED_EXTRA_CA_CERTS;
  delete process.env.MEMSNAP_SAVED_EXTRA_CA_CERTS;
}

import { statSync } from "node:fs";

const mtime = (rel) => statSync(new URL(rel, import.meta.url), { throwIfNoEntry: false })?.mtimeMs ?? -1;
const bundled = mtime("../dist/cli/memsnap.mjs") >= mtime("../dist/cli/main.js");
const { main } = await import(bundled ? "../dist/cli/memsnap.mjs" : "../dist/cli/main.js");

process.exitCode = await main(process.argv.slice(2));
