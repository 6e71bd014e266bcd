/**
 * The layers only point down: every import in src/ goes to its own folder or to a lower layer, and no
 * set of modules imports itself in a cycle (type-only imports count: they are part of the design too).
 */
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const SRC = join(dirname(fileURLToPath(import.meta.url)), "..", "src");

/** Layers, lowest first; a unit is a folder of src/ or a top-level module. */
export const LAYERS: string[][] = [
  ["errors", "version"],
  ["util"],
  ["objstore"],
  ["codecs"],
  ["format"],
  ["redact"],
  ["sources"],
  ["hooks", "keys"],
  ["config", "sign"],
  ["agent"],
  ["read"],
  ["store"],
  ["snapshot", "browse"],
  ["restore"],
  ["verify"],
  ["init", "schedule"],
  ["index"],
  ["cli"],
];
const rank = new Map(LAYERS.flatMap((units, i) => units.map((u) => [u, i] as const)));

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(join(dir, e.name)) : e.name.endsWith(".ts") ? [join(dir, e.name)] : []);
}
const unitOf = (file: string): string => relative(SRC, file).split(sep)[0]!.replace(/\.ts$/, "");

/** Every relative import and re-export of each module, resolved to a file under src/. */
function imports(): Map<string, string[]> {
  const out = new Map<string, string[]>();
  for (const f of sources(SRC)) {
    const text = readFileSync(f, "utf8");
    const specs = [...text.matchAll(/(?:^|\n)\s*(?:import|export)\b[^;]*?\bfrom\s*"(\.{1,2}\/[^"]+)"/g)].map((m) => m[1]!);
    specs.push(...[...text.matchAll(/\bimport\(\s*"(\.{1,2}\/[^"]+)"\s*\)/g)].map((m) => m[1]!));
    out.set(f, specs.map((s) => normalize(join(dirname(f), s)).replace(/\.js$/, ".ts")));
  }
  return out;
}

describe("layers", () => {
  const graph = imports();

  it("knows every unit of src/", () => {
    const units = new Set([...graph.keys()].map(unitOf));
    expect([...units].filter((u) => !rank.has(u))).toEqual([]);
    expect(units.size).toBeGreaterThan(10);
  });

  it("only imports its own unit or a lower layer", () => {
    const up: string[] = [];
    for (const [f, targets] of graph) {
      for (const t of targets) {
        const a = unitOf(f), b = unitOf(t);
        if (a !== b && !(rank.get(b)! < rank.get(a)!)) up.push(`${relative(SRC, f)} -> ${relative(SRC, t)}`);
      }
    }
    expect(up).toEqual([]);
  });

  it("has no import cycle", () => {
    // Tarjan's strongly connected components, iterative (no recursion on a deep graph).
    const index = new Map<string, number>(), low = new Map<string, number>(), onStack = new Set<string>();
    const stack: string[] = [], cycles: string[][] = [];
    let next = 0;
    for (const root of graph.keys()) {
      if (index.has(root)) continue;
      const work: [string, number][] = [[root, 0]];
      while (work.length) {
        const top = work[work.length - 1]!;
        const [v, i] = top;
        if (i === 0 && !index.has(v)) {
          index.set(v, next); low.set(v, next++); stack.push(v); onStack.add(v);
        }
        const succ = (graph.get(v) ?? []).filter((w) => graph.has(w));
        if (i < succ.length) {
          top[1]++;
          const w = succ[i]!;
          if (!index.has(w)) work.push([w, 0]);
          else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
          continue;
        }
        work.pop();
        if (work.length) { const p = work[work.length - 1]![0]; low.set(p, Math.min(low.get(p)!, low.get(v)!)); }
        if (low.get(v) === index.get(v)) {
          const scc: string[] = [];
          let w: string;
          do { w = stack.pop()!; onStack.delete(w); scc.push(relative(SRC, w)); } while (w !== v);
          if (scc.length > 1 || (graph.get(v) ?? []).includes(v)) cycles.push(scc.sort());
        }
      }
    }
    expect(cycles).toEqual([]);
  });
});
