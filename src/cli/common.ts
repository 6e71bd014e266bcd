/** Helpers shared by the CLI commands. */
export interface GlobalOpts {
  json: boolean;
}

/** Commander collector for repeatable options. */
export function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

/**
 * Run `fn` with an AbortSignal that fires on SIGINT/SIGTERM, so a command interrupted by
 * the user cleans up (no partial bundle, staging removed) before the process exits.
 */
export async function withAbort<T>(fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const ac = new AbortController();
  const onSignal = (): void => ac.abort();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    return await fn(ac.signal);
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}
