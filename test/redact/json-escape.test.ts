/**
 * Secrets hidden behind JSON escapes (`"g\u0068p_…"` is `"ghp_…"`, `https:\/\/u:p@h` a URL with
 * credentials): decoded for the rules, replaced in their escaped form, so the document stays
 * valid JSON and no form of the secret reaches the bundle. Unit tests of the decoder and the
 * escape test (JS and the native scanFile), the redactor on whole texts and streams, and the
 * real pipeline: a `files` layer (a small JSONL, a big one scanned where it lies, a JSONL
 * named .log), a `state` file, plaintext (payload decompressed with the real zstd binary) and
 * encrypted; a SQLite TEXT cell (the live read's page walks, native and JS, and its stale-byte
 * scan see the escape; the copy redacts it); a git blob (reported).
 */
import { spawnSync } from "node:child_process";
import { closeSync, mkdirSync, openSync, readFileSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { createRequire } from "node:module";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { generateIdentity, parseConfig, restoreToDir, snapshot } from "../../src/index.js";
import { decodeJsonEscapes, hasHidingEscape, hidingEscapeAt, HIDING_ESCAPE } from "../../src/redact/json.js";
import { nativePrefilter } from "../../src/redact/native.js";
import type { RedactionReport } from "../../src/redact/types.js";
import { emptyScan, scanObject } from "../../src/sources/git/history-scan.js";
import { SqliteWorker, type LiveBeginResult } from "../../src/sources/sqlite/worker-host.js";
import { readBundle } from "../helpers/cli.js";
import { requireTool } from "../helpers/tools.js";
import { redactBytes, redactor, removeTempDirs, tempDir } from "./helpers/redactor.js";

afterAll(removeTempDirs);

const TOKEN = "ghp_" + "Zq7Rk2Lm9Xv4Tb8Nc3Wd6Hy1Pf5Gs0Ja2Ke4"; // GitHub token shape, not a real one
const ESCAPED = TOKEN.replace("h", "\\u0068"); // g\u0068p_…
const ALL_ESCAPED = [...TOKEN].map((c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0")).join("");
const KEY_ID = "AKIA" + "QX3MZ7RT2KLV9WBN";

/** Every form the token could be found in by someone reading the bytes (raw, or any escaped spelling of its tail). */
function leaks(s: string): boolean {
  return s.includes(TOKEN) || s.includes(TOKEN.slice(4)) || s.includes(ESCAPED) || s.includes(ALL_ESCAPED.slice(24)) || s.includes(KEY_ID);
}

describe("decodeJsonEscapes", () => {
  it("decodes every JSON escape and maps each character back to its source offset", () => {
    const raw = String.raw`a\u0068\"\\\/\n\t\ud83d\ude00z\q\u12`;
    const d = decodeJsonEscapes(raw)!;
    expect(d.text).toBe('ah"\\/\n\t\ud83d\ude00z\\q\\u12');
    expect(Array.from(d.at)).toEqual([0, 1, 7, 9, 11, 13, 15, 17, 23, 29, 30, 31, 32, 33, 34, 35, raw.length]);
    expect(decodeJsonEscapes("no escapes")).toBeNull();
  });

  it("property: decoding a JSON string literal's content gives what JSON.parse gives", () => {
    fc.assert(fc.property(fc.string({ unit: "binary" }), fc.boolean(), (s, asciiOnly) => {
      let lit = JSON.stringify(s).slice(1, -1);
      if (asciiOnly) lit = lit.replace(/[^\x20-\x7e]/g, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
      const d = decodeJsonEscapes(lit);
      expect(d ? d.text : lit).toBe(s);
      if (d) for (let i = 1; i < d.at.length; i++) expect(d.at[i]!).toBeGreaterThan(d.at[i - 1]!);
    }));
  });
});

describe("the escape test", () => {
  it("hidingEscapeAt (bytes) agrees with HIDING_ESCAPE (strings), and the native scanFile stops where they do", async () => {
    const pieces = ["\\u0068", "\\/", "\\u00A0", "\\u2028", "\\u00e9", "\\u001b", "\\u003c", "\\u0026", "\\u005C", "\\u0027", "\\n", '\\"', "\\\\", "\\u20", "x", " ", "\\u3000", "\\uFEFF", "\\u007f", "\\u0009"];
    const anyEscape = fc.integer({ min: 0, max: 0xffff }).map((u) => "\\u" + u.toString(16).padStart(4, "0")[u % 2 ? "toUpperCase" : "toLowerCase"]());
    const ascii = fc.integer({ min: 0, max: 0x7f }).map((u) => "\\u00" + u.toString(16).padStart(2, "0"));
    fc.assert(fc.property(fc.array(fc.oneof(fc.constantFrom(...pieces), anyEscape, ascii), { maxLength: 12 }), (parts) => {
      const s = parts.join("");
      const at = hidingEscapeAt(Buffer.from(s));
      const m = HIDING_ESCAPE.exec(s);
      expect(at).toBe(m ? m.index : -1);
      expect(hasHidingEscape(s)).toBe(m !== null);
    }));
    expect(hidingEscapeAt(Buffer.from(String.raw`caf\u00e9 \u001b[0m \u003cb\u003e\u0026 "q\"" \\n`))).toBe(-1);
    // exactly these characters: letters, digits, _ - . : = / @ \ " ' and JS whitespace
    const hides = (u: number): boolean => hidingEscapeAt(Buffer.from("\\u" + u.toString(16).padStart(4, "0"))) === 0;
    for (let u = 0; u < 0x80; u++) expect(hides(u), u.toString(16)).toBe(/[A-Za-z0-9_\-.:=/@\\"'\s]/.test(String.fromCharCode(u)));
    for (const u of [0xa0, 0x1680, 0x2000, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff]) expect(hides(u)).toBe(true);
    for (const u of [0x80, 0xe9, 0x2019, 0x4e2d, 0xd83d]) expect(hides(u)).toBe(false);

    const native = nativePrefilter();
    if (native?.scanFile === undefined) return;
    expect(native.scanFileJson).toBe(true);
    const dir = tempDir();
    const scanFile = async (text: string, json: boolean): Promise<number> => {
      const p = join(dir, "f.jsonl");
      writeFileSync(p, text);
      const fd = openSync(p, "r");
      try {
        return await new Promise<number>((res) => native.scanFile!(fd, Buffer.byteLength(text), Buffer.alloc(32), (_e, at) => res(at), json));
      } finally {
        closeSync(fd);
      }
    };
    const filler = '{"role":"tool","content":"caf\\u00e9 \\u001b[0m \\u003cb\\u003e ok \\"quoted\\" line\\n"}\n'.repeat(40_000); // ~2.6 MB, several 1 MiB blocks
    for (const where of [0, 1 << 20, filler.length]) {
      const text = filler.slice(0, where) + `{"t":"${ESCAPED}"}\n` + filler.slice(where);
      expect(await scanFile(text, false)).toBe(-1); // nothing a byte scan sees
      const at = await scanFile(text, true);
      expect(at).toBe(Buffer.byteLength(filler.slice(0, where)) + 7);
    }
    expect(await scanFile(filler, true)).toBe(-1);
    // the native test decides each escape as the JS one does
    for (const u of [...Array.from({ length: 0x80 }, (_, i) => i), 0xa0, 0xe9, 0x1680, 0x2000, 0x200a, 0x200b, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff, 0xfffe]) {
      const esc = "\\u" + u.toString(16).padStart(4, "0");
      expect(await scanFile(`{"k":"a${esc}b"}\n`, true), esc).toBe(hidingEscapeAt(Buffer.from(`{"k":"a${esc}b"}\n`)));
    }
  }, 60_000);
});

describe("the redactor", () => {
  it("redacts escaped secrets in JSONL, keeps every line valid and everything else as it was; a second pass changes nothing", async () => {
    const r = await redactor();
    const lines = [
      { role: "tool", content: `gh auth token printed: \\"${ESCAPED}\\"` },
      { t: ALL_ESCAPED },
      { url: "https:\\/\\/deploy:Sup3rS3cretPassw0rd@git.example.com\\/repo.git" },
      { note: `id\\u00a0\\u2019${KEY_ID}\\u2019 stored` },
      { role: "assistant", content: "caf\\u00e9, nothing to hide \\u001b[0m" },
    ].map((o) => `{${Object.entries(o).map(([k, v]) => `"${k}":"${v}"`).join(",")}}`);
    for (const l of lines) JSON.parse(l);
    const input = Buffer.from(lines.join("\n") + "\n");
    for (const chunk of [1 << 20, 7, 64]) {
      const out = (await redactBytes(r, "traces/t.jsonl", input, { kind: "jsonl", chunk })).toString();
      expect(leaks(out), out).toBe(false);
      expect(out).not.toContain("Sup3rS3cretPassw0rd");
      const outLines = out.split("\n");
      expect(outLines).toHaveLength(lines.length + 1);
      outLines.slice(0, -1).forEach((l, i) => {
        const o = JSON.parse(l) as Record<string, string>;
        const orig = JSON.parse(lines[i]!) as Record<string, string>;
        for (const k of Object.keys(orig)) if (o[k] !== orig[k]) expect(o[k]).toContain("[REDACTED:");
      });
      expect(outLines[4]).toBe(lines[4]); // no secret: byte for byte
      expect(JSON.parse(outLines[0]!).content).toMatch(/^gh auth token printed: "\[REDACTED:[^\]]+\]"$/);
      const again = (await redactBytes(r, "traces/t.jsonl", Buffer.from(out), { kind: "jsonl", chunk })).toString();
      expect(again).toBe(out);
    }
    const rep = r.report();
    expect(rep.redacted["layer/traces/t.jsonl"]!["@secretlint/secretlint-rule-github"]).toBeGreaterThanOrEqual(2);
  });

  it("the same token escaped in a .log of JSON lines, a .md note and a whole text (redactText) is found too", async () => {
    const r = await redactor();
    const log = (await redactBytes(r, "app.log", Buffer.from(`{"level":"info","msg":"token ${ESCAPED}"}\n`))).toString();
    expect(leaks(log), log).toBe(false);
    expect(JSON.parse(log).msg).toMatch(/^token \[REDACTED:/);
    const md = (await redactBytes(r, "note.md", Buffer.from(`pasted config: {"auth": "${ESCAPED}"}\n`))).toString();
    expect(leaks(md), md).toBe(false);
    const cell = await r.redactText(`{"auth":{"github":"${ALL_ESCAPED}"}}`, "db/x.db");
    expect(leaks(cell), cell).toBe(false);
    expect(JSON.parse(cell).auth.github).toMatch(/^\[REDACTED:/);
  });
});

// ------------------------------------------------------------------------------ the pipeline

function setupAgent(): { dir: string; big: string } {
  const dir = tempDir("memsnap-json-escape-");
  const mem = join(dir, "memory");
  mkdirSync(join(mem, "traces"), { recursive: true });
  mkdirSync(join(dir, "state"), { recursive: true });
  const line = (i: number): string => JSON.stringify({ i, role: i % 2 ? "tool" : "assistant", content: `step ${i}: caf\u00e9 ok, nothing secret here` })
    .replace("\u00e9", "\\u00e9") + "\n";
  writeFileSync(join(mem, "traces", "small.jsonl"), line(1) + `{"role":"tool","content":"gh auth token: ${ESCAPED}"}\n` + line(2));
  // Big enough to be scanned where it lies (over 1 MiB), the token deep inside it.
  let big = "";
  for (let i = 0; big.length < 3 << 20; i++) big += line(i);
  const at = big.indexOf("\n", 2 << 20) + 1;
  big = big.slice(0, at) + `{"role":"tool","content":"export GITHUB_TOKEN=${ALL_ESCAPED}"}\n` + big.slice(at);
  writeFileSync(join(mem, "traces", "big.jsonl"), big);
  writeFileSync(join(mem, "events.log"), `{"ev":"login","tok":"${ESCAPED}"}\n`);
  writeFileSync(join(dir, "state", "cursor.json"), JSON.stringify({ cursor: 41, last_output: "x" }).replace('"x"', `"${ESCAPED}"`));
  return { dir, big };
}

function config(dir: string): ReturnType<typeof parseConfig> {
  return parseConfig({
    agent: "json-escape",
    sources: [{ kind: "files", name: "mem", path: "memory" }, { kind: "state", name: "state", path: "state" }],
  }, null, dir);
}

const EXPECTED = ["mem/events.log", "mem/traces/big.jsonl", "mem/traces/small.jsonl", "state/cursor.json"];

describe("snapshot with escaped secrets in files and state layers", () => {
  it("plaintext: every escaped token is redacted and reported; the decompressed payload holds no form of it; the restored files are valid JSON", async (ctx) => {
    if (!requireTool(["zstd"], ctx)) return;
    const { dir, big } = setupAgent();
    const res = await snapshot({ config: config(dir), out: join(dir, "p.memsnap") });
    const rep = res.manifest.redaction as unknown as RedactionReport;
    expect(rep.total_unredacted).toBe(0);
    for (const p of EXPECTED) expect(rep.redacted[p]?.["@secretlint/secretlint-rule-github"], `${p}: ${JSON.stringify(rep)}`).toBe(1);

    const t = spawnSync("zstd", ["-dc"], { input: readBundle(res.path).payload, maxBuffer: 1 << 30 });
    expect(t.status).toBe(0);
    expect(leaks(t.stdout.toString("latin1"))).toBe(false);

    const out = join(dir, "restored");
    await restoreToDir(res.path, out);
    for (const f of ["small.jsonl", "big.jsonl"]) {
      for (const l of readFileSync(join(out, "mem", "traces", f), "utf8").split("\n")) if (l) JSON.parse(l);
    }
    const restoredBig = readFileSync(join(out, "mem", "traces", "big.jsonl"), "utf8");
    expect(restoredBig.split("\n").length).toBe(big.split("\n").length);
    expect(restoredBig).toContain('"content":"export GITHUB_TOKEN=[REDACTED:');
    expect(JSON.parse(readFileSync(join(out, "state", "cursor.json"), "utf8")).last_output).toMatch(/^\[REDACTED:/);
  }, 120_000);

  it("encrypted: redacted the same way, and the plaintext manifest's report says so", async () => {
    const { dir } = setupAgent();
    const { identity, recipient } = await generateIdentity();
    const res = await snapshot({ config: config(dir), out: join(dir, "e.memsnap"), recipients: [recipient] });
    const rep = readBundle(res.path).manifest.redaction as RedactionReport;
    expect(rep.total_unredacted).toBe(0);
    for (const p of EXPECTED) expect(rep.redacted[p]?.["@secretlint/secretlint-rule-github"]).toBe(1);
    const out = join(dir, "restored");
    await restoreToDir(res.path, out, { keys: { identities: [identity] } });
    expect(leaks(readFileSync(join(out, "mem", "traces", "small.jsonl"), "utf8"))).toBe(false);
    expect(leaks(readFileSync(join(out, "mem", "events.log"), "utf8"))).toBe(false);
  }, 120_000);
});

// ------------------------------------------------------------------------------ SQLite cells, git history

describe("escaped secrets in SQLite TEXT cells and in git history", () => {
  interface Db { prepare(s: string): { run(...a: unknown[]): unknown; get(...a: unknown[]): unknown }; exec(s: string): void; close(): void }
  const Database = createRequire(import.meta.url)("better-sqlite3") as new (p: string, o?: { readonly?: boolean }) => Db;

  function makeDb(path: string, deleted = false): void {
    const db = new Database(path);
    db.exec("CREATE TABLE calls (id INTEGER PRIMARY KEY, tool TEXT, result TEXT)");
    const ins = db.prepare("INSERT INTO calls (tool, result) VALUES (?, ?)");
    for (let i = 0; i < 50; i++) ins.run("shell", `{"exit":0,"stdout":"caf\\u00e9 line ${i}\\n"}`);
    ins.run("gh", `{"exit":0,"stdout":"${ESCAPED}\\n"}`);
    if (deleted) db.exec("DELETE FROM calls WHERE tool = 'gh'");
    db.close();
  }

  it("the live read's scan (native and JS page walks alike) sends the database to the copy, which redacts the cell and keeps it valid JSON", async (ctx) => {
    if (!requireTool(["zstd"], ctx)) return;
    const dir = tempDir("memsnap-json-escape-db-");
    makeDb(join(dir, "mem.db"));
    makeDb(join(dir, "stale.db"), true);
    for (const walk of ["native", "js"] as const) {
      const w = new SqliteWorker({ walk });
      try {
        for (const [f, reason] of [["mem.db", "redaction_candidate"], ["stale.db", "stale_candidate"]]) {
          const fh = await open(join(dir, f!), "r");
          try {
            const r = await w.call<LiveBeginResult>({ op: "live_begin", handle: 1, src: join(dir, f!), fd: fh.fd, busyTimeoutMs: 2000, redact: true, hold: false });
            await w.call({ op: "live_release", handle: 1 });
            expect(r.reason, `${walk} ${f}`).toBe(reason);
          } finally {
            await fh.close();
          }
        }
      } finally {
        await w.close();
      }
    }
    const config = parseConfig({ agent: "json-escape-db", sources: [{ kind: "sqlite", name: "db", path: "mem.db" }] }, null, dir);
    const res = await snapshot({ config, out: join(dir, "db.memsnap") });
    const rep = res.manifest.redaction as unknown as RedactionReport;
    expect(rep.redacted["db/mem.db"]?.["@secretlint/secretlint-rule-github"], JSON.stringify(rep)).toBe(1);
    const t = spawnSync("zstd", ["-dc"], { input: readBundle(res.path).payload, maxBuffer: 1 << 30 });
    expect(leaks(t.stdout.toString("latin1"))).toBe(false);
    await restoreToDir(res.path, join(dir, "out"));
    const db = new Database(join(dir, "out", "db", "mem.db"), { readonly: true });
    try {
      const row = db.prepare("SELECT result FROM calls WHERE tool = 'gh'").get() as { result: string };
      expect(JSON.parse(row.result).stdout).toMatch(/^\[REDACTED:[^\]]+\]\n$/);
    } finally {
      db.close();
    }
  }, 60_000);

  it("a git blob with an escaped token is reported as unredacted", async () => {
    const r = await redactor();
    const st = emptyScan();
    await scanObject("blob", Buffer.from(`{"auth":"${ESCAPED}"}\n`), r, "memory/repo.bundle", st);
    expect(r.report().unredacted["memory/repo.bundle"]?.["@secretlint/secretlint-rule-github"]).toBe(1);
  });
});
