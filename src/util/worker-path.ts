/**
 * Where a worker thread's module is: every worker (`*.worker.ts`) is started from the file tsc
 * wrote for it under dist/, however memsnap runs. This module is found at the same depth in all
 * three cases, so `../../dist/` is the package's dist/ from each:
 *  - the library: dist/util/worker-path.js;
 *  - the CLI bundle (scripts/bundle-cli.mjs): dist/cli/memsnap*.mjs;
 *  - the TypeScript sources under vitest: src/util/worker-path.ts (`npm test` builds first).
 * From the sources, a compiled file older than a source module it is built from is an error, so
 * that tests never run a stale worker.
 */
import { readFileSync, statSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { MemsnapError } from "../errors.js";

const DIST = new URL("../../dist/", import.meta.url);
const FROM_SOURCES = import.meta.url.endsWith(".ts");
const checked = new Set<string>();

/**
 * The URL of a worker module, given by its path under src/ with the compiled extension
 * (`"snapshot/encoder.worker.js"`), for `new Worker(url, …)`.
 */
export function workerUrl(rel: string): URL {
  let url = bundled.get(rel);
  if (url) return url;
  url = new URL(rel, DIST);
  if (FROM_SOURCES && !checked.has(rel)) {
    assertBuilt(rel, new Set());
    checked.add(rel);
  }
  // The build's one-file bundle of the worker (scripts/bundle-cli.mjs), when it is not older than the module.
  const one = new URL(rel.replace(/\.js$/, ".bundle.mjs"), DIST);
  const mtime = (u: URL): number => statSync(u, { throwIfNoEntry: false })?.mtimeMs ?? -1;
  if (mtime(one) >= mtime(url) && mtime(url) >= 0) url = one;
  bundled.set(rel, url);
  return url;
}

const bundled = new Map<string, URL>();

/** From the sources: dist/<rel> and every module of ours it imports exist and are not older than their .ts. */
function assertBuilt(rel: string, seen: Set<string>): void {
  if (seen.has(rel)) return;
  seen.add(rel);
  const src = fileURLToPath(new URL(`../${rel.replace(/\.js$/, ".ts")}`, import.meta.url));
  const out = fileURLToPath(new URL(rel, DIST));
  const built = statSync(out, { throwIfNoEntry: false })?.mtimeMs ?? -1;
  const source = statSync(src, { throwIfNoEntry: false })?.mtimeMs ?? -1;
  if (source < 0) return; // not one of ours
  if (built < source) {
    const what = built < 0 ? "missing" : `older than ${src}`;
    throw new MemsnapError("MEMSNAP_INTERNAL", `the worker module ${out} is ${what}`, {
      hint: "workers run from dist/: run `npm run build` (npm test does)",
    });
  }
  // Relative imports and re-exports of the compiled file (`from "./x.js"`, `from "../util/y.js"`).
  for (const m of readFileSync(out, "utf8").matchAll(/^(?:import|export)\s[^;]*?from\s+"(\.{1,2}\/[^"]+\.js)"/gm)) {
    assertBuilt(fileURLToPath(new URL(m[1]!, new URL(rel, DIST))).slice(fileURLToPath(DIST).length), seen);
  }
}
