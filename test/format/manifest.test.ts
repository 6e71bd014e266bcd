/**
 * The manifest: canonical JSON, the seal (sha256 of the canonical JSON without `seal`),
 * encodeManifest, index hashing, and parseManifest's checks in their documented order
 * (JSON → format → manifest_version → shape).
 */
import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import {
  basesOf, checkSeal, computeSeal, encodeIndex, encodeManifest, indexHash, MANIFEST_VERSION, parseManifest, referencedIn, refOf, type Manifest,
} from "../../src/format/manifest.js";
import { canonicalJson } from "../../src/util/canonical-json.js";
import { isMemsnapError, type ErrorCode } from "../../src/errors.js";

const H = (s: string): string => createHash("sha256").update(s).digest("hex");

function sample(): Manifest {
  const index = [
    { path: "memory/MEMORY.md", layer: "memory", kind: "file", size: 3, sha256: H("abc"), mode: 0o644, mtime: "2024-01-01T00:00:00.000Z" },
    { path: "state/c.json", layer: "state", kind: "json", size: 2, sha256: H("{}"), mode: 0o600, mtime: "2024-01-01T00:00:00.000Z" },
  ];
  const body: Omit<Manifest, "seal"> = {
    format: "memsnap",
    manifest_version: MANIFEST_VERSION,
    snapshot_id: "01HZZZZZZZZZZZZZZZZZZZZZZZ",
    created_at: "2024-01-01T00:00:00.000Z",
    created_by: "cli",
    label: "nightly ✓",
    tenant: "acme",
    agent: "scribe",
    host: "box-1",
    tool: { name: "memsnap", version: "0.1.0" },
    parent: null,
    layers: [
      { name: "memory", kind: "files", schema_version: 1, artifacts: 1, bytes: 3, meta: { root: "/x", skipped: { symlinks: 0, special: 0 } } },
      { name: "state", kind: "state", schema_version: 1, artifacts: 1, bytes: 2 },
    ],
    payload: {
      member: "payload.tar.zst", compression: { codec: "zstd", level: 3 }, encryption: null,
      stored_size: 100, sha256: H("payload"), tar_size: 4096,
      index_sha256: indexHash({ format: "memsnap-index", snapshot_id: "01HZZZZZZZZZZZZZZZZZZZZZZZ", artifacts: index }),
      artifacts: 2, bytes: 5,
    },
    index,
    redaction: { policy: "off" },
  };
  return { ...body, seal: computeSeal(body) };
}

function expectParse(m: unknown, code: ErrorCode | null, msg?: RegExp): void {
  const bytes = Buffer.isBuffer(m) ? m : Buffer.from(JSON.stringify(m));
  let err: unknown = null;
  try {
    parseManifest(bytes);
  } catch (e) {
    err = e;
  }
  if (code === null) {
    expect(err).toBeNull();
    return;
  }
  expect(isMemsnapError(err, code), `expected ${code}, got ${String(err)}`).toBe(true);
  if (msg) expect((err as Error).message).toMatch(msg);
}

describe("canonical JSON", () => {
  it("sorts keys by code point at every depth, drops undefined, no whitespace", () => {
    expect(canonicalJson({ b: 1, a: [{ z: null, y: "x" }], é: true, Z: 2, u: undefined })).toBe('{"Z":2,"a":[{"y":"x","z":null}],"b":1,"é":true}');
    expect(canonicalJson("line\n\"q\" ✓")).toBe(JSON.stringify("line\n\"q\" ✓"));
    expect(canonicalJson([])).toBe("[]");
    expect(canonicalJson({})).toBe("{}");
  });

  it("refuses values JSON cannot carry faithfully", () => {
    expect(() => canonicalJson(Number.NaN)).toThrow(TypeError);
    expect(() => canonicalJson({ a: Infinity })).toThrow(TypeError);
    expect(() => canonicalJson(() => 1)).toThrow(TypeError);
  });
});

describe("seal", () => {
  it("is sha256: + hex of the canonical JSON without `seal`", () => {
    const m = sample();
    const { seal, ...rest } = m;
    expect(seal).toBe(`sha256:${H(canonicalJson(rest))}`);
    expect(seal).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(checkSeal(m)).toBe(true);
  });

  it("does not depend on key order or on the old seal", () => {
    const m = sample();
    const rev = (v: unknown): unknown => Array.isArray(v) ? v.map(rev)
      : v && typeof v === "object" ? Object.fromEntries(Object.entries(v).reverse().map(([k, x]) => [k, rev(x)])) : v;
    const reordered = rev(m) as Manifest;
    expect(JSON.stringify(reordered)).not.toBe(JSON.stringify(m));
    expect(computeSeal(reordered)).toBe(m.seal);
    expect(computeSeal({ ...m, seal: "sha256:0000" })).toBe(m.seal);
  });

  it("binds every field: any change, however deep, changes the seal", () => {
    const edits: ((m: Manifest) => void)[] = [
      (m) => { m.label = "nightly ✔"; },
      (m) => { m.host = "box-2"; },
      (m) => { m.parent = "01H0"; },
      (m) => { m.layers[0]!.meta = { root: "/y", skipped: { symlinks: 0, special: 0 } }; },
      (m) => { m.layers[1]!.schema_version = 2; },
      (m) => { m.payload.sha256 = H("other"); },
      (m) => { m.payload.stored_size += 1; },
      (m) => { m.index![1]!.mode = 0o644; },
      (m) => { m.index!.reverse(); },
      (m) => { (m.redaction as Record<string, unknown>).extra = 1; },
      (m) => { (m as unknown as Record<string, unknown>).new_field = null; },
    ];
    const seals = new Set<string>([sample().seal]);
    for (const edit of edits) {
      const m = structuredClone(sample());
      edit(m);
      expect(checkSeal(m)).toBe(false);
      seals.add(computeSeal(m));
    }
    expect(seals.size).toBe(edits.length + 1);
  });

  it("does not cover `signature` (a signature signs the seal)", () => {
    const m = sample();
    const signed = { ...m, signature: { scheme: "x", sig: "abc" } } as Manifest;
    expect(checkSeal(signed)).toBe(true);
  });
});

describe("encodeManifest / index", () => {
  it("encodeManifest writes sorted keys with a trailing newline, and parses back to the same manifest", () => {
    const m = sample();
    const bytes = encodeManifest(m);
    const text = bytes.toString("utf8");
    expect(text.endsWith("}\n")).toBe(true);
    const keys = Object.keys(JSON.parse(text));
    expect(keys).toEqual([...keys].sort());
    const back = parseManifest(bytes);
    expect(back).toEqual(m);
    expect(checkSeal(back)).toBe(true);
  });

  it("indexHash is sha256 of encodeIndex, which is canonical", () => {
    const doc = { format: "memsnap-index" as const, snapshot_id: "x", artifacts: sample().index! };
    expect(encodeIndex(doc).toString()).toBe(canonicalJson(doc));
    expect(indexHash(doc)).toBe(H(canonicalJson(doc)));
    expect(indexHash({ ...doc, snapshot_id: "y" })).not.toBe(indexHash(doc));
  });
});

describe("parseManifest", () => {
  it("accepts a valid manifest", () => {
    expectParse(sample(), null);
    const { index: _i, ...noIndex } = sample();
    expectParse({ ...noIndex, payload: { ...sample().payload, member: "payload.tar.zst.age", encryption: { scheme: "age", recipients: [{ type: "scrypt" }] } } }, null);
  });

  it("not JSON, or not an object → MEMSNAP_MANIFEST_CORRUPT", () => {
    expectParse(Buffer.from("{not json"), "MEMSNAP_MANIFEST_CORRUPT", /JSON/);
    expectParse(Buffer.from("[1,2]"), "MEMSNAP_MANIFEST_CORRUPT");
    expectParse(Buffer.from("null"), "MEMSNAP_MANIFEST_CORRUPT");
  });

  it("another format → MEMSNAP_BUNDLE_MALFORMED", () => {
    expectParse({ ...sample(), format: "tarball" }, "MEMSNAP_BUNDLE_MALFORMED");
    expectParse({ manifest_version: 1 }, "MEMSNAP_BUNDLE_MALFORMED");
  });

  it("a newer manifest_version → MEMSNAP_UNSUPPORTED_VERSION, before any other field is looked at", () => {
    expectParse({ ...sample(), manifest_version: MANIFEST_VERSION + 1 }, "MEMSNAP_UNSUPPORTED_VERSION", /newer/);
    expectParse({ format: "memsnap", manifest_version: 99, layers: "whatever the future holds" }, "MEMSNAP_UNSUPPORTED_VERSION");
    for (const v of [0, -1, 1.5, "1", null]) expectParse({ ...sample(), manifest_version: v }, "MEMSNAP_MANIFEST_CORRUPT", /manifest_version/);
  });

  it("missing or malformed fields → MEMSNAP_MANIFEST_CORRUPT", () => {
    const bad: ((m: Record<string, any>) => void)[] = [
      (m) => { delete m.snapshot_id; },
      (m) => { delete m.seal; },
      (m) => { m.tenant = "Acme Corp"; },
      (m) => { m.created_by = "cron"; },
      (m) => { m.label = 5; },
      (m) => { m.tool = "memsnap"; },
      (m) => { m.redaction = null; },
      (m) => { m.layers = {}; },
      (m) => { m.layers[0].artifacts = -1; },
      (m) => { m.payload.member = "payload.tar.gz"; },
      (m) => { m.payload.compression = { codec: "gzip" }; },
      (m) => { m.payload.encryption = { scheme: "pgp", recipients: [] }; },
      (m) => { m.payload.sha256 = "ABC"; },
      (m) => { m.payload.index_sha256 = H("x").toUpperCase(); },
      (m) => { m.payload.tar_size = 1.5; },
      (m) => { m.index = {}; },
      (m) => { m.index[0].sha256 = "nothex"; },
      (m) => { delete m.payload; },
    ];
    for (const edit of bad) {
      const m = structuredClone(sample()) as unknown as Record<string, any>;
      edit(m);
      expectParse(m, "MEMSNAP_MANIFEST_CORRUPT");
    }
  });
});

describe("manifest_version 2: bases and references", () => {
  const BASE = { snapshot_id: "01HYYYYYYYYYYYYYYYYYYYYYYY", seal: `sha256:${H("base")}` };
  function v2(edit: (m: Record<string, any>) => void = () => undefined): Record<string, any> {
    const m = structuredClone(sample()) as unknown as Record<string, any>;
    m.manifest_version = 2;
    m.bases = [BASE];
    m.layers[0].referenced = 1;
    m.index[0].ref = BASE.snapshot_id;
    edit(m);
    return m;
  }

  it("a well-formed incremental manifest parses; basesOf, referencedIn and refOf read it", () => {
    expectParse(v2(), null);
    const m = parseManifest(Buffer.from(JSON.stringify(v2())));
    expect(basesOf(m)).toEqual([BASE]);
    expect(referencedIn(m, m.layers[0]!)).toBe(1);
    expect(refOf(m, m.index![0]!)).toBe(BASE.snapshot_id);
    expect(refOf(m, m.index![1]!)).toBeUndefined();
  });

  it("malformed bases, references and counts → MEMSNAP_MANIFEST_CORRUPT", () => {
    expectParse(v2((m) => { m.bases = {}; }), "MEMSNAP_MANIFEST_CORRUPT", /bases/);
    expectParse(v2((m) => { m.bases = [{ snapshot_id: "../../etc/passwd", seal: BASE.seal }]; }), "MEMSNAP_MANIFEST_CORRUPT", /base/);
    expectParse(v2((m) => { m.bases = [{ snapshot_id: BASE.snapshot_id, seal: "sha256:nothex" }]; }), "MEMSNAP_MANIFEST_CORRUPT", /base/);
    expectParse(v2((m) => { m.bases = [BASE, BASE]; }), "MEMSNAP_MANIFEST_CORRUPT", /twice/);
    expectParse(v2((m) => { m.bases = [{ ...BASE, snapshot_id: m.snapshot_id }]; }), "MEMSNAP_MANIFEST_CORRUPT", /itself/);
    expectParse(v2((m) => { m.index[1].ref = "01HXXXXXXXXXXXXXXXXXXXXXXX"; }), "MEMSNAP_MANIFEST_CORRUPT", /not a base/);
    expectParse(v2((m) => { m.layers[0].referenced = 2; }), "MEMSNAP_MANIFEST_CORRUPT", /referenced/);
    expectParse(v2((m) => { m.layers[0].referenced = -1; }), "MEMSNAP_MANIFEST_CORRUPT", /referenced/);
  });

  it("in a version-1 manifest the same keys are unknown keys: kept (the seal covers them), never acted on", () => {
    const m = v2((x) => { x.manifest_version = 1; x.index[0].ref = "not even an id"; });
    expectParse(m, null);
    const p = parseManifest(Buffer.from(JSON.stringify(m)));
    expect(basesOf(p)).toEqual([]);
    expect(referencedIn(p, p.layers[0]!)).toBe(0);
    expect(refOf(p, p.index![0]!)).toBeUndefined();
    expect((p as unknown as Record<string, unknown>).bases).toEqual([BASE]);
  });
});
