// streamJson bounds the members it keeps all together, not only each value: a document of many
// members each under maxValueBytes cannot grow the result without bound (a KV index is read
// from the bundle at restore).
import { describe, expect, it } from "vitest";
import { JsonStreamError, streamJson, streamJsonSync } from "../../src/util/json-stream.js";

function* doc(members: number, valueBytes: number, streamed = 0): Generator<Buffer> {
  yield Buffer.from('{"items":[');
  for (let i = 0; i < streamed; i++) yield Buffer.from(`${i ? "," : ""}{"n":${i}}`);
  yield Buffer.from("]");
  const v = Buffer.from(JSON.stringify("x".repeat(valueBytes - 2)));
  for (let i = 0; i < members; i++) yield Buffer.concat([Buffer.from(`,"m${i}":`), v]);
  yield Buffer.from("}");
}

describe("streamJson: a budget for the members it keeps", () => {
  it("members under the per-value cap but over maxRetainedBytes together are refused", () => {
    const opts = { arrays: { items: () => undefined }, maxValueBytes: 1 << 20, maxRetainedBytes: 3 << 20 };
    expect(Object.keys(streamJsonSync(doc(3, 1 << 20), opts))).toHaveLength(4);
    expect(() => streamJsonSync(doc(4, 1 << 20), opts)).toThrow(JsonStreamError);
    expect(() => streamJsonSync(doc(4, 1 << 20), opts)).toThrow(/members other than the streamed arrays take more than maxRetainedBytes \(3145728\)/);
  });

  it("the default is 64 MiB of kept members; streamed elements do not count", async () => {
    let n = 0;
    const r = await streamJson(doc(60, 1 << 20, 100_000), { arrays: { items: () => { n++; } } });
    expect(n).toBe(100_000);
    expect(r.items).toBe(100_000);
    await expect(streamJson(doc(70, 1 << 20), { arrays: { items: () => undefined } })).rejects.toThrow(/maxRetainedBytes \(67108864\)/);
  });
});
