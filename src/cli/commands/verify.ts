import type { Command } from "commander";
import { loadIdentities, loadPassphrase, loadTrusted, verifyBundle, verifyError } from "../../index.js";
import { printJson, Progress } from "../output.js";
import { bundleArg, collect, defaultStore, type GlobalOpts, withAbort } from "../common.js";

export function registerVerify(program: Command, global: () => GlobalOpts): void {
  program
    .command("verify <bundle>")
    .description("check a bundle; without a key checks what can be checked and says what was not")
    .option("-i, --identity <file>", "age identity file to decrypt with (repeatable)", collect, [])
    .option("--passphrase-file <file>", "passphrase on the first line of this file (or set MEMSNAP_PASSPHRASE)")
    .option("--trust <pubkey|file>", "require a valid signature by this public key (memsnap-ed25519:… or a file of them; repeatable)", collect, [])
    .option("--deep", "also run each layer's own checks (e.g. JSON parse of state files)")
    .option("--store <dir>", "where to look up a snapshot id (default: $MEMSNAP_STORE, ./memsnap.json's store, ~/.local/share/memsnap/store)")
    .addHelpText("after", `
BUNDLE is a path, or a snapshot id (or unique prefix of one) from \`memsnap list\`.

Examples:
  $ memsnap verify snap.memsnap                      # keyless: structure, seal, payload SHA-256
  $ memsnap verify snap.memsnap -i key.txt --deep    # every artifact, plus layer checks
  $ memsnap verify snap.memsnap --trust signing.key.pub   # who made it, offline, no decryption key`)
    .action(async (ref: string, o: { identity: string[]; passphraseFile?: string; deep?: boolean; trust: string[]; store?: string }) => {
      const bundle = await bundleArg(ref, () => defaultStore(o.store));
      const trusted = await loadTrusted(o.trust);
      const identities = await loadIdentities(o.identity);
      const passphrase = await loadPassphrase(o.passphraseFile);
      const progress = new Progress("verify", !global().json && process.stderr.isTTY === true);
      const r = await withAbort((signal) => verifyBundle(bundle, {
        keys: { identities, passphrases: passphrase ? [passphrase] : [] }, deep: !!o.deep, trusted, signal,
        onProgress: (b, t) => progress.update(b, t),
      }));
      progress.done();
      if (global().json) {
        printJson({ ok: r.ok, path: r.path, snapshot_id: r.manifest?.snapshot_id ?? null, encrypted: r.encrypted, checks: r.checks, findings: r.findings });
      } else {
        for (const c of r.checks) {
          const mark = c.status === "passed" ? "ok     " : c.status === "failed" ? "FAILED " : "skipped";
          process.stdout.write(`${mark} ${c.name}${c.detail ? `: ${c.detail}` : ""}\n`);
        }
        const skipped = r.checks.filter((c) => c.status === "skipped");
        const needKey = skipped.filter((c) => c.detail?.startsWith("needs the key"));
        const others = skipped.filter((c) => !needKey.includes(c) && c.name !== "signature");
        const note = [
          ...(needKey.length ? [`${needKey.length} check(s) not run: pass --identity to run them`] : []),
          ...(others.length ? [`not run: ${others.map((c) => c.name).join(", ")}`] : []),
          ...(skipped.some((c) => c.name === "signature") ? ["unsigned"] : []),
        ].join("; ");
        if (r.ok) process.stdout.write(`verified ${r.manifest?.snapshot_id}${note ? ` (${note})` : ""}\n`);
      }
      if (!r.ok) {
        const err = verifyError(r);
        (err as { alreadyPrinted?: boolean }).alreadyPrinted = global().json;
        throw err;
      }
    });
}
