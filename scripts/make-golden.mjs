#!/usr/bin/env node
// Make the golden bundles for the CURRENT manifest_version from fixtures/demo-agent.
// Run once when a format version is introduced; never regenerate an older version's files.
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";
import { generateIdentity, identityFileText, MANIFEST_VERSION, parseConfig, snapshot, stripJsonComments } from "../dist/index.js";

const root = new URL("..", import.meta.url).pathname;
const agent = join(root, "fixtures", "demo-agent");
const out = join(root, "fixtures", "golden");
const v = `v${MANIFEST_VERSION}`;
if (existsSync(join(out, `${v}-plain.memsnap`)) && !process.argv.includes("--force")) {
  console.error(`golden bundles for ${v} exist; they are never regenerated (pass --force only while ${v} is unreleased)`);
  process.exit(2);
}
const raw = JSON.parse(stripJsonComments(readFileSync(join(agent, "memsnap.json"), "utf8")));
const config = parseConfig({ ...raw, redaction: { enabled: false } }, null, agent);
const { identity, recipient } = await generateIdentity();
writeFileSync(join(out, `${v}-age.key`), identityFileText(identity, recipient, new Date()), { mode: 0o600 });
for (const f of [`${v}-plain.memsnap`, `${v}-age.memsnap`]) {
  try { (await import("node:fs")).unlinkSync(join(out, f)); } catch {}
}
await snapshot({ config, out: join(out, `${v}-plain.memsnap`), label: "golden", createdBy: "api" });
await snapshot({ config, out: join(out, `${v}-age.memsnap`), recipients: [recipient], label: "golden", createdBy: "api" });
// Expected restored content: "<sha256>  <layer>/<path>" per artifact.
const lines = [];
for (const s of config.sources) {
  const base = join(agent, s.cfg.path);
  const walk = (d) => readdirSync(d).sort().flatMap((n) => statSync(join(d, n)).isDirectory() ? walk(join(d, n)) : [join(d, n)]);
  for (const f of walk(base)) {
    const rel = relative(base, f);
    if (s.cfg.kind === "files" && !rel.endsWith(".md")) continue;
    lines.push(`${createHash("sha256").update(readFileSync(f)).digest("hex")}  ${s.cfg.name}/${rel}`);
  }
}
writeFileSync(join(out, `${v}-files.sha256`), lines.join("\n") + "\n");
console.log(`wrote fixtures/golden/${v}-{plain,age}.memsnap, ${v}-age.key, ${v}-files.sha256`);
