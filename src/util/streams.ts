/** Small helpers over async iterables of chunks. */

/** All of `it`'s bytes in one buffer, or null once they pass `limit` (the rest is not read). */
export async function collect(it: AsyncIterable<Buffer>, limit: number): Promise<Buffer | null> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const c of it) {
    n += c.length;
    if (n > limit) return null;
    parts.push(c);
  }
  return Buffer.concat(parts);
}

/**
 * Run `fn` over `bytes`, then drain whatever it left unread: a consumer that stops early (a parse error) must not
 * leave the producer waiting.
 */
export async function consumeAll<T>(
  bytes: AsyncIterable<Buffer>,
  fn: (b: AsyncIterable<Buffer>) => Promise<T>,
): Promise<T> {
  const it = bytes[Symbol.asyncIterator]();
  const view: AsyncIterable<Buffer> = {
    [Symbol.asyncIterator]: () => ({
      next: () => it.next(),
      return: async () => ({ done: true as const, value: undefined }),
    }),
  };
  try {
    return await fn(view);
  } finally {
    for (;;) if ((await it.next()).done) break;
  }
}
