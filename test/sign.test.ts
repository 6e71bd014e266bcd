// Signed manifests: keygen --sign, snapshot --sign-key, verify --trust offline (no decryption
// key), restore --require-signature; any changed manifest byte or payload byte fails.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readLayout } from "../src/format/container.js";

const BIN = new URL("../bin/memsnap.js", import.meta.url).pathname;
const work = mkdtempSync(join(tmpdir(), "memsnap-sign-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function cli(args: string[]) {
  const r = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", cwd: work });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}
function verifyJson(args: string[]) {
  const r = cli(["verify", ...args, "--json"]);
  if (!r.stdout) throw new Error(`no stdout (exit ${r.code}): ${r.stderr}`);
  return { code: r.code, rep: JSON.parse(r.stdout) as { ok: boolean; checks: { name: string; status: string; detail?: string }[]; findings: { code: string }[] } };
}

let signed = "";
let unsigned = "";
let pub = "";
let otherPub = "";
let recipient = "";

beforeAll(() => {
  mkdirSync(join(work, "agent", "mem"), { recursive: true });
  writeFileSync(join(work, "agent", "mem", "a.md"), "hello\n".repeat(100));
  writeFileSync(join(work, "agent", "memsnap.json"), JSON.stringify({ agent: "signer", redaction: { enabled: false }, sources: [{ kind: "files", name: "mem", path: "mem" }] }));
  pub = cli(["keygen", "--sign", "-o", "sign.key"]).stdout.trim();
  otherPub = cli(["keygen", "--sign", "-o", "other.key"]).stdout.trim();
  recipient = cli(["keygen", "-o", "age.key"]).stdout.trim();
  expect(pub).toMatch(/^memsnap-ed25519:/);
  const s = cli(["snapshot", "-c", "agent/memsnap.json", "--out", "signed.memsnap", "--sign-key", "sign.key", "-r", recipient]);
  expect(s.code, s.stderr).toBe(0);
  const u = cli(["snapshot", "-c", "agent/memsnap.json", "--out", "unsigned.memsnap", "-r", recipient]);
  expect(u.code, u.stderr).toBe(0);
  signed = join(work, "signed.memsnap");
  unsigned = join(work, "unsigned.memsnap");
});

describe("signed manifests", () => {
  it("the signing key file is private and the public key is written beside it", () => {
    expect(readFileSync(join(work, "sign.key.pub"), "utf8").trim()).toBe(pub);
    expect((spawnSync("stat", ["-c", "%a", join(work, "sign.key")], { encoding: "utf8" }).stdout.trim())).toBe("600");
  });

  it("--sign-key given the wrong kind of file says which: the .pub, an age identity, anything else; nothing written", () => {
    writeFileSync(join(work, "not-a-key.txt"), "hello\n");
    for (const [file, why] of [
      ["sign.key.pub", "it holds a public key (the .pub file); signing needs the private key beside it"],
      ["age.key", "it is an age identity (for encryption), not a signing key"],
      ["not-a-key.txt", "not an Ed25519 private key in PEM"],
    ]) {
      const r = cli(["snapshot", "-c", "agent/memsnap.json", "--out", "never.memsnap", "--sign-key", file!, "-r", recipient]);
      expect(r.code, file).toBe(4);
      expect(r.stderr).toContain(`cannot use signing key ${file}: ${why} [MEMSNAP_IDENTITY_INVALID]`);
      expect(r.stderr).not.toContain("DECODER");
      expect(existsSync(join(work, "never.memsnap"))).toBe(false);
    }
  });

  it("verify --trust proves who made an encrypted bundle without the decryption key", () => {
    const { code, rep } = verifyJson([signed, "--trust", pub]);
    expect(code).toBe(0);
    const sig = rep.checks.find((c) => c.name === "signature")!;
    expect(sig.status).toBe("passed");
    expect(sig.detail).toContain("(trusted)");
    expect(rep.checks.find((c) => c.name === "decrypt")!.status).toBe("skipped");
    // a key file works as well as the inline key
    expect(verifyJson([signed, "--trust", join(work, "sign.key.pub")]).code).toBe(0);
  });

  it("verify --trust fails an unsigned bundle and one signed by another key", () => {
    const a = verifyJson([unsigned, "--trust", pub]);
    expect(a.code).toBe(4);
    expect(a.rep.findings.map((f) => f.code)).toEqual(["MEMSNAP_SIGNATURE_REQUIRED"]);
    const b = verifyJson([signed, "--trust", otherPub]);
    expect(b.code).toBe(4);
    expect(b.rep.findings.map((f) => f.code)).toEqual(["MEMSNAP_SIGNATURE_UNTRUSTED"]);
  });

  it("a changed byte anywhere in the manifest fails the signature, even when re-sealed", async () => {
    const layout = await readLayout(signed);
    const m = JSON.parse(layout.manifestBytes.toString("utf8"));
    const { computeSeal } = await import("../src/format/manifest.js");
    for (const mutate of [(x: any) => { x.label = "forged"; }, (x: any) => { x.layers[0].bytes += 1; }, (x: any) => { x.host = "elsewhere"; }]) {
      const copy = structuredClone(m);
      mutate(copy);
      const { signature, seal: _s, ...rest } = copy;
      copy.seal = computeSeal(rest); // an attacker can recompute the seal, but not the signature
      copy.signature = signature;
      const bytes = Buffer.from(JSON.stringify(copy, null, 1) + "\n");
      const file = readFileSync(signed);
      const mPos = layout.payloadOffset + layout.payloadSize + ((512 - (layout.payloadSize % 512)) % 512);
      const { encodeHeader } = await import("../src/format/tar-header.js");
      const forged = Buffer.concat([file.subarray(0, mPos), encodeHeader("manifest.json", bytes.length, new Date(), 0o644), bytes,
        Buffer.alloc((512 - (bytes.length % 512)) % 512), Buffer.alloc(1024)]);
      const path = join(work, `forged-${Math.random().toString(16).slice(2)}.memsnap`);
      writeFileSync(path, forged);
      const { code, rep } = verifyJson([path, "--trust", pub]);
      expect(code).toBe(3);
      expect(rep.findings.map((f) => f.code)).toContain("MEMSNAP_SIGNATURE_INVALID");
    }
  });

  it("a changed payload byte fails the signature's commitment", () => {
    const file = readFileSync(signed);
    file[700] ^= 0x01; // inside the age payload
    const path = join(work, "payload-flip.memsnap");
    writeFileSync(path, file);
    const { code, rep } = verifyJson([path, "--trust", pub]);
    expect(code).toBe(3);
    expect(rep.findings.map((f) => f.code)).toEqual(expect.arrayContaining(["MEMSNAP_PAYLOAD_HASH_MISMATCH", "MEMSNAP_SIGNATURE_INVALID"]));
  });

  it("restore --require-signature refuses unsigned and untrusted bundles and accepts a trusted one", () => {
    const a = cli(["restore", unsigned, "--to", join(work, "r-unsigned"), "-i", "age.key", "--require-signature", "--trust", pub]);
    expect(a.code).toBe(4);
    expect(a.stderr).toContain("[MEMSNAP_SIGNATURE_REQUIRED]");
    const b = cli(["restore", signed, "--to", join(work, "r-untrusted"), "-i", "age.key", "--require-signature", "--trust", otherPub]);
    expect(b.code).toBe(4);
    expect(b.stderr).toContain("[MEMSNAP_SIGNATURE_UNTRUSTED]");
    const c = cli(["restore", signed, "--to", join(work, "r-ok"), "-i", "age.key", "--require-signature", "--trust", pub]);
    expect(c.code, c.stderr).toBe(0);
    expect(readFileSync(join(work, "r-ok", "mem", "a.md"), "utf8")).toBe("hello\n".repeat(100));
  });
});
