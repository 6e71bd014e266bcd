import type { Command } from "commander";
import { ERROR_CODES, isMemsnapError, MemsnapError } from "../../errors.js";
import { loadIdentities, loadPassphrase } from "../../keys.js";
import { loadTrusted } from "../../sign.js";
import { bundlePaths } from "../../store/store.js";
import { verifyBundle, reportError as verifyError, type VerifyReport } from "../../verify.js";
import { printJson, Progress } from "../output.js";
import { bundleArg, collect, defaultStore, type GlobalOpts, withAbort } from "../common.js";

interface VerifyOpts {
  identity: string[];
  passphraseFile?: string;
  deep?: boolean;
  trust: string[];
  store?: string;
  all?: boolean;
}

/** `3 check(s) not run: pass --identity to run them; unsigned` */
function skippedNote(r: VerifyReport): string {
  const skipped = r.checks.filter((c) => c.status === "skipped");
  const needKey = skipped.filter((c) => c.detail?.startsWith("needs the key"));
  const others = skipped.filter((c) => !needKey.includes(c) && c.name !== "signature");
  return [
    ...(needKey.length ? [`${needKey.length} check(s) not run: pass --identity to run them`] : []),
    ...(others.length ? [`not run: ${others.map((c) => c.name).join(", ")}`] : []),
    ...(skipped.some((c) => c.name === "signature") ? ["unsigned"] : []),
  ].join("; ");
}

/** A failure's message without the bundle path it may start with (the line names the path already). */
const without = (path: string, message: string): string =>
  message.startsWith(`${path}: `) ? message.slice(path.length + 2) : message;

const reportJson = (r: VerifyReport) => ({
  ok: r.ok,
  path: r.path,
  snapshot_id: r.manifest?.snapshot_id ?? null,
  encrypted: r.encrypted,
  checks: r.checks,
  findings: r.findings,
});

/**
 * One bundle of several: a failure that is not a finding (a bug, whatever the bundle's bytes
 * made of it) is reported as that bundle's MEMSNAP_INTERNAL finding, and the next one runs.
 * An interrupt still stops the whole run.
 */
async function verifyOne(path: string, opts: Parameters<typeof verifyBundle>[1]): Promise<VerifyReport> {
  try {
    return await verifyBundle(path, opts);
  } catch (e) {
    if (isMemsnapError(e) || opts?.signal?.aborted) throw e;
    return {
      ok: false,
      path,
      manifest: null,
      encrypted: null,
      checks: [{ name: "verify", status: "failed", detail: String((e as Error)?.message ?? e) }],
      findings: [
        { code: "MEMSNAP_INTERNAL", message: `verify failed unexpectedly: ${String((e as Error)?.message ?? e)}` },
      ],
    };
  }
}

export function registerVerify(program: Command, global: () => GlobalOpts): void {
  program
    .command("verify [bundles...]")
    .description("check bundles; without a key checks what can be checked and says what was not")
    .option("-i, --identity <file>", "age identity file to decrypt with (repeatable)", collect, [])
    .option("--passphrase-file <file>", "passphrase on the first line of this file (or set MEMSNAP_PASSPHRASE)")
    .option(
      "--trust <pubkey|file>",
      "require a valid signature by this public key (memsnap-ed25519:… or a file of them; repeatable)",
      collect,
      [],
    )
    .option("--deep", "also run each layer's own checks (e.g. JSON parse of state files)")
    .option("--all", "verify every bundle in the store (every tenant and agent), damaged ones included")
    .option(
      "--store <dir>",
      "the store for --all and for snapshot ids (default: $MEMSNAP_STORE, ./memsnap.json's store, " +
        "~/.local/share/memsnap/store)",
    )
    .addHelpText(
      "after",
      `
A BUNDLE is a path, or a snapshot id (or unique prefix of one) from \`memsnap list\`. With one
bundle every check is listed; with several (or --all) one line per bundle, then a summary, and
the command fails if any bundle fails.

Examples:
  $ memsnap verify snap.memsnap                      # keyless: structure, seal, payload SHA-256
  $ memsnap verify snap.memsnap -i key.txt --deep    # every artifact, plus layer checks
  $ memsnap verify snap.memsnap --trust signing.key.pub   # who made it, offline, no decryption key
  $ memsnap verify --all --store /backups/memsnap    # every bundle of a copied store, no key needed`,
    )
    .action(async (refs: string[], o: VerifyOpts) => {
      if (o.all && refs.length)
        throw new MemsnapError("MEMSNAP_USAGE", "--all verifies the whole store: give no bundles with it", {
          hint: "drop --all, or the bundle arguments",
        });
      if (!o.all && !refs.length)
        throw new MemsnapError("MEMSNAP_USAGE", "no bundle given", {
          hint: "pass a bundle path or id, or --all for the whole store",
        });
      const trusted = await loadTrusted(o.trust);
      const identities = await loadIdentities(o.identity);
      const passphrase = await loadPassphrase(o.passphraseFile);
      const opts = { keys: { identities, passphrases: passphrase ? [passphrase] : [] }, deep: !!o.deep, trusted };
      if (!o.all && refs.length === 1) {
        const bundle = await bundleArg(refs[0]!, () => defaultStore(o.store));
        const progress = new Progress("verify", !global().json && process.stderr.isTTY === true);
        const r = await withAbort((signal) =>
          verifyBundle(bundle, { ...opts, signal, onProgress: (b, t) => progress.update(b, t) }),
        );
        progress.done();
        if (global().json) {
          printJson(reportJson(r));
        } else {
          for (const c of r.checks) {
            const mark = c.status === "passed" ? "ok     " : c.status === "failed" ? "FAILED " : "skipped";
            process.stdout.write(`${mark} ${c.name}${c.detail ? `: ${c.detail}` : ""}\n`);
          }
          const note = skippedNote(r);
          if (r.ok) process.stdout.write(`verified ${r.manifest?.snapshot_id}${note ? ` (${note})` : ""}\n`);
        }
        if (!r.ok) {
          const err = verifyError(r);
          (err as { alreadyPrinted?: boolean }).alreadyPrinted = global().json;
          throw err;
        }
        return;
      }

      // Several bundles: each is verified on its own; a failure is reported and the next one runs.
      let paths: string[];
      if (o.all) {
        const store = await defaultStore(o.store);
        paths = await bundlePaths(store);
        if (!paths.length)
          throw new MemsnapError("MEMSNAP_USAGE", `no bundles in ${store}`, {
            hint: "check --store (or $MEMSNAP_STORE)",
          });
      } else {
        paths = [];
        // A missing file among several is that one bundle's failure (reported, and the rest verified).
        for (const ref of refs)
          paths.push(
            await bundleArg(ref, () => defaultStore(o.store)).catch((e: unknown) => {
              if (isMemsnapError(e, "MEMSNAP_SOURCE_MISSING")) return ref;
              throw e;
            }),
          );
      }
      const results: VerifyReport[] = [];
      const failures: MemsnapError[] = [];
      await withAbort(async (signal) => {
        for (const path of paths) {
          signal.throwIfAborted();
          const r = await verifyOne(path, { ...opts, signal });
          results.push(r);
          if (!r.ok) failures.push(verifyError(r));
          if (global().json) continue;
          if (r.ok) {
            const note = skippedNote(r);
            process.stdout.write(`ok      ${r.manifest?.snapshot_id}  ${path}${note ? `  (${note})` : ""}\n`);
          } else {
            const e = failures[failures.length - 1]!;
            process.stdout.write(`FAILED  ${path}: ${without(path, e.message)} [${e.code}]\n`);
          }
        }
      });
      if (global().json) printJson({ ok: failures.length === 0, bundles: results.map(reportJson) });
      else
        process.stdout.write(
          `${results.length} bundle(s): ${results.length - failures.length} verified, ${failures.length} failed\n`,
        );
      if (failures.length) {
        const first = failures[0]!;
        const classes = new Set(failures.map((f) => ERROR_CODES[f.code].class));
        const code = classes.size === 1 ? first.code : "MEMSNAP_VERIFY_FAILED";
        const at = paths[results.findIndex((r) => !r.ok)]!;
        const err = new MemsnapError(
          code,
          `${failures.length} of ${results.length} bundles failed verification, ` +
            `first: ${at}: ${without(at, first.message)}`,
          {
            hint: first.hint ?? "do not restore a bundle that fails verification",
          },
        );
        (err as { alreadyPrinted?: boolean }).alreadyPrinted = global().json;
        throw err;
      }
    });
}
