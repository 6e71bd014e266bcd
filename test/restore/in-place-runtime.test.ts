// In-place restore of the layers beyond memory files and databases: a KV dump (its directory
// rebuilt and swapped whole) and agentlog traces (replaced like files), over a live agent that
// moved on or broke, and onto a new machine; the safety snapshot covers what is replaced.
import { appendFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeEach, describe, expect, it } from "vitest";
import { readLayout } from "../../src/format/container.js";
import { parseManifest } from "../../src/format/manifest.js";
import { agentlogId, parseLossless } from "../../src/util/canonical-agentlog.js";
import { expectOk, jsonOut, restoreOntoNewMachine, runCliSync, tempDir, treeHashes } from "../helpers/cli.js";
import { generateKvDump } from "../helpers/kv-dump.js";

function trace(agent: string): string {
  const meta = { agent };
  const first = { version: "0.1", id: agentlogId(parseLossless(JSON.stringify(meta))), kind: "metadata", ts: "2024-06-01T00:00:00Z", parent: null, payload: meta };
  const ask = { q: "hello" };
  const second = { version: "0.1", id: agentlogId(parseLossless(JSON.stringify(ask))), kind: "chat_request", ts: "2024-06-01T00:00:01Z", parent: first.id, payload: ask };
  return `${JSON.stringify(first)}\n${JSON.stringify(second)}\n`;
}

let work = "";
let agent = "";
let bundle = "";
const config = JSON.stringify({
  agent: "rt", redaction: { enabled: false },
  sources: [
    { kind: "kv", name: "kv", path: "runtime/kv", format: "memsnap" },
    { kind: "trace", name: "traces", path: "traces" },
    { kind: "trace", name: "run", path: "runs/one.agentlog" },
    { kind: "state", name: "state", path: "state" },
  ],
});

beforeEach(() => {
  work = tempDir("memsnap-ip-rt-");
  agent = join(work, "agent");
  generateKvDump({ dir: join(agent, "runtime", "kv"), nLayers: 2, sequences: 2, prefixBlocks: 1, ownBlocks: 1, zeroBlocks: 1 });
  mkdirSync(join(agent, "traces"), { recursive: true });
  writeFileSync(join(agent, "traces", "a.agentlog"), trace("a"));
  writeFileSync(join(agent, "traces", "notes.txt"), "not a trace: the layer's globs leave it alone\n");
  mkdirSync(join(agent, "runs"));
  writeFileSync(join(agent, "runs", "one.agentlog"), trace("one"));
  mkdirSync(join(agent, "state"));
  writeFileSync(join(agent, "state", "cursor.json"), '{"c":1}');
  writeFileSync(join(agent, "memsnap.json"), config);
  bundle = join(work, "b.memsnap");
  const s = runCliSync(["snapshot", "-c", join(agent, "memsnap.json"), "--out", bundle, "--json"]);
  expectOk(s);
});

describe("in-place restore of kv and trace layers", () => {
  it("over a live agent that moved on: the dump, the traces and the one-trace file come back; the safety snapshot keeps what was replaced", () => {
    const before = treeHashes(join(agent, "runtime", "kv"));
    writeFileSync(join(agent, "runtime", "kv", "extra.bin"), "written after the snapshot");
    appendFileSync(join(agent, "traces", "a.agentlog"), `${trace("a2").split("\n")[0]}\n`);
    writeFileSync(join(agent, "traces", "b.agentlog"), trace("b"));
    writeFileSync(join(agent, "runs", "one.agentlog"), trace("other"));
    writeFileSync(join(agent, "state", "cursor.json"), '{"c":2}');
    const store = join(work, "store");
    const r = runCliSync(["restore", bundle, "-c", join(agent, "memsnap.json"), "--store", store, "--only", "kv", "--only", "traces", "--only", "run", "--json"]);
    expectOk(r);
    expect(treeHashes(join(agent, "runtime", "kv"))).toEqual(before);
    expect(readFileSync(join(agent, "traces", "a.agentlog"), "utf8")).toBe(trace("a"));
    expect(existsSync(join(agent, "traces", "b.agentlog"))).toBe(false);
    expect(existsSync(join(agent, "traces", "notes.txt"))).toBe(true);
    expect(readFileSync(join(agent, "runs", "one.agentlog"), "utf8")).toBe(trace("one"));
    expect(readFileSync(join(agent, "state", "cursor.json"), "utf8")).toBe('{"c":2}'); // not --only
    // the safety snapshot holds the replaced layers only, as they were
    const safety = (jsonOut(r) as { safety_snapshot: { path: string } }).safety_snapshot;
    return readLayout(safety.path).then((l) => {
      const m = parseManifest(l.manifestBytes);
      expect(m.layers.map((x) => x.name).sort()).toEqual(["kv", "run", "traces"]);
      expect(m.index?.some((e) => e.path === "traces/b.agentlog")).toBe(true);
    });
  });

  it("a dump stored as byte planes (layer schema 3) comes back in place byte for byte", () => {
    writeFileSync(join(agent, "memsnap.json"), config.replace('"format":"memsnap"', '"format":"memsnap","shuffle":"on"'));
    const shuffled = join(work, "shuffled.memsnap");
    expectOk(runCliSync(["snapshot", "-c", join(agent, "memsnap.json"), "--out", shuffled, "--json"]));
    return readLayout(shuffled).then((l) => {
      const m = parseManifest(l.manifestBytes);
      expect(m.layers.find((x) => x.name === "kv")!.schema_version).toBe(3);
      const before = treeHashes(join(agent, "runtime", "kv"));
      const data = join(agent, "runtime", "kv", "data");
      const f = join(data, readdirSync(data).sort()[0]!);
      writeFileSync(f, Buffer.alloc(statSync(f).size, 7)); // every page of a data file overwritten
      writeFileSync(join(agent, "runtime", "kv", "extra.bin"), "written after the snapshot");
      // (a dump whose pages no longer match its manifest cannot be kept by a safety snapshot)
      const r = runCliSync(["restore", shuffled, "-c", join(agent, "memsnap.json"), "--only", "kv", "--no-safety-snapshot", "--json"]);
      expectOk(r);
      expect(treeHashes(join(agent, "runtime", "kv"))).toEqual(before);
    });
  });

  it("over a damaged dump: the safety snapshot cannot keep it and says how to go on; without one the dump is rebuilt", () => {
    const before = treeHashes(join(agent, "runtime", "kv"));
    const data = join(agent, "runtime", "kv", "data");
    const f = join(data, readdirSync(data).sort()[0]!);
    const b = readFileSync(f);
    b[100] = b[100]! ^ 0xff;
    writeFileSync(f, b);
    const refused = runCliSync(["restore", bundle, "-c", join(agent, "memsnap.json"), "--store", join(work, "store"), "--only", "kv"]);
    expect(refused.code).toBe(6);
    expect(refused.stderr).toContain("cannot take the safety snapshot of the live agent");
    expect(refused.stderr).toContain("[MEMSNAP_SOURCE_DIGEST_MISMATCH]");
    expect(refused.stderr).toContain("--no-safety-snapshot");
    expect(readFileSync(f)).toEqual(b); // untouched
    expectOk(runCliSync(["restore", bundle, "-c", join(agent, "memsnap.json"), "--only", "kv", "--no-safety-snapshot"]));
    expect(treeHashes(join(agent, "runtime", "kv"))).toEqual(before);
  });

  it("onto a new machine: every layer is created where the config puts it, a one-trace source as that file", () => {
    const fresh = join(work, "fresh");
    restoreOntoNewMachine(bundle, config, fresh);
    expect(treeHashes(join(fresh, "runtime", "kv"))).toEqual(treeHashes(join(agent, "runtime", "kv")));
    expect(readFileSync(join(fresh, "traces", "a.agentlog"), "utf8")).toBe(trace("a"));
    expect(statSync(join(fresh, "runs", "one.agentlog")).isFile()).toBe(true);
    expect(readFileSync(join(fresh, "runs", "one.agentlog"), "utf8")).toBe(trace("one"));
    expect(readFileSync(join(fresh, "state", "cursor.json"), "utf8")).toBe('{"c":1}');
    rmSync(fresh, { recursive: true, force: true });
  });
});

describe("in-place restore of a bundle with a CRIU layer", () => {
  it("is refused before anything happens, with the --only flags for the layers that can go in place", async () => {
    const { genCriuDump } = await import("../helpers/criu-dump.js");
    const { expectCliError } = await import("../helpers/cli.js");
    const a = join(work, "with-criu");
    mkdirSync(join(a, "state"), { recursive: true });
    writeFileSync(join(a, "state", "cursor.json"), '{"c":1}');
    genCriuDump(join(a, "dump"), { pids: [7], pagesPerProcess: 2 });
    const key = join(work, "age.key");
    const recipient = runCliSync(["keygen", "-o", key]).stdout.trim();
    writeFileSync(join(a, "memsnap.json"), JSON.stringify({
      agent: "cr", recipients: [recipient], sources: [{ kind: "state", name: "state", path: "state" }, { kind: "criu", name: "proc", path: "dump" }],
    }));
    const b = join(work, "cr.memsnap");
    expectOk(runCliSync(["snapshot", "-c", join(a, "memsnap.json"), "--out", b]));
    writeFileSync(join(a, "state", "cursor.json"), '{"c":2}');
    const store = join(work, "cr-store");
    const r = runCliSync(["restore", b, "-c", join(a, "memsnap.json"), "-i", key, "--store", store]);
    expectCliError(r, 2, "MEMSNAP_USAGE");
    expect(r.stderr).toContain("layer proc: criu layers cannot be restored in place yet");
    expect(r.stderr).toContain("hint: restore it with --to DIR; the others in place with --only state");
    expect(existsSync(store)).toBe(false); // not even a safety snapshot
    expect(readFileSync(join(a, "state", "cursor.json"), "utf8")).toBe('{"c":2}');
    // the way out it names works
    expectOk(runCliSync(["restore", b, "-c", join(a, "memsnap.json"), "-i", key, "--store", store, "--only", "state"]));
    expect(readFileSync(join(a, "state", "cursor.json"), "utf8")).toBe('{"c":1}');
  });
});
