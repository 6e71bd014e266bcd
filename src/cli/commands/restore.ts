import type { Command } from "commander";
import { loadIdentities, loadPassphrase, restoreToDir } from "../../index.js";
import { fmtBytes, fmtRate, printJson, Progress } from "../output.js";
import { collect, type GlobalOpts, withAbort } from "../common.js";

export function registerRestore(program: Command, global: () => GlobalOpts): void {
  program
    .command("restore <bundle>")
    .description("restore a bundle into a new or empty directory, checking every hash")
    .requiredOption("--to <dir>", "directory to restore into (must not exist, or be empty)")
    .option("-i, --identity <file>", "age identity file (repeatable)", collect, [])
    .option("--passphrase-file <file>", "passphrase on the first line of this file (or set MEMSNAP_PASSPHRASE)")
    .addHelpText("after", `
Examples:
  $ memsnap restore snap.memsnap --to ./restored -i key.txt`)
    .action(async (bundle: string, o: { to: string; identity: string[]; passphraseFile?: string }) => {
      const g = global();
      const identities = await loadIdentities(o.identity);
      const passphrase = await loadPassphrase(o.passphraseFile);
      const progress = new Progress("restore", !g.json && process.stderr.isTTY === true);
      const r = await withAbort((signal) => restoreToDir(bundle, o.to, {
        keys: { identities, passphrases: passphrase ? [passphrase] : [] }, signal,
        onProgress: (b, t) => progress.update(b, t),
      }));
      progress.done();
      if (g.json) {
        printJson({ ok: true, path: r.path, snapshot_id: r.manifest.snapshot_id, artifacts: r.artifacts, bytes: r.bytes, duration_ms: Math.round(r.durationMs) });
      } else {
        process.stdout.write(`restored ${r.manifest.snapshot_id} into ${r.path}\n  ${r.artifacts} artifacts, ${fmtBytes(r.bytes)}, every hash checked, in ${(r.durationMs / 1000).toFixed(2)} s (${fmtRate(r.bytes, r.durationMs)})\n`);
      }
    });
}
