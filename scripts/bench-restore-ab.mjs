// bench-restore-ab.mjs — two memsnap CLIs' `restore --to`, alternating, on one bundle of a mix: wall and CPU seconds.
//   node scripts/bench-restore-ab.mjs OLD/bin/memsnap.js NEW/bin/memsnap.js MIX_DIR [RUNS]
// The bundle is written once (by NEW, age-encrypted), then each run restores it with OLD and with NEW, in
// alternating order. Medians; CPU seconds are less sensitive than wall time to other work on the machine.
// (#38: the keyed restore without the SHA-256 of the stored bytes, read/read-payload.ts `skipStoredHash`.)
import { timedRun, syncDisks, machineInfo } from "./lib/measure.mjs";
import { mixSources } from "./lib/mix-sources.mjs";
import fs from "node:fs";
import path from "node:path";

const [oldCli, newCli, mix, runs = "5"] = process.argv.slice(2);
if (!oldCli || !newCli || !mix) throw new Error("usage: bench-restore-ab.mjs OLD_CLI NEW_CLI MIX_DIR [RUNS]");
const work = path.join(process.env.TMPDIR ?? "/tmp", `memsnap-rab-${process.pid}`);
fs.rmSync(work, { recursive: true, force: true });
fs.mkdirSync(work, { recursive: true });
const key = path.join(work, "key.txt");
const kg = await timedRun([process.execPath, newCli, "keygen", "-o", key], { cwd: work, tmpDir: work, captureStdout: true });
const recipient = kg.stdout.match(/age1[0-9a-z]+/)[0];
const cfg = { tenant: "ab", agent: "ab", sources: mixSources(mix), recipients: [recipient], compression: { level: 3 } };
fs.writeFileSync(path.join(work, "memsnap.json"), JSON.stringify(cfg));
const bundle = path.join(work, "b.memsnap");
const s = await timedRun([process.execPath, newCli, "snapshot", "-c", path.join(work, "memsnap.json"), "--out", bundle], { cwd: work, tmpDir: work });
if (!s.ok) throw new Error(s.stderr);
const res = { old: { wall: [], cpu: [] }, new: { wall: [], cpu: [] } };
for (let i = 0; i < Number(runs); i++) {
  for (const who of i % 2 ? ["new", "old"] : ["old", "new"]) {
    const to = path.join(work, `r-${who}`);
    fs.rmSync(to, { recursive: true, force: true });
    syncDisks();
    const argv = [process.execPath, who === "old" ? oldCli : newCli, "restore", bundle, "--to", to, "--layout", "layers"];
    const r = await timedRun([...argv, "-i", key], { cwd: work, tmpDir: work });
    if (!r.ok) throw new Error(r.stderr);
    res[who].wall.push(r.seconds);
    res[who].cpu.push(r.cpuSeconds);
    fs.rmSync(to, { recursive: true, force: true });
    console.error(who, r.seconds.toFixed(3), r.cpuSeconds?.toFixed(3));
  }
}
const med = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const m = machineInfo();
console.log(`bundle ${(fs.statSync(bundle).size / 1e6).toFixed(1)} MB (age-encrypted); ${runs} runs each`);
for (const k of ["wall", "cpu"]) {
  console.log(`restore ${k} s: old ${med(res.old[k]).toFixed(3)} new ${med(res.new[k]).toFixed(3)} new/old ${(med(res.new[k]) / med(res.old[k])).toFixed(3)}`);
}
const sha = /\bsha_ni\b/.test(fs.existsSync("/proc/cpuinfo") ? fs.readFileSync("/proc/cpuinfo", "utf8") : "");
console.log(`CPU: ${m.cpu} (${m.nproc} cores; SHA extensions: ${sha ? "yes" : "no"})`);
fs.rmSync(work, { recursive: true, force: true });
