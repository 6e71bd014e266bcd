import type { Command } from "commander";
import { existsSync } from "node:fs";
import { catArtifact, loadIndex, openSnapshot, pathFilter } from "../../browse/index.js";
import { loadConfig, bundleArg, collect, defaultStore, type GlobalOpts, withAbort } from "../common.js";
import { isMemsnapError, MemsnapError } from "../../errors.js";
import type { IndexEntry, Manifest } from "../../format/manifest.js";
import { loadIdentities, loadPassphrase } from "../../keys.js";
import { scryptMaxLogN } from "../../codecs/age/scrypt.js";
import type { Keys } from "../../read/read-payload.js";
import { resolveStore } from "../../store/paths.js";
import { listSnapshots } from "../../store/store.js";
import { fmtBytes, printJson } from "../output.js";

interface KeyOpts {
  identity: string[];
  passphraseFile?: string;
  scryptMaxLogN?: string;
}

async function keysFrom(o: KeyOpts): Promise<Keys> {
  const passphrase = await loadPassphrase(o.passphraseFile);
  return {
    identities: await loadIdentities(o.identity),
    passphrases: passphrase ? [passphrase] : [],
    ...(o.scryptMaxLogN !== undefined ? { scryptMaxLogN: scryptMaxLogN(o.scryptMaxLogN) } : {}),
  };
}

function keyOptions(c: Command): Command {
  return c
    .option("-i, --identity <file>", "age identity file, for encrypted snapshots (repeatable)", collect, [])
    .option("--passphrase-file <file>", "passphrase on the first line of this file (or set MEMSNAP_PASSPHRASE)")
    .option("--scrypt-max-log-n <n>", "open a passphrase bundle whose scrypt work factor is up to 2^n (default 18)");
}

const octal = (mode: number): string => (mode & 0o7777).toString(8).padStart(4, "0");

/** An index entry as `ls --json` and `find --json` give it. */
function entryJson(m: Manifest, e: IndexEntry): Record<string, unknown> {
  return {
    path: e.path,
    layer: e.layer,
    kind: e.kind,
    size: e.size,
    mode: octal(e.mode),
    mtime: e.mtime,
    sha256: e.sha256,
    ...(m.manifest_version >= 2 && e.ref ? { base: e.ref } : {}),
  };
}

function table(rows: string[][], head: string[]): string {
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  return (
    [head, ...rows]
      .map((r) =>
        r
          .map((c, i) => (i === r.length - 1 ? c : c.padEnd(w[i]!)))
          .join("  ")
          .trimEnd(),
      )
      .join("\n") + "\n"
  );
}

/**
 * A name from a bundle as a terminal line shows it: control characters escaped (a hostile name cannot move the cursor).
 */
const shown = (s: string): string =>
  s.replace(/[\x00-\x1f\x7f-\x9f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);

const when = (iso: string): string => iso.replace(/\.\d+Z$/, "Z");

export function registerBrowse(program: Command, global: () => GlobalOpts): void {
  keyOptions(
    program.command("ls <bundle> [path...]").description("list a snapshot's files with their size, mode and layer"),
  )
    .option(
      "--store <dir>",
      "store to look the snapshot id up in (default: $MEMSNAP_STORE, ./memsnap.json's store, " +
        "~/.local/share/memsnap/store)",
    )
    .addHelpText(
      "after",
      `
BUNDLE is a path or a snapshot id (or unique prefix). PATH filters: a path as listed
(<layer>/<path>), a directory prefix of one, or a glob (\`*\`, \`**\`, \`?\`, \`{a,b}\`; a pattern
without \`/\` matches a name at any depth).

A plaintext bundle's file list is in its manifest: nothing else is read. An encrypted bundle
(or one of more files than its manifest lists) keeps the list at the end of its payload: ls
then needs the key and reads the whole payload (decrypting, decompressing and hashing every
file, writing none).

Files of an incremental snapshot whose bytes are in a base bundle are listed too (BASE column).

Examples:
  $ memsnap ls 01JD0K7Q
  $ memsnap ls 01JD0K7Q 'memory/**/*.md' -i key.txt
  $ memsnap ls agent.memsnap memory/ --json`,
    )
    .action(async (ref: string, paths: string[], o: KeyOpts & { store?: string }) => {
      const bundle = await bundleArg(ref, () => defaultStore(o.store));
      const s = await openSnapshot(bundle);
      const index = await withAbort(async (signal) => loadIndex(s, await keysFrom(o), signal));
      const match = pathFilter(paths);
      const hits = index.filter((e) => match(e.path));
      if (global().json) {
        process.stdout.write(JSON.stringify(hits.map((e) => entryJson(s.manifest, e))) + "\n");
        return;
      }
      if (!hits.length) {
        process.stderr.write(`memsnap: no file of ${s.manifest.snapshot_id} matches ${paths.join(" ")}\n`);
        return;
      }
      const incremental = hits.some((e) => e.ref);
      const rows = hits.map((e) => [
        octal(e.mode),
        String(e.size),
        when(e.mtime),
        shown(e.kind),
        shown(e.path),
        ...(incremental ? [e.ref ?? "-"] : []),
      ]);
      process.stdout.write(
        table(
          rows.map((r) => (incremental ? [...r.slice(0, 4), r[5]!, r[4]!] : r)),
          ["MODE", "SIZE", "MTIME", "KIND", ...(incremental ? ["BASE"] : []), "PATH"],
        ),
      );
    });

  keyOptions(
    program
      .command("cat <bundle> <path>")
      .description("write one file of a snapshot to stdout, its SHA-256 and size checked first"),
  )
    .option("--store <dir>", "store to look the snapshot id up in")
    .addHelpText(
      "after",
      `
PATH is a file as 'memsnap ls' lists it (<layer>/<path>). The file's bytes are kept in a
private temporary file (mode 0600, in $TMPDIR, removed after) until their size and SHA-256 are
checked, and only then written to stdout: a file that does not match writes nothing (exit 3,
MEMSNAP_ARTIFACT_HASH_MISMATCH). A plaintext bundle's payload is read only up to the file (its
hash is in the sealed manifest); an encrypted bundle's index is at the end of its payload, which
is then read whole (decrypted with the key) and checked. A file an incremental snapshot
references is read from its base bundle beside it.

Examples:
  $ memsnap cat 01JD0K7Q memory/notes/note3.md
  $ memsnap cat agent.memsnap state/session.json -i key.txt | jq .`,
    )
    .action(async (ref: string, path: string, o: KeyOpts & { store?: string }) => {
      if (global().json)
        throw new MemsnapError("MEMSNAP_USAGE", "cat writes the file's bytes; --json does not apply", {
          hint: "drop --json",
        });
      const bundle = await bundleArg(ref, () => defaultStore(o.store));
      const s = await openSnapshot(bundle);
      const keys = await keysFrom(o);
      await withAbort((signal) => catArtifact(s, path, keys, process.stdout, signal));
    });

  keyOptions(program.command("find <glob>").description("find files by path across an agent's snapshots"))
    .option(
      "--store <dir>",
      "store directory (default: $MEMSNAP_STORE, the config's store, ~/.local/share/memsnap/store)",
    )
    .option(
      "-c, --config <file>",
      "take the store, tenant and agent from this memsnap.json (default: ./memsnap.json if present)",
    )
    .option("--tenant <id>", "only this tenant")
    .option("--agent <id>", "only this agent")
    .addHelpText(
      "after",
      `
GLOB matches paths as 'memsnap ls' lists them (<layer>/<path>; a pattern without \`/\` matches a
name at any depth). Plaintext snapshots are searched through their manifests; encrypted ones need
-i/--passphrase-file (and are read whole); those no given key opens are skipped with a warning.

Examples:
  $ memsnap find note3.md
  $ memsnap find 'memory/**/*.md' -c agent/memsnap.json -i key.txt --json`,
    )
    .action(async (glob: string, o: KeyOpts & { store?: string; config?: string; tenant?: string; agent?: string }) => {
      const cfgPath = o.config ?? (existsSync("memsnap.json") ? "memsnap.json" : undefined);
      const config = cfgPath ? await loadConfig(cfgPath) : null;
      const tenant = o.tenant ?? config?.tenant;
      const agent = o.agent ?? config?.agent;
      const store = resolveStore(o.store, config?.store);
      const snaps = await listSnapshots(store, { ...(tenant ? { tenant } : {}), ...(agent ? { agent } : {}) }, (p) =>
        process.stderr.write(`memsnap: warning: unreadable bundle ${p}\n`),
      );
      const keys = await keysFrom(o);
      const match = pathFilter([glob]);
      const found: { snapshot_id: string; created_at: string; m: Manifest; e: IndexEntry }[] = [];
      const skipped: { snapshot_id: string; reason: string }[] = [];
      await withAbort(async (signal) => {
        for (const snap of snaps) {
          let index: IndexEntry[];
          try {
            index = await loadIndex(await openSnapshot(snap.path), keys, signal);
          } catch (e) {
            if (!isMemsnapError(e) || signal.aborted) throw e;
            skipped.push({ snapshot_id: snap.id, reason: `${e.code}: ${e.message}` });
            process.stderr.write(`memsnap: warning: skipped ${snap.id}: ${e.message}\n`);
            continue;
          }
          for (const e of index)
            if (match(e.path)) found.push({ snapshot_id: snap.id, created_at: snap.created_at, m: snap.manifest, e });
        }
      });
      if (global().json) {
        printJson({
          ok: true,
          store,
          matches: found.map((f) => ({ snapshot_id: f.snapshot_id, created_at: f.created_at, ...entryJson(f.m, f.e) })),
          skipped,
        });
        return;
      }
      if (!found.length) {
        process.stderr.write(
          `memsnap: no file matches ${glob} in ${snaps.length - skipped.length} snapshot(s) of ${store}\n`,
        );
        return;
      }
      process.stdout.write(
        table(
          found.map((f) => [
            f.snapshot_id,
            when(f.created_at),
            fmtBytes(f.e.size),
            f.e.sha256.slice(0, 12),
            shown(f.e.path),
          ]),
          ["SNAPSHOT", "CREATED", "SIZE", "SHA256", "PATH"],
        ),
      );
    });
}
