#!/bin/sh
":" //; exec node --max-semi-space-size=2 "$0" "$@"
// The two lines above are for sh, which runs this file when it is executed (`memsnap …`): it
// re-runs it with node, in the same process (exec), with V8's young generation capped at
// 2 MiB per semi-space. Under a snapshot's or restore's allocation rate the default (16 MiB)
// grows to ~30 MiB more resident memory for no gain in speed (measured on the bench mix:
// snapshot peak RSS 193 -> 166-170 MiB at the same wall time). To node, line 2 is a string
// and a comment, so `node bin/memsnap.js …` works too (with V8's default young generation).
import { main } from "../dist/cli/main.js";

process.exitCode = await main(process.argv.slice(2));
