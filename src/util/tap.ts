/**
 * A byte-mode pass-through that shows each chunk to a callback (hashing, counting, limits).
 * Async-generator stages in `pipeline` are object-mode and buffer up to 16 chunks each
 * (16 MiB with 1 MiB reads); a Tap buffers at most `highWaterMark` bytes, which keeps peak
 * memory flat. A callback that throws fails the stream with that error.
 */
import { Transform, type TransformCallback } from "node:stream";

export class Tap extends Transform {
  constructor(
    private readonly see: (chunk: Buffer) => void,
    private readonly atEnd?: () => void,
    highWaterMark = 256 * 1024,
  ) {
    super({ highWaterMark });
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    try {
      this.see(chunk);
    } catch (e) {
      cb(e as Error);
      return;
    }
    cb(null, chunk);
  }

  override _flush(cb: TransformCallback): void {
    try {
      this.atEnd?.();
    } catch (e) {
      cb(e as Error);
      return;
    }
    cb();
  }
}
