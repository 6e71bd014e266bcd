#!/usr/bin/env node
// Make the golden bundles for the CURRENT manifest_version from fixtures/demo-agent.
// Run once when a format version is introduced; never regenerate an older version's files.
// Version 2 is the incremental bundle: v2-{plain,age}.memsnap each reference artifacts of a
// base, kept beside them as fixtures/golden/<base id>.memsnap (where a restore looks for it).
// Version 3 is a plaintext bundle whose manifest leaves the index out (written for more than
// MANIFEST_INDEX_MAX artifacts; here for the demo agent's few, by lowering the limit to 0):
// v3-plain.memsnap only, since an encrypted manifest never held the index.
import { createHash } from "node:crypto";
import { copyFileSync, cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { generateIdentity, identityFileText, MANIFEST_VERSION, parseConfig, snapshot } from "../dist/index.js";
import { stripJsonComments } from "../dist/config.js";

const root = new URL("..", import.meta.url).pathname;
const agent = join(root, "fixtures", "demo-agent");
const out = join(root, "fixtures", "golden");
const v = `v${MANIFEST_VERSION}`;
if (existsSync(join(out, `${v}-plain.memsnap`)) && !process.argv.includes("--force")) {
  console.error(`golden bundles for ${v} exist; they are never regenerated (pass --force only while ${v} is unreleased)`);
  process.exit(2);
}
const raw = JSON.parse(stripJsonComments(readFileSync(join(agent, "memsnap.json"), "utf8")));
const { identity, recipient } = await generateIdentity();
if (MANIFEST_VERSION !== 3) writeFileSync(join(out, `${v}-age.key`), identityFileText(identity, recipient, new Date()), { mode: 0o600 });
for (const f of [`${v}-plain.memsnap`, `${v}-age.memsnap`]) {
  try { (await import("node:fs")).unlinkSync(join(out, f)); } catch {}
}
let src = agent;
if (MANIFEST_VERSION === 2) {
  // A copy of the demo agent: an incremental snapshot of it, one file edited, a second one.
  src = mkdtempSync(join(tmpdir(), "memsnap-golden-"));
  cpSync(agent, src, { recursive: true });
  const config = parseConfig({ ...raw, redaction: { enabled: false } }, null, src);
  const store = join(src, ".store");
  for (const [kind, recipients] of [["plain", []], ["age", [recipient]]]) {
    rmSync(join(src, ".memsnap"), { recursive: true, force: true });
    const base = await snapshot({ config, store, recipients, label: "golden base", createdBy: "api", incremental: true });
    writeFileSync(join(src, "memory", "MEMORY.md"), readFileSync(join(agent, "memory", "MEMORY.md"), "utf8") + "- golden v2: this line is in the incremental bundle\n");
    const child = await snapshot({ config, store, recipients, label: "golden", createdBy: "api", incremental: true });
    if (child.manifest.manifest_version !== 2 || !child.incremental?.referenced) throw new Error("the second snapshot referenced nothing");
    copyFileSync(base.path, join(out, `${base.id}.memsnap`));
    copyFileSync(child.path, join(out, `${v}-${kind}.memsnap`));
    writeFileSync(join(src, "memory", "MEMORY.md"), readFileSync(join(agent, "memory", "MEMORY.md"))); // back, for the next pair
  }
  writeFileSync(join(src, "memory", "MEMORY.md"), readFileSync(join(agent, "memory", "MEMORY.md"), "utf8") + "- golden v2: this line is in the incremental bundle\n");
} else if (MANIFEST_VERSION === 3) {
  const config = parseConfig({ ...raw, redaction: { enabled: false } }, null, agent);
  const r = await snapshot({ config, out: join(out, `${v}-plain.memsnap`), label: "golden", createdBy: "api", manifestIndexMax: 0 });
  if (r.manifest.manifest_version !== 3 || r.manifest.index !== undefined) throw new Error("the v3 golden bundle's manifest lists its index");
} else {
  const config = parseConfig({ ...raw, redaction: { enabled: false } }, null, agent);
  await snapshot({ config, out: join(out, `${v}-plain.memsnap`), label: "golden", createdBy: "api" });
  await snapshot({ config, out: join(out, `${v}-age.memsnap`), recipients: [recipient], label: "golden", createdBy: "api" });
}
const config = parseConfig({ ...raw, redaction: { enabled: false } }, null, src);
// Expected restored content: "<sha256>  <layer>/<path>" per artifact.
const lines = [];
for (const s of config.sources) {
  const base = join(src, s.cfg.path);
  const walk = (d) => readdirSync(d).sort().flatMap((n) => statSync(join(d, n)).isDirectory() ? walk(join(d, n)) : [join(d, n)]);
  for (const f of walk(base)) {
    const rel = relative(base, f);
    if (s.cfg.kind === "files" && !rel.endsWith(".md")) continue;
    lines.push(`${createHash("sha256").update(readFileSync(f)).digest("hex")}  ${s.cfg.name}/${rel}`);
  }
}
writeFileSync(join(out, `${v}-files.sha256`), lines.join("\n") + "\n");
if (src !== agent) rmSync(src, { recursive: true, force: true });
console.log(`wrote fixtures/golden/${v}-${MANIFEST_VERSION === 3 ? "plain.memsnap" : "{plain,age}.memsnap, ${v}-age.key"}, ${v}-files.sha256${src !== agent ? " and the bases beside them" : ""}`);
