// age scrypt (passphrase) stanzas on node:crypto, and the work factors memsnap writes and opens.

import { randomBytes, scrypt as scryptCb } from "node:crypto";
import { MemsnapError } from "../../errors.js";
import { b64Strict, base64NoPad, TAG } from "./common.js";
import { HeaderMalformed, openFileKey, sealFileKey, type StanzaIn, type StanzaOut } from "./header.js";

/** The work factor memsnap (and the age CLI) writes. */
export const DEFAULT_SCRYPT_LOG_N = 18;
/** Highest scrypt work factor we write or accept at all (the same cap as typage). */
export const MAX_SCRYPT_LOG_N = 20;
/**
 * Highest scrypt work factor opened unless the caller raises it: 2^18 (N·r·128 = 256 MiB of
 * memory, about half a second), what memsnap and the age CLI write. A header is read before
 * anything authenticates it, so its work factor is the bundle's to choose: 2^20 cost 4.9 s and
 * 1 GiB before the MAC failed.
 */
export const DEFAULT_SCRYPT_MAX_LOG_N = 18;
/** The environment variable that raises {@link DEFAULT_SCRYPT_MAX_LOG_N} (up to 2^20). */
export const SCRYPT_MAX_LOG_N_ENV = "MEMSNAP_SCRYPT_MAX_LOG_N";

/**
 * The scrypt work factor (log2 N) a decryption accepts: `given` when set, else
 * $MEMSNAP_SCRYPT_MAX_LOG_N, else 2^18 (a string is parsed as decimal digits). Throws
 * MEMSNAP_USAGE for a value that is not an integer 1..20.
 */
export function scryptMaxLogN(given?: number | string, env: NodeJS.ProcessEnv = process.env): number {
  const num = (v: string): number => (/^[0-9]{1,3}$/.test(v.trim()) ? Number(v.trim()) : NaN);
  const raw =
    typeof given === "string"
      ? num(given)
      : (given ?? (env[SCRYPT_MAX_LOG_N_ENV] ? num(env[SCRYPT_MAX_LOG_N_ENV]!) : DEFAULT_SCRYPT_MAX_LOG_N));
  if (!Number.isInteger(raw) || raw < 1 || raw > MAX_SCRYPT_LOG_N) {
    const what = given !== undefined ? "--scrypt-max-log-n" : SCRYPT_MAX_LOG_N_ENV;
    const got = given ?? env[SCRYPT_MAX_LOG_N_ENV];
    throw new MemsnapError("MEMSNAP_USAGE", `${what} must be an integer from 1 to ${MAX_SCRYPT_LOG_N}, got ${got}`, {
      hint:
        `the work factor is a power of two: ${DEFAULT_SCRYPT_MAX_LOG_N} (the default) opens ` +
        `2^${DEFAULT_SCRYPT_MAX_LOG_N}, 20 opens 2^20 (1 GiB of memory)`,
    });
  }
  return raw;
}

/** What scrypt at work factor 2^logN (r = 8) needs in memory, for messages. */
function scryptMemory(logN: number): string {
  const mib = (128 * 8 * 2 ** logN) / (1024 * 1024);
  return mib >= 1024 ? `${mib / 1024} GiB` : `${mib} MiB`;
}
const SCRYPT_LABEL = "age-encryption.org/v1/scrypt";

// ---------------------------------------------------------------------------------------
// scrypt recipient / identity on node:crypto (async: runs on the libuv thread pool).

function scryptKey(passphrase: string, salt: Uint8Array, logN: number): Promise<Buffer> {
  const N = 2 ** logN;
  const r = 8;
  return new Promise((resolve, reject) => {
    scryptCb(
      Buffer.from(passphrase, "utf8"),
      Buffer.concat([Buffer.from(SCRYPT_LABEL, "latin1"), salt]),
      32,
      { N, r, p: 1, maxmem: 128 * r * N + 64 * 1024 * 1024 },
      (err, key) => (err ? reject(err) : resolve(key)),
    );
  });
}

/** age scrypt recipient: `-> scrypt <salt> <logN>`, body = sealed file key. */
export async function scryptStanza(passphrase: string, logN: number, fileKey: Uint8Array): Promise<StanzaOut> {
  const salt = randomBytes(16);
  const key = await scryptKey(passphrase, salt, logN);
  return { args: ["scrypt", base64NoPad(salt), String(logN)], body: sealFileKey(key, fileKey) };
}

/**
 * The file key from the (only) scrypt stanza for `passphrase`, or null when it does not open
 * it. A work factor over `maxLogN` is MEMSNAP_UNSAFE_BUNDLE before any scrypt work is done.
 */
export async function unwrapScrypt(st: StanzaIn, passphrase: string, maxLogN: number): Promise<Uint8Array | null> {
  const [, saltB64, logNStr] = st.args;
  if (st.args.length !== 3 || saltB64 === undefined || logNStr === undefined || !/^[1-9][0-9]*$/.test(logNStr)) {
    throw new HeaderMalformed("invalid scrypt stanza");
  }
  const salt = b64Strict(saltB64);
  if (salt === null || salt.length !== 16) throw new HeaderMalformed("invalid scrypt stanza");
  if (st.body.length !== 16 + TAG) throw new HeaderMalformed("invalid scrypt stanza body");
  const logN = Number(logNStr);
  if (logN > maxLogN) {
    const big = logN > 64 ? `${logNStr.length > 12 ? `${logNStr.slice(0, 12)}…` : logNStr}` : String(logN);
    const memory = logN <= 64 ? ` (${scryptMemory(logN)} of memory)` : "";
    throw new MemsnapError(
      "MEMSNAP_UNSAFE_BUNDLE",
      `the bundle's passphrase stanza asks for an scrypt work factor of 2^${big}${memory}, over the limit of ` +
        `2^${maxLogN} (${scryptMemory(maxLogN)}); nothing was decrypted`,
      {
        hint:
          logN > MAX_SCRYPT_LOG_N
            ? `memsnap opens work factors up to 2^${MAX_SCRYPT_LOG_N} at most; memsnap and age write ` +
              `2^${DEFAULT_SCRYPT_LOG_N}: this bundle was not written by either, or was altered`
            : `memsnap and age write 2^${DEFAULT_SCRYPT_LOG_N}; if you trust this bundle, raise the limit with ` +
              `--scrypt-max-log-n ${logN} (or ${SCRYPT_MAX_LOG_N_ENV}=${logN})`,
      },
    );
  }
  return openFileKey(await scryptKey(passphrase, salt, logN), st.body);
}
