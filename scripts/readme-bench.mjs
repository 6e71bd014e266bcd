#!/usr/bin/env node
/**
 * readme-bench.mjs — puts a bench report into README.md without rerunning the bench.
 *
 *   node scripts/readme-bench.mjs [--report FILE] [--readme FILE] [--svg-out FILE]
 *
 *   --report FILE   the report.json that `scripts/bench.mjs --report` wrote (default .bench/report.json)
 *   --readme FILE   the README whose <!-- bench:start --> … <!-- bench:end --> block is replaced
 *                   (default README.md)
 *   --svg-out FILE  where the chart goes (default docs/bench.svg; the README links to it
 *                   relatively); it is copied from report.svg beside the report, or rendered
 *                   from the report when that is absent
 *
 * `scripts/bench.mjs --readme` does the same at the end of a run.
 */
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { updateReadme } from "./lib/bench-report.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

function main(argv) {
  const o = { report: path.join(ROOT, ".bench", "report.json"), readme: path.join(ROOT, "README.md"), svgOut: path.join(ROOT, "docs", "bench.svg") };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const val = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return path.resolve(argv[++i]);
    };
    if (a === "--report") o.report = val();
    else if (a === "--readme") o.readme = val();
    else if (a === "--svg-out") o.svgOut = val();
    else if (a === "-h" || a === "--help") {
      const doc = fs.readFileSync(fileURLToPath(import.meta.url), "utf8").split("\n");
      console.log(doc.slice(2, doc.indexOf(" */")).map((l) => l.replace(/^ \* ?/, "")).join("\n"));
      return 0;
    } else throw new Error(`unknown argument ${a}`);
  }
  const report = JSON.parse(fs.readFileSync(o.report, "utf8"));
  const svgFrom = path.join(path.dirname(o.report), "report.svg");
  const r = updateReadme(report, { root: ROOT, readme: o.readme, svgOut: o.svgOut, svgFrom: fs.existsSync(svgFrom) ? svgFrom : null });
  console.error(`readme-bench: updated ${path.relative(process.cwd(), r.readme) || r.readme} and ${path.relative(process.cwd(), r.svg) || r.svg} from ${path.relative(process.cwd(), o.report)}`);
  return 0;
}

try {
  process.exit(main(process.argv.slice(2)));
} catch (e) {
  console.error(`readme-bench: ${e.message}`);
  process.exit(e.message.startsWith("unknown argument") || e.message.includes("needs a value") ? 2 : 1);
}
