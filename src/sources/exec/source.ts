/**
 * The `exec` source: external source plugins, for runtimes memsnap does not know (a LangGraph
 * checkpointer, a vector DB). The protocol (memsnap-plugin/1) is documented in docs/PLUGINS.md;
 * its wire types are JSON Schemas in docs/schemas/.
 *
 * Capture (./capture.ts) reads a tar stream of the layer's files from the plugin's stdout;
 * restore (./restore.ts) hands the restored files to the plugin, which turns them into live state.
 *
 * A plugin that cannot start or exits non-zero is MEMSNAP_PLUGIN_FAILED; one that runs past
 * timeout_ms is killed (SIGTERM to its process group, SIGKILL after a grace period) and is
 * MEMSNAP_PLUGIN_TIMEOUT; a malformed tar stream, an entry outside the layer (absolute, `..`)
 * or one that is not a regular file (symlink, hard link, device) is MEMSNAP_PLUGIN_PROTOCOL.
 * Any of them fails the snapshot: no bundle, no temp file.
 *
 * A restore runs only a command MEMSNAP_ALLOW_PLUGINS lists (./allow.ts).
 */
import { isPlainObject } from "../../util/config-check.js";
import type { SourceKind } from "../types.js";
import { captureLayer } from "./capture.js";
import { parseExecConfig, type ExecConfig } from "./config.js";
import { PLUGIN_PROTOCOL, PLUGIN_RECORD, RESPONSE_MAX } from "./protocol.js";
import { materializeLayer } from "./restore.js";

/** External source plugins; see the module comment and docs/PLUGINS.md. */
export const execSource: SourceKind<ExecConfig> = {
  kind: "exec",
  schemaVersion: 1,
  parseConfig: parseExecConfig,
  capture: captureLayer,
  async deepVerify({ entry, bytes }) {
    const rel = entry.path.slice(entry.layer.length + 1);
    const parts: Buffer[] = [];
    let n = 0;
    for await (const c of bytes) {
      if (rel !== PLUGIN_RECORD) continue;
      n += c.length;
      if (n <= RESPONSE_MAX) parts.push(c);
    }
    if (rel !== PLUGIN_RECORD) return null;
    if (n > RESPONSE_MAX) return `${entry.path}: over ${RESPONSE_MAX} bytes`;
    try {
      const doc = JSON.parse(Buffer.concat(parts).toString("utf8")) as Record<string, unknown>;
      if (!isPlainObject(doc) || doc.protocol !== PLUGIN_PROTOCOL || !isPlainObject(doc.config)) {
        return `${entry.path}: not a ${PLUGIN_PROTOCOL} plugin record (protocol and config are required)`;
      }
      return null;
    } catch (e) {
      return `${entry.path}: not valid JSON (${(e as Error).message})`;
    }
  },
  materialize: materializeLayer,
};
