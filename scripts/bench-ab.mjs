// bench-ab.mjs — two memsnap CLIs, alternating, on a mix directory: snapshot and restore --to, wall and CPU seconds.
// node scripts/bench-ab.mjs OLD/bin/memsnap.js NEW/bin/memsnap.js .bench/mix-0.1/data [RUNS]  (medians; the
// refactor check of #37: CPU time is less sensitive than wall time to other work on the machine)
// A/B: old vs new memsnap CLI, alternating, on the cached bench mix: snapshot and restore --to, wall and CPU.
import { timedRun, syncDisks } from "./lib/measure.mjs";
import { mixSources } from "./lib/mix-sources.mjs";
import fs from "node:fs"; import path from "node:path";
const [oldCli, newCli, mix, runs = "3"] = process.argv.slice(2);
const work = path.join(process.env.TMPDIR ?? "/tmp", `memsnap-ab-${process.pid}`); fs.rmSync(work, { recursive: true, force: true }); fs.mkdirSync(work, { recursive: true });
const key = path.join(work, "key.txt");
const kg = await timedRun([process.execPath, newCli, "keygen", "-o", key], { cwd: work, tmpDir: work, captureStdout: true });
const recipient = kg.stdout.match(/age1[0-9a-z]+/)[0];
fs.writeFileSync(path.join(work, "memsnap.json"), JSON.stringify({ tenant: "ab", agent: "ab", sources: mixSources(mix), recipients: [recipient], compression: { level: 3 } }));
const res = { old: { snap: [], snapCpu: [], rest: [], restCpu: [] }, new: { snap: [], snapCpu: [], rest: [], restCpu: [] } };
for (let i = 0; i < Number(runs); i++) {
  for (const who of i % 2 ? ["new", "old"] : ["old", "new"]) {
    const cli = who === "old" ? oldCli : newCli;
    const out = path.join(work, `b-${who}.memsnap`); fs.rmSync(out, { force: true });
    syncDisks();
    const s = await timedRun([process.execPath, cli, "snapshot", "-c", path.join(work, "memsnap.json"), "--out", out], { cwd: work, tmpDir: work });
    if (!s.ok) throw new Error(s.stderr);
    res[who].snap.push(s.seconds); res[who].snapCpu.push(s.cpuSeconds);
    const to = path.join(work, `r-${who}`); fs.rmSync(to, { recursive: true, force: true });
    syncDisks();
    const r = await timedRun([process.execPath, cli, "restore", out, "--to", to, "-i", key, "--layout", "layers"], { cwd: work, tmpDir: work });
    if (!r.ok) throw new Error(r.stderr);
    res[who].rest.push(r.seconds); res[who].restCpu.push(r.cpuSeconds);
    fs.rmSync(to, { recursive: true, force: true });
    console.error(who, s.seconds.toFixed(2), s.cpuSeconds?.toFixed(2), r.seconds.toFixed(2), r.cpuSeconds?.toFixed(2));
  }
}
const med = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
for (const k of ["snap", "snapCpu", "rest", "restCpu"]) console.log(k, "old", med(res.old[k]).toFixed(2), "new", med(res.new[k]).toFixed(2), "new/old", (med(res.new[k]) / med(res.old[k])).toFixed(3));
