import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { EXIT_CODE_MEANINGS, EXIT_CODES } from "../src/cli/exit-codes.js";
import { ERROR_CODES } from "../src/errors.js";

const errorsDoc = readFileSync(new URL("../docs/errors.md", import.meta.url), "utf8");
const readme = readFileSync(new URL("../README.md", import.meta.url), "utf8");

describe("docs stay in sync with the code", () => {
  it("docs/errors.md lists every error code with its exit code", () => {
    for (const [code, v] of Object.entries(ERROR_CODES)) {
      expect(errorsDoc).toContain(`| \`${code}\` | ${EXIT_CODES[v.class]} |`);
    }
    const documented = [...errorsDoc.matchAll(/\| `(MEMSNAP_[A-Z_]+)` \|/g)].map((m) => m[1]);
    expect(documented.sort()).toEqual(Object.keys(ERROR_CODES).sort());
  });

  it("docs/errors.md and the README list every exit code", () => {
    for (const [c, m] of Object.entries(EXIT_CODE_MEANINGS)) {
      expect(errorsDoc).toContain(`| ${c} | ${m} |`);
      expect(readme).toMatch(new RegExp(`^\\| ${c} \\|`, "m"));
    }
  });
});
