#!/usr/bin/env node
/**
 * Bundle the CLI (dist/cli/main.js and every module of ours it reaches) into one ES module,
 * dist/cli/memsnap.mjs, which bin/memsnap.js loads. Run by `npm run build` after tsc.
 *
 * Why: Node 20 has no compile cache for ES modules, and loading the ~90 modules of dist one by
 * one (resolve, read, parse, link) cost every command ~0.1 s of CPU before it did any work:
 * `memsnap --version` 0.16 -> 0.11 s, a keyless verify 1.28 -> 1.12 s, the bench snapshot
 * 3.70 -> 3.61 s and 6.60 -> 6.42 CPU-s (medians of 5-6 alternating runs on the 2-core bench
 * machine). Packages stay external (resolved from node_modules at run time as before), except
 * age-encryption and the @noble / @scure packages it is made of: pure JS ES modules, ~50 files,
 * whose loading took ~108 ms of every command that encrypts or decrypts, ~33 ms once bundled
 * (their license comments are kept at the end of the bundle). The AWS SDK (@aws-sdk, @smithy and the
 * few packages they use) is bundled too, into a chunk that only the s3 code's dynamic imports reach:
 * ~60 CommonJS modules, each resolved, read and wrapped by node's loader, cost every s3 command
 * ~45 ms more CPU than the one chunk (`memsnap list --store s3://…` against the loopback server:
 * 0.325 -> 0.28 CPU-s, means of 6 alternating runs on the 2-core machine). The native addons are found
 * relative to the bundle's URL: it sits in dist/cli, at the same depth as the modules it
 * replaces, so `../../native/...` still resolves.
 *
 * The library entry (dist/index.js) is not bundled: importers get the modules as tsc wrote them.
 */
import { build } from "esbuild";
import { readdirSync, readFileSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const pkg = JSON.parse(readFileSync(join(root, "package.json"), "utf8"));
/** Packages bundled in (every other bare import, node: builtins included, stays external). */
const BUNDLED = /^(age-encryption|@noble\/|@scure\/|@aws-sdk\/|@smithy\/|@aws-crypto\/|tslib$|bowser$|fast-xml-parser$|strnum$)/;

// Chunk names carry a content hash: drop the previous build's files first.
for (const f of readdirSync(join(root, "dist/cli"))) if (/^memsnap.*\.mjs$/.test(f)) rmSync(join(root, "dist/cli", f));

await build({
  entryPoints: { memsnap: join(root, "dist/cli/main.js") },
  outdir: join(root, "dist/cli"),
  outExtension: { ".js": ".mjs" },
  // What is imported on demand (age-encryption, the isomorphic-git and secretlint adapters)
  // goes into chunks of its own, loaded only by the commands that use it.
  splitting: true,
  chunkNames: "memsnap-[hash]",
  bundle: true,
  platform: "node",
  format: "esm",
  target: "node20",
  logLevel: "warning",
  legalComments: "eof",
  // The AWS SDK is CommonJS: its require() of node's modules needs a require in each ES module esbuild writes.
  banner: { js: 'import { createRequire as __memsnapRequire } from "node:module";\nconst require = __memsnapRequire(import.meta.url);' },
  plugins: [{
    name: "memsnap-externals",
    setup(b) {
      b.onResolve({ filter: /^[^./]/ }, (args) => (BUNDLED.test(args.path) ? undefined : { path: args.path, external: true }));
    },
  }, {
    // dist/version.js reads ../package.json relative to itself; in the bundle that path would
    // be one level off, so the bundle carries the name and version it was built from.
    name: "memsnap-version",
    setup(b) {
      b.onLoad({ filter: /[\\/]dist[\\/]version\.js$/ }, () => ({
        contents: `export const TOOL_NAME = ${JSON.stringify(pkg.name)};\nexport const TOOL_VERSION = ${JSON.stringify(pkg.version)};\n`,
        loader: "js",
      }));
    },
  }],
});

// Each worker (`*.worker.js`) is bundled too, into `<name>.worker.bundle.mjs` beside it: a worker thread then
// loads one file instead of its dozen modules, each of them resolved, read and parsed again in every thread
// (util/worker-path.ts starts the bundle when it is at least as new as the module).
const workers = [];
const walk = (d) => {
  for (const e of readdirSync(d, { withFileTypes: true })) {
    const p = join(d, e.name);
    if (e.isDirectory()) walk(p);
    else if (e.name.endsWith(".worker.js")) workers.push(p);
  }
};
walk(join(root, "dist"));
await Promise.all(workers.map((w) => build({
  entryPoints: [w],
  outfile: w.replace(/\.js$/, ".bundle.mjs"),
  bundle: true,
  platform: "node",
  format: "esm",
  target: "node20",
  logLevel: "warning",
  legalComments: "eof",
  plugins: [{
    name: "memsnap-externals",
    setup(b) {
      b.onResolve({ filter: /^[^./]/ }, (args) => (BUNDLED.test(args.path) ? undefined : { path: args.path, external: true }));
    },
  }],
})));
