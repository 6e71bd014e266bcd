/**
 * Manifest fields that become paths, names or recursion (issue #35, items 1, 5 and 6):
 * - every layer name is [a-z0-9][a-z0-9_-]{0,63} and listed once, every index entry lies under
 *   the layer it names (MEMSNAP_UNSAFE_PATH, exit 9, as the same name in the payload);
 * - snapshot_id, parent and base ids are ULIDs, kinds are identifiers, created_at is a time,
 *   the manifest nests at most 64 levels (MEMSNAP_MANIFEST_CORRUPT, exit 3);
 * - canonical JSON (the seal) does not recurse, so no depth of a parsed value overflows it;
 * - with real processes: `restore --to` of a sqlite layer named ../outside/app leaves a live
 *   database and its -wal untouched; a hostile snapshot id neither stages outside an agent nor
 *   wedges it; `verify --all` over a store holding a 200,000-deep manifest reports that file
 *   and goes on.
 */
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { isMemsnapError, type ErrorCode } from "../../src/errors.js";
import {
  computeSeal, encodeManifest, indexHash, MANIFEST_MAX_DEPTH, MANIFEST_VERSION, parseManifest, type Manifest,
} from "../../src/format/manifest.js";
import { canonicalJson, jsonDepthOver, valueDepthOver } from "../../src/util/canonical-json.js";

const Database = createRequire(import.meta.url)("better-sqlite3") as typeof import("better-sqlite3");
const BIN = new URL("../../bin/memsnap.js", import.meta.url).pathname;
const HOSTILE = new URL("../../fixtures/hostile/", import.meta.url).pathname;
const VICTIM_KEY = join(HOSTILE, "victim.key");
const work = mkdtempSync(join(tmpdir(), "memsnap-manifest-names-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const H = (s: string): string => createHash("sha256").update(s).digest("hex");
const ID = "01HZZZZZZZZZZZZZZZZZZZZZZZ";

function sample(): Record<string, any> {
  const index = [
    { path: "memory/MEMORY.md", layer: "memory", kind: "file", size: 3, sha256: H("abc"), mode: 0o644, mtime: "2024-01-01T00:00:00.000Z" },
    { path: "state/c.json", layer: "state", kind: "json", size: 2, sha256: H("{}"), mode: 0o600, mtime: "2024-01-01T00:00:00.000Z" },
  ];
  const body: Omit<Manifest, "seal"> = {
    format: "memsnap", manifest_version: MANIFEST_VERSION, snapshot_id: ID, created_at: "2024-01-01T00:00:00.000Z", created_by: "cli",
    label: null, tenant: "acme", agent: "scribe", host: "box-1", tool: { name: "memsnap", version: "0.1.0" }, parent: null,
    layers: [
      { name: "memory", kind: "files", schema_version: 1, artifacts: 1, bytes: 3, meta: { root: "/x" } },
      { name: "state", kind: "state", schema_version: 1, artifacts: 1, bytes: 2 },
    ],
    payload: {
      member: "payload.tar.zst", compression: { codec: "zstd", level: 3 }, encryption: null, stored_size: 100, sha256: H("p"), tar_size: 4096,
      index_sha256: indexHash({ format: "memsnap-index", snapshot_id: ID, artifacts: index }), artifacts: 2, bytes: 5,
    },
    index,
    redaction: { policy: "off" },
  };
  return { ...body, seal: computeSeal(body) };
}

function parseError(m: unknown): unknown {
  try {
    parseManifest(Buffer.isBuffer(m) ? m : Buffer.from(JSON.stringify(m)));
    return null;
  } catch (e) {
    return e;
  }
}

function expectCode(edit: (m: Record<string, any>) => void, code: ErrorCode | null, msg?: RegExp): void {
  const m = sample();
  edit(m);
  const err = parseError(m);
  if (code === null) {
    expect(err, String(err)).toBeNull();
    return;
  }
  expect(isMemsnapError(err, code), `expected ${code}, got ${String(err)}`).toBe(true);
  if (msg) expect((err as Error).message).toMatch(msg);
}

/** `{"a":{"a":…1…}}`, `depth` objects. */
const deepText = (depth: number): string => `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`;

describe("parseManifest: names that become paths (MEMSNAP_UNSAFE_PATH)", () => {
  it("accepts the names memsnap writes", () => {
    expectCode(() => undefined, null);
    expectCode((m) => { m.layers[0].name = "a"; m.index[0].layer = "a"; m.index[0].path = "a/MEMORY.md"; }, null);
    expectCode((m) => { const n = `0${"a_-".repeat(21)}`; m.layers[0].name = n; m.index[0].layer = n; m.index[0].path = `${n}/x`; }, null);
  });

  it.each([
    ["../outside/app"], ["/abs"], ["Memory"], [""], ["."], [".."], ["a".repeat(65)], ["app\0x"], ["-lead"], ["_lead"], ["a/b"], ["a b"], ["é"],
  ])("refuses the layer name %j", (name) => {
    expectCode((m) => { m.layers.push({ name, kind: "sqlite", schema_version: 1, artifacts: 0, bytes: 0 }); }, "MEMSNAP_UNSAFE_PATH", /layer name/);
  });

  it("refuses a layer listed twice", () => {
    expectCode((m) => { m.layers.push({ name: "memory", kind: "sqlite", schema_version: 1, artifacts: 0, bytes: 0 }); }, "MEMSNAP_UNSAFE_PATH", /twice/);
  });

  it("refuses an index entry whose layer is undeclared, a path, or not its path's first segment", () => {
    expectCode((m) => { m.index[0].layer = "ghost"; }, "MEMSNAP_UNSAFE_PATH", /not in the manifest/);
    expectCode((m) => { m.index[0].layer = "../../outside"; }, "MEMSNAP_UNSAFE_PATH", /not in the manifest/);
    expectCode((m) => { m.index[1].layer = "memory"; }, "MEMSNAP_UNSAFE_PATH", /not under its layer/);
    expectCode((m) => { m.index[0].path = "memory/../../x"; }, "MEMSNAP_UNSAFE_PATH", /'\.\.'/);
    expectCode((m) => { m.index[0].path = "/etc/passwd"; }, "MEMSNAP_UNSAFE_PATH", /absolute/);
    expectCode((m) => { m.index[0].path = "memory"; }, "MEMSNAP_UNSAFE_PATH", /not inside a layer/);
    expectCode((m) => { m.index[0].path = "elsewhere/x"; }, "MEMSNAP_UNSAFE_PATH", /not in the manifest/);
  });
});

describe("parseManifest: ids, kinds, times (MEMSNAP_MANIFEST_CORRUPT)", () => {
  it.each([
    ["01JHXST1E0000000000/../../p"], [ID.toLowerCase()], [`8${ID.slice(1)}`], [ID.slice(0, 25)], [`${ID}0`], [`${ID.slice(0, 25)}\0`], [`${ID.slice(0, 25)}U`], [""],
  ])("refuses the snapshot_id %j", (id) => {
    expectCode((m) => { m.snapshot_id = id; }, "MEMSNAP_MANIFEST_CORRUPT", /snapshot_id/);
  });

  it("refuses a parent that is a string but no ULID; accepts a ULID and null", () => {
    expectCode((m) => { m.parent = "01HYYYYYYYYYYYYYYYYYYYYYYY"; }, null);
    expectCode((m) => { m.parent = "../../../etc/passwd"; }, "MEMSNAP_MANIFEST_CORRUPT", /parent/);
    expectCode((m) => { m.parent = `9${ID.slice(1)}`; }, "MEMSNAP_MANIFEST_CORRUPT", /parent/);
  });

  it("refuses a base id past 48 bits of time (the old check took any 26 base32 characters)", () => {
    const v2 = (id: string) => (m: Record<string, any>): void => { m.manifest_version = 2; m.bases = [{ snapshot_id: id, seal: `sha256:${H("b")}` }]; };
    expectCode(v2("01HYYYYYYYYYYYYYYYYYYYYYYY"), null);
    expectCode(v2("9ZZZZZZZZZZZZZZZZZZZZZZZZZ"), "MEMSNAP_MANIFEST_CORRUPT", /base/);
  });

  it("refuses a kind that is not an identifier; an unknown identifier is left to MEMSNAP_UNSUPPORTED_LAYER", () => {
    expectCode((m) => { m.layers[1].kind = "../sqlite"; }, "MEMSNAP_MANIFEST_CORRUPT", /kind/);
    expectCode((m) => { m.layers[1].kind = ""; }, "MEMSNAP_MANIFEST_CORRUPT", /kind/);
    expectCode((m) => { m.layers[1].kind = "future-kind"; }, null);
  });

  it("refuses a created_at that is not an ISO-8601 UTC time, and a meta that is not an object", () => {
    expectCode((m) => { m.created_at = "yesterday"; }, "MEMSNAP_MANIFEST_CORRUPT", /created_at/);
    expectCode((m) => { m.created_at = "2024-13-45T99:99:99.000Z"; }, "MEMSNAP_MANIFEST_CORRUPT", /created_at/);
    expectCode((m) => { m.layers[0].meta = [1]; }, "MEMSNAP_MANIFEST_CORRUPT", /meta/);
  });
});

describe("nesting depth", () => {
  it(`a manifest nested ${MANIFEST_MAX_DEPTH} levels parses; one level more is MEMSNAP_MANIFEST_CORRUPT`, () => {
    // The document is level 1, layers 2, a layer 3, its meta 4: meta holds depth - 4 more.
    const at = (depth: number): Buffer => {
      const m = sample();
      m.layers[0].meta = "@X@";
      return Buffer.from(JSON.stringify(m).replace('"@X@"', deepText(depth - 3)));
    };
    expect(parseError(at(MANIFEST_MAX_DEPTH))).toBeNull();
    expect(isMemsnapError(parseError(at(MANIFEST_MAX_DEPTH + 1)), "MEMSNAP_MANIFEST_CORRUPT")).toBe(true);
  });

  it("a manifest nested 200,000 levels deep (objects or arrays) is MEMSNAP_MANIFEST_CORRUPT, not a stack overflow", () => {
    for (const deep of [deepText(200_000), `${"[".repeat(200_000)}${"]".repeat(200_000)}`]) {
      const text = JSON.stringify({ ...sample(), redaction: "@X@" }).replace('"@X@"', deep);
      const err = parseError(Buffer.from(text));
      expect(isMemsnapError(err, "MEMSNAP_MANIFEST_CORRUPT"), String(err)).toBe(true);
      expect((err as Error).message).toMatch(/nested more than 64 levels/);
    }
  });

  it("brackets inside strings do not count, escaped quotes do not end a string", () => {
    expectCode((m) => { m.label = `${"[{".repeat(5000)}\\"[[[\\\\`; }, null);
    expect(jsonDepthOver(Buffer.from(JSON.stringify({ s: "\"[[[[[", t: [[1]] })), 3)).toBe(false);
    expect(jsonDepthOver(Buffer.from(JSON.stringify({ s: "\\", t: [[[1]]] })), 3)).toBe(true);
    expect(jsonDepthOver(Buffer.from("[]"), 0)).toBe(true);
    expect(jsonDepthOver(Buffer.from("1"), 0)).toBe(false);
  });

  it("jsonDepthOver agrees with the depth of the parsed value on random JSON", () => {
    const depth = (v: unknown): number => {
      let max = 0;
      const stack: [unknown, number][] = [[v, 0]];
      while (stack.length) {
        const [x, d] = stack.pop()!;
        if (x === null || typeof x !== "object") { max = Math.max(max, d); continue; }
        max = Math.max(max, d + 1);
        for (const y of Object.values(x as object)) stack.push([y, d + 1]);
      }
      return max;
    };
    fc.assert(fc.property(fc.jsonValue({ maxDepth: 12 }), fc.integer({ min: 0, max: 14 }), (v, max) => {
      const text = Buffer.from(JSON.stringify(v));
      expect(jsonDepthOver(text, max)).toBe(depth(v) > max);
      expect(valueDepthOver(v, max)).toBe(depth(v) > max);
    }), { numRuns: 300 });
  });

  it("encodeManifest refuses to write a manifest no reader would take (a layer's meta nested too deep): MEMSNAP_SOURCE_INVALID naming the layer", () => {
    const m = sample() as Manifest;
    let v: unknown = 1;
    for (let i = 0; i < 70; i++) v = { a: v };
    m.layers[0]!.meta = { engine: v };
    let err: unknown = null;
    try { encodeManifest(m); } catch (e) { err = e; }
    expect(isMemsnapError(err, "MEMSNAP_SOURCE_INVALID"), String(err)).toBe(true);
    expect((err as Error).message).toMatch(/layer memory/);
    // what it does write, it reads back
    const ok = sample() as Manifest;
    expect(parseManifest(encodeManifest(ok)).seal).toBe(ok.seal);
  });
});

describe("canonical JSON does not recurse", () => {
  /** The recursive definition it replaced, as the reference. */
  const reference = (value: unknown): string => {
    if (value === null || typeof value !== "object") return JSON.stringify(value);
    if (Array.isArray(value)) return `[${value.map(reference).join(",")}]`;
    const o = value as Record<string, unknown>;
    return `{${Object.keys(o).filter((k) => o[k] !== undefined).sort().map((k) => `${JSON.stringify(k)}:${reference(o[k])}`).join(",")}}`;
  };

  it("gives the same bytes as the recursive definition on random values", () => {
    fc.assert(fc.property(fc.jsonValue({ maxDepth: 8 }), (v) => { expect(canonicalJson(v)).toBe(reference(v)); }), { numRuns: 500 });
  });

  it("encodes a value nested 200,000 levels (what JSON.parse makes of a hostile payload index)", () => {
    const v = JSON.parse(`{"x":${"[".repeat(200_000)}${"]".repeat(200_000)},"a":${deepText(200_000)}}`) as unknown;
    const s = canonicalJson(v);
    expect(s.startsWith(`{"a":{"a":`)).toBe(true);
    expect(s.length).toBe(2 + 4 + 200_000 * 6 + 1 + 5 + 400_000);
  });

  it("refuses a cyclic value instead of looping; shared (acyclic) values are fine", () => {
    const a: Record<string, unknown> = { x: 1 };
    a.self = { back: a };
    expect(() => canonicalJson(a)).toThrow(TypeError);
    const shared = { k: [1] };
    expect(canonicalJson({ p: shared, q: shared })).toBe('{"p":{"k":[1]},"q":{"k":[1]}}');
  });
});

// ------------------------------------------------------------------------------ real processes

function cli(args: string[], env: Record<string, string> = {}) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", env: { ...process.env, ...env }, timeout: 120_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}
const jsonOf = (s: string): any => JSON.parse(s);

/** Every file under `dir` with its bytes' hash (regular files), for before/after comparisons. */
function tree(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string, rel: string): void => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const r = rel ? `${rel}/${e.name}` : e.name;
      if (e.isDirectory()) walk(join(d, e.name), r);
      else out[r] = createHash("sha256").update(readFileSync(join(d, e.name))).digest("hex");
    }
  };
  walk(dir, "");
  return out;
}

describe("restore --to: a sqlite layer named ../outside/app", () => {
  it.each([
    ["layer-name-dotdot-sqlite.memsnap", false],
    ["layer-name-dotdot-sqlite-enc.memsnap", true],
  ])("%s: refused (exit 9) before anything is written; the live database and its -wal there keep every committed row", (file, key) => {
    const parent = mkdtempSync(join(work, "sqlite-"));
    const deep = join(parent, "deep");
    const app = join(deep, "outside", "app"); // where staging/../outside/app lands
    mkdirSync(app, { recursive: true });
    // A live WAL database with its committed rows only in the -wal (no checkpoint, connection open).
    const db = new Database(join(app, "agent.db"));
    try {
      db.pragma("journal_mode = WAL");
      db.pragma("wal_autocheckpoint = 0");
      db.exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)");
      const ins = db.prepare("INSERT INTO notes (body) VALUES (?)");
      for (let i = 0; i < 50; i++) ins.run(`committed ${i}`);
      writeFileSync(join(app, "other.db-journal"), "a side file the bundle must not delete\n");
      expect(existsSync(join(app, "agent.db-wal"))).toBe(true);
      const before = tree(deep);
      const args = ["restore", join(HOSTILE, file), "--to", join(deep, "restored"), "--json"];
      if (key) args.push("-i", VICTIM_KEY);
      const r = cli(args);
      expect(r.code, r.stdout + r.stderr).toBe(9);
      expect(jsonOf(r.stdout).error.code).toBe("MEMSNAP_UNSAFE_PATH");
      expect(jsonOf(r.stdout).error.hint).toBeTruthy();
      // Nothing written, nothing deleted: no target, no staging, the side files byte for byte.
      expect(tree(deep)).toEqual(before);
      expect(readdirSync(deep)).toEqual(["outside"]);
      expect(readdirSync(parent)).toEqual(["deep"]);
      // Every committed row is still there for a new reader (it reads them from the -wal).
      const reader = new Database(join(app, "agent.db"));
      try {
        expect((reader.prepare("SELECT count(*) AS n FROM notes").get() as { n: number }).n).toBe(50);
      } finally {
        reader.close();
      }
    } finally {
      db.close();
    }
  });
});

describe("a hostile snapshot id neither stages outside an agent nor wedges it", () => {
  it.each([
    ["snapshot-id-not-ulid.memsnap", false],
    ["snapshot-id-not-ulid-enc.memsnap", true],
  ])("%s: in-place restore exits 3 before anything changes; recover and snapshot still work", (file, key) => {
    const root = mkdtempSync(join(work, "agent-"));
    const agent = join(root, "agent");
    const store = join(root, "store");
    mkdirSync(join(agent, "memory"), { recursive: true });
    writeFileSync(join(agent, "memory", "live.md"), "live\n");
    const config = join(agent, "memsnap.json");
    writeFileSync(config, JSON.stringify({ agent: "victim", store, sources: [{ kind: "files", name: "memory", path: "memory" }] }));
    const beforeRoot = readdirSync(root).sort();
    const beforeAgent = tree(agent);
    const args = ["restore", join(HOSTILE, file), "-c", config, "--json"];
    if (key) args.push("-i", VICTIM_KEY);
    const r = cli(args);
    expect(r.code, r.stdout + r.stderr).toBe(3);
    expect(jsonOf(r.stdout).error.code).toBe("MEMSNAP_MANIFEST_CORRUPT");
    expect(jsonOf(r.stdout).error.message).toMatch(/snapshot_id/);
    expect(readdirSync(root).sort()).toEqual(beforeRoot); // nothing staged beside the agent
    expect(existsSync(join(root, "p"))).toBe(false);
    expect(tree(agent)).toEqual(beforeAgent);
    expect(existsSync(join(agent, ".memsnap", "journal.json"))).toBe(false);
    // The agent is not wedged.
    const rec = cli(["recover", "-c", config, "--json"]);
    expect(rec.code, rec.stdout + rec.stderr).toBe(0);
    const snap = cli(["snapshot", "-c", config, "--json"]);
    expect(snap.code, snap.stdout + snap.stderr).toBe(0);
    const restored = cli(["restore", jsonOf(snap.stdout).path, "-c", config, "--no-safety-snapshot", "--json"]);
    expect(restored.code, restored.stdout + restored.stderr).toBe(0);
    expect(readFileSync(join(agent, "memory", "live.md"), "utf8")).toBe("live\n");
  });
});

describe("verify over a store holding a 200,000-deep manifest", () => {
  it("verify --all reports that file (MEMSNAP_MANIFEST_CORRUPT) and verifies the others", () => {
    const root = mkdtempSync(join(work, "store-"));
    const store = join(root, "store");
    const agent = join(root, "agent");
    mkdirSync(join(agent, "memory"), { recursive: true });
    writeFileSync(join(agent, "memory", "MEMORY.md"), "# remember\n");
    const config = join(agent, "memsnap.json");
    writeFileSync(config, JSON.stringify({ agent: "victim", store, sources: [{ kind: "files", name: "memory", path: "memory" }] }));
    const first = cli(["snapshot", "-c", config, "--json"]);
    expect(first.code, first.stderr).toBe(0);
    // The hostile file sits among the agent's bundles under an id that sorts between two good ones.
    const dir = join(store, "default", "victim");
    const deepId = "01JHXST1E00000000000000000";
    copyFileSync(join(HOSTILE, "manifest-deep-200k.memsnap"), join(dir, `${deepId}.memsnap`));
    copyFileSync(join(HOSTILE, "manifest-deep-200k-enc.memsnap"), join(dir, "01JHXST1E00000000000000001.memsnap"));
    const second = cli(["snapshot", "-c", config, "--json"]);
    expect(second.code, second.stderr).toBe(0);

    const r = cli(["verify", "--all", "--store", store, "--json"]);
    expect(r.code, r.stdout + r.stderr).toBe(3);
    const out = jsonOf(r.stdout) as { ok: boolean; bundles: { ok: boolean; path: string; findings: { code: string }[] }[] };
    expect(out.ok).toBe(false);
    expect(out.bundles.map((b) => [b.path.slice(dir.length + 1), b.ok, b.findings.map((f) => f.code)])).toEqual([
      [`${deepId}.memsnap`, false, ["MEMSNAP_MANIFEST_CORRUPT"]],
      ["01JHXST1E00000000000000001.memsnap", false, ["MEMSNAP_MANIFEST_CORRUPT"]],
      [`${jsonOf(first.stdout).id}.memsnap`, true, []],
      [`${jsonOf(second.stdout).id}.memsnap`, true, []],
    ]);
    const text = cli(["verify", "--all", "--store", store]);
    expect(text.code).toBe(3);
    expect(text.stdout).toMatch(new RegExp(`FAILED  .*${deepId}\\.memsnap: manifest: nested more than 64 levels deep \\[MEMSNAP_MANIFEST_CORRUPT\\]`));
    expect(text.stdout).toMatch(/4 bundle\(s\): 2 verified, 2 failed/);
    // list and inspect skip or refuse it the same way, without a stack overflow
    const list = cli(["list", "--store", store, "--json"]);
    expect(list.code, list.stdout + list.stderr).toBe(0);
    const inspect = cli(["inspect", join(dir, `${deepId}.memsnap`), "--json"]);
    expect(inspect.code).toBe(3);
    expect(jsonOf(inspect.stdout).error.code).toBe("MEMSNAP_MANIFEST_CORRUPT");
  });
});

describe("an in-place dry run of a bundle whose payload index lists a path outside its layer", () => {
  it("payload-index-dotdot-enc.memsnap: refused (exit 9); the dry run used to list memory/../../outside.fifo as a file it would add", () => {
    const root = mkdtempSync(join(work, "dry-"));
    const agent = join(root, "agent");
    mkdirSync(join(agent, "memory"), { recursive: true });
    writeFileSync(join(agent, "memory", "ok.md"), "harmless\n");
    const config = join(agent, "memsnap.json");
    writeFileSync(config, JSON.stringify({ agent: "victim", store: join(root, "store"), sources: [{ kind: "files", name: "memory", path: "memory" }] }));
    const r = spawnSync(process.execPath, [BIN, "restore", join(HOSTILE, "payload-index-dotdot-enc.memsnap"), "-c", config, "--dry-run", "-i", VICTIM_KEY, "--json"], {
      encoding: "utf8", timeout: 60_000,
    });
    expect(r.status, `${r.stdout} ${r.stderr}`).toBe(9);
    expect(jsonOf(r.stdout).error.code).toBe("MEMSNAP_UNSAFE_PATH");
    expect(readdirSync(root).sort()).toEqual(["agent"]);
    expect(readFileSync(join(agent, "memory", "ok.md"), "utf8")).toBe("harmless\n");
  });
});
