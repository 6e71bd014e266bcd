import { describe, expect, it } from "vitest";
import { destinationError, MemsnapError } from "../src/errors.js";

function errno(code: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`${code}: test`), { code });
}

describe("destinationError", () => {
  it("a full file system or an exhausted quota is MEMSNAP_DEST_FULL, with a hint for every writing command", () => {
    const full = destinationError(errno("ENOSPC"), "/d/x.memsnap");
    expect(full.code).toBe("MEMSNAP_DEST_FULL");
    expect(full.message).toBe("no space left writing /d/x.memsnap");
    expect(full.hint).toMatch(/snapshot --out\/--store, restore --to/);
    const quota = destinationError(errno("EDQUOT"), "/d/out/a.db");
    expect(quota.code).toBe("MEMSNAP_DEST_FULL");
    expect(quota.message).toBe("disk quota exceeded writing /d/out/a.db");
    expect(quota.hint).toMatch(/quota/);
  });

  it("a file size limit names the limit; anything else asks to check the directory", () => {
    const big = destinationError(errno("EFBIG"), "/d/x");
    expect(big.code).toBe("MEMSNAP_DEST_UNWRITABLE");
    expect(big.hint).toMatch(/ulimit -f/);
    const denied = destinationError(errno("EACCES"), "/d/x");
    expect(denied.code).toBe("MEMSNAP_DEST_UNWRITABLE");
    expect(denied.message).toContain("EACCES");
    expect(denied.hint).toMatch(/exists and is writable/);
  });

  it("keeps a MemsnapError as it is", () => {
    const own = new MemsnapError("MEMSNAP_UNSAFE_PATH", "x", { hint: "h" });
    expect(destinationError(own, "/d")).toBe(own);
  });
});

describe("parseDuration", () => {
  it("takes ms, s, m, h and d, and bare seconds; anything else is MEMSNAP_USAGE", async () => {
    const { parseDuration } = await import("../src/util/duration.js");
    expect(parseDuration("500ms")).toBe(500);
    expect(parseDuration("30")).toBe(30_000);
    expect(parseDuration("1.5m")).toBe(90_000);
    expect(parseDuration("2h")).toBe(7_200_000);
    expect(parseDuration("7d")).toBe(604_800_000);
    for (const bad of ["", "1w", "h", "-1s", "1 d"]) expect(() => parseDuration(bad), bad).toThrow(/bad duration/);
  });
});
