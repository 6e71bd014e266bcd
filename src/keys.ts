/** Loading keys from files: age identities, recipients, passphrases. */
import { readFile } from "node:fs/promises";
import { MemsnapError } from "./errors.js";
import { parseIdentities, parseRecipients } from "./pipeline/age.js";

async function readKeyFile(path: string, what: string): Promise<string> {
  try {
    return await readFile(path, "utf8");
  } catch (e) {
    throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `cannot read ${what} ${path}: ${(e as Error).message}`, {
      path, hint: `check the ${what} path`,
    });
  }
}

/** Read age identity files (as age-keygen writes). Throws MEMSNAP_IDENTITY_INVALID. */
export async function loadIdentities(files: readonly string[]): Promise<string[]> {
  const out: string[] = [];
  for (const f of files) out.push(...parseIdentities(await readKeyFile(f, "identity file")));
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
export async function loadPassphrase(file: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  if (file) {
    const text = await readKeyFile(file, "passphrase file");
    const line = text.split(/\r?\n/)[0] ?? "";
    if (!line) throw new MemsnapError("MEMSNAP_IDENTITY_INVALID", `passphrase file ${file} is empty`, { path: file });
    return line;
  }
  return env.MEMSNAP_PASSPHRASE || undefined;
}
