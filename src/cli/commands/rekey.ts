import type { Command } from "commander";
import { MemsnapError } from "../../errors.js";
import { loadIdentities, loadPassphrase, loadRecipients } from "../../keys.js";
import { loadSigningKey } from "../../sign.js";
import { rekeyBundles, type RekeyResult } from "../../store/rekey.js";
import { bundlePaths } from "../../store/store.js";
import { commandWarning, printJson } from "../output.js";
import { bundleArg, collect, defaultStore, type GlobalOpts } from "../common.js";

interface RekeyCliOpts {
  identity: string[];
  passphraseFile?: string;
  recipient: string[];
  recipientsFile: string[];
  removeRecipient: string[];
  replace?: boolean;
  newPassphraseFile?: string;
  signKey?: string;
  dryRun?: boolean;
  all?: boolean;
  store?: string;
  tenant?: string;
  agent?: string;
}

/** `2 recipient(s): sha256:…, sha256:…` or `passphrase`. */
function describe(r: RekeyResult): string {
  if (r.passphrase) return "passphrase";
  return `${r.recipients.length} recipient(s): ${r.recipients.map((x) => x.fingerprint ?? x.type).join(", ")}`;
}

export function registerRekey(program: Command, global: () => GlobalOpts): void {
  program
    .command("rekey [bundles...]")
    .description(
      "add or remove age recipients, or change the passphrase, of encrypted bundles (the payload is not encrypted " +
        "again)",
    )
    .option("-i, --identity <file>", "an age identity that opens the bundles now (repeatable)", collect, [])
    .option(
      "--passphrase-file <file>",
      "the passphrase that opens the bundles now, on the first line of this file (or set MEMSNAP_PASSPHRASE)",
    )
    .option("-r, --recipient <age1…>", "add this recipient (repeatable)", collect, [])
    .option("-R, --recipients-file <file>", "add the recipients in this file (repeatable)", collect, [])
    .option(
      "--remove-recipient <age1…|fingerprint>",
      "remove this recipient (its age1… key or the sha256:… fingerprint `inspect` shows; repeatable)",
      collect,
      [],
    )
    .option("--replace", "encrypt to exactly the recipients given with -r/-R (every other one is removed)")
    .option(
      "--new-passphrase-file <file>",
      "encrypt to the passphrase on the first line of this file instead (every recipient is removed)",
    )
    .option(
      "--sign-key <file>",
      "sign the new manifest with this Ed25519 key (without it, an existing signature is removed)",
    )
    .option("--dry-run", "check the key and say what would change; write nothing")
    .option("--all", "rekey every encrypted bundle in the store (plaintext ones are skipped)")
    .option("--tenant <id>", "with --all: only this tenant's bundles")
    .option("--agent <id>", "with --all: only this agent's bundles")
    .option(
      "--store <dir>",
      "the store for --all and for snapshot ids (default: $MEMSNAP_STORE, ./memsnap.json's store, " +
        "~/.local/share/memsnap/store)",
    )
    .addHelpText(
      "after",
      `
Only the age header is rewritten: the same file key is wrapped for the new recipients and the
payload is copied byte for byte. The manifest is sealed again (new payload size, hash and
recipient fingerprints). Each bundle is replaced atomically; bundles linked as incremental bases
are rekeyed together, bases first, and a base is refused without the bundles that reference it.
A recipient removed can no longer open the new file, but any copy made before still opens with
the old key: rekeying does not revoke what was already copied.

Examples:
  $ memsnap rekey 01J… -i old.key -r "$(age-keygen -y new.key)" --remove-recipient "$(age-keygen -y old.key)"
  $ memsnap rekey --all -i old.key --replace -R team.recipients --sign-key signing.key
  $ memsnap rekey snap.memsnap --passphrase-file old.pass --new-passphrase-file new.pass`,
    )
    .action(async (refs: string[], o: RekeyCliOpts) => {
      if (o.all && refs.length)
        throw new MemsnapError("MEMSNAP_USAGE", "--all rekeys the whole store: give no bundles with it", {
          hint: "drop --all, or the bundle arguments",
        });
      if (!o.all && (o.tenant || o.agent))
        throw new MemsnapError("MEMSNAP_USAGE", "--tenant and --agent narrow --all", {
          hint: "add --all, or drop them",
        });
      if (!o.all && !refs.length)
        throw new MemsnapError("MEMSNAP_USAGE", "no bundle given", {
          hint: "pass bundle paths or ids, or --all for the whole store",
        });
      const identities = await loadIdentities(o.identity);
      const passphrase = await loadPassphrase(o.passphraseFile);
      if (!identities.length && !passphrase) {
        throw new MemsnapError("MEMSNAP_IDENTITY_REQUIRED", "rekey needs the key that opens the bundles now", {
          hint: "pass -i OLD_KEY (or --passphrase-file OLD) as well as the new recipients",
        });
      }
      const add = await loadRecipients(o.recipient, o.recipientsFile);
      const newPassphrase = o.newPassphraseFile ? await loadPassphrase(o.newPassphraseFile, {}) : undefined;
      const signKey = o.signKey ? await loadSigningKey(o.signKey) : undefined;
      let paths: string[];
      let fromStore = true;
      if (o.all) {
        const store = await defaultStore(o.store);
        paths = await bundlePaths(store, {
          ...(o.tenant ? { tenant: o.tenant } : {}),
          ...(o.agent ? { agent: o.agent } : {}),
        });
        if (!paths.length)
          throw new MemsnapError("MEMSNAP_USAGE", `no bundles in ${store}`, {
            hint: "check --store (or $MEMSNAP_STORE)",
          });
      } else {
        paths = [];
        for (const ref of refs) {
          const path = await bundleArg(ref, () => defaultStore(o.store));
          if (path === ref) fromStore = false; // a path given: its directory need not be a store's
          paths.push(path);
        }
      }
      const out = await rekeyBundles(paths, {
        keys: { identities, passphrases: passphrase ? [passphrase] : [] },
        add,
        remove: o.removeRecipient,
        replace: !!o.replace,
        ...(newPassphrase !== undefined ? { newPassphrase } : {}),
        ...(signKey ? { signKey } : {}),
        dryRun: !!o.dryRun,
        lock: fromStore,
        skipPlaintext: !!o.all,
      });
      for (const r of out.bundles) {
        if (r.signature_dropped)
          commandWarning({
            path: r.path,
            message:
              `${r.snapshot_id}: its signature ${r.dry_run ? "would be" : "was"} removed (it would no longer ` +
              `verify); pass --sign-key to sign it again`,
          });
        if (r.bases_not_rekeyed.length)
          commandWarning({
            path: r.path,
            message:
              `${r.snapshot_id} references ${r.bases_not_rekeyed.join(", ")}, which keep their old keys: ` +
              `restoring it needs a key for them too`,
          });
      }
      if (global().json) {
        printJson({ ok: true, dry_run: !!o.dryRun, bundles: out.bundles, skipped: out.skipped });
        return;
      }
      for (const r of out.bundles) {
        const changes = [
          ...(r.added.length ? [`+${r.added.length}`] : []),
          ...(r.removed.length ? [`-${r.removed.length}`] : []),
          ...(r.bases_updated.length ? [`bases ${r.bases_updated.join(", ")} resealed`] : []),
          ...(r.signed ? ["signed"] : []),
        ];
        process.stdout.write(
          `${r.dry_run ? "would rekey" : "rekeyed"} ${r.snapshot_id}  ${describe(r)}` +
            `${changes.length ? `  (${changes.join("; ")})` : ""}  ${r.path}\n`,
        );
      }
      for (const s of out.skipped) process.stdout.write(`skipped ${s.snapshot_id}  ${s.reason}  ${s.path}\n`);
      process.stdout.write(
        `${out.bundles.length} bundle(s) ${o.dryRun ? "would be rekeyed (dry run: nothing written)" : "rekeyed"}` +
          `${out.skipped.length ? `, ${out.skipped.length} skipped` : ""}\n`,
      );
    });
}
