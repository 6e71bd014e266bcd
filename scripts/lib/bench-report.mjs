/**
 * bench-report.mjs — renders a bench report (the object scripts/bench.mjs writes to
 * .bench/report.json) as a hand-written SVG chart, and keeps the README's benchmark block
 * (between `<!-- bench:start -->` and `<!-- bench:end -->`) up to date. Node built-ins only.
 *
 *   renderSvg(report)                         → SVG text: throughput per operation (memsnap vs
 *                                               the shell pipeline, MB/s), time ratio memsnap /
 *                                               pipeline with each target, memsnap RSS over time,
 *                                               and throughput per stage (when the report has it)
 *   readmeBlock(report, { svg, reproduce })   → the markdown between the markers
 *   replaceBlock(text, block)                 → README text with the block replaced (throws when
 *                                               the markers are missing)
 *   updateReadme(report, { root, … })         → writes docs/bench.svg and the README block
 */
import fs from "node:fs";
import path from "node:path";

export const README_START = "<!-- bench:start -->";
export const README_END = "<!-- bench:end -->";

const COLORS = {
  memsnap: "#2563eb",
  baseline: "#9ca3af",
  ok: "#16a34a",
  miss: "#ea580c",
  target: "#dc2626",
  grid: "#e5e7eb",
  axis: "#374151",
  text: "#111827",
  muted: "#6b7280",
};
const SERIES = ["#2563eb", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be123c"];
const FONT = "font-family=\"-apple-system, 'Segoe UI', Helvetica, Arial, sans-serif\"";

// A white outline behind small labels so lines under them do not strike them through.
const HALO = 'stroke="#ffffff" stroke-width="3" paint-order="stroke"';
const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
const r1 = (x) => Math.round(x * 10) / 10;
const fmtSize = (b) => (!Number.isFinite(b) ? "?" : b >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(2)} GiB` : `${(b / 2 ** 20).toFixed(1)} MiB`);

/** A "nice" axis maximum and step for values up to `max`. */
function niceAxis(max, ticks = 5) {
  if (!(max > 0) || !Number.isFinite(max)) return { top: 1, step: 0.2 };
  const raw = max / ticks;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? 10 * mag;
  return { top: Math.ceil(max / step - 1e-9) * step, step };
}

const fmtNum = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1).replace(/\.0$/, "") : v.toFixed(2).replace(/0$/, "").replace(/\.0$/, ""));

function text(x, y, s, { size = 12, anchor = "start", color = COLORS.text, weight = "normal", extra = "" } = {}) {
  return `<text x="${r1(x)}" y="${r1(y)}" font-size="${size}" text-anchor="${anchor}" fill="${color}"${weight !== "normal" ? ` font-weight="${weight}"` : ""}${extra ? ` ${extra}` : ""}>${esc(s)}</text>`;
}

/** Y axis with grid lines; returns [svg parts, y(v)]. */
function yAxis(x0, y0, w, h, top, step, label, fmt = fmtNum) {
  const parts = [];
  const y = (v) => y0 + h - (v / top) * h;
  for (let v = 0; v <= top + 1e-9; v += step) {
    parts.push(`<line x1="${r1(x0)}" y1="${r1(y(v))}" x2="${r1(x0 + w)}" y2="${r1(y(v))}" stroke="${COLORS.grid}" stroke-width="1"/>`);
    parts.push(text(x0 - 6, y(v) + 4, fmt(v), { size: 11, anchor: "end", color: COLORS.muted }));
  }
  parts.push(`<line x1="${r1(x0)}" y1="${r1(y0)}" x2="${r1(x0)}" y2="${r1(y0 + h)}" stroke="${COLORS.axis}" stroke-width="1"/>`);
  parts.push(`<line x1="${r1(x0)}" y1="${r1(y0 + h)}" x2="${r1(x0 + w)}" y2="${r1(y0 + h)}" stroke="${COLORS.axis}" stroke-width="1"/>`);
  parts.push(text(x0 - 44, y0 + h / 2, label, { size: 11, anchor: "middle", color: COLORS.muted, extra: `transform="rotate(-90 ${r1(x0 - 44)} ${r1(y0 + h / 2)})"` }));
  return [parts, y];
}

function panelTitle(x, y, title, sub) {
  const p = [text(x, y, title, { size: 14, weight: "600" })];
  if (sub) p.push(text(x, y + 16, sub, { size: 11, color: COLORS.muted }));
  return p;
}

function legend(x, y, items) {
  const p = [];
  let cx = x;
  for (const { label, color, dash } of items) {
    if (dash) p.push(`<line x1="${r1(cx)}" y1="${r1(y - 4)}" x2="${r1(cx + 16)}" y2="${r1(y - 4)}" stroke="${color}" stroke-width="2" stroke-dasharray="5 3"/>`);
    else p.push(`<rect x="${r1(cx)}" y="${r1(y - 10)}" width="12" height="12" rx="2" fill="${color}"/>`);
    p.push(text(cx + 20, y, label, { size: 11 }));
    cx += 34 + label.length * 6.6;
  }
  return p;
}

/** Throughput bars: per operation, memsnap vs baseline MB/s. */
/** An operation's name under its bars; a parenthesised qualifier ("snapshot (no redact)") goes on a second line. */
function opLabel(cx, y, op) {
  return op.split(/ (?=\()/).map((line, i) => text(cx, y + 13 * i, line, { size: 11, anchor: "middle" }));
}

function throughputPanel(rows, x, y, w, h, { title = "Throughput (MB/s, higher is better)", sub = "MB/s of the mix; verify (no key): of the bundle", baseline = "shell pipeline" } = {}) {
  const parts = panelTitle(x, y, title, sub);
  const px = x + 56;
  const py = y + 40;
  const pw = w - 66;
  const ph = h - 92;
  const vals = rows.flatMap((r) => [r.memsnap?.mbPerS, r.baseline?.mbPerS]).filter((v) => Number.isFinite(v));
  const { top, step } = niceAxis(Math.max(1, ...vals) * 1.12);
  const [axis, yv] = yAxis(px, py, pw, ph, top, step, "MB/s");
  parts.push(...axis);
  const gw = pw / Math.max(1, rows.length);
  const bw = Math.min(40, gw * 0.32);
  rows.forEach((r, i) => {
    const cx = px + gw * i + gw / 2;
    [["memsnap", r.memsnap?.mbPerS, -1], ["baseline", r.baseline?.mbPerS, 0]].forEach(([who, v, off]) => {
      const bx = cx + off * bw + (off === 0 ? 2 : -2);
      if (Number.isFinite(v)) {
        parts.push(`<rect x="${r1(bx)}" y="${r1(yv(v))}" width="${r1(bw)}" height="${r1(py + ph - yv(v))}" fill="${COLORS[who]}"><title>${esc(`${r.op}: ${who} ${fmtNum(v)} MB/s`)}</title></rect>`);
        parts.push(text(bx + bw / 2, yv(v) - 4, fmtNum(v), { size: 10, anchor: "middle", color: COLORS.muted, extra: HALO }));
      } else {
        parts.push(text(bx + bw / 2, py + ph - 4, "n/a", { size: 10, anchor: "middle", color: COLORS.muted }));
      }
    });
    parts.push(...opLabel(cx, py + ph + 16, r.op));
  });
  parts.push(...legend(px, y + h - 8, [{ label: "memsnap", color: COLORS.memsnap }, { label: baseline, color: COLORS.baseline }]));
  return parts;
}

/**
 * The stage rows (report.stages.rows, one per stage and class of data) folded into one bar pair
 * per stage: bytes over the summed time of all classes, for memsnap's engine and for the tool.
 */
export function stageBars(stageRows) {
  const by = new Map();
  for (const r of stageRows ?? []) {
    if (!r.bytes) continue;
    const b = by.get(r.stage) ?? { op: r.stage, tool: r.tool, m: [0, 0], t: [0, 0] };
    if (r.memsnap) { b.m[0] += r.bytes; b.m[1] += r.bytes / r.memsnap; }
    if (r.toolMBs) { b.t[0] += r.bytes; b.t[1] += r.bytes / r.toolMBs; }
    by.set(r.stage, b);
  }
  return [...by.values()].map((b) => ({
    op: `${b.op} (${b.tool})`,
    memsnap: { mbPerS: b.m[1] > 0 ? Math.round(b.m[0] / b.m[1]) : null },
    baseline: { mbPerS: b.t[1] > 0 ? Math.round(b.t[0] / b.t[1]) : null },
  }));
}

/** Ratio bars: memsnap time / pipeline time per operation, each with its target. */
function ratioPanel(rows, x, y, w, h) {
  const parts = panelTitle(x, y, "Time vs the pipeline (memsnap s / pipeline s)", "lower is better; dashed red: target, grey: parity (1.0×)");
  const px = x + 56;
  const py = y + 40;
  const pw = w - 66;
  const ph = h - 92;
  const vals = rows.flatMap((r) => [r.ratio, r.target?.maxTimeRatio]).filter((v) => Number.isFinite(v));
  const { top, step } = niceAxis(Math.max(1.2, ...vals) * 1.12);
  const [axis, yv] = yAxis(px, py, pw, ph, top, step, "ratio", (v) => `${fmtNum(v)}×`);
  parts.push(...axis);
  parts.push(`<line x1="${r1(px)}" y1="${r1(yv(1))}" x2="${r1(px + pw)}" y2="${r1(yv(1))}" stroke="${COLORS.baseline}" stroke-width="1.5"/>`);
  const gw = pw / Math.max(1, rows.length);
  const bw = Math.min(48, gw * 0.45);
  rows.forEach((r, i) => {
    const cx = px + gw * i + gw / 2;
    const t = r.target?.maxTimeRatio;
    if (Number.isFinite(r.ratio)) {
      const ok = !Number.isFinite(t) || r.ratio <= t;
      parts.push(`<rect x="${r1(cx - bw / 2)}" y="${r1(yv(r.ratio))}" width="${r1(bw)}" height="${r1(py + ph - yv(r.ratio))}" fill="${ok ? COLORS.ok : COLORS.miss}"><title>${esc(`${r.op}: ${r.ratio.toFixed(2)}×${Number.isFinite(t) ? ` (target ≤ ${t}×)` : ""}`)}</title></rect>`);
      parts.push(text(cx, yv(r.ratio) - 4, `${r.ratio.toFixed(2)}×`, { size: 10, anchor: "middle", color: COLORS.muted, extra: HALO }));
    } else {
      parts.push(text(cx, py + ph - 4, "n/a", { size: 10, anchor: "middle", color: COLORS.muted }));
    }
    if (Number.isFinite(t)) {
      parts.push(`<line x1="${r1(cx - gw * 0.42)}" y1="${r1(yv(t))}" x2="${r1(cx + gw * 0.42)}" y2="${r1(yv(t))}" stroke="${COLORS.target}" stroke-width="2" stroke-dasharray="5 3"/>`);
      // beside the bar, above the line
      parts.push(text(cx + bw / 2 + 3, yv(t) - 4, `≤ ${t}×`, { size: 9, color: COLORS.target, extra: HALO }));
    }
    parts.push(...opLabel(cx, py + ph + 16, r.op));
  });
  parts.push(...legend(px, y + h - 8, [{ label: "within target", color: COLORS.ok }, { label: "over target", color: COLORS.miss }, { label: "target", color: COLORS.target, dash: true }]));
  return parts;
}

/** Lines: memsnap RSS over time, one per run, with the RSS target. */
function rssPanel(report, x, y, w, h) {
  const series = Object.entries(report.rss ?? {}).filter(([, v]) => v?.samples?.length);
  const interval = series[0]?.[1]?.intervalMs ?? 50;
  const parts = panelTitle(x, y, "memsnap RSS over time (MiB)", `summed VmRSS of the memsnap process tree, sampled every ${interval} ms; peak in the legend from /usr/bin/time`);
  const px = x + 56;
  const py = y + 40;
  const pw = w - 66;
  const ph = h - 92;
  const targetMiB = report.targets?.maxRssMiB ?? null;
  const maxT = Math.max(0.1, ...series.flatMap(([, v]) => v.samples.map((s) => s[0])));
  const maxMiB = Math.max(16, targetMiB ?? 0, ...series.flatMap(([, v]) => v.samples.map((s) => s[1] / 1024)), ...series.map(([, v]) => (v.peakKiB ?? 0) / 1024));
  const { top, step } = niceAxis(maxMiB * 1.08);
  const [axis, yv] = yAxis(px, py, pw, ph, top, step, "MiB");
  parts.push(...axis);
  const tx = niceAxis(maxT, 8);
  const xv = (t) => px + (t / tx.top) * pw;
  for (let t = 0; t <= tx.top + 1e-9; t += tx.step) {
    parts.push(`<line x1="${r1(xv(t))}" y1="${r1(py + ph)}" x2="${r1(xv(t))}" y2="${r1(py + ph + 4)}" stroke="${COLORS.axis}" stroke-width="1"/>`);
    parts.push(text(xv(t), py + ph + 16, `${fmtNum(t)} s`, { size: 10, anchor: "middle", color: COLORS.muted }));
  }
  if (targetMiB) {
    parts.push(`<line x1="${r1(px)}" y1="${r1(yv(targetMiB))}" x2="${r1(px + pw)}" y2="${r1(yv(targetMiB))}" stroke="${COLORS.target}" stroke-width="1.5" stroke-dasharray="5 3"/>`);
    parts.push(text(px + pw - 4, yv(targetMiB) - 6, `target ≤ ${targetMiB} MiB`, { size: 10, anchor: "end", color: COLORS.target, extra: HALO }));
  }
  const items = [];
  series.forEach(([name, v], i) => {
    const color = SERIES[i % SERIES.length];
    const pts = v.samples.map(([t, kib]) => `${r1(xv(t))},${r1(yv(kib / 1024))}`).join(" ");
    parts.push(`<polyline points="${pts}" fill="none" stroke="${color}" stroke-width="1.8" stroke-linejoin="round"><title>${esc(name)}</title></polyline>`);
    const peak = v.peakKiB ?? v.sampledPeakKiB;
    items.push({ label: `${name}${peak ? ` (peak ${fmtNum(peak / 1024)} MiB)` : ""}`, color });
  });
  if (!series.length) parts.push(text(px + pw / 2, py + ph / 2, "no memsnap runs sampled", { size: 12, anchor: "middle", color: COLORS.muted }));
  parts.push(...legend(px, y + h - 8, items));
  return parts;
}

/** The whole chart as SVG text. */
export function renderSvg(report) {
  const W = 980;
  const stages = stageBars(report.stages?.rows);
  const H = stages.length ? 1130 : 780;
  const rows = report.rows ?? [];
  const mix = report.mix ?? {};
  const m = report.machine ?? {};
  const gib = fmtSize(mix.bytes);
  const parts = [];
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" ${FONT}>`);
  parts.push(`<title>memsnap benchmark, scale ${esc(report.params?.scale)}</title>`);
  parts.push(`<rect x="0" y="0" width="${W}" height="${H}" fill="#ffffff"/>`);
  parts.push(text(20, 28, `memsnap vs tar | zstd -3 -T2 | age — scale ${report.params?.scale} (${gib}, ${mix.files ?? "?"} files), seed ${report.params?.seed}`, { size: 16, weight: "600" }));
  parts.push(text(20, 46, `${m.nproc ?? "?"} CPUs (${m.cpu ?? "?"}), ${m.memGiB ?? "?"} GiB RAM, node ${m.node ?? "?"}; ${report.params?.runs ?? 1} run(s) per command (median); ${report.date ?? ""}`, { size: 11, color: COLORS.muted }));
  // Rows measured against memsnap's own full snapshot (the incremental ones) are in the table, not in the panels against the pipeline.
  const vsPipeline = rows.filter((r) => !r.vsSelf);
  parts.push(...throughputPanel(vsPipeline, 20, 80, 470, 330));
  parts.push(...ratioPanel(vsPipeline, 500, 80, 470, 330));
  parts.push(...rssPanel(report, 20, 440, 950, 330));
  if (stages.length) {
    parts.push(...throughputPanel(stages, 20, 800, 950, 320, {
      title: "Throughput per stage (MB/s, one thread, higher is better)",
      sub: "each stage alone over samples of the mix's text, SQLite and KV bytes; grey: the tool that does the stage in the pipeline",
      baseline: "pipeline tool",
    }));
  }
  parts.push("</svg>");
  return parts.join("\n") + "\n";
}

/**
 * The README block: the report's table, the chart, and the command that reproduces it.
 * @param {object} report      the report.json object
 * @param {{svg: string, reproduce: string, table: string}} o   svg: path the README links to
 */
export function readmeBlock(report, { svg, reproduce, table }) {
  const m = report.machine ?? {};
  const mix = report.mix ?? {};
  const lines = [];
  lines.push(`Scale ${report.params?.scale} (${fmtSize(mix.bytes)}, ${mix.files ?? "?"} files, seed ${report.params?.seed}) on ${m.nproc ?? "?"} CPUs (${m.cpu ?? "?"}), ${m.memGiB ?? "?"} GiB RAM, node ${m.node ?? "?"}, ${String(report.date ?? "").slice(0, 10)}; page cache ${String(report.params?.cache ?? "warm").split(" ")[0]}, ${report.params?.runs ?? 1} run(s) per command (median):`);
  lines.push("");
  lines.push(table);
  lines.push("");
  const rc = report.restoreCheck?.memsnap;
  if (rc?.layers) {
    lines.push(`Restore check (memsnap, per layer): ${rc.layers.map((l) => `${l.name} (${l.kind}) ${l.ok ? "ok" : l.ok === false ? "MISMATCH" : "n/a"}`).join(", ")}.`);
    lines.push("");
  }
  lines.push(`![memsnap benchmark: throughput, time ratio and RSS](${svg})`);
  lines.push("");
  if (report.stages?.markdown) {
    lines.push(report.stages.intro);
    lines.push("");
    lines.push(report.stages.markdown);
    lines.push("");
  }
  lines.push("Reproduce:");
  lines.push("");
  lines.push("```sh");
  lines.push(reproduce);
  lines.push("```");
  return lines.join("\n");
}

/** `text` with everything between the README markers replaced by `block`. */
export function replaceBlock(text, block) {
  const a = text.indexOf(README_START);
  const b = text.indexOf(README_END);
  if (a < 0 || b < 0 || b < a) throw new Error(`README has no ${README_START} … ${README_END} block`);
  return `${text.slice(0, a + README_START.length)}\n${block}\n${text.slice(b)}`;
}

/**
 * Copies the chart to `svgOut` (default ROOT/docs/bench.svg; rendered from the report when no
 * `svgFrom` is given) and replaces the README block (default ROOT/README.md) with the table,
 * the chart and the reproduce command. Returns the paths written.
 */
export function updateReadme(report, { root, readme = path.join(root, "README.md"), svgOut = path.join(root, "docs", "bench.svg"), svgFrom = null } = {}) {
  if (!report?.table?.markdown) throw new Error("the report has no table (written by an older bench.mjs?): rerun scripts/bench.mjs --report");
  const text = fs.readFileSync(readme, "utf8");
  const svgText = svgFrom ? fs.readFileSync(svgFrom, "utf8") : renderSvg(report);
  const svgRel = path.relative(path.dirname(readme), svgOut).split(path.sep).join("/");
  const reproduce = report.reproduce ?? `node scripts/bench.mjs --scale ${report.params?.scale} --seed ${report.params?.seed} --report`;
  const next = replaceBlock(text, readmeBlock(report, { svg: svgRel, reproduce: `${reproduce}   # add --readme to refresh this block`, table: report.table.markdown }));
  fs.mkdirSync(path.dirname(svgOut), { recursive: true });
  fs.writeFileSync(svgOut, svgText);
  fs.writeFileSync(readme, next);
  return { readme, svg: svgOut };
}
