/** Where bundles live by default. */
import { homedir } from "node:os";
import { join, resolve } from "node:path";

/** The store directory: explicit, else $MEMSNAP_STORE, else the config's, else $XDG_DATA_HOME/memsnap/store. */
export function resolveStore(explicit: string | undefined, fromConfig: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  if (explicit) return resolve(explicit);
  if (env.MEMSNAP_STORE) return resolve(env.MEMSNAP_STORE);
  if (fromConfig) return fromConfig;
  const data = env.XDG_DATA_HOME || join(homedir(), ".local", "share");
  return join(data, "memsnap", "store");
}
