/**
 * The native/directio addon: page-aligned memory, so the bundle sink (../pipeline/encoder.ts)
 * can write with O_DIRECT. Why: on the 2-core bench machine (ext4 on a virtio disk) writing
 * 600 MiB through the page cache and fdatasync took 0.66-0.72 s and 0.40-0.48 CPU-s of kernel
 * time (copying into the page cache, then writeback), and with O_DIRECT 0.31-0.41 s and
 * 0.05-0.07 CPU-s (`dd bs=1M count=600 conv=fdatasync` against `oflag=direct`). A snapshot is
 * CPU-bound on such a machine, so the kernel's copy competes with zstd and SHA-256.
 *
 * Linux only (O_DIRECT). Built by `npm install` / `npm ci` with node-gyp, like the pre-filter;
 * without it (no compiler, another platform) bundles are written through the page cache as
 * before. `MEMSNAP_DIRECT_IO=0` turns it off (`misaligned`, for tests, hands the sink memory that
 * O_DIRECT refuses, to exercise the fallback). Bundles are the same bytes either way.
 */
import { constants, existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** Where the addon is built (native/directio/build/Release), from dist/util or src/util. */
const ADDON = fileURLToPath(new URL("../../native/directio/build/Release/memsnap_directio.node", import.meta.url));

/** The addon's path when this process may write bundles with O_DIRECT (null: page cache). */
export function directIoAddon(): string | null {
  if (process.env.MEMSNAP_DIRECT_IO === "0" || process.platform !== "linux" || constants.O_DIRECT === undefined) return null;
  return existsSync(ADDON) ? ADDON : null;
}
