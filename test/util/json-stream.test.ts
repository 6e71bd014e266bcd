/** Unit tests for src/util/json-stream.ts: differential against JSON.parse, rejections, limits, callbacks. */
import { describe, expect, it } from "vitest";
import { JsonStreamError, streamJson, streamJsonSync, type StreamJsonOptions } from "../../src/util/json-stream.js";

/** mulberry32: a small seeded PRNG, so failures reproduce. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

type Rng = () => number;
const int = (rng: Rng, n: number): number => Math.floor(rng() * n);
const pick = <T>(rng: Rng, xs: readonly T[]): T => xs[int(rng, xs.length)]!;

const WS = ["", "", "", " ", "\n", "\t", "\r\n", "  \n\t "];
const ws = (rng: Rng): string => pick(rng, WS);

/** Pieces of string content: plain, structural characters, multi-byte UTF-8, emoji. */
const STRING_PIECES = ["a", "key", "x y", "]", "}", "[", "{", ",", ":", "é", "日本", "😀", "/", "'", "\u2028", "0"];
/** The same content written as JSON escapes. */
const ESCAPES = ['\\"', "\\\\", "\\n", "\\t", "\\u00e9", "\\u65e5", "\\ud83d\\ude00", "\\/", "\\b", "\\f", "\\r", "\\u0000"];

/** A JSON string literal with a random mix of raw text and escapes. */
function genString(rng: Rng): string {
  let s = '"';
  const n = int(rng, 6);
  for (let i = 0; i < n; i++) s += rng() < 0.3 ? pick(rng, ESCAPES) : pick(rng, STRING_PIECES);
  // Ending in an escaped backslash or an escaped quote exercises the string scan's edge cases.
  if (rng() < 0.15) s += pick(rng, ["\\\\", '\\"', "\\\\\\\\", '\\\\\\"']);
  return s + '"';
}

const NUMBERS = ["0", "-0", "1", "-1", "42", "-17", "3.25", "-0.5", "1e5", "1E-3", "-2.5e+10", "6.02E23", "12345678901234567890", "0.000001"];
const genNumber = (rng: Rng): string => (rng() < 0.5 ? pick(rng, NUMBERS) : String(int(rng, 2_000_000) - 1_000_000));

/** A random JSON value as text, with random insignificant whitespace. */
function genValue(rng: Rng, depth: number): string {
  const r = rng();
  if (depth <= 0 || r < 0.45) {
    const p = rng();
    if (p < 0.4) return genString(rng);
    if (p < 0.8) return genNumber(rng);
    return pick(rng, ["true", "false", "null"]);
  }
  const n = int(rng, 5);
  const parts: string[] = [];
  if (r < 0.75) {
    for (let i = 0; i < n; i++) parts.push(ws(rng) + genString(rng) + ws(rng) + ":" + ws(rng) + genValue(rng, depth - 1) + ws(rng));
    return "{" + (parts.length ? parts.join(",") : ws(rng)) + "}";
  }
  for (let i = 0; i < n; i++) parts.push(ws(rng) + genValue(rng, depth - 1) + ws(rng));
  return "[" + (parts.length ? parts.join(",") : ws(rng)) + "]";
}

/** The streamed keys the generated documents use; "it\u0065ms" in the text is also "items". */
const STREAMED = ["items", "entries"];

/** A random document: a top-level object with streamed arrays, ordinary members, duplicates. */
function genDocument(rng: Rng): string {
  const members: string[] = [];
  const keys = [...STREAMED].filter(() => rng() < 0.85);
  const nOther = int(rng, 5);
  for (let i = 0; i < nOther; i++) keys.push(pick(rng, ["meta", "version", "note", "it", "entrie", "__proto__", "2", "é日本"]));
  // shuffle
  for (let i = keys.length - 1; i > 0; i--) {
    const j = int(rng, i + 1);
    [keys[i], keys[j]] = [keys[j]!, keys[i]!];
  }
  const seenStreamed = new Set<string>();
  for (const key of keys) {
    let keyText = JSON.stringify(key);
    if (key === "items" && rng() < 0.3) keyText = '"it\\u0065ms"';
    let value: string;
    if (STREAMED.includes(key)) {
      if (seenStreamed.has(key)) continue; // a streamed key given twice is an error (tested apart)
      seenStreamed.add(key);
      if (rng() < 0.1) {
        value = genValue(rng, 2); // not necessarily an array: returned as is
      } else {
        const n = rng() < 0.1 ? 0 : int(rng, 40);
        const elems: string[] = [];
        for (let i = 0; i < n; i++) elems.push(ws(rng) + genValue(rng, 3) + ws(rng));
        value = "[" + (elems.length ? elems.join(",") : ws(rng)) + "]";
      }
    } else {
      value = genValue(rng, 3);
    }
    members.push(ws(rng) + keyText + ws(rng) + ":" + ws(rng) + value + ws(rng));
  }
  return ws(rng) + "{" + (members.length ? members.join(",") : ws(rng)) + "}" + ws(rng);
}

/** Split `bytes` into chunks: one chunk, 1-byte chunks, or random sizes. */
function chunkify(bytes: Uint8Array, rng: Rng, mode: number): Uint8Array[] {
  if (mode === 0) return [bytes];
  const out: Uint8Array[] = [];
  for (let i = 0; i < bytes.length; ) {
    const n = mode === 1 ? 1 : mode === 2 ? 1 + int(rng, 8) : 1 + int(rng, 300);
    // Copies, so the parser cannot rely on chunks sharing one backing buffer.
    out.push(bytes.slice(i, i + n));
    i += n;
  }
  return out;
}

const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);

interface Collected {
  result: Record<string, unknown>;
  items: Record<string, Array<[number, unknown]>>;
}

function collectingOptions(keys: string[], extra: Partial<StreamJsonOptions> = {}): { opts: StreamJsonOptions; items: Collected["items"] } {
  const items: Collected["items"] = {};
  const arrays: StreamJsonOptions["arrays"] = {};
  for (const k of keys) {
    items[k] = [];
    arrays[k] = (item, index) => items[k]!.push([index, item]);
  }
  return { opts: { arrays, ...extra }, items };
}

function runSync(chunks: Uint8Array[], keys = STREAMED, extra: Partial<StreamJsonOptions> = {}): Collected {
  const { opts, items } = collectingOptions(keys, extra);
  return { result: streamJsonSync(chunks, opts), items };
}

async function runAsync(chunks: Uint8Array[], keys = STREAMED, extra: Partial<StreamJsonOptions> = {}): Promise<Collected> {
  const { opts, items } = collectingOptions(keys, extra);
  async function* gen(): AsyncGenerator<Uint8Array> {
    for (const c of chunks) yield c;
  }
  return { result: await streamJson(gen(), opts), items };
}

/** What streamJson should produce for `text`, from JSON.parse. */
function expected(text: string, keys = STREAMED): Collected {
  const doc = JSON.parse(text) as Record<string, unknown>;
  const result: Record<string, unknown> = {};
  const items: Collected["items"] = {};
  for (const k of Object.keys(doc)) {
    const v = doc[k];
    if (keys.includes(k) && Array.isArray(v)) {
      items[k] = v.map((x, i) => [i, x]);
      Object.defineProperty(result, k, { value: v.length, writable: true, enumerable: true, configurable: true });
    } else {
      Object.defineProperty(result, k, { value: v, writable: true, enumerable: true, configurable: true });
    }
  }
  for (const k of keys) items[k] ??= [];
  return { result, items };
}

function expectSame(got: Collected, want: Collected): void {
  expect(Object.keys(got.result)).toEqual(Object.keys(want.result));
  expect(got.result).toStrictEqual(want.result);
  expect(Object.getPrototypeOf(got.result)).toBe(Object.prototype);
  expect(got.items).toStrictEqual(want.items);
}

/** Assert that the document is rejected with a JsonStreamError, sync and async, whole and byte by byte. */
async function expectRejected(text: string | Uint8Array, keys = STREAMED): Promise<JsonStreamError> {
  const bytes = typeof text === "string" ? utf8(text) : text;
  let first: JsonStreamError | undefined;
  for (const chunks of [[bytes], chunkify(bytes, prng(1), 1), chunkify(bytes, prng(2), 2)]) {
    let err: unknown;
    try {
      runSync(chunks, keys);
    } catch (e) {
      err = e;
    }
    expect(err, `sync should reject ${JSON.stringify(new TextDecoder().decode(bytes))}`).toBeInstanceOf(JsonStreamError);
    expect((err as Error).message).toMatch(/at byte offset \d+$/);
    await expect(runAsync(chunks, keys)).rejects.toBeInstanceOf(JsonStreamError);
    first ??= err as JsonStreamError;
  }
  return first!;
}

describe("streamJson: differential against JSON.parse", () => {
  it("agrees with JSON.parse on generated documents in any chunking", async () => {
    const rng = prng(20240607);
    for (let n = 0; n < 400; n++) {
      const text = genDocument(rng);
      const want = expected(text);
      const bytes = utf8(text);
      for (let mode = 0; mode < 4; mode++) {
        const chunks = chunkify(bytes, rng, mode);
        expectSame(runSync(chunks), want);
        if (mode === 1 || mode === 3) expectSame(await runAsync(chunks), want);
      }
    }
  });

  it("accepts a sync iterable in streamJson and any Uint8Array view", async () => {
    const text = '{"a": [1, {"b": "日本"}], "items": ["x", 2, null], "z": true}';
    const bytes = utf8(text);
    // A view into a larger buffer, not starting at offset 0.
    const backing = new Uint8Array(bytes.length + 10);
    backing.set(bytes, 5);
    const view = backing.subarray(5, 5 + bytes.length);
    const { opts, items } = collectingOptions(["items"]);
    const result = await streamJson([view.subarray(0, 7), view.subarray(7)], opts);
    expectSame({ result, items }, expected(text, ["items"]));
  });

  it("copies what it keeps, so a source may reuse one buffer for every chunk", () => {
    const text = JSON.stringify({ a: { b: "日本".repeat(30) }, items: Array.from({ length: 300 }, (_, i) => ({ i, s: `é${i}"\\` })), z: [1.5, null] });
    const bytes = utf8(text);
    for (const size of [1, 3, 7, 64, 1000]) {
      function* reusing(): Generator<Uint8Array> {
        const shared = new Uint8Array(size);
        for (let i = 0; i < bytes.length; i += size) {
          const n = Math.min(size, bytes.length - i);
          shared.fill(0x7d); // clobber what the parser saw last time
          shared.set(bytes.subarray(i, i + n));
          yield shared.subarray(0, n);
        }
      }
      const { opts, items } = collectingOptions(["items"]);
      expectSame({ result: streamJsonSync(reusing(), opts), items }, expected(text, ["items"]));
    }
  });

  it("streams a large array element by element and counts it", () => {
    const n = 5000;
    const elems = Array.from({ length: n }, (_, i) => ({ key: `k/${i}/é`, sha256: "ab".repeat(32), size: i * 7, s: 'q"]}\\' }));
    const text = JSON.stringify({ version: 2, entries: elems, tail: { ok: true } });
    const seen: unknown[] = [];
    const result = streamJsonSync(chunkify(utf8(text), prng(3), 3), {
      arrays: {
        entries: (item, index) => {
          expect(index).toBe(seen.length);
          seen.push(item);
        },
      },
    });
    expect(result).toEqual({ version: 2, entries: n, tail: { ok: true } });
    expect(seen).toEqual(elems);
  });

  it("returns count 0 for an empty streamed array", () => {
    for (const text of ['{"items":[]}', '{ "items" : [ \n ] , "a" : 1 }']) {
      const got = runSync(chunkify(utf8(text), prng(4), 1));
      expect(got.result).toEqual(JSON.parse(text.replace("[ \n ]", "0").replace("[]", "0")));
      expect(got.items.items).toEqual([]);
    }
  });

  it("returns a streamed key's non-array value as is, without calling back", () => {
    for (const v of ["5", '"x"', "null", '{"a":[1,2]}', "true"]) {
      const text = `{"items":${v},"b":[1]}`;
      const got = runSync([utf8(text)]);
      expect(got.result).toStrictEqual({ items: JSON.parse(v), b: [1] });
      expect(got.items.items).toEqual([]);
    }
  });

  it("keeps the last of duplicate ordinary keys, like JSON.parse", () => {
    const text = '{"a":1,"b":2,"a":{"x":3},"items":[7]}';
    expectSame(runSync([utf8(text)]), expected(text));
    expect(runSync([utf8(text)]).result).toEqual({ a: { x: 3 }, b: 2, items: 1 });
  });

  it("makes __proto__ an own property, like JSON.parse", () => {
    const got = runSync([utf8('{"__proto__":{"polluted":1},"items":[]}')]);
    expect(Object.getPrototypeOf(got.result)).toBe(Object.prototype);
    expect(Object.hasOwn(got.result, "__proto__")).toBe(true);
    expect((got.result as { polluted?: unknown }).polluted).toBeUndefined();
  });

  it("does not stream inherited property names", () => {
    const got = streamJsonSync([utf8('{"toString":[1,2],"items":[3]}')], { arrays: { items: () => {} } });
    expect(got).toEqual({ toString: [1, 2], items: 1 });
  });

  it("finishes a number split across chunks only at its delimiter", () => {
    const got = runSync([utf8('{"items":[12'), utf8("34,5"), utf8("6]"), utf8(',"n":-1'), utf8("e"), utf8("3}")]);
    expect(got.items.items).toEqual([
      [0, 1234],
      [1, 56],
    ]);
    expect(got.result).toEqual({ items: 2, n: -1e3 });
  });

  it("handles strings ending in escaped backslashes and quotes across chunk boundaries", () => {
    const text = String.raw`{"items":["a\\", "b\"]", "c\\\"}", "\\\\"], "k\\": "v\"\\"}`;
    const want = expected(text);
    const bytes = utf8(text);
    for (let cut = 1; cut < bytes.length; cut++) {
      expectSame(runSync([bytes.subarray(0, cut), bytes.subarray(cut)]), want);
    }
    expectSame(runSync(chunkify(bytes, prng(5), 1)), want);
  });
});

describe("streamJson: invalid documents", () => {
  const sample = String.raw`{"version": 1, "items": [{"k": "é日本😀", "n": -1.5e3}, "a\"]\\", [true, false, null], 12], "meta": {"x": [1, {"y": "}"}]}, "entries": []}`;

  it("the sample itself parses", () => {
    expectSame(runSync([utf8(sample)]), expected(sample));
  });

  it("rejects every truncation of a document", async () => {
    const bytes = utf8(sample);
    for (let cut = 0; cut < bytes.length; cut++) {
      const prefix = bytes.subarray(0, cut);
      expect(() => JSON.parse(new TextDecoder().decode(prefix))).toThrow(SyntaxError);
      for (const chunks of [[prefix], chunkify(prefix, prng(cut), 1)]) {
        expect(() => runSync(chunks), `prefix of ${cut} bytes`).toThrow(JsonStreamError);
      }
      await expect(runAsync(chunkify(prefix, prng(cut), 2))).rejects.toBeInstanceOf(JsonStreamError);
    }
  });

  const invalid: Array<[string, string]> = [
    ["empty input", ""],
    ["only whitespace", " \n\t "],
    ["trailing garbage", '{"a":1} x'],
    ["a second closing brace", '{"a":1}}'],
    ["a second document", '{"a":1}{}'],
    ["trailing garbage after streamed array", '{"items":[1,2]} ,'],
    ["missing comma between members", '{"a":1 "b":2}'],
    ["missing comma between streamed elements", '{"items":[1 2]}'],
    ["missing comma between streamed objects", '{"items":[{"a":1} {"b":2}]}'],
    ["missing comma inside a value", '{"a":[1 2]}'],
    ["trailing comma in the object", '{"a":1,}'],
    ["trailing comma in a streamed array", '{"items":[1,2,]}'],
    ["trailing comma in a nested array", '{"a":[1,]}'],
    ["trailing comma in a nested object", '{"a":{"b":1,}}'],
    ["leading comma in a streamed array", '{"items":[,1]}'],
    ["double comma in a streamed array", '{"items":[1,,2]}'],
    ["double comma in the object", '{"a":1,,"b":2}'],
    ["a lone comma", "{,}"],
    ["bad literal", '{"a":tru}'],
    ["bad literal in a streamed array", '{"items":[tru]}'],
    ["bad literal nested", '{"a":[nul]}'],
    ["literal followed by junk", '{"a":true1}'],
    ["unterminated string value", '{"a":"abc}'],
    ["unterminated string element", '{"items":["abc]}'],
    ["unterminated key", '{"abc'],
    ["unterminated nested object", '{"a":{"b":1}'],
    ["unterminated streamed array", '{"items":[1,2'],
    ["missing colon", '{"a" 1}'],
    ["unquoted key", "{a:1}"],
    ["single-quoted string", "{'a':1}"],
    ["missing value", '{"a":}'],
    ["missing value before comma", '{"a":,"b":1}'],
    ["leading zero", '{"a":01}'],
    ["bare fraction point", '{"items":[1.]}'],
    ["plus sign", '{"a":+1}'],
    ["hex number", '{"a":0x10}'],
    ["NaN", '{"a":NaN}'],
    ["raw control character in a string", '{"a":"x\u0001y"}'],
    ["raw newline in a key", '{"a\nb":1}'],
    ["bad escape", '{"items":["\\x"]}'],
    ["short unicode escape", '{"a":"\\u12"}'],
    ["mismatched brackets", '{"a":[1}]}'],
    ["streamed array closed by a brace", '{"items":[1}'],
    ["object closed by a bracket", '{"a":1]'],
    ["non-JSON whitespace (form feed)", '{\f"a":1}'],
    ["non-JSON whitespace (NBSP)", '{"a":\u00a01}'],
    ["byte order mark", '\ufeff{"a":1}'],
    ["a comment", '{"a":1 /* c */}'],
    ["key that is not a string", '{1:2}'],
    ["a string glued to a number", '{"a":1"b"}'],
  ];

  for (const [name, text] of invalid) {
    it(`rejects: ${name}`, async () => {
      expect(() => JSON.parse(text)).toThrow(SyntaxError);
      await expectRejected(text);
    });
  }

  it("rejects a top-level value that is not an object (valid JSON, but not a document)", async () => {
    for (const text of ["[1,2]", '[{"items":[1]}]', '"x"', "1", "null", " true "]) {
      expect(() => JSON.parse(text)).not.toThrow();
      const err = await expectRejected(text);
      expect(err.message).toMatch(/must be an object/);
    }
  });

  it("rejects a streamed key that appears twice (JSON.parse would keep the last)", async () => {
    for (const text of ['{"items":[1],"items":[2]}', '{"items":[1],"a":0,"it\\u0065ms":[]}', '{"items":5,"items":[2]}']) {
      expect(() => JSON.parse(text)).not.toThrow();
      const err = await expectRejected(text);
      expect(err.message).toMatch(/duplicate key "items"/);
    }
  });

  it("reports the byte offset of the problem", () => {
    const text = '{"k": "日本", "items": [1, 2, tru]}';
    let err: unknown;
    try {
      runSync(chunkify(utf8(text), prng(6), 1));
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(JsonStreamError);
    expect((err as JsonStreamError).offset).toBe(utf8(text.slice(0, text.indexOf("tru"))).length);
    expect((err as JsonStreamError).message).toContain(`at byte offset ${(err as JsonStreamError).offset}`);
  });
});

describe("streamJson: maxValueBytes", () => {
  async function expectRejectedWith(text: string, extra: Partial<StreamJsonOptions>): Promise<void> {
    for (const mode of [0, 1, 2]) {
      const chunks = chunkify(utf8(text), prng(12), mode);
      expect(() => runSync(chunks, STREAMED, extra)).toThrow(/maxValueBytes/);
      await expect(runAsync(chunks, STREAMED, extra)).rejects.toThrow(/maxValueBytes/);
    }
  }

  it("rejects a member value or element larger than the limit, accepts one at the limit", async () => {
    const extra = { maxValueBytes: 10 };
    expect(runSync([utf8('{"a":"12345678"}')], STREAMED, extra).result).toEqual({ a: "12345678" }); // 10 bytes
    expect(runSync([utf8('{"items":[[1,2,3,40]]}')], STREAMED, extra).items.items).toEqual([[0, [1, 2, 3, 40]]]); // 10 bytes
    await expectRejectedWith('{"a":"123456789"}', extra); // 11 bytes
    await expectRejectedWith('{"items":[[1,2,3,4,5]]}', extra); // 11 bytes
  });

  it("measures the limit exactly, in bytes", () => {
    const ok = runSync([utf8('{"a":"éééé"}')], STREAMED, { maxValueBytes: 10 }); // "éééé" is 10 bytes
    expect(ok.result).toEqual({ a: "éééé" });
    for (const chunks of [[utf8('{"a":"ééééx"}')], chunkify(utf8('{"a":"ééééx"}'), prng(7), 1)]) {
      expect(() => runSync(chunks, STREAMED, { maxValueBytes: 10 })).toThrow(/maxValueBytes/);
    }
  });

  it("rejects an over-long element, key and member value, sync and async, in any chunking", async () => {
    const big = "x".repeat(100);
    for (const text of [`{"items":["${big}"]}`, `{"${big}":1}`, `{"a":{"b":"${big}"}}`, `{"items":[${"1".repeat(100)}]}`, `{"items":5${"0".repeat(100)}}`]) {
      for (const mode of [0, 1, 2]) {
        const chunks = chunkify(utf8(text), prng(8), mode);
        expect(() => runSync(chunks, STREAMED, { maxValueBytes: 50 })).toThrow(JsonStreamError);
        await expect(runAsync(chunks, STREAMED, { maxValueBytes: 50 })).rejects.toThrow(/maxValueBytes/);
      }
    }
  });

  it("gives up on an incomplete value as soon as it is over the limit (bounded memory)", () => {
    for (const [head, fill] of [
      ['{"a":"', "x"],
      ['{"items":[{"k":[', "1,"],
      ['{"items":[', "9"],
      ['{"', "k"],
    ] as const) {
      let pulled = 0;
      function* endless(): Generator<Uint8Array> {
        yield utf8(head);
        const piece = utf8(fill.repeat(64));
        for (;;) {
          pulled += piece.length;
          yield piece;
        }
      }
      expect(() => streamJsonSync(endless(), { arrays: { items: () => {} }, maxValueBytes: 1000 })).toThrow(JsonStreamError);
      expect(pulled).toBeLessThan(1200);
    }
  });

  it("streams an array far larger than the limit", () => {
    const text = JSON.stringify({ items: Array.from({ length: 1000 }, (_, i) => ({ i, s: "abcdefgh" })) });
    const got = runSync(chunkify(utf8(text), prng(9), 3), STREAMED, { maxValueBytes: 64 });
    expect(got.result).toEqual({ items: 1000 });
    expect(got.items.items!.length).toBe(1000);
  });
});

describe("streamJson: callbacks", () => {
  it("propagates the error a callback throws, unchanged", async () => {
    const boom = new Error("boom");
    const opts: StreamJsonOptions = {
      arrays: {
        items: (_item, index) => {
          if (index === 2) throw boom;
        },
      },
    };
    const bytes = utf8('{"items":[1,2,3,4],"b":1}');
    expect(() => streamJsonSync([bytes], opts)).toThrow(boom);
    let caught: unknown;
    try {
      streamJsonSync(chunkify(bytes, prng(10), 1), opts);
    } catch (e) {
      caught = e;
    }
    expect(caught).toBe(boom);
    await expect(streamJson([bytes], opts)).rejects.toBe(boom);
    async function* gen(): AsyncGenerator<Uint8Array> {
      yield* chunkify(bytes, prng(11), 2);
    }
    await expect(streamJson(gen(), opts)).rejects.toBe(boom);
  });

  it("propagates a non-Error thrown value, and a JsonStreamError thrown by a callback, unchanged", () => {
    for (const thrown of [{ not: "an error" }, new JsonStreamError("the caller's own", 0)]) {
      let caught: unknown;
      try {
        streamJsonSync([utf8('{"items":[1]}')], {
          arrays: {
            items: () => {
              throw thrown;
            },
          },
        });
      } catch (e) {
        caught = e;
      }
      expect(caught).toBe(thrown);
    }
  });

  it("calls back in order with each element's index, for each streamed key", () => {
    const calls: string[] = [];
    streamJsonSync([utf8('{"a":["x","y"],"m":0,"b":[{"z":1}],"c":[]}')], {
      arrays: {
        a: (item, i) => calls.push(`a${i}=${JSON.stringify(item)}`),
        b: (item, i) => calls.push(`b${i}=${JSON.stringify(item)}`),
        c: () => calls.push("c"),
        absent: () => calls.push("absent"),
      },
    });
    expect(calls).toEqual(['a0="x"', 'a1="y"', 'b0={"z":1}']);
  });
});
