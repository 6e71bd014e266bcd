#!/usr/bin/env node
// The README's first command: snapshot the built-in demo agent, inspect and verify the
// bundle (without and with the key), restore it, and show each command as it runs.
import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const bin = join(root, "bin", "memsnap.js");
const work = mkdtempSync(join(tmpdir(), "memsnap-demo-"));
const agent = join(work, "agent");
cpSync(join(root, "fixtures", "demo-agent"), agent, { recursive: true });

function run(args, { show = true } = {}) {
  const shown = args.map((a) => (a.startsWith(work) ? a.replace(work, "$DEMO") : a)).join(" ");
  if (show) process.stdout.write(`\n$ memsnap ${shown}\n`);
  const out = execFileSync(process.execPath, [bin, ...args], { cwd: work, encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
  if (show) process.stdout.write(out);
  return out;
}

process.stdout.write(`demo workspace: ${work} (shown as $DEMO)\n`);
const recipient = run(["keygen", "-o", join(work, "key.txt")]).trim();
run(["keygen", "--sign", "-o", join(work, "sign.key")]);
const out = run(["snapshot", "-c", join(agent, "memsnap.json"), "--store", join(work, "store"), "-r", recipient, "--sign-key", join(work, "sign.key"), "--label", "demo"]);
const snap = { path: /^\s+path\s+(.+)$/m.exec(out)[1] };
run(["inspect", snap.path]);
run(["verify", snap.path, "--trust", join(work, "sign.key.pub")]);
run(["verify", snap.path, "-i", join(work, "key.txt"), "--deep"]);
run(["restore", snap.path, "--to", join(work, "restored"), "-i", join(work, "key.txt")]);
const a = readFileSync(join(agent, "memory", "MEMORY.md"));
const b = readFileSync(join(work, "restored", "memory", "MEMORY.md"));
if (!a.equals(b)) throw new Error("restored MEMORY.md differs from the original");
process.stdout.write(`\nrestored files match the originals. Try: tar -tvf ${snap.path.replace(work, "$DEMO")}\n`);
