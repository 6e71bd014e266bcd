/** The `redaction` config: schema, validation codes, allow-list and rule switches. */
import { afterAll, describe, expect, it } from "vitest";
import { parseConfig } from "../../src/index.js";
import { isMemsnapError } from "../../src/errors.js";
import { createRedactor, parseRedactionConfig } from "../../src/redact/index.js";
import { redactor, removeTempDirs, tempDir } from "./helpers/redactor.js";

afterAll(removeTempDirs);

const code = (fn: () => unknown): string | undefined => {
  try {
    fn();
  } catch (e) {
    if (isMemsnapError(e)) return e.code;
    throw e;
  }
  return undefined;
};

describe("parseRedactionConfig", () => {
  it("defaults: on, nothing allowed, nothing disabled", () => {
    expect(parseRedactionConfig(undefined, "r")).toEqual({ enabled: true, allow: [], disable: [] });
    expect(parseRedactionConfig({}, "r")).toEqual({ enabled: true, allow: [], disable: [] });
    expect(parseRedactionConfig({ enabled: false }, "r").enabled).toBe(false);
  });

  it("accepts literals, /regex/flags and rule ids", () => {
    const c = parseRedactionConfig({ allow: ["AKIAI44QH8DHBEXAMPLE", "/^sk_test_/i"], rules: { disable: ["memsnap/bearer-token", "@secretlint/secretlint-rule-aws"] } }, "r");
    expect(c).toEqual({ enabled: true, allow: ["AKIAI44QH8DHBEXAMPLE", "/^sk_test_/i"], disable: ["memsnap/bearer-token", "@secretlint/secretlint-rule-aws"] });
  });

  it.each([
    ["an unknown key", { enable: true }, "MEMSNAP_CONFIG_UNKNOWN_KEY"],
    ["an unknown key under rules", { rules: { enable: [] } }, "MEMSNAP_CONFIG_UNKNOWN_KEY"],
    ["a bad regex", { allow: ["/([a-z/"] }, "MEMSNAP_CONFIG_INVALID"],
    ["bad regex flags", { allow: ["/abc/gx"] }, "MEMSNAP_CONFIG_INVALID"],
    ["allow not an array", { allow: "x" }, "MEMSNAP_CONFIG_INVALID"],
    ["an empty allow entry", { allow: [""] }, "MEMSNAP_CONFIG_INVALID"],
    ["rules not an object", { rules: ["memsnap/jwt"] }, "MEMSNAP_CONFIG_INVALID"],
    ["an unknown rule id", { rules: { disable: ["memsnap/nope"] } }, "MEMSNAP_CONFIG_INVALID"],
    ["enabled not a boolean", { enabled: "yes" }, "MEMSNAP_CONFIG_INVALID"],
  ])("rejects %s", (_name, raw, expected) => {
    expect(code(() => parseRedactionConfig(raw as Record<string, unknown>, "memsnap.json: redaction"))).toBe(expected);
  });

  it("is what parseConfig uses", () => {
    const base = { agent: "a", sources: [{ kind: "files", name: "mem", path: "m" }] };
    expect(parseConfig({ ...base, redaction: { rules: { disable: ["memsnap/jwt"] } } }, null, "/tmp").redaction.disable).toEqual(["memsnap/jwt"]);
    expect(code(() => parseConfig({ ...base, redaction: { allow: ["/(/"] } }, null, "/tmp"))).toBe("MEMSNAP_CONFIG_INVALID");
    expect(code(() => parseConfig({ ...base, redaction: { rules: { disable: ["x"], other: 1 } } }, null, "/tmp"))).toBe("MEMSNAP_CONFIG_UNKNOWN_KEY");
  });
});

describe("allow-list and rule switches", () => {
  const text = "id AKIAI44QH8DHBEXAMPLE, stripe sk_test_FAKEFAKEFAKEFAKE0000, password=hunter2-fake";

  it("a literal entry keeps its match", async () => {
    const r = await redactor({ allow: ["AKIAI44QH8DHBEXAMPLE"] });
    expect(await r.redactText(text, "x")).toBe("id AKIAI44QH8DHBEXAMPLE, stripe [REDACTED:memsnap/stripe-key], password=[REDACTED:memsnap/password-assignment]");
  });

  it("a regex entry keeps its matches (against the value or the whole match)", async () => {
    const r = await redactor({ allow: ["/^sk_test_/", "/^password=hunter2/"] });
    expect(await r.redactText(text, "x")).toBe("id [REDACTED:@secretlint/secretlint-rule-aws], stripe sk_test_FAKEFAKEFAKEFAKE0000, password=hunter2-fake");
  });

  it("rules.disable turns a rule off", async () => {
    const r = await redactor({ disable: ["memsnap/password-assignment", "@secretlint/secretlint-rule-aws"] });
    expect(await r.redactText(text, "x")).toBe("id AKIAI44QH8DHBEXAMPLE, stripe [REDACTED:memsnap/stripe-key], password=hunter2-fake");
    expect(r.report().policy).toBe("custom");
  });

  it("enabled: false gives no redactor; the default policy is named default", async () => {
    expect(await createRedactor({ enabled: false, allow: [] }, tempDir())).toBeUndefined();
    expect((await redactor()).report().policy).toBe("default");
  });
});
