/** The memsnap command-line program. It uses only the library's public entry. */
import { Command, CommanderError } from "commander";
import { ERROR_CODES, MemsnapError } from "../errors.js";
import { onKeyFileWarning } from "../keys.js";
import { TOOL_VERSION } from "../version.js";
import { registerBrowse } from "./commands/browse.js";
import { registerInit } from "./commands/init.js";
import { registerInspect } from "./commands/inspect.js";
import { registerKeygen } from "./commands/keygen.js";
import { registerRekey } from "./commands/rekey.js";
import { registerRestore } from "./commands/restore.js";
import { registerSnapshot } from "./commands/snapshot.js";
import { registerSchedule } from "./commands/schedule.js";
import { registerStore } from "./commands/store.js";
import { registerVerify } from "./commands/verify.js";
import type { GlobalOpts } from "./common.js";
import { EXIT_CODE_MEANINGS, EXIT_CODES } from "./exit-codes.js";
import { commandWarning, reportError, resetCommandWarnings } from "./output.js";

let pipesGuarded = false;
let keyWarningsHeard = false;

/**
 * A reader that goes away (`memsnap list | head -1`, `memsnap --help | true`) closes our
 * stdout or stderr: node then emits EPIPE as an 'error' event, which, unhandled, kills the
 * process with a stack trace wherever it is, in the middle of a snapshot or a restore too,
 * before their cleanup runs. What nobody reads is dropped instead and the command finishes
 * (its exit code is unchanged). Any other error on those streams still throws.
 */
function guardClosedPipes(): void {
  if (pipesGuarded) return;
  pipesGuarded = true;
  for (const stream of [process.stdout, process.stderr]) {
    stream.on("error", (e: NodeJS.ErrnoException) => {
      if (e.code !== "EPIPE") throw e;
    });
  }
}

/** Run the CLI with `argv` (without node and script); resolves with the exit code. */
export async function main(argv: string[]): Promise<number> {
  guardClosedPipes();
  resetCommandWarnings();
  if (!keyWarningsHeard) {
    keyWarningsHeard = true;
    onKeyFileWarning(commandWarning); // an identity, passphrase or signing key file open to others
  }
  const program = new Command();
  const global = (): GlobalOpts => ({ json: !!program.opts().json });
  program
    .name("memsnap")
    .description("atomic, verifiable snapshots of an AI agent's memory")
    .version(TOOL_VERSION)
    .option("--json", "print one JSON object on stdout (errors too)")
    .exitOverride()
    .showHelpAfterError(false)
    .configureOutput({
      writeErr: (s) => {
        if (!s.startsWith("error:")) process.stderr.write(s);
      },
    })
    .addHelpText(
      "after",
      `
Examples:
  $ memsnap keygen -o key.txt
  $ memsnap snapshot -c memsnap.json -r "$(grep -o 'age1.*' key.txt)"
  $ memsnap verify ~/.local/share/memsnap/store/default/agent/01J….memsnap
  $ memsnap restore 01J….memsnap --to ./restored -i key.txt

Exit codes:
${Object.entries(EXIT_CODE_MEANINGS)
  .map(([c, m]) => `  ${c.padStart(2)}  ${m}`)
  .join("\n")}`,
    );
  registerInit(program, global);
  registerSnapshot(program, global);
  registerInspect(program, global);
  registerVerify(program, global);
  registerRestore(program, global);
  registerBrowse(program, global);
  registerKeygen(program, global);
  registerStore(program, global);
  registerRekey(program, global);
  registerSchedule(program, global);
  const json = argv.includes("--json");
  try {
    await program.parseAsync(argv, { from: "user" });
    return 0;
  } catch (e) {
    if (e instanceof CommanderError) {
      if (e.exitCode === 0 || e.code === "commander.helpDisplayed" || e.code === "commander.version") return 0;
      // No command: commander has printed the help on stderr; a usage error without a second message.
      if (e.code === "commander.help" && !json) return EXIT_CODES[ERROR_CODES.MEMSNAP_USAGE.class];
      if (e.code === "commander.help")
        return reportError(new MemsnapError("MEMSNAP_USAGE", "no command given", { hint: "see 'memsnap --help'" }), {
          json,
        });
      return reportError(
        new MemsnapError("MEMSNAP_USAGE", e.message.replace(/^error: /, ""), { hint: "see 'memsnap --help'" }),
        { json },
      );
    }
    // verify --json has already printed its report as the one JSON object; only set the exit code.
    if ((e as { alreadyPrinted?: boolean }).alreadyPrinted && e instanceof MemsnapError)
      return EXIT_CODES[ERROR_CODES[e.code].class];
    return reportError(e, { json });
  }
}
