#!/usr/bin/env node
/**
 * kv-json-store.mjs — an example memsnap source plugin (protocol memsnap-plugin/1, docs/PLUGINS.md).
 *
 * The "runtime" is a tiny key-value store kept in one JSON file (`{"key": value, …}`).
 * capture exports it as one file per key plus a small header file; restore rebuilds the
 * store file from those files. Plain Node, built-ins only: a plugin needs nothing from memsnap.
 *
 *   memsnap.json:
 *     { "kind": "exec", "name": "kv",
 *       "command": ["node", "examples/plugins/kv-json-store.mjs"],
 *       "config": { "path": "data/store.json" } }
 *
 *   capture:  node kv-json-store.mjs capture < request.json > layer.tar
 *             layer.tar: kv-store.json            {"format":"kv-json-store/1","keys":N}
 *                        keys/<urlencoded key>.json  the value, as JSON
 *   restore:  node kv-json-store.mjs restore < request.json
 *             writes <dir>/store.json (sorted keys, 2-space indent, final newline), prints
 *             {"protocol":"memsnap-plugin/1","ok":true,"message":…}
 *
 * Files are marked with the pax records MEMSNAP.text=1 / MEMSNAP.kind=json, so memsnap's
 * redactor may rewrite secrets in them (they stay valid JSON).
 */
import fs from "node:fs";
import path from "node:path";

const PROTOCOL = "memsnap-plugin/1";
const FORMAT = "kv-json-store/1";

function die(msg, code = 1) {
  process.stderr.write(`kv-json-store: ${msg}\n`);
  process.exit(code);
}

async function readRequest(op) {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  let req;
  try {
    req = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch (e) {
    die(`the request on stdin is not JSON: ${e.message}`, 2);
  }
  if (req?.protocol !== PROTOCOL) die(`unsupported protocol ${JSON.stringify(req?.protocol)} (this plugin speaks ${PROTOCOL})`, 2);
  if (req.op !== op) die(`request op ${JSON.stringify(req.op)} does not match argv ${op}`, 2);
  return req;
}

/** The store file named by config.path, relative to the working directory (memsnap runs plugins in the config's directory). */
function storePath(config) {
  const p = config?.path ?? process.env.KV_STORE;
  if (typeof p !== "string" || p === "") die('config.path (or env KV_STORE) must name the store file', 2);
  return path.resolve(p);
}

/** A canonical store file: sorted keys, 2-space indent, final newline. */
function storeText(obj) {
  const sorted = Object.fromEntries(Object.keys(obj).sort().map((k) => [k, obj[k]]));
  return `${JSON.stringify(sorted, null, 2)}\n`;
}

// ---- a minimal tar writer (ustar + pax records) ----------------------------------------

function octal(n, width) {
  return `${n.toString(8).padStart(width - 1, "0")}\0`;
}

function header(name, size, type, mtime) {
  const h = Buffer.alloc(512);
  h.write(name, 0, 100, "utf8");
  h.write(octal(0o644, 8), 100);
  h.write(octal(0, 8), 108);
  h.write(octal(0, 8), 116);
  h.write(octal(size, 12), 124);
  h.write(octal(mtime, 12), 136);
  h.write("        ", 148);
  h.write(type, 156);
  h.write("ustar\0", 257);
  h.write("00", 263);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148);
  return h;
}

function pad(n) {
  return Buffer.alloc((512 - (n % 512)) % 512);
}

function paxRecords(records) {
  let out = "";
  for (const [k, v] of Object.entries(records)) {
    const body = ` ${k}=${v}\n`;
    const blen = Buffer.byteLength(body);
    let len = blen + 1;
    while (String(len).length + blen !== len) len = String(len).length + blen;
    out += `${len}${body}`;
  }
  return Buffer.from(out, "utf8");
}

/** One regular-file entry (a pax header first, for long names and the MEMSNAP.* hints). */
function fileEntry(name, data, mtime) {
  const pax = paxRecords({ path: name, "MEMSNAP.text": "1", "MEMSNAP.kind": "json" });
  return Buffer.concat([
    header("PaxHeader", pax.length, "x", mtime), pax, pad(pax.length),
    header(name.slice(0, 99), data.length, "0", mtime), data, pad(data.length),
  ]);
}

function write(buf) {
  return new Promise((resolve, reject) => {
    process.stdout.write(buf, (e) => (e ? reject(e) : resolve()));
  });
}

async function capture() {
  const req = await readRequest("capture");
  const file = storePath(req.config);
  let store;
  try {
    store = JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (e) {
    die(`cannot read the store ${file}: ${e.message}`);
  }
  if (typeof store !== "object" || store === null || Array.isArray(store)) die(`${file} is not a JSON object`);
  const mtime = Math.floor(fs.statSync(file).mtimeMs / 1000);
  const keys = Object.keys(store).sort();
  await write(fileEntry("kv-store.json", Buffer.from(`${JSON.stringify({ format: FORMAT, keys: keys.length })}\n`), mtime));
  for (const k of keys) {
    await write(fileEntry(`keys/${encodeURIComponent(k)}.json`, Buffer.from(`${JSON.stringify(store[k])}\n`), mtime));
  }
  await write(Buffer.alloc(1024)); // end of archive
}

async function restore() {
  const req = await readRequest("restore");
  const dir = req.dir;
  if (typeof dir !== "string" || !path.isAbsolute(dir)) die("restore request without an absolute dir", 2);
  const head = JSON.parse(fs.readFileSync(path.join(dir, "kv-store.json"), "utf8"));
  if (head.format !== FORMAT) die(`unknown export format ${JSON.stringify(head.format)}`);
  const keysDir = path.join(dir, "keys");
  const names = fs.existsSync(keysDir) ? fs.readdirSync(keysDir).filter((n) => n.endsWith(".json")) : [];
  const store = {};
  for (const n of names) store[decodeURIComponent(n.slice(0, -5))] = JSON.parse(fs.readFileSync(path.join(keysDir, n), "utf8"));
  if (Object.keys(store).length !== head.keys) die(`the export lists ${head.keys} keys but ${Object.keys(store).length} were restored`);
  const tmp = path.join(dir, `.store.json.tmp-${process.pid}`);
  fs.writeFileSync(tmp, storeText(store), { mode: 0o600 });
  fs.renameSync(tmp, path.join(dir, "store.json"));
  process.stdout.write(`${JSON.stringify({ protocol: PROTOCOL, ok: true, message: `restored ${head.keys} keys to store.json` })}\n`);
}

const op = process.argv[2];
if (op === "capture") await capture();
else if (op === "restore") await restore();
else die(`usage: kv-json-store.mjs capture|restore (got ${JSON.stringify(op)})`, 2);
