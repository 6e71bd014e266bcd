/**
 * Minimal POSIX ustar header codec for the outer bundle container. The container has two
 * members written by memsnap itself, so a full tar library is not needed here; what is
 * needed is patching the payload member's size in place after streaming it, which a
 * fixed-width header allows. Sizes that do not fit 11 octal digits (≥ 8 GiB) use GNU
 * base-256, which GNU tar, bsdtar and Go's archive/tar read.
 */
export const BLOCK = 512;
const MAX_OCTAL_SIZE = 0o77777777777;

/** Bytes of padding that follow a member of `size` bytes. */
export function padding(size: number): number {
  const r = size % BLOCK;
  return r === 0 ? 0 : BLOCK - r;
}

/** `value` as len - 1 octal digits and a NUL, digit by digit (no string: a header is written per artifact). */
function writeOctal(buf: Buffer, off: number, len: number, value: number): void {
  let v = value;
  for (let i = off + len - 2; i >= off; i--) {
    buf[i] = 0x30 + (v % 8);
    v = Math.floor(v / 8);
  }
  buf[off + len - 1] = 0;
}

function writeSize(buf: Buffer, size: number): void {
  if (size <= MAX_OCTAL_SIZE) {
    writeOctal(buf, 124, 12, size);
    return;
  }
  buf.fill(0, 124, 136);
  buf[124] = 0x80;
  let v = BigInt(size);
  for (let i = 135; i > 124; i--) {
    buf[i] = Number(v & 0xffn);
    v >>= 8n;
  }
}

/** Encode a regular-file ustar header. `name` must be ASCII and < 100 bytes. */
export function encodeHeader(name: string, size: number, mtime: Date, mode = 0o644): Buffer {
  const buf = Buffer.alloc(BLOCK);
  if (Buffer.byteLength(name) >= 100) throw new RangeError(`tar name too long: ${name}`);
  buf.write(name, 0, 100, "utf8");
  writeOctal(buf, 100, 8, mode);
  writeOctal(buf, 108, 8, 0);
  writeOctal(buf, 116, 8, 0);
  writeSize(buf, size);
  writeOctal(buf, 136, 12, Math.floor(mtime.getTime() / 1000));
  buf[156] = 0x30; // '0' regular file
  buf.write("ustar\0", 257, 6, "ascii");
  buf.write("00", 263, 2, "ascii");
  buf.write("memsnap", 265, 32, "ascii");
  buf.write("memsnap", 297, 32, "ascii");
  setChecksum(buf);
  return buf;
}

/** One PAX extended-header record: `"<len> <key>=<value>\n"`, where `<len>` counts the whole record. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let len = Buffer.byteLength(body);
  let n = len + String(len).length;
  if (String(n).length !== String(len).length) n = len + String(n).length;
  len = n;
  return `${len}${body}`;
}

/** Split a name into ustar prefix (≤ 155 bytes) and name (≤ 100 bytes) at a `/`, or null. */
function splitUstar(name: string): { prefix: string; base: string } | null {
  if (Buffer.byteLength(name) !== name.length) return null; // non-ASCII: PAX carries it exactly
  if (name.length <= 100) return { prefix: "", base: name };
  for (let i = name.indexOf("/"); i >= 0; i = name.indexOf("/", i + 1)) {
    if (i <= 155 && name.length - i - 1 <= 100 && name.length - i - 1 > 0)
      return { prefix: name.slice(0, i), base: name.slice(i + 1) };
  }
  return null;
}

/** The fields every payload header has alike (uid, gid, magic, version), the rest zeros. */
const TEMPLATE = (() => {
  const b = Buffer.alloc(BLOCK);
  writeOctal(b, 108, 8, 0);
  writeOctal(b, 116, 8, 0);
  b.write("ustar\0", 257, 6, "ascii");
  b.write("00", 263, 2, "ascii");
  return b;
})();

function rawHeader(name: string, prefix: string, size: number, mtimeSec: number, mode: number, type: number): Buffer {
  const buf = Buffer.allocUnsafe(BLOCK);
  TEMPLATE.copy(buf);
  buf.write(name, 0, 100, "utf8");
  writeOctal(buf, 100, 8, mode & 0o7777);
  writeSize(buf, size);
  writeOctal(buf, 136, 12, mtimeSec);
  buf[156] = type;
  if (prefix) buf.write(prefix, 345, 155, "utf8");
  setChecksum(buf);
  return buf;
}

/**
 * The header block(s) of one regular-file member of the payload tar: a plain ustar header
 * when the name fits (directly or split into prefix/name at a `/`), otherwise a PAX extended
 * header carrying the exact `path` followed by a ustar header with a truncated name, as GNU
 * tar and tar-stream write them. The member's bytes and padding follow.
 */
export function encodeEntryHeader(name: string, size: number, mtime: Date, mode = 0o644): Buffer {
  const t = Math.floor(mtime.getTime() / 1000);
  const mtimeSec = Number.isFinite(t) ? Math.min(Math.max(t, 0), 0o77777777777) : 0;
  const split = splitUstar(name);
  if (split) return rawHeader(split.base, split.prefix, size, mtimeSec, mode, 0x30);
  const pax = Buffer.from(paxRecord("path", name), "utf8");
  const short = Buffer.from(name, "utf8")
    .subarray(0, 99)
    .toString("latin1")
    .replace(/[^\x20-\x7e]/g, "_");
  const paxName = `PaxHeader/${short}`.slice(0, 99);
  return Buffer.concat([
    rawHeader(paxName, "", pax.length, mtimeSec, 0o644, 0x78),
    pax,
    Buffer.alloc(padding(pax.length)),
    rawHeader(short, "", size, mtimeSec, mode, 0x30),
  ]);
}

/** Rewrite the size field (and checksum) of an encoded header in place. */
export function patchSize(buf: Buffer, size: number): void {
  writeSize(buf, size);
  setChecksum(buf);
}

function checksumOf(buf: Buffer): number {
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : buf[i]!;
  return sum;
}

function setChecksum(buf: Buffer): void {
  const sum = checksumOf(buf);
  buf.write(sum.toString(8).padStart(6, "0") + "\0 ", 148, 8, "ascii");
}

/** A decoded header, or the reason it is not one. */
export interface DecodedHeader {
  name: string;
  size: number;
  type: string;
}

function parseOctal(buf: Buffer, off: number, len: number): number | null {
  const s = buf
    .toString("ascii", off, off + len)
    .replace(/[\0 ]+$/g, "")
    .replace(/^ +/, "");
  if (s === "") return 0;
  if (!/^[0-7]+$/.test(s)) return null;
  return parseInt(s, 8);
}

/**
 * Decode a header block. Returns null for an all-zero block (end of archive) and throws
 * a plain Error with a reason when the block is not a valid header.
 */
export function decodeHeader(buf: Buffer): DecodedHeader | null {
  if (buf.length !== BLOCK) throw new Error("short header block");
  if (buf.every((b) => b === 0)) return null;
  const stored = parseOctal(buf, 148, 8);
  if (stored === null || stored !== checksumOf(buf)) throw new Error("tar header checksum mismatch");
  const nul = buf.indexOf(0, 0);
  const name = buf.toString("utf8", 0, nul >= 0 && nul < 100 ? nul : 100);
  let size: number | null;
  if ((buf[124]! & 0x80) !== 0) {
    let v = 0n;
    for (let i = 125; i < 136; i++) v = (v << 8n) | BigInt(buf[i]!);
    size = v > BigInt(Number.MAX_SAFE_INTEGER) ? null : Number(v);
  } else {
    size = parseOctal(buf, 124, 12);
  }
  if (size === null) throw new Error("tar header has an invalid size field");
  return { name, size, type: String.fromCharCode(buf[156] || 0x30) };
}
