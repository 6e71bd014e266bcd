/**
 * End to end through the real snapshot pipeline: a memory directory with secrets → snapshot
 * (plaintext) → restore → the secrets are replaced, the live files did not change, and the
 * manifest's redaction report is filled in.
 *
 * The pipeline redacts artifacts a source marks `text: true`. The test registers a source kind
 * that is the `files` source with its artifacts marked as text (JSON by extension), so it does
 * not depend on which built-in sources mark their artifacts.
 */
import { createHash } from "node:crypto";
import { cpSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parseConfig, restoreToDir, snapshot } from "../../src/index.js";
import { SOURCE_KINDS } from "../../src/sources/registry.js";
import type { SourceKind } from "../../src/sources/types.js";
import type { RedactionReport } from "../../src/redact/types.js";
import { filesSource } from "../../src/sources/files.js";
import { removeTempDirs, tempDir } from "./helpers/redactor.js";

const FIX = "fixtures/redaction";
const KIND = "redact-test-text-files";

beforeAll(() => {
  const kind: SourceKind<{ name: string }> = {
    ...(filesSource as unknown as SourceKind<{ name: string }>),
    kind: KIND,
    async capture(cfg, ctx) {
      const cap = await (filesSource as unknown as SourceKind<{ name: string }>).capture(cfg, ctx);
      return {
        ...cap,
        artifacts: (async function* () {
          for await (const a of cap.artifacts) yield { ...a, text: true, ...(/\.jsonl?$/.test(a.path) ? { kind: a.path.endsWith("l") ? "jsonl" : "json" } : {}) };
        })(),
      };
    },
  };
  SOURCE_KINDS[KIND] = kind;
});
afterAll(() => {
  delete SOURCE_KINDS[KIND];
  removeTempDirs();
});

function hashTree(root: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string): void => {
    for (const n of readdirSync(d).sort()) {
      const p = join(d, n);
      if (statSync(p).isDirectory()) walk(p);
      else out[relative(root, p)] = createHash("sha256").update(readFileSync(p)).digest("hex") + ` ${statSync(p).mtimeMs}`;
    }
  };
  walk(root);
  return out;
}

async function setup(): Promise<{ agent: string; mem: string }> {
  const agent = tempDir("memsnap-redact-e2e-");
  const mem = join(agent, "memory");
  cpSync(`${FIX}/memory`, mem, { recursive: true });
  cpSync(`${FIX}/session.jsonl`, join(mem, "traces", "session.jsonl"), { recursive: true });
  cpSync(`${FIX}/gcp-service-account.json`, join(mem, "keys", "sa.json"));
  cpSync(`${FIX}/negatives.md`, join(mem, "notes", "negatives.md"));
  return { agent, mem };
}

describe("snapshot → restore with redaction", () => {
  it("secrets are replaced in the bundle, live files are untouched, the manifest holds the report", async () => {
    const { agent, mem } = await setup();
    const before = hashTree(mem);
    const config = parseConfig({ agent: "redact-e2e", sources: [{ kind: KIND, name: "mem", path: "memory" }] }, null, agent);
    const out = join(agent, "snap.memsnap");
    const res = await snapshot({ config, out });
    expect(hashTree(mem)).toEqual(before);

    const rep = res.manifest.redaction as unknown as RedactionReport;
    expect(rep.policy).toBe("default");
    expect(rep.total_unredacted).toBe(0);
    expect(rep.unredacted).toEqual({});
    expect(rep.redacted["mem/MEMORY.md"]).toEqual({
      "@secretlint/secretlint-rule-aws": 2, "@secretlint/secretlint-rule-database-connection-string": 1, "@secretlint/secretlint-rule-github": 1,
      "@secretlint/secretlint-rule-privatekey": 1, "memsnap/aws-temporary-id": 1, "memsnap/password-assignment": 1, "memsnap/stripe-key": 1,
    });
    expect(rep.redacted["mem/traces/session.jsonl"]).toEqual({ "memsnap/jwt": 1, "memsnap/openai-project-key": 1, "memsnap/password-assignment": 2, "memsnap/secret-assignment": 2 });
    expect(rep.redacted["mem/keys/sa.json"]).toEqual({ "memsnap/gcp-service-account-key": 1 });
    expect(rep.redacted["mem/notes/negatives.md"]).toBeUndefined();
    expect(rep.total_redacted).toBe(15);
    expect(rep.rules_fired).toContain("memsnap/jwt");
    const textBytes = Object.keys(before).reduce((n, p) => n + statSync(join(mem, p)).size, 0);
    expect(rep.bytes_scanned).toBe(textBytes);

    const restored = join(agent, "restored");
    await restoreToDir(out, restored);
    expect(readFileSync(join(restored, "mem", "MEMORY.md"), "utf8")).toBe(readFileSync(`${FIX}/expected/MEMORY.md`, "utf8"));
    expect(readFileSync(join(restored, "mem", "traces", "session.jsonl"), "utf8")).toBe(readFileSync(`${FIX}/expected/session.jsonl`, "utf8"));
    expect(readFileSync(join(restored, "mem", "keys", "sa.json"), "utf8")).toBe(readFileSync(`${FIX}/expected/gcp-service-account.json`, "utf8"));
    expect(readFileSync(join(restored, "mem", "notes", "negatives.md"), "utf8")).toBe(readFileSync(`${FIX}/negatives.md`, "utf8"));
    // the index records the redacted sizes
    const entry = res.manifest.index!.find((e) => e.path === "mem/MEMORY.md")!;
    expect(entry.size).toBe(statSync(join(restored, "mem", "MEMORY.md")).size);
    const manifestText = JSON.stringify(res.manifest);
    for (const s of ["AKIAI44QH8DHBEXAMPLE", "hunter2-fake", "fake-p4ssw0rd", "FAKEKEYFORTESTS0"]) expect(manifestText).not.toContain(s);
  });

  it("--no-redact keeps the bytes and records policy off; the config's allow-list and disable are honoured", async () => {
    const { agent, mem } = await setup();
    const config = parseConfig({ agent: "redact-e2e", sources: [{ kind: KIND, name: "mem", path: "memory" }] }, null, agent);
    const off = await snapshot({ config, out: join(agent, "off.memsnap"), redact: false });
    expect(off.manifest.redaction).toEqual({ policy: "off" });
    await restoreToDir(off.path, join(agent, "off"));
    expect(readFileSync(join(agent, "off", "mem", "MEMORY.md"))).toEqual(readFileSync(join(mem, "MEMORY.md")));

    const custom = parseConfig({
      agent: "redact-e2e",
      redaction: { allow: ["AKIAI44QH8DHBEXAMPLE"], rules: { disable: ["memsnap/password-assignment"] } },
      sources: [{ kind: KIND, name: "mem", path: "memory" }],
    }, null, agent);
    const res = await snapshot({ config: custom, out: join(agent, "custom.memsnap") });
    const rep = res.manifest.redaction as unknown as RedactionReport;
    expect(rep.policy).toBe("custom");
    expect(rep.redacted["mem/MEMORY.md"]!["@secretlint/secretlint-rule-aws"]).toBe(1);
    expect(rep.rules_fired).not.toContain("memsnap/password-assignment");
    await restoreToDir(res.path, join(agent, "custom"));
    const md = readFileSync(join(agent, "custom", "mem", "MEMORY.md"), "utf8");
    expect(md).toContain("aws_access_key_id = AKIAI44QH8DHBEXAMPLE");
    expect(md).toContain("password=hunter2-fake");
    expect(md).toContain("aws_secret_access_key = [REDACTED:@secretlint/secretlint-rule-aws]");
  });
});
