/**
 * CRIU image format: magics, image classification by file name, a streaming frame scanner,
 * and a minimal protobuf reader for the two messages memsnap needs (PstreeEntry, Pagemap*).
 *
 * Framing (CRIU ≥ 1.1 "images v1.1"): an image starts with two little-endian u32, the common
 * magic 0x54564319 (or the service magic 0x55105940 for `stats-*` and `irmap-cache`) and the
 * per-type magic, followed by protobuf frames `u32 length` + `length` bytes until EOF.
 * `inventory.img` starts with its own magic only. Raw images (`pages-*.img`, ip/iptables
 * dumps, tmpfs tarballs) carry no header. A few types put raw data after their frames
 * (pipe buffers, socket queues, ghost file contents); for those only the magics and the first
 * frame header are checked.
 */

export const PAGE_SIZE = 4096;

export const IMG_COMMON_MAGIC = 0x54564319;
export const IMG_SERVICE_MAGIC = 0x55105940;
export const INVENTORY_MAGIC = 0x58313116;
export const PSTREE_MAGIC = 0x50273030;
export const CORE_MAGIC = 0x55053847;
export const MM_MAGIC = 0x57492820;
export const PAGEMAP_MAGIC = 0x56084025;
export const FDINFO_MAGIC = 0x56213732;
export const IDS_MAGIC = 0x54432030;
export const FILES_MAGIC = 0x56303138;
export const FS_MAGIC = 0x51403912;
export const STATS_MAGIC = 0x57093306;
export const IRMAP_CACHE_MAGIC = 0x57004059;

/** PagemapEntry.flags bits (criu/include/pagemap.h). */
export const PE_PARENT = 1 << 0;
export const PE_LAZY = 1 << 1;
export const PE_PRESENT = 1 << 2;

/** Per-type magics of framed images (criu/include/magic.h), by value → name. */
export const IMAGE_MAGICS: ReadonlyMap<number, string> = new Map<number, string>([
  [PSTREE_MAGIC, "pstree"],
  [FDINFO_MAGIC, "fdinfo"],
  [PAGEMAP_MAGIC, "pagemap"],
  [CORE_MAGIC, "core"],
  [IDS_MAGIC, "ids"],
  [0x54123737, "vmas"],
  [0x56513555, "pipes"],
  [0x56453709, "pipes-data"],
  [0x58364939, "fifo"],
  [0x59333054, "fifo-data"],
  [0x55344201, "sigacts"],
  [0x54373943, "unixsk"],
  [0x56443851, "inetsk"],
  [0x60454618, "packetsk"],
  [0x57464056, "itimers"],
  [0x52603957, "posix-timers"],
  [0x56264026, "sk-queues"],
  [0x54473203, "utsns"],
  [0x54023547, "creds"],
  [0x53115007, "ipc-var"],
  [0x46283044, "ipcns-shm"],
  [0x55453737, "ipcns-msg"],
  [0x59573019, "ipcns-sem"],
  [0x50363636, "reg-files"],
  [0x59255641, "ext-files"],
  [FS_MAGIC, "fs"],
  [MM_MAGIC, "mm"],
  [0x59133954, "remap-fpath"],
  [0x52583605, "ghost-file"],
  [0x51465506, "tcp-stream"],
  [0x44523722, "eventfd"],
  [0x45023858, "eventpoll"],
  [0x44433746, "eventpoll-tfd"],
  [0x57323820, "signalfd"],
  [0x48424431, "inotify"],
  [0x54562009, "inotify-wd"],
  [0x55563928, "mountpoints"],
  [0x57373951, "netdev"],
  [0x55933752, "netns"],
  [0x59433025, "tty-files"],
  [0x59453036, "tty-info"],
  [0x59413026, "tty-data"],
  [0x54323616, "file-locks"],
  [0x57113925, "rlimit"],
  [0x55096122, "fanotify"],
  [0x56506035, "fanotify-mark"],
  [0x59255647, "signal"],
  [0x58005614, "netlink-sk"],
  [0x61394011, "ns-files"],
  [0x57143751, "tunfile"],
  [0x59383330, "cgroup"],
  [0x50493712, "timerfd"],
  [0x61404013, "cpuinfo"],
  [0x55474906, "userns"],
  [0x64413049, "seccomp"],
  [0x67343323, "binfmt-misc"],
  [0x49353943, "autofs"],
  [FILES_MAGIC, "files"],
  [0x48453499, "memfd-inode"],
  [0x43114433, "timens"],
  [0x61157326, "pidns"],
  [0x57506142, "bpfmap-file"],
  [0x64324033, "bpfmap-data"],
  [0x59423047, "apparmor"],
]);

/** Service images' magics (after IMG_SERVICE_MAGIC). */
export const SERVICE_MAGICS: ReadonlyMap<number, string> = new Map<number, string>([
  [STATS_MAGIC, "stats"],
  [IRMAP_CACHE_MAGIC, "irmap-cache"],
]);

/** Types whose frames are followed by raw data (so frames do not run to EOF). */
const INLINE_DATA_TYPES = new Set([
  "pipes-data",
  "fifo-data",
  "sk-queues",
  "tcp-stream",
  "ghost-file",
  "ipcns-shm",
  "ipcns-msg",
  "ipcns-sem",
  "bpfmap-data",
]);

/** Raw images: no header at all. */
const RAW_IMAGE = new RegExp(
  "^(?:pages-\\d+\\.img|(?:ifaddr|route|route6|rule|iptables|ip6tables|nftables|netns-ct|netns-exp)-\\d+\\.img" +
    "|tmpfs(?:-dev)?-\\d+\\.tar\\.gz\\.img)$",
);
const PAGES_IMAGE = /^pages-(\d+)\.img$/;
const SERVICE_IMAGE = /^(?:stats-[a-z]+|irmap-cache)$/;

/** How a file in an images directory is read, by its name; null when it is not an image (logs). */
export type ImageClass = "inventory" | "framed" | "service" | "pages" | "raw";

export function classifyImage(name: string): ImageClass | null {
  if (name === "inventory.img") return "inventory";
  if (PAGES_IMAGE.test(name)) return "pages";
  if (RAW_IMAGE.test(name)) return "raw";
  if (SERVICE_IMAGE.test(name)) return "service";
  if (name.endsWith(".img")) return "framed";
  return null;
}

/** The N of `pages-N.img`, or null. */
export function pagesId(name: string): number | null {
  const m = PAGES_IMAGE.exec(name);
  return m ? Number(m[1]) : null;
}

/** Largest frame memsnap buffers when it needs a frame's content (pstree, pagemap). */
export const MAX_DECODED_FRAME = 16 * 1024 * 1024;

export interface ScanResult {
  /** Type name from the magic table (`inventory` for inventory.img). */
  type: string;
  magic: number;
  frames: number;
  /** Frame contents, when asked to collect them. */
  collected: Buffer[];
  bytes: number;
}

export class ImageFormatError extends Error {}

/**
 * Check one image's header and framing as its bytes stream by. `collect` keeps each frame's
 * content (only for small, decoded images). Throws ImageFormatError with a precise reason.
 */
export async function scanImage(cls: ImageClass, chunks: AsyncIterable<Buffer>, collect = false): Promise<ScanResult> {
  const headerLen = cls === "inventory" ? 4 : 8;
  let head = Buffer.alloc(0);
  let type = "";
  let magic = 0;
  let inline = false;
  let bytes = 0;
  let frames = 0;
  const collected: Buffer[] = [];
  // Frame state: reading a 4-byte length, or skipping/collecting `left` body bytes.
  let lenBuf = Buffer.alloc(0);
  let left = 0;
  let body: Buffer[] | null = null;
  let stop = false; // inline-data types: stop checking after the first frame header
  const fail = (why: string): never => {
    throw new ImageFormatError(why);
  };

  const parseHeader = (h: Buffer): void => {
    const m0 = h.readUInt32LE(0);
    if (cls === "inventory") {
      if (m0 !== INVENTORY_MAGIC) fail(`bad magic 0x${hex(m0)} (inventory must start with 0x${hex(INVENTORY_MAGIC)})`);
      type = "inventory";
      magic = m0;
      return;
    }
    const m1 = h.readUInt32LE(4);
    if (cls === "service") {
      if (m0 !== IMG_SERVICE_MAGIC) {
        fail(`bad magic 0x${hex(m0)} (a service image starts with 0x${hex(IMG_SERVICE_MAGIC)})`);
      }
      const t = SERVICE_MAGICS.get(m1);
      if (!t) fail(`unknown service image magic 0x${hex(m1)}`);
      type = t!;
    } else {
      if (m0 !== IMG_COMMON_MAGIC) {
        fail(
          m0 === IMG_SERVICE_MAGIC
            ? "service magic on a regular image"
            : `bad magic 0x${hex(m0)} (an image starts with 0x${hex(IMG_COMMON_MAGIC)})`,
        );
      }
      const t = IMAGE_MAGICS.get(m1);
      if (!t) fail(`unknown image magic 0x${hex(m1)}`);
      type = t!;
    }
    magic = m1;
    inline = INLINE_DATA_TYPES.has(type);
  };

  for await (const raw of chunks) {
    let c = raw;
    bytes += c.length;
    if (stop) continue;
    if (head.length < headerLen) {
      const need = headerLen - head.length;
      head = Buffer.concat([head, c.subarray(0, need)]);
      c = c.subarray(need);
      if (head.length < headerLen) continue;
      parseHeader(head);
    }
    while (c.length > 0 && !stop) {
      if (left > 0) {
        const n = Math.min(left, c.length);
        if (body) body.push(c.subarray(0, n));
        left -= n;
        c = c.subarray(n);
        if (left === 0 && body) {
          collected.push(Buffer.concat(body));
          body = null;
        }
        continue;
      }
      const need = 4 - lenBuf.length;
      lenBuf = Buffer.concat([lenBuf, c.subarray(0, need)]);
      c = c.subarray(need);
      if (lenBuf.length < 4) break;
      const len = lenBuf.readUInt32LE(0);
      lenBuf = Buffer.alloc(0);
      frames++;
      if (inline) {
        stop = true; // raw data follows the entries; the first frame header is all we check
        break;
      }
      left = len;
      if (collect) {
        if (len > MAX_DECODED_FRAME) {
          fail(`frame ${frames} is ${len} bytes, over the ${MAX_DECODED_FRAME}-byte limit for a ${type} entry`);
        }
        body = [];
        if (len === 0) {
          collected.push(Buffer.alloc(0));
          body = null;
        }
      }
    }
  }
  if (head.length < headerLen) fail(`truncated header (${bytes} bytes, an image needs at least ${headerLen})`);
  if (!stop) {
    if (lenBuf.length > 0) fail(`${lenBuf.length} stray byte(s) at the end (a frame length needs 4)`);
    if (left > 0) {
      fail(`frame ${frames} runs ${left} byte(s) past the end of the file (frames must end exactly at EOF)`);
    }
  }
  return { type, magic, frames, collected, bytes };
}

function hex(n: number): string {
  return n.toString(16).padStart(8, "0");
}

// ---- protobuf ----------------------------------------------------------------------------

/** One decoded protobuf field: varints as bigint, length-delimited as bytes, fixed as bigint. */
export interface PbField {
  no: number;
  wire: number;
  value: bigint | Buffer;
}

/** Decode every top-level field of a protobuf message. Throws ImageFormatError on malformed input. */
export function decodeMessage(buf: Buffer): PbField[] {
  const out: PbField[] = [];
  let pos = 0;
  const varint = (): bigint => {
    let v = 0n;
    let shift = 0n;
    for (let i = 0; i < 10; i++) {
      if (pos >= buf.length) throw new ImageFormatError("truncated varint");
      const b = buf[pos++]!;
      v |= BigInt(b & 0x7f) << shift;
      if ((b & 0x80) === 0) return v;
      shift += 7n;
    }
    throw new ImageFormatError("varint longer than 10 bytes");
  };
  while (pos < buf.length) {
    const key = varint();
    const no = Number(key >> 3n);
    const wire = Number(key & 7n);
    if (no === 0) throw new ImageFormatError("field number 0");
    switch (wire) {
      case 0:
        out.push({ no, wire, value: varint() });
        break;
      case 1:
        if (pos + 8 > buf.length) throw new ImageFormatError("truncated fixed64");
        out.push({ no, wire, value: buf.readBigUInt64LE(pos) });
        pos += 8;
        break;
      case 2: {
        const len = varint();
        if (len > BigInt(buf.length - pos)) throw new ImageFormatError("length-delimited field runs past the message");
        const n = Number(len);
        out.push({ no, wire, value: buf.subarray(pos, pos + n) });
        pos += n;
        break;
      }
      case 5:
        if (pos + 4 > buf.length) throw new ImageFormatError("truncated fixed32");
        out.push({ no, wire, value: BigInt(buf.readUInt32LE(pos)) });
        pos += 4;
        break;
      default:
        throw new ImageFormatError(`unsupported wire type ${wire}`);
    }
  }
  return out;
}

function lastVarint(fields: PbField[], no: number): bigint | undefined {
  let v: bigint | undefined;
  for (const f of fields) if (f.no === no && f.wire === 0) v = f.value as bigint;
  return v;
}

/** PstreeEntry {pid=1, ppid=2, pgid=3, sid=4, threads=5}: the pid (required). */
export function decodePstreePid(frame: Buffer): number {
  const pid = lastVarint(decodeMessage(frame), 1);
  if (pid === undefined) throw new ImageFormatError("pstree entry without a pid");
  if (pid <= 0n || pid > 0xffffffffn) throw new ImageFormatError(`pstree entry with pid ${pid}`);
  return Number(pid);
}

/** PagemapHead {pages_id=1}. */
export function decodePagemapHead(frame: Buffer): number {
  const id = lastVarint(decodeMessage(frame), 1);
  if (id === undefined) throw new ImageFormatError("pagemap head without pages_id");
  if (id > 0xffffffffn) throw new ImageFormatError(`pagemap head with pages_id ${id}`);
  return Number(id);
}

export interface PagemapEntry {
  vaddr: bigint;
  nrPages: number;
  /** Effective flags: the `flags` field, or (older images) derived from `in_parent`. */
  flags: number;
}

/** PagemapEntry {vaddr=1, nr_pages=2, in_parent=3 (bool), flags=4}. */
export function decodePagemapEntry(frame: Buffer): PagemapEntry {
  const f = decodeMessage(frame);
  const vaddr = lastVarint(f, 1);
  const nr = lastVarint(f, 2);
  if (vaddr === undefined || nr === undefined) throw new ImageFormatError("pagemap entry without vaddr or nr_pages");
  if (nr > 0xffffffffn) throw new ImageFormatError(`pagemap entry with nr_pages ${nr}`);
  const inParent = lastVarint(f, 3);
  const flags = lastVarint(f, 4);
  const eff = flags !== undefined ? Number(flags & 0xffffffffn) : inParent ? PE_PARENT : PE_PRESENT;
  return { vaddr, nrPages: Number(nr), flags: eff };
}

/** Pages a pagemap entry stores in its own pages-N.img: PE_PRESENT and not in the parent. */
export function pagesInImage(e: PagemapEntry): number {
  return (e.flags & PE_PRESENT) !== 0 && (e.flags & PE_PARENT) === 0 ? e.nrPages : 0;
}
