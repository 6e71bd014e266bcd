#!/usr/bin/env node
// Build the hostile bundles in fixtures/hostile/ (run after `npm run build`). Each is a valid
// container with a sealed manifest whose payload hash matches, so only the payload's content
// is hostile: restore must refuse each with an unsafe-bundle code before writing outside staging.
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { compress } from "zstd-napi";
import { bundle as build, container, header, pad, sha, tarOf } from "./lib/hostile-bundle.mjs";
import { encodeHeader as containerHeader } from "../dist/format/tar-header.js";

const out = new URL("../fixtures/hostile/", import.meta.url).pathname;
const groupsDir = new URL("./hostile/", import.meta.url).pathname;
/** Every case written: {file, exit, code, check, key?, note?}; saved as fixtures/hostile/cases.json. */
const cases = [];
function bundle(file, entries, opts) {
  writeFileSync(join(out, file), build(entries, opts));
}

// Keep the victim's key (fixtures/hostile/victim.key): encrypted cases are made for it.
const victimKey = readFileSync(join(out, "victim.key"));
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
writeFileSync(join(out, "victim.key"), victimKey, { mode: 0o600 });
const ok = { name: "memory/ok.md", data: "harmless\n" };
bundle("absolute-path.memsnap", [ok, { name: "/tmp/memsnap-hostile-abs/evil", data: "pwned\n" }]);
bundle("dotdot.memsnap", [ok, { name: "memory/../../memsnap-hostile-dotdot", data: "pwned\n" }]);
bundle("symlink-then-write.memsnap", [ok, { name: "memory/link", type: "2", link: "/tmp" }, { name: "memory/link/memsnap-hostile-through-link", data: "pwned\n" }]);
bundle("symlink-outside.memsnap", [ok, { name: "memory/escape", type: "2", link: "../../../../etc" }]);
bundle("hardlink-outside.memsnap", [ok, { name: "memory/passwd", type: "1", link: "/etc/passwd" }]);
bundle("device-node.memsnap", [ok, { name: "memory/tty", type: "3" }]);
bundle("fifo.memsnap", [ok, { name: "memory/pipe", type: "6" }]);
bundle("duplicate-path.memsnap", [ok, { name: "memory/ok.md", data: "second copy\n" }]);
bundle("longer-than-declared.memsnap", [ok, { name: "memory/big.md", data: "x".repeat(4096) }], { indexSizes: { "memory/big.md": 16 } });
bundle("unknown-layer.memsnap", [ok, { name: "elsewhere/evil", data: "pwned\n" }]);
// A KV layer whose artifacts include the name restore uses for its page spool.
bundle("kv-spool-collision.memsnap", [
  { name: `kv/pages/${sha(Buffer.from("page\n"))}`, data: "page\n" },
  { name: "kv/.memsnap-spool", data: "not a spool\n" },
], { layer: { name: "kv", kind: "kv" } });
// A KV layer whose artifacts include a name restore uses for a spool part.
bundle("kv-spool-part-collision.memsnap", [
  { name: `kv/pages/${sha(Buffer.from("page\n"))}@0.0`, data: "page\n" },
  { name: "kv/.memsnap-spool-0", data: "not a spool part\n" },
], { layer: { name: "kv", kind: "kv", schema_version: 2 } });
// A KV page placed 1 TiB into its file: restore would make a huge sparse file.
bundle("kv-place-past-end.memsnap", [
  { name: `kv/pages/${sha(Buffer.from("page\n"))}@0.${2 ** 40}`, data: "page\n" },
], { layer: { name: "kv", kind: "kv", schema_version: 2 } });
// A layer's entries split by another layer's: restore materializes a layer once it has passed it.
bundle("layers-interleaved.memsnap", [
  { name: "memory/a.md", data: "a\n" }, { name: "notes/b.md", data: "b\n" }, { name: "memory/c.md", data: "c\n" },
], { layers: [{ name: "memory", kind: "files" }, { name: "notes", kind: "files" }] });
// zstd bomb: 64 MiB of zeros in the tar entry while the manifest declares a 2 KiB tar.
{
  const big = Buffer.alloc(64 * 1024 * 1024);
  bundle("zstd-bomb.memsnap", [ok, { name: "memory/zeros", data: big }], { tarSize: 2048 });
}
// A container whose manifest header claims 100 MiB: refused before anything is read.
{
  const now = new Date("2026-01-01T00:00:00Z");
  const payload = compress(tarOf([]));
  writeFileSync(join(out, "manifest-over-cap.memsnap"), Buffer.concat([
    containerHeader("payload.tar.zst", payload.length, now, 0o600), payload, Buffer.alloc(pad(payload.length)),
    containerHeader("manifest.json", 100 * 1024 * 1024, now, 0o644), Buffer.alloc(1024),
  ]));
}
// The grouped cases: each scripts/hostile/<group>.mjs exports a default function that gets the
// builders and returns its cases, `{file, bytes, exit, code, check?, key?, env?, note}`:
// - check "to" (the default): test/restore/hostile-corpus.test.ts runs `restore FILE --to DIR`
//   (with the victim's key when key is true, and env added) and expects exit and code, a hint,
//   and nothing written outside DIR's parent;
// - check "custom": the group's own test exercises it (it must name the file).
for (const g of readdirSync(groupsDir).filter((f) => f.endsWith(".mjs")).sort()) {
  const mod = await import(join(groupsDir, g));
  const made = await mod.default({ bundle: build, container, header, pad, sha, tarOf, compress });
  for (const c of made) {
    if (!/^[a-z0-9][a-z0-9.-]*\.memsnap$/.test(c.file) || cases.some((x) => x.file === c.file)) throw new Error(`bad or duplicate case file ${c.file}`);
    writeFileSync(join(out, c.file), c.bytes);
    // `beside`: bundles a case needs next to it (the bases of incremental cases), named by snapshot id.
    for (const b of c.beside ?? []) {
      if (!/^[0-7][0-9A-HJKMNP-TV-Z]{25}\.memsnap$/.test(b.file)) throw new Error(`bad base file ${b.file}`);
      writeFileSync(join(out, b.file), b.bytes);
    }
    const { bytes: _b, beside, ...rest } = c;
    cases.push({ group: g.replace(/\.mjs$/, ""), check: "to", ...rest, ...(beside?.length ? { beside: beside.map((b) => b.file) } : {}) });
  }
}
writeFileSync(join(out, "cases.json"), JSON.stringify(cases, null, 1) + "\n");
writeFileSync(join(out, "README.md"), `# hostile bundles

Made by \`scripts/make-hostile.mjs\` (\`npm run build && node scripts/make-hostile.mjs\`). Each is a valid
container whose manifest is sealed and whose payload hash matches, so keyless checks pass; the
payload itself is hostile. \`test/restore/hostile.test.ts\` requires restore (both \`--to\` and in place)
to refuse every one with exit code 9 (\`MEMSNAP_UNSAFE_PATH\` or \`MEMSNAP_UNSAFE_BUNDLE\`), to write
nothing outside staging, and to remove staging.

The grouped cases (\`scripts/hostile/*.mjs\`) are listed in \`cases.json\` with the exit code and
error code restore must answer; \`test/restore/hostile-corpus.test.ts\` runs each \`check: "to"\` case,
and each group's own test runs its \`custom\` ones. Encrypted cases are encrypted with the real
\`age\` to \`victim.key\` (a test key, nothing else uses it).
`);
console.log("wrote fixtures/hostile/");
