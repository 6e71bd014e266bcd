import type { Command } from "commander";
import { open } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import { MemsnapError } from "../../errors.js";
import { detectAgent } from "../../init/detect.js";
import { fmtMiB, renderConfig } from "../../init/render.js";
import { printJson } from "../output.js";
import { collect, type GlobalOpts } from "../common.js";

/** How many left-out entries init's text prints (--json has them all). */
const LEFT_OUT_SHOWN = 12;

export function registerInit(program: Command, global: () => GlobalOpts): void {
  program
    .command("init [home]")
    .description(
      "detect an agent's memdir, databases, state, notes, logs, traces and runtime dumps, and write memsnap.json",
    )
    .option("--agent <id>", "agent id (default: the home directory's name)")
    .option("--tenant <id>", "tenant id", "default")
    .option("-r, --recipient <age1…>", "encrypt snapshots to this recipient (repeatable)", collect, [])
    .option("-o, --out <file>", "where to write the config (default: <home>/memsnap.json)")
    .option("--force", "overwrite an existing config")
    .option("--print", "print the config instead of writing it")
    .addHelpText(
      "after",
      `
Examples:
  $ memsnap init ~/agents/scribe
  $ memsnap init . --agent scribe -r age1... && memsnap snapshot`,
    )
    .action(
      async (
        home: string | undefined,
        o: { agent?: string; tenant: string; recipient: string[]; out?: string; force?: boolean; print?: boolean },
      ) => {
        const dir = resolve(home ?? ".");
        const d = await detectAgent(dir);
        const agent =
          o.agent ??
          basename(dir)
            .toLowerCase()
            .replace(/[^a-z0-9_-]+/g, "-")
            .slice(0, 64);
        const rendered = renderConfig(d, { agent, tenant: o.tenant, recipients: o.recipient });
        // A text file (and what --print writes to a terminal) ends with a newline.
        const text = rendered.endsWith("\n") ? rendered : `${rendered}\n`;
        const out = resolve(o.out ?? join(dir, "memsnap.json"));
        if (!o.print) {
          let fh;
          try {
            fh = await open(out, o.force ? "w" : "wx", 0o644);
          } catch (e) {
            const code = (e as NodeJS.ErrnoException).code;
            throw new MemsnapError(
              code === "EEXIST" ? "MEMSNAP_DEST_EXISTS" : "MEMSNAP_DEST_UNWRITABLE",
              `cannot write ${out}: ${(e as Error).message}`,
              {
                path: out,
                hint:
                  code === "EEXIST"
                    ? "pass --force to overwrite it, or --print to see the proposal"
                    : "check the directory",
              },
            );
          }
          try {
            await fh.writeFile(text);
          } finally {
            await fh.close();
          }
        }
        if (global().json) {
          printJson({
            ok: true,
            config: o.print ? null : out,
            agent,
            tenant: o.tenant,
            sources: d.sources,
            coverage: d.coverage,
            left_out: d.left_out,
          });
          return;
        }
        if (o.print) {
          process.stdout.write(text);
          return;
        }
        process.stdout.write(`found in ${dir}:\n`);
        for (const s of d.sources) process.stdout.write(`  ${s.kind.padEnd(7)} ${s.name.padEnd(20)} ${s.path}\n`);
        // Every byte under the home is in a source or listed here (the largest first).
        const { captured_bytes: got, total_bytes: all } = d.coverage;
        const left = d.left_out;
        process.stdout.write(
          `captures ${fmtMiB(got)} of ${fmtMiB(all)}${
            left.length ? `; left out ${fmtMiB(all - got)} in ${left.reduce((a, l) => a + l.files, 0)} file(s):` : ""
          }\n`,
        );
        for (const l of left.slice(0, LEFT_OUT_SHOWN))
          process.stdout.write(
            `  ${fmtMiB(l.bytes).padStart(9)}  ${l.path}${l.files > 1 ? ` (${l.files} files)` : ""}: ${l.reason}\n`,
          );
        if (left.length > LEFT_OUT_SHOWN)
          process.stdout.write(`  … and ${left.length - LEFT_OUT_SHOWN} more (--json lists them all)\n`);
        process.stdout.write(`wrote ${out}\n`);
        if (o.recipient.length === 0) {
          // Without recipients every snapshot is plaintext, and one with a CRIU dump is refused.
          const criu = d.sources.some((s) => s.kind === "criu");
          process.stdout.write(
            `no recipients: snapshots will not be encrypted${
              criu ? " (and a CRIU dump is refused in plaintext)" : ""
            }; to encrypt them:\n` +
              `  memsnap keygen -o ~/.config/memsnap/age.key    # prints age1…\n` +
              `  then put it in "recipients" in ${out}, or run init again with -r age1… --force\n`,
          );
        }
        process.stdout.write(`next: memsnap snapshot -c ${out}\n`);
      },
    );
}
