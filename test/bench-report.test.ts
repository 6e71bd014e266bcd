/**
 * The benchmark's report helpers (scripts/lib/bench-report.mjs): the stage rows folded into one
 * bar pair per stage, and the README block carrying the stage table when a report has one.
 */
import { describe, expect, it } from "vitest";
import { readmeBlock, renderSvg, stageBars } from "../scripts/lib/bench-report.mjs";

const MB = 1e6;

describe("throughput per stage in the bench report", () => {
  it("folds a stage's classes into bytes over summed time, for memsnap and for the tool apart", () => {
    const bars = stageBars([
      // 100 MB at 100 MB/s (1 s) and 100 MB at 300 MB/s (1/3 s): 200 MB in 4/3 s = 150 MB/s
      { stage: "zstd", tool: "zstd -3 -T1", bytes: 100 * MB, memsnap: 100, toolMBs: 50 },
      { stage: "zstd", tool: "zstd -3 -T1", bytes: 100 * MB, memsnap: 300, toolMBs: 50 },
      { stage: "sha256", tool: "sha256sum", bytes: 10 * MB, memsnap: 2000, toolMBs: null },
      // no byte count (the redaction row): not a bar
      { stage: "redaction", tool: "—", bytes: null, memsnap: 250, toolMBs: null },
    ]);
    expect(bars).toEqual([
      { op: "zstd (zstd -3 -T1)", memsnap: { mbPerS: 150 }, baseline: { mbPerS: 50 } },
      { op: "sha256 (sha256sum)", memsnap: { mbPerS: 2000 }, baseline: { mbPerS: null } },
    ]);
  });

  it("the chart gains the stage panel and the README block the stage table only when the report has stages", () => {
    const base = { params: { scale: 1, seed: 1, runs: 1 }, mix: { bytes: 2 ** 30, files: 3 }, machine: {}, rows: [] };
    const withStages = {
      ...base,
      stages: { intro: "Throughput per stage: test", markdown: "| stage |\n| --- |\n| zstd |", rows: [{ stage: "zstd", tool: "zstd -3 -T1", bytes: MB, memsnap: 100, toolMBs: 50 }] },
    };
    expect(renderSvg(base)).not.toContain("Throughput per stage");
    const svg = renderSvg(withStages);
    expect(svg).toContain("Throughput per stage");
    expect(svg).toContain('height="1130"');
    const block = readmeBlock(withStages, { svg: "docs/bench.svg", reproduce: "node scripts/bench.mjs", table: "| op |" });
    expect(block).toContain("Throughput per stage: test");
    expect(block).toContain("| zstd |");
    expect(readmeBlock(base, { svg: "docs/bench.svg", reproduce: "x", table: "| op |" })).not.toContain("Throughput per stage");
  });

  it("rows measured against memsnap's own full snapshot (incremental) stay out of the panels against the pipeline", () => {
    const row = (op: string, extra: Record<string, unknown> = {}) => ({
      op, ratio: 0.5, status: "ok", target: { maxTimeRatio: null }, throughputBytes: MB, memsnap: { ok: true, seconds: 1, mbPerS: 1 }, baseline: { ok: true, seconds: 2, mbPerS: 0.5 }, ...extra,
    });
    const report = { params: { scale: 1, seed: 1, runs: 1 }, mix: { bytes: 2 ** 30, files: 3 }, machine: {}, rows: [row("snapshot"), row("incremental snapshot", { vsSelf: true })] };
    const svg = renderSvg(report);
    expect(svg).toContain(">snapshot<");
    expect(svg).not.toContain("incremental");
  });
});
