/**
 * What every command loads at start-up: the CLI bundle and the chunks it imports statically. The AWS SDK
 * (~0.2 s of CPU to load; bundled into a chunk of its own by scripts/bundle-cli.mjs) must be reached only
 * through a dynamic import, when an s3 store is used.
 */
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const CLI = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "dist", "cli");

/** The files the bundle's entry loads before it runs, and the packages they import. */
function staticGraph(): { files: string[]; packages: Set<string> } {
  const files: string[] = [];
  const packages = new Set<string>();
  const todo = ["memsnap.mjs"];
  while (todo.length) {
    const f = todo.pop()!;
    if (files.includes(f)) continue;
    files.push(f);
    const text = readFileSync(join(CLI, f), "utf8");
    for (const m of text.matchAll(/(?:^|[;\n])\s*(?:import|export)\s*(?:[^"'();]*?\sfrom\s*)?["']([^"']+)["']/g)) {
      const spec = m[1]!;
      if (spec.startsWith("./")) todo.push(spec.slice(2));
      else packages.add(spec);
    }
  }
  return { files, packages };
}

describe("CLI start-up", () => {
  it("does not load the AWS SDK unless an s3 store is used", () => {
    const { files, packages } = staticGraph();
    expect(files.length).toBeGreaterThan(0);
    expect(packages.has("commander")).toBe(true); // the walk sees the bundle's static imports
    expect([...packages].filter((p) => p.startsWith("@aws-sdk/") || p.startsWith("@smithy/"))).toEqual([]);
    // Bundled, the SDK is code in a chunk (esbuild names each module it took in a comment): in none loaded at start.
    const sdk = (f: string): boolean => readFileSync(join(CLI, f), "utf8").includes("node_modules/@aws-sdk/client-s3/");
    expect(readdirSync(CLI).filter((f) => f.endsWith(".mjs") && sdk(f)).length).toBeGreaterThan(0);
    expect(files.filter(sdk)).toEqual([]);
  });
});
