/**
 * Every module of dist/ that a script or test names exists (`npm test` builds first). The bench's
 * per-stage table imported dist/pipeline/levels.js for months after the restructure (#37) moved
 * it to dist/snapshot/, and the bench only noted "stage measure failed".
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";

const ROOT = join(import.meta.dirname, "..");

function files(dir: string, out: string[] = []): string[] {
  for (const e of readdirSync(dir)) {
    const p = join(dir, e);
    if (statSync(p).isDirectory()) {
      if (e !== "node_modules" && e !== "fixtures") files(p, out);
    } else if (/\.(mjs|js|ts)$/.test(e)) out.push(p);
  }
  return out;
}

/** dist paths in `text`: "…/dist/a/b.js" literals, and path.join(…, "dist", "a", "b.js") calls. */
function distPaths(text: string): string[] {
  const out = new Set<string>();
  for (const m of text.matchAll(/["'`](?:\.\.?\/)*(?:\.\.\/)*dist\/([\w./-]+\.js)["'`]/g)) out.add(`dist/${m[1]}`);
  for (const m of text.matchAll(/"dist"((?:\s*,\s*"[\w.-]+")+)/g)) {
    const parts = [...m[1]!.matchAll(/"([\w.-]+)"/g)].map((x) => x[1]);
    if (parts.at(-1)!.endsWith(".js")) out.add(["dist", ...parts].join("/"));
  }
  return [...out];
}

describe("scripts and tests import dist modules that exist", () => {
  it("finds both spellings", () => {
    expect(distPaths(`import x from "../../dist/format/manifest.js"; path.join(root, "dist", "snapshot", "levels.js")`)).toEqual([
      "dist/format/manifest.js",
      "dist/snapshot/levels.js",
    ]);
  });

  it("every one is built", () => {
    const missing: string[] = [];
    let seen = 0;
    for (const f of [...files(join(ROOT, "scripts")), ...files(join(ROOT, "test"))]) {
      if (f === import.meta.filename) continue;
      for (const p of distPaths(readFileSync(f, "utf8"))) {
        seen++;
        if (!existsSync(join(ROOT, p))) missing.push(`${relative(ROOT, f)}: ${p}`);
      }
    }
    expect(seen).toBeGreaterThan(10);
    expect(missing).toEqual([]);
  });
});
