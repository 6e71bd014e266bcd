/**
 * Shared output slots: a fixed SharedArrayBuffer cut into equal slots that a producer thread
 * fills and the main thread reads in place, then gives back. No buffer is allocated, copied or
 * transferred per batch. Measured on the bench's scale-1 restore before this: the main thread
 * copied each 1 MiB batch the decoder worker posted into a fresh Buffer (~930 MB of memmove),
 * and that stream of new ArrayBuffers drove V8's external-memory GC: a mark-compact every
 * ~25 ms through the KV layer (33 in all) and ~0.5 CPU-s of concurrent marking on V8's helper
 * threads, on a machine whose two cores the restore already keeps busy.
 *
 * A slot is held by whoever reads it (the payload reader holds its current batch) and by
 * anyone who keeps a view of it past that: a consumer that writes a chunk later (WriteBehind,
 * a batched writev) pins it with {@link pin} and calls the release it gets back once done. The
 * slot goes back to the producer when the last hold is released. Views of a slot that are used
 * after that read whatever the producer wrote next; with `MEMSNAP_POISON_SLOTS=1` (the test
 * suite sets it) a slot is overwritten with 0xdb the moment it is given back, so such a use
 * fails the tests' content checks instead of passing by luck.
 */

const POISON = 0xdb;

/** The pools by their memory, so {@link pin} can find a view's slot from the view alone. */
const pools = new WeakMap<ArrayBufferLike, SlotPool>();

export class SlotPool {
  readonly memory: SharedArrayBuffer;
  readonly #holds: Uint32Array;
  readonly #poison = process.env.MEMSNAP_POISON_SLOTS === "1";

  /** `onFree(slot)`: the slot may be filled again (called once its last hold is released). */
  constructor(
    readonly count: number,
    readonly slotSize: number,
    private readonly onFree: (slot: number) => void,
  ) {
    this.memory = new SharedArrayBuffer(count * slotSize);
    this.#holds = new Uint32Array(count);
    pools.set(this.memory, this);
  }

  /** `len` bytes of `slot` as a Buffer over the shared memory (no copy), held once for the caller. */
  take(slot: number, len: number): Buffer {
    if (!(slot >= 0 && slot < this.count) || this.#holds[slot] !== 0 || len > this.slotSize) {
      throw new RangeError(`slot ${slot} (${len} bytes) cannot be taken`);
    }
    this.#holds[slot] = 1;
    return Buffer.from(this.memory, slot * this.slotSize, len);
  }

  hold(slot: number): void {
    this.#holds[slot]! += 1;
  }

  release(slot: number): void {
    const n = this.#holds[slot]!;
    if (n === 0) throw new RangeError(`slot ${slot} released more often than held`);
    this.#holds[slot] = n - 1;
    if (n > 1) return;
    if (this.#poison) new Uint8Array(this.memory, slot * this.slotSize, this.slotSize).fill(POISON);
    this.onFree(slot);
  }

  /** The slot a view of this pool's memory lies in. */
  slotOf(view: Uint8Array): number {
    return Math.floor(view.byteOffset / this.slotSize);
  }
}

/**
 * Keep `view`'s memory from being reused until the returned function is called (once). Returns
 * null when `view` is not in a slot pool (its memory is the holder's own; nothing to do).
 */
export function pin(view: Uint8Array): (() => void) | null {
  const pool = pools.get(view.buffer);
  if (pool === undefined || view.length === 0) return null;
  const slot = pool.slotOf(view);
  pool.hold(slot);
  let done = false;
  return () => {
    if (done) return;
    done = true;
    pool.release(slot);
  };
}
