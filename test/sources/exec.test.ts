/**
 * The `exec` source (external plugins, protocol memsnap-plugin/1) end to end through the
 * library: the example plugin (examples/plugins/kv-json-store.mjs) round-trips a key-value
 * store through capture, bundle and restore; a large entry streams through; misbehaving
 * plugins (crash, hang, malformed tar, `../x`, absolute and symlink entries, a missing
 * executable) each fail with their own code, no bundle, no temp file and no process left;
 * restore runs plugins only when MEMSNAP_ALLOW_PLUGINS allows it; deep verify; the JSON
 * Schemas accept what memsnap sends.
 */
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it, vi } from "vitest";
import { isMemsnapError, parseConfig, restoreToDir, snapshot, verifyBundle } from "../../src/index.js";
import { SOURCE_KINDS } from "../../src/sources/registry.js";
import type { RedactionReport, Redactor } from "../../src/redact/types.js";
import { ALLOW_PLUGINS_ENV, parseAllowedPlugins } from "../../src/sources/exec/allow.js";
import { PLUGIN_PROTOCOL, PLUGIN_RECORD } from "../../src/sources/exec/protocol.js";
import { reseal } from "../helpers/reseal.js";
import type { Artifact, SourceKind } from "../../src/sources/types.js";
import { tempDir } from "../helpers/cli.js";
import tar from "tar-stream";
import { tarOf, type TarItem } from "../helpers/criu-dump.js";

// ------------------------------------------------------------------------------ redactor stub

const redactorHook = vi.hoisted(() => ({ current: undefined as undefined | (() => unknown) }));
vi.mock(import("../../src/redact/index.js"), async (importOriginal) => {
  const mod = await importOriginal();
  return { ...mod, createRedactor: async () => redactorHook.current?.() as Redactor | undefined };
});

/** Records which artifacts the pipeline hands to the redactor (text ones). */
class RecordingRedactor implements Redactor {
  readonly seen: { path: string; kind: string }[] = [];
  candidate(): boolean {
    return false;
  }
  async redactText(t: string): Promise<string> {
    return t;
  }
  async scanText(): Promise<void> {}
  async redactArtifact(artifact: Artifact, payloadPath: string): Promise<Artifact> {
    this.seen.push({ path: payloadPath, kind: artifact.kind });
    return artifact;
  }
  report(): RedactionReport {
    return { policy: "stub", rules_fired: [], redacted: {}, unredacted: {}, total_redacted: 0, total_unredacted: 0, bytes_scanned: 0 };
  }
  async cleanup(): Promise<void> {}
}

// ------------------------------------------------------------------------------ helpers

const KV = fileURLToPath(new URL("../../examples/plugins/kv-json-store.mjs", import.meta.url));
const SCHEMAS = fileURLToPath(new URL("../../docs/schemas/", import.meta.url));
const NODE = process.execPath;
const sha = (b: Buffer | string): string => createHash("sha256").update(b).digest("hex");

/** Let restore run exactly these whole commands (MEMSNAP_ALLOW_PLUGINS as a JSON list). */
function allow(...commands: (string[] | { command: string[]; cwd?: string })[]): void {
  process.env[ALLOW_PLUGINS_ENV] = JSON.stringify(commands);
}

afterEach(() => {
  delete process.env[ALLOW_PLUGINS_ENV];
  redactorHook.current = undefined;
});

interface Agent {
  dir: string;
  out: string;
}

function agent(): Agent {
  const dir = tempDir("memsnap-exec-");
  const out = join(dir, "out");
  mkdirSync(out);
  return { dir, out };
}

function config(a: Agent, source: Record<string, unknown>, redaction = false) {
  return parseConfig({ agent: "a1", redaction: { enabled: redaction }, sources: [{ kind: "exec", name: "kv", ...source }] }, null, a.dir);
}

async function snap(a: Agent, source: Record<string, unknown>, redaction = false) {
  return snapshot({ config: config(a, source, redaction), out: join(a.out, "b.memsnap") });
}

async function expectRefused(a: Agent, p: Promise<unknown>, code: string, msg?: RegExp): Promise<Error> {
  const e = await p.then(() => null, (x: unknown) => x as Error);
  expect(e, "snapshot should fail").not.toBeNull();
  expect(isMemsnapError(e) ? e.code : e).toBe(code);
  if (msg) expect(e!.message).toMatch(msg);
  expect(readdirSync(a.out)).toEqual([]);
  return e!;
}

/** A store file in the plugin's canonical format (what its restore writes). */
function storeText(obj: Record<string, unknown>): string {
  const sorted = Object.fromEntries(Object.keys(obj).sort().map((k) => [k, obj[k]]));
  return `${JSON.stringify(sorted, null, 2)}\n`;
}

/**
 * A stand-in plugin: reads its request, saves it to `request.json`, writes the file TAR_FILE
 * (if set) to stdout, STDERR_MSG to stderr, and exits with EXIT_CODE.
 */
function catPlugin(dir: string): string {
  const p = join(dir, "cat-plugin.mjs");
  writeFileSync(p, `import fs from "node:fs";
const chunks = [];
for await (const c of process.stdin) chunks.push(c);
fs.writeFileSync(process.env.REQ_OUT ?? "request.json", JSON.stringify({ argv: process.argv.slice(2), request: JSON.parse(Buffer.concat(chunks).toString()), protocolEnv: process.env.MEMSNAP_PLUGIN_PROTOCOL }));
if (process.env.TAR_FILE) process.stdout.write(fs.readFileSync(process.env.TAR_FILE));
if (process.env.STDERR_MSG) process.stderr.write(process.env.STDERR_MSG + "\\n");
process.stdout.end(() => process.exit(Number(process.env.EXIT_CODE ?? 0)));
`);
  return p;
}

async function catSource(a: Agent, items: TarItem[] | Buffer, env: Record<string, string> = {}): Promise<Record<string, unknown>> {
  const tarFile = join(a.dir, `payload-${randomBytes(3).toString("hex")}.tar`);
  writeFileSync(tarFile, Buffer.isBuffer(items) ? items : await tarOf(items));
  return { command: [NODE, catPlugin(a.dir)], env: { TAR_FILE: tarFile, ...env } };
}

/** True while `pid` runs (a zombie, dead but not yet reaped by init, counts as gone). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    return !/^\d+ \(.*\) Z /.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}

// ------------------------------------------------------------------------------ the example plugin

describe("exec: the kv-json-store example plugin", () => {
  function kvAgent(store: Record<string, unknown>): Agent {
    const a = agent();
    mkdirSync(join(a.dir, "data"));
    writeFileSync(join(a.dir, "data", "store.json"), storeText(store));
    return a;
  }
  const STORE = { "user/name": "Ada", prefs: { short: true, langs: ["en", "fr"] }, "counter": 41, "": null, "ünï": "ok" };
  const kvSource = { command: [NODE, KV], config: { path: "data/store.json" } };

  it("captures the store as files, verifies deep, and restores the store byte for byte", async () => {
    const a = kvAgent(STORE);
    const r = await snap(a, kvSource);
    const layer = r.manifest.layers[0]!;
    expect(layer.kind).toBe("exec");
    expect(layer.meta).toMatchObject({
      plugin: { protocol: PLUGIN_PROTOCOL, command: [NODE, KV], cwd: a.dir, timeout_ms: 60000 },
      entries: 6,
    });
    const paths = r.manifest.index!.map((e) => e.path);
    expect(paths[0]).toBe(`kv/${PLUGIN_RECORD}`);
    expect(paths).toContain("kv/kv-store.json");
    expect(paths).toContain(`kv/keys/${encodeURIComponent("user/name")}.json`);
    expect(r.manifest.index!.find((e) => e.path === "kv/kv-store.json")!.kind).toBe("json");
    const v = await verifyBundle(r.path, { deep: true });
    expect(v.findings).toEqual([]);
    allow([NODE, KV]);
    const to = join(a.dir, "restored");
    await restoreToDir(r.path, to);
    for (const e of r.manifest.index!) expect(sha(readFileSync(join(to, e.path))), e.path).toBe(e.sha256);
    expect(readFileSync(join(to, "kv", "store.json"), "utf8")).toBe(readFileSync(join(a.dir, "data", "store.json"), "utf8"));
    expect(JSON.parse(readFileSync(join(to, "kv", PLUGIN_RECORD), "utf8"))).toEqual({
      protocol: PLUGIN_PROTOCOL, layer: "kv", command: [NODE, KV], config: { path: "data/store.json" },
    });
  });

  it("restore runs the plugin only when MEMSNAP_ALLOW_PLUGINS allows it", async () => {
    const a = kvAgent({ k: 1 });
    const r = await snap(a, kvSource);
    const to = join(a.dir, "restored");
    const e = await restoreToDir(r.path, to).then(() => null, (x: unknown) => x);
    expect(isMemsnapError(e, "MEMSNAP_PLUGIN_UNTRUSTED")).toBe(true);
    expect((e as Error).message).toContain(`${JSON.stringify([NODE, KV])} + "restore"`);
    expect(existsSync(to)).toBe(false);
    expect(readdirSync(a.dir).filter((n) => n.includes("staging"))).toEqual([]);
    const untrusted = async (): Promise<void> => {
      expect(isMemsnapError(await restoreToDir(r.path, to).catch((x: unknown) => x), "MEMSNAP_PLUGIN_UNTRUSTED")).toBe(true);
      expect(existsSync(to)).toBe(false);
    };
    process.env[ALLOW_PLUGINS_ENV] = "/usr/bin/something-else";
    await untrusted();
    // The first word alone (as the old syntax had it) no longer admits a command.
    process.env[ALLOW_PLUGINS_ENV] = `/usr/bin/other:${NODE}`;
    await untrusted();
    allow([NODE, KV, "--extra"], [NODE]);
    await untrusted();
    allow([NODE, KV]);
    await restoreToDir(r.path, to);
    expect(JSON.parse(readFileSync(join(to, "kv", "store.json"), "utf8"))).toEqual({ k: 1 });
  });

  it("marks the plugin's files as text for the redactor (MEMSNAP.text pax record), and its record as json", async () => {
    const a = kvAgent({ k: "v" });
    const rec = new RecordingRedactor();
    redactorHook.current = () => rec;
    await snap(a, kvSource, true);
    expect(rec.seen).toEqual([
      { path: `kv/${PLUGIN_RECORD}`, kind: "json" }, { path: "kv/kv-store.json", kind: "json" }, { path: "kv/keys/k.json", kind: "json" },
    ]);
  });

  it("a plugin error during capture is MEMSNAP_PLUGIN_FAILED with its stderr", async () => {
    const a = agent();
    await expectRefused(a, snap(a, { ...kvSource, config: { path: "missing.json" } }), "MEMSNAP_PLUGIN_FAILED",
      /exited with status 1: kv-json-store: cannot read the store .*missing\.json/);
  });

  it("a failing restore is MEMSNAP_PLUGIN_FAILED with the plugin's error, and nothing is restored", async () => {
    const a = agent();
    const p = join(a.dir, "locked.mjs");
    writeFileSync(p, `if (process.argv[2] === "capture") process.stdout.write(Buffer.alloc(1024));
else process.stdout.write(JSON.stringify({ protocol: "${PLUGIN_PROTOCOL}", ok: false, error: "store is locked" }) + "\\n");`);
    const r = await snap(a, { command: [NODE, p] });
    expect(r.manifest.layers[0]!.meta).toMatchObject({ entries: 0 });
    allow([NODE, p]);
    const to = join(a.dir, "restored");
    const e = await restoreToDir(r.path, to).then(() => null, (x: unknown) => x as Error);
    expect(isMemsnapError(e, "MEMSNAP_PLUGIN_FAILED")).toBe(true);
    expect(e!.message).toMatch(/could not restore layer kv: store is locked/);
    expect(existsSync(to)).toBe(false);
  });
});

describe("exec: restore failures", () => {
  it("a restore that hangs past timeout_ms is MEMSNAP_PLUGIN_TIMEOUT, and nothing is restored", async () => {
    const a = agent();
    const p = join(a.dir, "slow.mjs");
    writeFileSync(p, `if (process.argv[2] === "capture") process.stdout.write(Buffer.alloc(1024)); else setInterval(() => {}, 1000);`);
    const r = await snap(a, { command: [NODE, p], timeout_ms: 600 });
    allow([NODE, p]);
    const to = join(a.dir, "restored");
    const e = await restoreToDir(r.path, to).then(() => null, (x: unknown) => x);
    expect(isMemsnapError(e, "MEMSNAP_PLUGIN_TIMEOUT")).toBe(true);
    expect(existsSync(to)).toBe(false);
  });

  it("a restore response that is not the documented JSON is MEMSNAP_PLUGIN_PROTOCOL", async () => {
    const a = agent();
    const p = join(a.dir, "chatty.mjs");
    writeFileSync(p, `if (process.argv[2] === "capture") process.stdout.write(Buffer.alloc(1024)); else console.log("done!");`);
    const r = await snap(a, { command: [NODE, p] });
    allow([NODE, p]);
    const e = await restoreToDir(r.path, join(a.dir, "restored")).then(() => null, (x: unknown) => x);
    expect(isMemsnapError(e, "MEMSNAP_PLUGIN_PROTOCOL")).toBe(true);
  });
});

// ------------------------------------------------------------------------------ a bundle does not choose the code

describe("exec: the command a restore runs comes from this host, never from the bundle", () => {
  /** A real bundle of the cat plugin, and the bundle with its recorded plugin changed (resealed). */
  async function tampered(a: Agent, change: (plugin: Record<string, unknown>) => void): Promise<{ src: Record<string, unknown>; path: string }> {
    const src = await catSource(a, [{ name: "x.txt", data: Buffer.from("x") }]);
    const r = await snap(a, src);
    const path = await reseal(r.path, (m) => change((m.layers[0]!.meta as { plugin: Record<string, unknown> }).plugin), join(a.dir, "tampered.memsnap"));
    return { src, path };
  }

  it("a recorded `node -e <code>` never runs: not with the first word allowed (the old syntax), nor with 1, nor with the real plugin allowed", async () => {
    const a = agent();
    const pwned = join(a.dir, "pwned");
    const { src, path } = await tampered(a, (p) => {
      p.command = [NODE, "-e", `require('fs').writeFileSync(${JSON.stringify(pwned)}, '')`];
    });
    const to = join(a.dir, "restored");
    for (const env of [NODE, "1", "all", JSON.stringify([src.command]), JSON.stringify([[NODE]])]) {
      process.env[ALLOW_PLUGINS_ENV] = env;
      const e = await restoreToDir(path, to).then(() => null, (x: unknown) => x as Error);
      expect(isMemsnapError(e, "MEMSNAP_PLUGIN_UNTRUSTED"), `${env}: ${String(e)}`).toBe(true);
      expect((e as { hint?: string }).hint).toMatch(/whole command/);
      expect(existsSync(pwned), env).toBe(false);
      expect(existsSync(to)).toBe(false);
    }
  });

  it("the cwd the bundle records is not used: the plugin runs in the restored layer's directory", async () => {
    const a = agent();
    const outside = join(a.dir, "outside");
    mkdirSync(outside);
    const { src, path } = await tampered(a, (p) => {
      p.cwd = outside;
    });
    allow(src.command as string[]);
    const to = join(a.dir, "restored");
    await restoreToDir(path, to); // the cat plugin writes request.json into its cwd
    expect(readdirSync(outside)).toEqual([]);
    expect(JSON.parse(readFileSync(join(to, "kv", "request.json"), "utf8")).argv).toEqual(["restore"]);
  });

  it("an allow-list entry may name the directory the plugin runs in", async () => {
    const a = agent();
    const src = await catSource(a, [{ name: "x.txt", data: Buffer.from("x") }]);
    const r = await snap(a, src);
    const work = join(a.dir, "work");
    mkdirSync(work);
    allow({ command: src.command as string[], cwd: work });
    await restoreToDir(r.path, join(a.dir, "restored"));
    expect(JSON.parse(readFileSync(join(work, "request.json"), "utf8")).request).toMatchObject({ op: "restore", layer: "kv" });
  });

  it("a recorded command that differs from the allowed one in any argument is refused, and neither runs", async () => {
    // [change, and whether the plugin's first word alone is also tried as the allow-list]
    const changes: [(c: string[]) => string[], boolean][] = [
      [(c) => [...c, "--evil"], true], [(c) => [c[0]!, `${c[1]!} `], true], [(c) => c.slice(0, 1), false],
    ];
    for (const [change, firstWord] of changes) {
      const a = agent();
      const reqOut = join(a.dir, "ran.json");
      const { src, path } = await tampered(a, (p) => {
        p.command = change(p.command as string[]);
      });
      for (const env of [JSON.stringify([src.command]), ...(firstWord ? [NODE] : [])]) {
        process.env[ALLOW_PLUGINS_ENV] = env;
        process.env.REQ_OUT = reqOut;
        try {
          const e = await restoreToDir(path, join(a.dir, "restored")).then(() => null, (x: unknown) => x);
          expect(isMemsnapError(e, "MEMSNAP_PLUGIN_UNTRUSTED"), String(e)).toBe(true);
        } finally {
          delete process.env.REQ_OUT;
        }
        expect(existsSync(reqOut), env).toBe(false);
      }
    }
  });

  it("MEMSNAP_ALLOW_PLUGINS: whole commands as JSON, one-word commands as a list; 1/all and malformed values allow nothing", () => {
    expect(parseAllowedPlugins(undefined)).toEqual({ allowed: [] });
    expect(parseAllowedPlugins(" ")).toEqual({ allowed: [] });
    expect(parseAllowedPlugins("/usr/local/bin/kv:/opt/p")).toEqual({ allowed: [{ command: ["/usr/local/bin/kv"] }, { command: ["/opt/p"] }] });
    expect(parseAllowedPlugins('[["node","/opt/kv.mjs"],{"command":["/opt/p","--x"],"cwd":"/srv"}]')).toEqual({
      allowed: [{ command: ["node", "/opt/kv.mjs"] }, { command: ["/opt/p", "--x"], cwd: "/srv" }],
    });
    for (const bad of ["1", "all", "TRUE", "[", "{}", '["node"]', "[[]]", '[[""]]', '[{"command":["x"],"cwd":"rel"}]', '[{"command":["x"],"env":{}}]', "[[1]]"]) {
      expect(parseAllowedPlugins(bad), bad).toHaveProperty("error");
    }
  });
});

// ------------------------------------------------------------------------------ protocol

describe("exec: the protocol", () => {
  it("sends the documented capture request on stdin, argv capture, and MEMSNAP_PLUGIN_PROTOCOL", async () => {
    const a = agent();
    const src = await catSource(a, [{ name: "a.txt", data: Buffer.from("A") }], { REQ_OUT: join(a.dir, "req.json") });
    await snap(a, { ...src, config: { url: "sqlite:///x", n: 2 } });
    const seen = JSON.parse(readFileSync(join(a.dir, "req.json"), "utf8"));
    expect(seen).toEqual({
      argv: ["capture"], protocolEnv: PLUGIN_PROTOCOL,
      request: { protocol: PLUGIN_PROTOCOL, op: "capture", layer: "kv", config: { url: "sqlite:///x", n: 2 } },
    });
  });

  it("streams a large entry through, and skips directory entries", async () => {
    const a = agent();
    const big = randomBytes(12 * 1024 * 1024);
    const src = await catSource(a, [{ name: "./d/", type: "directory" }, { name: "./d/big.bin", data: big }, { name: "e.txt", data: Buffer.alloc(0) }]);
    const r = await snap(a, src);
    expect(r.manifest.layers[0]!.meta).toMatchObject({ entries: 2, bytes: big.length, directories_skipped: 1 });
    const to = join(a.dir, "restored");
    allow(src.command as string[]);
    await restoreToDir(r.path, to);
    expect(readFileSync(join(to, "kv", "d", "big.bin")).equals(big)).toBe(true);
    expect(readFileSync(join(to, "kv", "e.txt")).length).toBe(0);
  });

  it("the restore request names the absolute directory holding the layer's files", async () => {
    const a = agent();
    const src = await catSource(a, [{ name: "x.txt", data: Buffer.from("x") }]);
    const r = await snap(a, src);
    const reqOut = join(a.dir, "restore-req.json");
    process.env.REQ_OUT = reqOut;
    allow(src.command as string[]);
    try {
      await restoreToDir(r.path, join(a.dir, "restored"));
    } finally {
      delete process.env.REQ_OUT;
    }
    const seen = JSON.parse(readFileSync(reqOut, "utf8"));
    expect(seen.argv).toEqual(["restore"]);
    expect(seen.request).toMatchObject({ protocol: PLUGIN_PROTOCOL, op: "restore", layer: "kv", config: {} });
    expect(seen.request.dir).toMatch(/^\/.*memsnap-staging-.*\/kv$/);
  });

  it("the published JSON Schemas describe the requests memsnap sends", () => {
    const cap = JSON.parse(readFileSync(join(SCHEMAS, "plugin-capture-request.json"), "utf8"));
    const res = JSON.parse(readFileSync(join(SCHEMAS, "plugin-restore-request.json"), "utf8"));
    const resp = JSON.parse(readFileSync(join(SCHEMAS, "plugin-response.json"), "utf8"));
    for (const s of [cap, res, resp]) {
      expect(s.$schema).toMatch(/json-schema\.org/);
      expect(s.properties.protocol.const).toBe(PLUGIN_PROTOCOL);
    }
    expect(cap.required.sort()).toEqual(["config", "layer", "op", "protocol"]);
    expect(cap.properties.op.const).toBe("capture");
    expect(res.required.sort()).toEqual(["config", "dir", "layer", "op", "protocol"]);
    expect(res.properties.op.const).toBe("restore");
    expect(resp.required.sort()).toEqual(["ok", "protocol"]);
  });
});

// ------------------------------------------------------------------------------ misbehaving plugins

describe("exec: misbehaving plugins fail the snapshot with their own code and leave nothing", () => {
  it("a crash (non-zero exit) is MEMSNAP_PLUGIN_FAILED with the stderr tail", async () => {
    const a = agent();
    const full = await tarOf([{ name: "a.bin", data: randomBytes(100_000) }]);
    const src = await catSource(a, full.subarray(0, 20_000), { EXIT_CODE: "3", STDERR_MSG: "boom: database is locked" });
    await expectRefused(a, snap(a, src), "MEMSNAP_PLUGIN_FAILED", /exited with status 3: boom: database is locked/);
  });

  it("a crash after a complete stream is still MEMSNAP_PLUGIN_FAILED", async () => {
    const a = agent();
    const src = await catSource(a, [{ name: "a.txt", data: Buffer.from("A") }], { EXIT_CODE: "1", STDERR_MSG: "late failure" });
    await expectRefused(a, snap(a, src), "MEMSNAP_PLUGIN_FAILED", /late failure/);
  });

  it("a plugin killed by a signal is MEMSNAP_PLUGIN_FAILED", async () => {
    const a = agent();
    const p = join(a.dir, "suicide.mjs");
    writeFileSync(p, "process.kill(process.pid, 'SIGKILL');");
    await expectRefused(a, snap(a, { command: [NODE, p] }), "MEMSNAP_PLUGIN_FAILED", /killed by SIGKILL/);
  });

  it("a hang past timeout_ms is MEMSNAP_PLUGIN_TIMEOUT; the plugin (ignoring SIGTERM) and its children are killed", async () => {
    const a = agent();
    const p = join(a.dir, "hang.mjs");
    writeFileSync(p, `import fs from "node:fs"; import { spawn } from "node:child_process";
process.on("SIGTERM", () => {});
const child = spawn(process.execPath, ["-e", "process.on('SIGTERM', () => {}); setInterval(() => {}, 1000)"], { stdio: "ignore" });
fs.writeFileSync(${JSON.stringify(join(a.dir, "pids"))}, process.pid + " " + child.pid);
process.stdout.write(Buffer.alloc(512, 0x41).subarray(0, 100)); // half a header, then nothing
setInterval(() => {}, 1000);
`);
    const t0 = Date.now();
    await expectRefused(a, snap(a, { command: [NODE, p], timeout_ms: 700 }), "MEMSNAP_PLUGIN_TIMEOUT", /ran past its 700 ms timeout and was killed/);
    expect(Date.now() - t0).toBeLessThan(15_000);
    const pids = readFileSync(join(a.dir, "pids"), "utf8").split(" ").map(Number);
    // SIGKILL went to the plugin's whole group; a process dies a moment after the signal, so
    // allow a loaded machine up to 5 s (CI once saw the grandchild still running at once).
    for (let i = 0; i < 100 && pids.some(alive); i++) await new Promise((r) => setTimeout(r, 50));
    for (const pid of pids) expect(alive(pid), `pid ${pid}`).toBe(false);
  });

  it("a plugin that closes stdout but never exits is MEMSNAP_PLUGIN_TIMEOUT", async () => {
    const a = agent();
    const tarFile = join(a.dir, "t.tar");
    writeFileSync(tarFile, await tarOf([{ name: "a", data: Buffer.from("a") }]));
    const p = join(a.dir, "linger.mjs");
    writeFileSync(p, `import fs from "node:fs"; process.stdout.end(fs.readFileSync(${JSON.stringify(tarFile)})); setInterval(() => {}, 1000);`);
    await expectRefused(a, snap(a, { command: [NODE, p], timeout_ms: 800 }), "MEMSNAP_PLUGIN_TIMEOUT");
  });

  it("a malformed tar stream is MEMSNAP_PLUGIN_PROTOCOL", async () => {
    const a = agent();
    const src = await catSource(a, Buffer.alloc(2048, 0x41));
    await expectRefused(a, snap(a, src), "MEMSNAP_PLUGIN_PROTOCOL", /malformed tar stream/);
  });

  it("a tar that ends inside an entry (exit 0) is MEMSNAP_PLUGIN_PROTOCOL", async () => {
    const a = agent();
    const full = await tarOf([{ name: "a.bin", data: randomBytes(50_000) }]);
    const src = await catSource(a, full.subarray(0, 10_000));
    await expectRefused(a, snap(a, src), "MEMSNAP_PLUGIN_PROTOCOL");
  });

  const hostile: [string, TarItem[], RegExp][] = [
    ["a `../x` entry", [{ name: "ok.txt", data: Buffer.from("ok") }, { name: "../x", data: Buffer.from("x") }], /entry "\.\.\/x": '\.\.' segment \(outside the layer\)/],
    ["a nested `..` entry", [{ name: "a/../../x", data: Buffer.from("x") }], /'\.\.' segment/],
    ["an absolute entry", [{ name: "/etc/evil", data: Buffer.from("x") }], /entry "\/etc\/evil": absolute path/],
    ["a symlink entry", [{ name: "link", type: "symlink", linkname: "/etc/passwd" }], /entry "link" is a symlink entry; only regular files are allowed/],
    ["the reserved record name", [{ name: PLUGIN_RECORD, data: Buffer.from("{}") }], /reserved for memsnap/],
    ["a duplicate entry", [{ name: "a", data: Buffer.from("1") }, { name: "./a", data: Buffer.from("2") }], /appears twice/],
  ];
  for (const [what, items, msg] of hostile) {
    it(`${what} is MEMSNAP_PLUGIN_PROTOCOL`, async () => {
      const a = agent();
      await expectRefused(a, snap(a, await catSource(a, items)), "MEMSNAP_PLUGIN_PROTOCOL", msg);
    });
  }

  it("a hard link entry is MEMSNAP_PLUGIN_PROTOCOL", async () => {
    const a = agent();
    const pack = tar.pack();
    const chunks: Buffer[] = [];
    const done = (async () => { for await (const c of pack) chunks.push(c as Buffer); })();
    pack.entry({ name: "a", size: 1 }, Buffer.from("a"));
    pack.entry({ name: "b", type: "link", linkname: "a" });
    pack.finalize();
    await done;
    await expectRefused(a, snap(a, await catSource(a, Buffer.concat(chunks))), "MEMSNAP_PLUGIN_PROTOCOL", /is a link entry/);
  });

  it("a missing executable is MEMSNAP_PLUGIN_FAILED", async () => {
    const a = agent();
    await expectRefused(a, snap(a, { command: ["./no-such-plugin"] }), "MEMSNAP_PLUGIN_FAILED", /could not be started \(spawn .*no-such-plugin ENOENT\)/);
  });

  it("config: command must be a non-empty string array; timeout, env and config are checked", () => {
    const a = agent();
    expect(() => config(a, {})).toThrow(/"command" must be/);
    expect(() => config(a, { command: [] })).toThrow(/"command" must be/);
    expect(() => config(a, { command: ["x"], timeout_ms: 5 })).toThrow(/"timeout_ms" must be an integer/);
    expect(() => config(a, { command: ["x"], env: { A: 1 } })).toThrow(/"env" must map/);
    expect(() => config(a, { command: ["x"], config: [1] })).toThrow(/"config" must be an object/);
    expect(() => config(a, { command: ["x"], nope: 1 })).toThrow(/unknown key "nope"/);
  });
});

describe("exec: deep verify", () => {
  it("names the artifact when the plugin record is broken", async () => {
    const a = agent();
    mkdirSync(join(a.dir, "raw"));
    writeFileSync(join(a.dir, "raw", PLUGIN_RECORD), "{ not json");
    writeFileSync(join(a.dir, "raw", "data.bin"), "opaque");
    const c = parseConfig({ agent: "a1", redaction: { enabled: false }, sources: [{ kind: "files", name: "kv", path: "raw" }] }, null, a.dir);
    c.sources[0]!.impl = { ...SOURCE_KINDS.files!, kind: "exec", schemaVersion: 1 } as SourceKind<{ name: string }>;
    const r = await snapshot({ config: c, out: join(a.out, "b.memsnap") });
    const v = await verifyBundle(r.path, { deep: true });
    expect(v.findings).toEqual([{
      code: "MEMSNAP_DEEP_VERIFY_FAILED", path: `kv/${PLUGIN_RECORD}`, message: expect.stringMatching(/^kv\/\.memsnap-plugin\.json: not valid JSON/),
    }]);
  });
});
