/**
 * The byte-plane shuffle of numeric pages (KV-cache pages of 2- and 4-byte elements): every
 * element's byte 0, then every byte 1, …; native/directio's `planes` when built, else JS loops.
 * Used by the kv source (sources/kv) and by the packer, which stores such pages as planes.
 */
import { createRequire } from "node:module";
import { memoryAddon } from "./directio.js";

/** The most bytes shuffled or put back at once (a KV page's bound, KV_MAX_PAGE_BYTES). */
export const PLANES_MAX_BYTES = 64 * 1024 * 1024;

/**
 * Split `src` (elements of `elem` bytes) into byte planes: every element's byte 0, then
 * every byte 1, …; for 2-byte dtypes the low bytes, then the high bytes. `src.length` must
 * be a multiple of `elem`.
 */
export function shuffle(src: Uint8Array, elem: number): Buffer {
  const out = Buffer.allocUnsafe(src.length);
  const native = nativePlanes();
  if (native && (elem === 2 || elem === 4)) {
    native(out, src, elem, false);
    return out;
  }
  const n = src.length / elem;
  if (elem === 2) {
    for (let i = 0, j = 0; i < n; i++, j += 2) {
      out[i] = src[j]!;
      out[n + i] = src[j + 1]!;
    }
  } else {
    for (let b = 0; b < elem; b++) {
      const base = b * n;
      for (let i = 0, j = b; i < n; i++, j += elem) out[base + i] = src[j]!;
    }
  }
  return out;
}

/** The inverse of {@link shuffle}. */
export function unshuffle(src: Uint8Array, elem: number): Buffer {
  const out = Buffer.allocUnsafe(src.length);
  const native = nativePlanes();
  if (native && (elem === 2 || elem === 4)) {
    native(out, src, elem, true);
    return out;
  }
  const n = src.length / elem;
  if (elem === 2) {
    for (let i = 0, j = 0; i < n; i++, j += 2) {
      out[j] = src[i]!;
      out[j + 1] = src[n + i]!;
    }
  } else {
    for (let b = 0; b < elem; b++) {
      const base = b * n;
      for (let i = 0, j = b; i < n; i++, j += elem) out[j] = src[base + i]!;
    }
  }
  return out;
}

type Planes = (dst: Uint8Array, src: Uint8Array, elem: number, inverse: boolean) => void;
let planesFn: Planes | null | undefined;
/**
 * native/directio's `planes` (the same shuffle at memory speed; the JS loops run at ~0.2 GB/s),
 * or null: not built, or MEMSNAP_NATIVE=0.
 */
function nativePlanes(): Planes | null {
  if (planesFn === undefined) {
    const path = memoryAddon();
    try {
      planesFn = path ? ((createRequire(import.meta.url)(path) as { planes?: Planes }).planes ?? null) : null;
    } catch {
      planesFn = null;
    }
  }
  return planesFn;
}

/** {@link shuffle} into `dst` (the same length as `src`). */
export function shuffleInto(dst: Uint8Array, src: Uint8Array, elem: number): void {
  const native = nativePlanes();
  if (native && (elem === 2 || elem === 4)) native(dst, src, elem, false);
  else dst.set(shuffle(src, elem));
}
