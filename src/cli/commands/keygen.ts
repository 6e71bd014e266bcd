import type { Command } from "commander";
import { open } from "node:fs/promises";
import { generateIdentity, identityFileText, MemsnapError } from "../../index.js";
import { printJson } from "../output.js";
import type { GlobalOpts } from "../common.js";

export function registerKeygen(program: Command, global: () => GlobalOpts): void {
  program
    .command("keygen")
    .description("make an age X25519 identity file (mode 0600) and print its recipient")
    .requiredOption("-o, --out <file>", "where to write the identity (must not exist)")
    .addHelpText("after", `
Examples:
  $ memsnap keygen -o ~/.config/memsnap/key.txt
  $ memsnap snapshot -r "$(memsnap keygen -o key.txt)"`)
    .action(async (o: { out: string }) => {
      const { identity, recipient } = await generateIdentity();
      let fh;
      try {
        fh = await open(o.out, "wx", 0o600);
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        throw new MemsnapError(code === "EEXIST" ? "MEMSNAP_DEST_EXISTS" : "MEMSNAP_DEST_UNWRITABLE", `cannot create ${o.out}: ${(e as Error).message}`, {
          path: o.out, hint: code === "EEXIST" ? "keygen never overwrites a key; choose another path" : "check the directory",
        });
      }
      try {
        await fh.writeFile(identityFileText(identity, recipient, new Date()));
        await fh.sync();
      } finally {
        await fh.close();
      }
      if (global().json) printJson({ ok: true, path: o.out, recipient });
      else {
        process.stderr.write(`memsnap: wrote identity to ${o.out} (keep it secret; without it encrypted bundles cannot be restored)\n`);
        process.stdout.write(`${recipient}\n`);
      }
    });
}
