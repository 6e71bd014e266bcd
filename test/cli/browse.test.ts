/**
 * `memsnap ls`, `cat` and `find` through the CLI: a snapshot's file list from a plaintext
 * manifest alone (the payload is damaged and ls still answers), from an encrypted payload with
 * the key, one file's bytes with its hash checked (nothing on stdout when it does not match),
 * an incremental snapshot's referenced files read from the base, and a search across an
 * agent's snapshots that skips, with a warning, those no given key opens.
 */
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { encodeIndex } from "../../src/format/manifest.js";
import {
  BIN, DEFAULT_FILES, expectCliError, expectOk, jsonOut, makeAgent, readBundle, recipientOf, reseal, runCli, sha256, tempDir, writeBundle, type Agent,
} from "../helpers/cli.js";
import { requireTool, type SkipContext } from "../helpers/tools.js";

let a: Agent;
let key: string;
let store: string;
let plain: string;
let enc: string;

async function snap(args: string[]): Promise<{ id: string; path: string }> {
  const r = await runCli(["snapshot", "-c", a.config, "--store", store, "--json", ...args], { cwd: a.dir });
  expectOk(r);
  const j = jsonOut(r);
  return { id: j.id ?? j.snapshot_id, path: j.path };
}

beforeAll(async () => {
  a = makeAgent();
  store = join(a.dir, "store");
  expectOk(await runCli(["keygen", "-o", "key.txt"], { cwd: a.dir }));
  key = join(a.dir, "key.txt");
  plain = (await snap(["--label", "plain"])).path;
  enc = (await snap(["-r", recipientOf(key), "--label", "enc"])).path;
});

describe("memsnap ls", () => {
  it("lists a plaintext snapshot's files with mode, size, kind and path; --json gives an array", async () => {
    const r = await runCli(["ls", plain], { cwd: a.dir });
    expectOk(r);
    const lines = r.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^MODE\s+SIZE\s+MTIME\s+KIND\s+PATH$/);
    expect(lines.some((l) => /^0644\s+3000\s+\S+\s+file\s+memory\/blob\.bin$/.test(l))).toBe(true);
    expect(lines.some((l) => l.endsWith("state/cursor.json"))).toBe(true);
    const j = jsonOut(await runCli(["--json", "ls", plain], { cwd: a.dir }));
    expect(Array.isArray(j)).toBe(true);
    expect(j.map((e: { path: string }) => e.path).sort()).toEqual([
      ...Object.keys(DEFAULT_FILES).map((p) => `memory/${p}`), "state/cursor.json", "state/runs/dream-run.json",
    ].sort());
    const blob = j.find((e: { path: string }) => e.path === "memory/blob.bin");
    expect(blob).toMatchObject({ layer: "memory", size: 3000, mode: "0644", sha256: sha256(DEFAULT_FILES["blob.bin"] as Buffer) });
  });

  it("filters by directory prefix and glob", async () => {
    const paths = async (...f: string[]): Promise<string[]> => jsonOut(await runCli(["--json", "ls", plain, ...f], { cwd: a.dir })).map((e: { path: string }) => e.path).sort();
    expect(await paths("memory/notes")).toEqual(["memory/notes/2024-06-01.md", "memory/notes/empty.md"]);
    expect(await paths("memory/**/*.md")).toEqual(["memory/MEMORY.md", "memory/notes/2024-06-01.md", "memory/notes/empty.md"]);
    expect(await paths("*.json")).toEqual(["state/cursor.json", "state/runs/dream-run.json"]);
    expect(await paths("state/", "memory/deep")).toEqual(["memory/deep/a/b/c.txt", "state/cursor.json", "state/runs/dream-run.json"]);
  });

  it("reads only the manifest of a plaintext bundle: a damaged payload still lists, cat refuses it", async () => {
    const d = tempDir("memsnap-browse-");
    const broken = join(d, "broken.memsnap");
    const parts = readBundle(plain);
    const payload = Buffer.from(parts.payload);
    payload[Math.floor(payload.length / 2)]! ^= 0xff;
    writeBundle(broken, parts.payloadName, payload, parts.manifestBytes);
    const r = await runCli(["--json", "ls", broken], { cwd: d });
    expectOk(r);
    expect(jsonOut(r).length).toBe(7);
    const c = await runCli(["cat", broken, "memory/MEMORY.md"], { cwd: d });
    expect(c.code).not.toBe(0);
    expect(c.stdout).toBe("");
  });

  it("an encrypted snapshot needs the key, then lists from the payload's index", async () => {
    expectCliError(await runCli(["ls", enc], { cwd: a.dir }), 4, "MEMSNAP_IDENTITY_REQUIRED");
    const r = await runCli(["--json", "ls", enc, "-i", key, "memory/MEMORY.md"], { cwd: a.dir });
    expectOk(r);
    expect(jsonOut(r)).toEqual([expect.objectContaining({ path: "memory/MEMORY.md", size: (DEFAULT_FILES["MEMORY.md"] as string).length })]);
  });
});

describe("memsnap cat", () => {
  it("writes one file's exact bytes, plaintext and encrypted, by path or by snapshot id", async () => {
    for (const [b, extra] of [[plain, []], [enc, ["-i", key]]] as const) {
      // (spawnSync for the raw bytes: runCli decodes stdout as UTF-8)
      const c = spawnSync(process.execPath, [BIN, "cat", b, "memory/blob.bin", ...extra], { cwd: a.dir, env: { ...process.env, XDG_DATA_HOME: join(a.dir, ".xdg") } });
      expect(c.status, c.stderr.toString()).toBe(0);
      expect(sha256(c.stdout)).toBe(sha256(DEFAULT_FILES["blob.bin"] as Buffer));
    }
    const id = jsonOut(await runCli(["--json", "list", "--store", store], { cwd: a.dir })).snapshots[0].id;
    const r = await runCli(["cat", id, "state/cursor.json", "--store", store, "-i", key], { cwd: a.dir });
    expectOk(r);
    expect(JSON.parse(r.stdout)).toEqual({ offset: 42, file: "log-7" });
  });

  it("a plaintext bundle: reads the payload only up to the file, checked against the sealed index (damage after it does not matter, verify still finds it)", () => {
    const e = makeAgent({ agent: "early", files: { "a.md": "hello\n", "z.bin": Buffer.from(Array.from({ length: 3_000_000 }, (_, i) => ((i * 2654435761) >>> 7) & 0xff)) } });
    const bundle = join(e.dir, "b.memsnap");
    expect(spawnSync(process.execPath, [BIN, "snapshot", "-c", e.config, "-o", bundle], { encoding: "utf8" }).status).toBe(0);
    const parts = readBundle(bundle);
    const payload = Buffer.from(parts.payload);
    payload[payload.length - 1]! ^= 0xff; // the payload's last byte: after every file
    const damaged = join(e.dir, "d.memsnap");
    writeBundle(damaged, parts.payloadName, payload, parts.manifestBytes);
    const c = spawnSync(process.execPath, [BIN, "cat", damaged, "memory/a.md"], { encoding: "utf8" });
    expect(c.status, c.stderr).toBe(0);
    expect(c.stdout).toBe("hello\n");
    expect(spawnSync(process.execPath, [BIN, "verify", damaged], { encoding: "utf8" }).status).toBe(3);
  });

  it("a reader that goes away early (| head -c 10) ends the copy quietly, exit 0", () => {
    const big = makeAgent({ agent: "pipe", files: { "big.bin": Buffer.alloc(4 << 20, 7) } });
    const bundle = join(big.dir, "b.memsnap");
    expect(spawnSync(process.execPath, [BIN, "snapshot", "-c", big.config, "-o", bundle], { encoding: "utf8" }).status).toBe(0);
    const r = spawnSync("bash", ["-c", `"$0" "$1" cat "$2" memory/big.bin | head -c 10 >/dev/null; echo "\${PIPESTATUS[0]}"`, process.execPath, BIN, bundle], { encoding: "utf8" });
    expect(r.stdout.trim()).toBe("0");
    expect(r.stderr).toBe("");
  });

  it("a path the snapshot does not hold: MEMSNAP_SOURCE_MISSING, nothing on stdout", async () => {
    const r = await runCli(["cat", plain, "memory/nope.md"], { cwd: a.dir });
    expectCliError(r, 6, "MEMSNAP_SOURCE_MISSING");
    expect(r.stderr).toContain("memory/nope.md");
    expect(r.stdout).toBe("");
  });

  it("bytes that differ from the index (payload hash and seal recomputed): MEMSNAP_ARTIFACT_HASH_MISMATCH, exit 3, nothing on stdout", async (ctx) => {
    const b = craft(ctx, "memory/a.md", "altered!\n", "original\n");
    const r = await runCli(["cat", b, "memory/a.md"]);
    expectCliError(r, 3, "MEMSNAP_ARTIFACT_HASH_MISMATCH");
    expect(r.stdout).toBe("");
  });
});

describe("memsnap find", () => {
  it("finds a file across the agent's snapshots; encrypted ones without a key are skipped with a warning", async () => {
    const r = await runCli(["--json", "find", "MEMORY.md", "--store", store], { cwd: a.dir });
    expectOk(r);
    const j = jsonOut(r);
    expect(j.matches.map((m: { path: string }) => m.path)).toEqual(["memory/MEMORY.md"]);
    expect(j.skipped.length).toBe(1);
    expect(j.skipped[0].reason).toMatch(/^MEMSNAP_IDENTITY_REQUIRED/);
    const h = await runCli(["find", "MEMORY.md", "--store", store], { cwd: a.dir });
    expectOk(h);
    expect(h.stderr).toMatch(/warning: skipped \S+: .*encrypted/);
    expect(h.stdout).toMatch(/^SNAPSHOT\s+CREATED\s+SIZE\s+SHA256\s+PATH\n/);
    const k = jsonOut(await runCli(["--json", "find", "memory/notes/*.md", "--store", store, "-i", key], { cwd: a.dir }));
    expect(k.skipped).toEqual([]);
    expect(k.matches.length).toBe(4);
    expect(new Set(k.matches.map((m: { snapshot_id: string }) => m.snapshot_id)).size).toBe(2);
  });
});

describe("incremental snapshots", () => {
  it("ls lists the files held in the base, cat reads them from it", async () => {
    const b = makeAgent({ agent: "incr" });
    const st = join(b.dir, "store");
    const first = jsonOut(await runCli(["snapshot", "-c", b.config, "--store", st, "--incremental", "--json"], { cwd: b.dir }));
    writeFileSync(join(b.memoryDir, "MEMORY.md"), "# changed\n");
    const second = jsonOut(await runCli(["snapshot", "-c", b.config, "--store", st, "--incremental", "--json"], { cwd: b.dir }));
    const l = jsonOut(await runCli(["--json", "ls", second.path], { cwd: b.dir }));
    const blob = l.find((e: { path: string }) => e.path === "memory/blob.bin");
    expect(blob.base).toBe(first.id ?? first.snapshot_id);
    expect(l.find((e: { path: string }) => e.path === "memory/MEMORY.md").base).toBeUndefined();
    const h = await runCli(["ls", second.path], { cwd: b.dir });
    expect(h.stdout).toMatch(/BASE\s+PATH/);
    const c = await runCli(["cat", second.path, "memory/notes/2024-06-01.md"], { cwd: b.dir });
    expectOk(c);
    expect(c.stdout).toBe(DEFAULT_FILES["notes/2024-06-01.md"]);
    // Without the base beside it, the referenced file cannot be read.
    const alone = join(tempDir("memsnap-alone-"), "x.memsnap");
    writeFileSync(alone, readFileSync(second.path));
    expectCliError(await runCli(["cat", alone, "memory/notes/2024-06-01.md"]), 6, "MEMSNAP_BASE_MISSING");
  });
});

/** A plaintext bundle of one file whose payload bytes differ from its index, with everything else (payload hash, seal) consistent. */
function craft(ctx: SkipContext, name: string, content: string, indexContent: string): string {
  requireTool(["tar", "zstd"], ctx);
  const d = tempDir("memsnap-craft-");
  const src = join(d, "src");
  mkdirSync(join(src, ".memsnap"), { recursive: true });
  const base = readBundle(plain).manifest;
  writeFileSync(join(src, "e0"), content);
  const artifacts = [{
    path: name, layer: name.split("/")[0]!, kind: "file", size: Buffer.byteLength(indexContent), sha256: sha256(indexContent), mode: 0o644, mtime: new Date(0).toISOString(),
  }];
  const indexBytes = encodeIndex({ format: "memsnap-index", snapshot_id: base.snapshot_id, artifacts } as unknown as Parameters<typeof encodeIndex>[0]);
  writeFileSync(join(src, ".memsnap", "index.json"), indexBytes);
  const tarFile = join(d, "payload.tar");
  const t = spawnSync("tar", ["--format=pax", "-P", "-C", src, "-cf", tarFile, "--transform", `s,^e0$,${name},`, "e0", ".memsnap/index.json"], { encoding: "utf8" });
  expect(t.status, t.stderr).toBe(0);
  const z = spawnSync("zstd", ["-q", "-f", "--check", tarFile, "-o", `${tarFile}.zst`], { encoding: "utf8" });
  expect(z.status, z.stderr).toBe(0);
  const payload = readFileSync(`${tarFile}.zst`);
  const manifest = reseal({
    ...base,
    layers: base.layers.map((l: Record<string, unknown>) => ({ ...l, artifacts: artifacts.filter((x) => x.layer === l.name).length, bytes: artifacts.filter((x) => x.layer === l.name).reduce((n, x) => n + x.size, 0) })),
    index: artifacts,
    payload: {
      ...base.payload, member: "payload.tar.zst", encryption: null, stored_size: payload.length, sha256: sha256(payload), tar_size: statSync(tarFile).size,
      index_sha256: sha256(indexBytes), artifacts: 1, bytes: artifacts[0]!.size,
    },
  });
  const bundle = join(d, "crafted.memsnap");
  writeBundle(bundle, "payload.tar.zst", payload, manifest);
  rmSync(src, { recursive: true });
  return bundle;
}
