/**
 * Every rule on its fixture: the exact replacement, idempotence, the pre-filter's
 * over-approximation, and texts where no rule may fire.
 */
import { readFileSync } from "node:fs";
import { afterAll, describe, expect, it } from "vitest";
import { ALL_RULE_IDS, MEMSNAP_RULE_IDS, SECRETLINT_RULE_IDS } from "../../src/redact/index.js";
import { candidate, secretlintCandidate } from "../../src/redact/prefilter.js";
import { SECRETLINT_FILTER_COMMENTS } from "../../src/redact/rules.js";
import { redactBytes, redactor, removeTempDirs } from "./helpers/redactor.js";

interface Case { rule: string; name: string; input: string; expected: string }
const FIX = "fixtures/redaction";
const { cases } = JSON.parse(readFileSync(`${FIX}/cases.json`, "utf8")) as { cases: Case[] };

afterAll(removeTempDirs);

describe("one fixture per rule", () => {
  it("covers every memsnap rule and the secretlint rules the issue names", () => {
    const covered = new Set(cases.map((c) => c.rule));
    for (const id of MEMSNAP_RULE_IDS) expect(covered, id).toContain(id);
    for (const id of ["aws", "github", "slack", "openai", "anthropic", "npm", "huggingface", "sendgrid", "privatekey", "database-connection-string", "basicauth"]) {
      expect(covered).toContain(`@secretlint/secretlint-rule-${id}`);
    }
    for (const c of cases) expect(ALL_RULE_IDS).toContain(c.rule);
  });

  it.each(cases.map((c) => [c.name, c] as const))("%s", async (_name, c) => {
    const r = await redactor();
    expect(candidate(c.input)).toBe(true);
    if (c.rule.startsWith("@secretlint/")) expect(secretlintCandidate(c.input)).toBe(true);
    const once = await r.redactText(c.input, "case");
    expect(once).toBe(c.expected);
    expect(once).toContain(`[REDACTED:${c.rule}]`);
    expect(await r.redactText(once, "again")).toBe(once);
    const rep = r.report();
    expect(rep.redacted.case).toEqual(expect.objectContaining({ [c.rule]: expect.any(Number) }));
    expect(rep.redacted.again).toBeUndefined();
    // the streaming path gives the same bytes
    expect((await redactBytes(r, "case.txt", Buffer.from(c.input))).toString()).toBe(c.expected);
  });
});

describe("where no rule may fire", () => {
  it("prose, placeholders, counts, hashes, UUIDs, base64, public keys", async () => {
    const r = await redactor();
    const text = readFileSync(`${FIX}/negatives.md`, "utf8");
    expect(await r.redactText(text, "neg")).toBe(text);
    expect(r.report().total_redacted).toBe(0);
  });

  it.each([
    ["the word password in prose", "I forgot my password again, the password hint did not help"],
    ["empty value", "password=\n"],
    ["template value", "password=${PASSWORD}"],
    ["env reference", "DB_PASSWORD=$DB_PASSWORD"],
    ["mask", "password: ********"],
    ["already redacted", "password=[REDACTED:memsnap/password-assignment]"],
    ["a short secret: value", "secret: abc"],
    ["token count", "token: 4096"],
    ["sk- in words", "sk-ills, task-based, risk-free, Sk-8"],
    ["a git sha", "commit 9fceb02d0ae598e95dc970b74767f19372d61af8"],
    ["PWD", "PWD=/home/alice"],
  ])("%s", async (_name, text) => {
    const r = await redactor();
    expect(await r.redactText(text, "neg")).toBe(text);
  });
});

describe("overlaps and labels", () => {
  it("a token in an assignment is labelled by the more specific rule, and the whole value goes", async () => {
    const r = await redactor();
    expect(await r.redactText("password=sk_live_FAKEFAKEFAKEFAKE0000", "x")).toBe("password=[REDACTED:memsnap/stripe-key]");
    expect(await r.redactText("API_KEY=AKIAI44QH8DHBEXAMPLE", "x")).toBe("API_KEY=[REDACTED:@secretlint/secretlint-rule-aws]");
  });

  it("a replacement that changes a neighbour's context is followed up (AKIA… glued to a URL)", async () => {
    const r = await redactor();
    const out = await r.redactText("AKIAI44QH8DHBEXAMPLEhttps://fakeuser:fakepass123@example.net/x", "x");
    expect(out).toBe("[REDACTED:@secretlint/secretlint-rule-aws][REDACTED:@secretlint/secretlint-rule-basicauth]/x");
    expect(await r.redactText(out, "x")).toBe(out);
  });

  it("secretlint-disable comments in the text do not switch redaction off", async () => {
    const r = await redactor();
    const out = await r.redactText("<!-- secretlint-disable -->\ntoken ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000\n", "x");
    expect(out).toBe("<!-- secretlint-disable -->\ntoken [REDACTED:@secretlint/secretlint-rule-github]\n");
    // on the same line, and in an earlier region of the same batch
    const text = "secretlint-disable AKIAI44QH8DHBEXAMPLE\nsecretlint-disable-line ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000\n";
    expect(await r.redactText(text, "x")).toBe(
      "secretlint-disable [REDACTED:@secretlint/secretlint-rule-aws]\nsecretlint-disable-line [REDACTED:@secretlint/secretlint-rule-github]\n");
  });

  it("PEM blocks without an END marker are redacted through their base64 lines", async () => {
    const r = await redactor();
    const text = "before\n-----BEGIN PRIVATE KEY-----\nFAKEKEYFORTESTS0FAKEKEYFORTESTS0\nFAKEKEYFORTESTS0==\nafter the key, prose\n";
    expect(await r.redactText(text, "x")).toBe("before\n[REDACTED:memsnap/pem-private-key]\nafter the key, prose\n");
  });
});

describe("pathological input stays linear", () => {
  it.each([
    ["identifier soup", "a_b-c.".repeat(300_000)],
    ["base64url", "eyJ" + "Ab-_".repeat(500_000)],
    ["assignments", "password=x token= secret: ".repeat(80_000)],
    ["URL-ish", "https://a:b@".repeat(100_000)],
    ["quotes and escapes", '"\\"\\\\'.repeat(300_000) + " password: \""],
  ])("%s (2 MB, one line)", async (_name, text) => {
    const r = await redactor();
    const t0 = performance.now();
    await r.redactText(text, "x");
    await r.redactDocument(`{"k": "${text.replace(/["\\]/g, "")}"}`, "y", true);
    expect(performance.now() - t0).toBeLessThan(20_000);
  }, 60_000);
});

describe("secretlint", () => {
  it("the rule list matches the installed recommend preset", async () => {
    const { rules } = await import("@secretlint/secretlint-rule-preset-recommend");
    const ids = rules.map((r) => r.meta.id).filter((id) => id !== SECRETLINT_FILTER_COMMENTS);
    expect([...ids].sort()).toEqual([...SECRETLINT_RULE_IDS].sort());
  });

  it("a disabled rule stays off; with every secretlint rule off memsnap's rules still run", async () => {
    const r = await redactor({ disable: ["@secretlint/secretlint-rule-github"] });
    expect(await r.redactText("ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000", "x")).toBe("ghp_FAKEFAKEFAKEFAKEFAKEFAKEFAKEFAKE0000");
    const none = await redactor({ disable: [...SECRETLINT_RULE_IDS] });
    expect(await none.redactText("AKIAI44QH8DHBEXAMPLE password=hunter2-fake", "x")).toBe("AKIAI44QH8DHBEXAMPLE password=[REDACTED:memsnap/password-assignment]");
  });
});

describe("which units reach secretlint", () => {
  it("a Databricks token does; an id that only holds `dapi` (a trace's `call_…dapi7`) does not", async () => {
    expect(secretlintCandidate('{"tool_id":"call_0002qwdapi7"}')).toBe(false);
    expect(secretlintCandidate("dapi0123456789abcdef0123456789abcde")).toBe(false); // 31 hex digits
    const token = `dapi${"0123456789abcdef".repeat(2)}`;
    expect(secretlintCandidate(`{"token":"${token}"}`)).toBe(true);
    const r = await redactor();
    const out = await r.redactText(`{"token":"${token}"}`, "databricks");
    expect(out).not.toContain(token);
    expect(out).toContain("[REDACTED:");
  });
});
