/** Loading keys from files: age identities, recipients, passphrases. */
import { open } from "node:fs/promises";
import { MemsnapError } from "./errors.js";
import { parseIdentities, parseRecipients } from "./codecs/age/keys.js";

/** A secret key file that others than its owner can read or write (see {@link onKeyFileWarning}). */
export interface KeyFileWarning {
  path: string;
  message: string;
}

const keyFileListeners = new Set<(w: KeyFileWarning) => void>();

/**
 * Be told of each secret key file (an identity file, a passphrase file, a signing key) that is
 * loaded while its mode gives group or others any access (`mode & 0o077`): it is still used
 * (as ssh does not, memsnap does not refuse), and the CLI prints a warning. Returns the
 * function that stops the listening.
 */
export function onKeyFileWarning(listener: (w: KeyFileWarning) => void): () => void {
  keyFileListeners.add(listener);
  return () => keyFileListeners.delete(listener);
}

/** Paths that name a descriptor (a pipe, a here-document), whose mode says nothing of a file kept on disk. */
const DESCRIPTOR_PATH = /^(-|\/dev\/(stdin|fd\/\d+)|\/proc\/(self|thread-self|\d+)\/fd\/\d+)$/;

/**
 * Read a key file (MEMSNAP_IDENTITY_INVALID when it cannot be read). With `secret`, a regular
 * file whose mode lets group or others in is reported to the {@link onKeyFileWarning}
 * listeners; the mode is the one of the file read (fstat of the descriptor, not a second lookup).
 */
export async function readKeyFile(path: string, what: string, secret = false): Promise<string> {
  try {
    const fh = await open(path, "r");
    try {
      if (secret && !DESCRIPTOR_PATH.test(path)) {
        const st = await fh.stat();
        if (st.isFile() && (st.mode & 0o077) !== 0) {
          const mode = (st.mode & 0o777).toString(8).padStart(4, "0");
          const who =
            st.mode & 0o070 && st.mode & 0o007 ? "group and others" : st.mode & 0o070 ? "its group" : "others";
          const w = {
            path,
            message:
              `${what} ${path} is open to ${who} (mode ${mode}): whoever can read it holds the key; chmod ` +
              `600 ${path}`,
          };
          for (const l of keyFileListeners) l(w);
        }
      }
      return await fh.readFile("utf8");
    } finally {
      await fh.close();
    }
  } catch (e) {
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `cannot read ${what} ${path}: ${(e as Error).message}`, {
      path,
      hint: `check the ${what} path`,
    });
  }
}

/** Read age identity files (as age-keygen writes). Throws MEMSNAP_IDENTITY_INVALID. */
export async function loadIdentities(files: readonly string[]): Promise<string[]> {
  const out: string[] = [];
  for (const f of files) out.push(...parseIdentities(await readKeyFile(f, "identity file", true)));
  return out;
}

/** Collect recipients given inline (`age1…`) and in recipients files. Throws MEMSNAP_IDENTITY_INVALID. */
export async function loadRecipients(inline: readonly string[], files: readonly string[]): Promise<string[]> {
  const out: string[] = [];
  for (const r of inline) out.push(...parseRecipients(r));
  for (const f of files) out.push(...parseRecipients(await readKeyFile(f, "recipients file")));
  return [...new Set(out)];
}

/** A passphrase from a file (first line) or from MEMSNAP_PASSPHRASE. */
export async function loadPassphrase(
  file: string | undefined,
  env: NodeJS.ProcessEnv = process.env,
): Promise<string | undefined> {
  if (file) {
    const text = await readKeyFile(file, "passphrase file", true);
    const line = text.split(/\r?\n/)[0] ?? "";
    if (!line) throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `passphrase file ${file} is empty`, { path: file });
    return line;
  }
  return env.MEMSNAP_PASSPHRASE || undefined;
}
