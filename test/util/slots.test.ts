import { describe, expect, it } from "vitest";
import { pin, SlotPool } from "../../src/util/slots.js";

describe("SlotPool", () => {
  it("a slot goes back once its last hold is released, and is poisoned then when asked", () => {
    const freed: number[] = [];
    const pool = new SlotPool(3, 4096, (s) => freed.push(s));
    const v = pool.take(1, 100);
    v.fill(7);
    expect(v.buffer).toBe(pool.memory);
    const un = pin(v.subarray(10, 20))!;
    expect(un).not.toBeNull();
    pool.release(1); // the reader moves on; the pin keeps the slot
    expect(freed).toEqual([]);
    expect(v[0]).toBe(7);
    un();
    un(); // a second call does nothing
    expect(freed).toEqual([1]);
    expect(v[0]).toBe(process.env.MEMSNAP_POISON_SLOTS === "1" ? 0xdb : 7);
    expect(() => pool.release(1)).toThrow(RangeError);
  });

  it("a slot cannot be taken twice; views of other memory need no pin", () => {
    const pool = new SlotPool(2, 4096, () => undefined);
    pool.take(0, 10);
    expect(() => pool.take(0, 10)).toThrow(RangeError);
    expect(() => pool.take(1, 4097)).toThrow(RangeError);
    expect(pin(Buffer.alloc(10))).toBeNull();
    expect(pin(pool.take(1, 10).subarray(0, 0))).toBeNull();
  });

  it("the test suite runs with poisoned slots", () => {
    expect(process.env.MEMSNAP_POISON_SLOTS).toBe("1");
  });
});
