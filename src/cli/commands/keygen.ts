import type { Command } from "commander";
import { mkdir, open, unlink } from "node:fs/promises";
import { dirname } from "node:path";
import { MemsnapError } from "../../errors.js";
import { generateIdentity, identityFileText } from "../../codecs/age/keys.js";
import { generateSigningKey, keyId } from "../../sign.js";
import { printJson } from "../output.js";
import type { GlobalOpts } from "../common.js";

export function registerKeygen(program: Command, global: () => GlobalOpts): void {
  program
    .command("keygen")
    .description(
      "make an age X25519 identity file (mode 0600) and print its recipient; with --sign, an Ed25519 signing key",
    )
    .requiredOption("-o, --out <file>", "where to write the key (must not exist)")
    .option("--sign", "make an Ed25519 manifest-signing key instead (writes FILE and FILE.pub, prints the public key)")
    .addHelpText(
      "after",
      `
Examples:
  $ memsnap keygen -o ~/.config/memsnap/key.txt
  $ memsnap snapshot -r "$(memsnap keygen -o key.txt)"
  $ memsnap keygen --sign -o signing.key        # prints memsnap-ed25519:…, also in signing.key.pub`,
    )
    .action(async (o: { out: string; sign?: boolean }) => {
      if (o.sign) {
        const { privatePem, publicKey } = generateSigningKey();
        await writeNew(o.out, privatePem, 0o600);
        // Both files or neither: a private key without its .pub (say FILE.pub existed) is removed.
        await writeNew(`${o.out}.pub`, `${publicKey}\n`, 0o644).catch(async (e: unknown) => {
          await unlink(o.out).catch(() => undefined);
          throw e;
        });
        if (global().json) printJson({ ok: true, path: o.out, public_key: publicKey, key_id: keyId(publicKey) });
        else {
          process.stderr.write(`memsnap: wrote signing key to ${o.out} and public key to ${o.out}.pub\n`);
          process.stdout.write(`${publicKey}\n`);
        }
        return;
      }
      const { identity, recipient } = await generateIdentity();
      await writeNew(o.out, identityFileText(identity, recipient, new Date()), 0o600);
      if (global().json) printJson({ ok: true, path: o.out, recipient });
      else {
        process.stderr.write(
          `memsnap: wrote identity to ${o.out} (keep it secret; without it encrypted bundles cannot be restored)\n`,
        );
        process.stdout.write(`${recipient}\n`);
      }
    });
}

/**
 * Create a key file that must not exist yet, durably. Missing parent directories are created
 * private (0700), as `keygen -o ~/.config/memsnap/key.txt` on a new machine needs.
 */
async function writeNew(path: string, text: string, mode: number): Promise<void> {
  let fh;
  try {
    await mkdir(dirname(path), { recursive: true, mode: 0o700 });
    fh = await open(path, "wx", mode);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new MemsnapError(
      code === "EEXIST" ? "MEMSNAP_DEST_EXISTS" : "MEMSNAP_DEST_UNWRITABLE",
      `cannot create ${path}: ${(e as Error).message}`,
      {
        path,
        hint:
          code === "EEXIST"
            ? "keygen never overwrites a key; choose another path"
            : "check that the directory can be created and written",
      },
    );
  }
  try {
    await fh.writeFile(text);
    await fh.sync();
  } finally {
    await fh.close();
  }
}
