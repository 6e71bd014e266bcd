import { describe, expect, it } from "vitest";
import { fmtBytes, fmtRate } from "../../src/cli/output.js";

describe("fmtBytes / fmtRate", () => {
  it("bytes in decimal units", () => {
    expect(fmtBytes(682)).toBe("682 B");
    expect(fmtBytes(1500)).toBe("1.50 kB");
    expect(fmtBytes(552_032_768)).toBe("552.0 MB");
  });

  it("a rate in the unit that suits it, never 0.0 MB/s for a small restore", () => {
    expect(fmtRate(929_900_000, 2410)).toBe("385.9 MB/s");
    expect(fmtRate(682, 50)).toBe("13.6 kB/s");
    expect(fmtRate(10, 1000)).toBe("10 B/s");
    expect(fmtRate(1000, 0)).toBe("-");
  });
});
