import type { Command } from "commander";
import { readLayout } from "../../format/container.js";
import { basesOf, checkSeal, parseManifest, referencedIn } from "../../format/manifest.js";
import { MANIFEST_INDEX_MAX } from "../../snapshot/snapshot.js";
import { fmtBytes, printJson, redactionLine } from "../output.js";
import { bundleArg, defaultStore, type GlobalOpts } from "../common.js";

export function registerInspect(program: Command, global: () => GlobalOpts): void {
  program
    .command("inspect <bundle>")
    .description("show a bundle's manifest without the key and without reading the payload")
    .option(
      "--store <dir>",
      "where to look up a snapshot id (default: $MEMSNAP_STORE, ./memsnap.json's store, ~/.local/share/memsnap/store)",
    )
    .addHelpText(
      "after",
      `
BUNDLE is a path, or a snapshot id (or unique prefix of one) from \`memsnap list\`.

Examples:
  $ memsnap inspect 01JD0….memsnap
  $ memsnap inspect 01JD0K7Q          # an id prefix, looked up in the store
  $ memsnap inspect 01JD0….memsnap --json | jq .layers`,
    )
    .action(async (ref: string, o: { store?: string }) => {
      const bundle = await bundleArg(ref, () => defaultStore(o.store));
      const layout = await readLayout(bundle);
      const m = parseManifest(layout.manifestBytes);
      const sealOk = checkSeal(m);
      if (global().json) {
        printJson({ ok: true, path: layout.path, bundle_bytes: layout.fileSize, seal_ok: sealOk, manifest: m });
        return;
      }
      const enc = m.payload.encryption
        ? `age (${m.payload.encryption.recipients
            .map((r) => (r.type === "scrypt" ? "passphrase" : `x25519 ${r.fingerprint}`))
            .join(", ")})`
        : "none";
      const lines = [
        `bundle     ${layout.path} (${fmtBytes(layout.fileSize)})`,
        `snapshot   ${m.snapshot_id}`,
        `created    ${m.created_at} by ${m.created_by} on ${m.host} (${m.tool.name} ${m.tool.version})`,
        `agent      ${m.tenant}/${m.agent}`,
        `label      ${m.label ?? "-"}`,
        `parent     ${m.parent ?? "-"}`,
        ...(basesOf(m).length
          ? [
              `bases      ${basesOf(m)
                .map((b) => b.snapshot_id)
                .join(", ")} (incremental: needs them beside it to restore)`,
            ]
          : []),
        `format     ${m.format} manifest v${m.manifest_version}, seal ${sealOk ? "ok" : "MISMATCH"}`,
        `payload    ${m.payload.member}: ${fmtBytes(m.payload.stored_size)} stored, ${fmtBytes(m.payload.bytes)} ` +
          `in ${m.payload.artifacts} artifacts, zstd ${m.payload.compression.level}`,
        `encryption ${enc}`,
        `signature  ${
          m.signature
            ? `${String((m.signature as { key_id?: unknown }).key_id)} (verify --trust to check it)`
            : "unsigned"
        }`,
        `layers`,
        ...m.layers.map(
          (l) =>
            `  ${l.name.padEnd(16)} ${l.kind.padEnd(8)} v${l.schema_version}  ${String(l.artifacts).padStart(7)} ` +
            `artifacts  ${fmtBytes(l.bytes)}` +
            (referencedIn(m, l) ? `  (${referencedIn(m, l)} referenced in bases)` : ""),
        ),
        `redaction  ${redactionLine(m.redaction)}`,
      ];
      if (m.index === undefined) {
        lines.push(
          m.payload.encryption
            ? "index      encrypted (in the payload; the manifest keeps only its hash)"
            : `index      in the payload only (${m.payload.artifacts} artifacts; the manifest lists at ` +
                `most ${MANIFEST_INDEX_MAX})`,
        );
      }
      process.stdout.write(lines.join("\n") + "\n");
    });
}
