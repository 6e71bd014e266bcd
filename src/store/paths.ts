/** Where bundles live by default. */
import { homedir } from "node:os";
import { join } from "node:path";
import { locationString, parseStoreLocation } from "../objstore/location.js";

/**
 * The store: explicit, else $MEMSNAP_STORE, else the config's, else $XDG_DATA_HOME/memsnap/store.
 * A local one is an absolute directory; an s3 one stays its canonical `s3://bucket/prefix` URL.
 * Any other `scheme://` (or a malformed s3 URL) is MEMSNAP_USAGE, never a local directory.
 */
export function resolveStore(
  explicit: string | undefined,
  fromConfig: string | undefined,
  env: NodeJS.ProcessEnv = process.env,
): string {
  if (explicit) return locationString(parseStoreLocation(explicit));
  if (env.MEMSNAP_STORE) return locationString(parseStoreLocation(env.MEMSNAP_STORE));
  if (fromConfig) return locationString(parseStoreLocation(fromConfig));
  const data = env.XDG_DATA_HOME || join(homedir(), ".local", "share");
  return join(data, "memsnap", "store");
}
