#!/usr/bin/env node
// Regenerate docs/errors.md from src/errors.ts and src/cli/exit-codes.ts (run after `npm run build`).
import { writeFileSync } from "node:fs";
import { ERROR_CODES } from "../dist/errors.js";
import { EXIT_CODES, EXIT_CODE_MEANINGS } from "../dist/cli/exit-codes.js";

let s = "# memsnap errors and exit codes\n\nEvery error memsnap raises carries one of these stable codes. Codes are API: they are added, never renamed. The CLI prints `memsnap: error: <message> [CODE]` and `memsnap: hint: <what to do>` on stderr, or with `--json` one object `{ok: false, exit_code, error: {code, message, hint}}` on stdout. This table is checked against `src/errors.ts` by `test/docs.test.ts`; regenerate it with `npm run build && node scripts/gen-errors-doc.mjs`.\n\n## Exit codes\n\n| exit | meaning |\n|---|---|\n";
for (const [c, m] of Object.entries(EXIT_CODE_MEANINGS)) s += `| ${c} | ${m} |\n`;
s += "\n## Error codes\n\n| code | exit | meaning |\n|---|---|---|\n";
for (const [c, v] of Object.entries(ERROR_CODES)) s += `| \`${c}\` | ${EXIT_CODES[v.class]} | ${v.meaning} |\n`;
writeFileSync(new URL("../docs/errors.md", import.meta.url), s);
