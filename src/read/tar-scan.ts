/**
 * The payload's tar framing, parsed where the bytes are decompressed (the decoder worker,
 * ./decoder.worker.ts) so that each entry is hashed there too, and the main thread only writes.
 *
 * It reads what memsnap writes (ustar, with the name split
 * into prefix/name, and a pax `path` record for other names) and what older memsnap versions
 * and tar-stream wrote (pax `path`/`size`, pax global headers, GNU long names); it follows
 * tar-stream's extract on the points a hostile bundle could use to make two parsers disagree:
 * an all-zero block is skipped, a checksum must match, the magic must be ustar or GNU, a pax
 * `size` replaces the header's, a `name/` regular file is a directory, numeric fields are read
 * with tar-stream's leniency (test/pipeline/tar-scan.test.ts compares the two on thousands of
 * damaged archives). There is only one parser on the read path, so the bytes hashed are the
 * bytes written.
 *
 * Output: `ops`, a flat list the caller takes after each scan: `OP_START, name, size, type,
 * hashed`, then `OP_DATA, offset, length` for the entry's bytes in the scanned buffer (offsets
 * into the buffer passed to {@link TarScanner.scan}), then `OP_END, sha256 hex` once all its
 * bytes passed. `hashed` is 1 when the scanner hashes the entry, 0 when it leaves that to the
 * reader (then the digest is ""): the `hashHere` callback decides per entry, so the work can go
 * to whichever thread has time for it. Errors end the scan: `error` holds the message and
 * `scan`/`end` return false.
 */
export const OP_START = 1;
export const OP_DATA = 2;
export const OP_END = 3;

interface HashLike {
  update(b: Uint8Array): unknown;
  digest(enc: "hex"): string;
}

export class TarScanner {
  ops: (number | string)[] = [];
  error: string | null = null;
  /** Bytes of tar consumed so far. */
  offset = 0;
  private readonly newHash: () => HashLike;
  private readonly hashHere: () => boolean;
  /** 0 header, 1 entry bytes, 2 padding, 3 pax or GNU long-name bytes. */
  private state = 0;
  private readonly hdr = Buffer.alloc(512);
  private hdrFill = 0;
  private left = 0;
  private pad = 0;
  private hash: HashLike | null = null;
  private meta: Buffer | null = null;
  private metaFill = 0;
  private metaType = 0;
  private pax: Record<string, string> | null = null;
  private paxGlobal: Record<string, string> | null = null;
  private longPath: string | null = null;

  constructor(newHash: () => HashLike, hashHere: () => boolean = () => true) {
    this.newHash = newHash;
    this.hashHere = hashHere;
  }

  /** Scan `buf[from, to)`, the next bytes of the tar. False on a framing error (see `error`). */
  scan(buf: Buffer, from: number, to: number): boolean {
    if (this.error !== null) return false;
    let p = from;
    while (p < to) {
      if (this.state === 0) {
        if (this.hdrFill === 0 && to - p >= 512) {
          const ok = this.header(buf, p);
          p += 512;
          this.offset += 512;
          if (!ok) return false;
          continue;
        }
        const n = Math.min(512 - this.hdrFill, to - p);
        buf.copy(this.hdr, this.hdrFill, p, p + n);
        this.hdrFill += n;
        p += n;
        this.offset += n;
        if (this.hdrFill === 512) {
          this.hdrFill = 0;
          if (!this.header(this.hdr, 0)) return false;
        }
      } else if (this.state === 1) {
        const n = Math.min(this.left, to - p);
        if (this.hash !== null) this.hash.update(buf.subarray(p, p + n));
        const ops = this.ops;
        const k = ops.length;
        // Extend the previous range when it ends here (one range per entry per buffer).
        if (k >= 3 && ops[k - 3] === 2 && (ops[k - 2] as number) + (ops[k - 1] as number) === p)
          ops[k - 1] = (ops[k - 1] as number) + n;
        else ops.push(2, p, n);
        this.left -= n;
        p += n;
        this.offset += n;
        if (this.left === 0) this.endEntry();
      } else if (this.state === 2) {
        const n = Math.min(this.left, to - p);
        this.left -= n;
        p += n;
        this.offset += n;
        if (this.left === 0) this.state = 0;
      } else {
        const n = Math.min(this.left, to - p);
        buf.copy(this.meta!, this.metaFill, p, p + n);
        this.metaFill += n;
        this.left -= n;
        p += n;
        this.offset += n;
        if (this.left === 0) this.endMeta();
      }
    }
    return true;
  }

  /** The tar has ended: false when it ends inside a header, an entry or its padding. */
  end(): boolean {
    if (this.error !== null) return false;
    if (this.state !== 0 || this.hdrFill !== 0) return this.fail("Unexpected end of data");
    return true;
  }

  private fail(msg: string): false {
    this.error = msg;
    return false;
  }

  private afterBytes(size: number): void {
    const r = size % 512;
    this.pad = r === 0 ? 0 : 512 - r;
  }

  private endEntry(): void {
    this.ops.push(3, this.hash === null ? "" : this.hash.digest("hex"));
    this.hash = null;
    this.left = this.pad;
    this.state = this.pad > 0 ? 2 : 0;
  }

  private endMeta(): void {
    const b = this.meta!.subarray(0, this.metaFill);
    this.meta = null;
    if (this.metaType === 76 || this.metaType === 78) this.longPath = TarScanner.str(b, 0, b.length);
    else if (this.metaType === 103) this.paxGlobal = TarScanner.pax(b);
    else if (this.metaType === 120)
      this.pax = this.paxGlobal === null ? TarScanner.pax(b) : Object.assign({}, this.paxGlobal, TarScanner.pax(b));
    this.left = this.pad;
    this.state = this.pad > 0 ? 2 : 0;
  }

  private header(b: Buffer, o: number): boolean {
    let sum = 256;
    for (let i = o; i < o + 148; i++) sum += b[i]!;
    for (let i = o + 156; i < o + 512; i++) sum += b[i]!;
    if (sum === 256) return true; // an all-zero block (the end-of-archive marker): skipped
    if (sum !== TarScanner.oct(b, o + 148, 8))
      return this.fail("Invalid tar header. Maybe the tar is corrupted or it needs to be gunzipped?");
    const ustar =
      b[o + 257] === 0x75 && b[o + 258] === 0x73 && b[o + 259] === 0x74 && b[o + 260] === 0x61 && b[o + 261] === 0x72;
    const v = b[o + 262];
    const isUstar = ustar && v === 0;
    const isGnu = ustar && v === 0x20 && b[o + 263] === 0x20 && b[o + 264] === 0;
    if (!isUstar && !isGnu) return this.fail("Invalid tar header: unknown format.");
    const flag = b[o + 156] === 0 ? 48 : b[o + 156]!;
    let size = TarScanner.oct(b, o + 124, 12);
    if (flag === 120 || flag === 103 || flag === 76 || flag === 78 || flag === 75) {
      if (!(size >= 0) || size > 4 * 1024 * 1024) return this.fail("Header exceeds max size"); // tar-stream's cap
      this.afterBytes(size);
      if (flag === 75) {
        this.left = size + this.pad; // a GNU long link name: nothing here has a link
        this.state = this.left > 0 ? 2 : 0;
        return true;
      }
      this.metaType = flag;
      this.meta = Buffer.alloc(size);
      this.metaFill = 0;
      this.left = size;
      this.state = 3;
      if (size === 0) this.endMeta();
      return true;
    }
    let name = TarScanner.str(b, o, 100);
    if (isUstar && b[o + 345] !== 0) name = `${TarScanner.str(b, o + 345, 155)}/${name}`;
    if (this.longPath !== null) {
      name = this.longPath;
      this.longPath = null;
    }
    if (this.pax !== null) {
      if (this.pax.path) name = this.pax.path;
      if (this.pax.size) size = parseInt(this.pax.size, 10);
      this.pax = null;
    }
    if (!(size >= 0) || !Number.isSafeInteger(size)) return this.fail("Invalid header");
    let type: string;
    switch (flag) {
      case 48:
        type = name.endsWith("/") ? "directory" : "file";
        break;
      case 49:
        type = "link";
        break;
      case 50:
        type = "symlink";
        break;
      case 51:
        type = "character-device";
        break;
      case 52:
        type = "block-device";
        break;
      case 53:
        type = "directory";
        break;
      case 54:
        type = "fifo";
        break;
      case 55:
        type = "contiguous-file";
        break;
      default:
        type = "unknown";
    }
    const here = type === "file" && this.hashHere();
    this.ops.push(1, name, size, type, here ? 1 : 0);
    if (type !== "file") {
      // The reader refuses it at OP_START; nothing after it is framed.
      this.ops.push(3, "");
      return this.fail(`a ${type} entry`);
    }
    this.afterBytes(size);
    this.hash = here ? this.newHash() : null;
    this.left = size;
    this.state = 1;
    if (size === 0) this.endEntry();
    return true;
  }

  /** A NUL-terminated UTF-8 string field. */
  private static str(b: Buffer, o: number, len: number): string {
    let e = o;
    while (e < o + len && b[e] !== 0) e++;
    return b.toString("utf8", o, e);
  }

  /**
   * A numeric field as tar-stream reads it: GNU base-256 (NaN if negative or malformed, where
   * tar-stream's value would be negative or null), else octal: leading spaces skipped, the
   * field cut at its first space, leading NULs skipped, then `parseInt(…, 8)` (which stops at
   * the first byte that is not an octal digit; NaN if there is none).
   */
  private static oct(b: Buffer, o: number, len: number): number {
    if (b[o]! & 0x80) {
      if (b[o] !== 0x80) return NaN;
      let v = 0;
      for (let i = o + 1; i < o + len; i++) v = v * 256 + b[i]!;
      return v;
    }
    const end0 = o + len;
    let i = o;
    while (i < end0 && b[i] === 0x20) i++;
    let end = i;
    while (end < end0 && b[end] !== 0x20) end++;
    while (i < end && b[i] === 0) i++;
    if (i === end) return 0;
    return parseInt(b.toString("utf8", i, end), 8);
  }

  /** pax records `"<len> <key>=<value>\n"` (as tar-stream reads them: stops at the first malformed one). */
  private static pax(buf: Buffer): Record<string, string> {
    const r: Record<string, string> = {};
    while (buf.length) {
      let i = 0;
      while (i < buf.length && buf[i] !== 32) i++;
      const len = parseInt(buf.toString("utf8", 0, i), 10);
      if (!len) return r;
      const s = buf.toString("utf8", i + 1, len - 1);
      const k = s.indexOf("=");
      if (k === -1) return r;
      r[s.slice(0, k)] = s.slice(k + 1);
      buf = buf.subarray(len);
    }
    return r;
  }
}
