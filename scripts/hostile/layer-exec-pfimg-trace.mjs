// Hostile layer contents: exec (a bundle naming the code a restore runs), pfimg (blobs that
// decompress past what the layer declares), trace (records that cost unbounded memory to check).
// See scripts/make-hostile.mjs for the shape; test/restore/hostile-layer-contents.test.ts runs the
// custom cases (and checks that no exec case ran anything).
import { agentlogId, parseLossless } from "../../dist/util/canonical-agentlog.js";

/** Where a hostile exec command would leave its mark (the tests check it never appears). */
export const EXEC_PWNED = "/tmp/memsnap-hostile-exec-pwned";
/** The file a plugin run in the bundle's recorded cwd (/tmp) would create there. */
export const EXEC_CWD_MARK = "memsnap-hostile-exec-cwd-pwned";

export default function ({ bundle, sha, compress }) {
  const cases = [];
  const both = (file, make, rest) => {
    cases.push({ file: `${file}.memsnap`, bytes: make(false), ...rest });
    cases.push({ file: `${file}-encrypted.memsnap`, bytes: make(true), key: true, ...rest, note: `${rest.note} (encrypted to the victim's key)` });
  };

  // ---- exec: the plugin command recorded in the bundle --------------------------------------
  const execBundle = (command, encrypt, cwd = "/tmp") => {
    const record = JSON.stringify({ protocol: "memsnap-plugin/1", layer: "kv", command, config: {} }, null, 2) + "\n";
    return bundle([
      { name: "kv/.memsnap-plugin.json", data: record, kind: "json" },
      { name: "kv/data.txt", data: "x\n" },
    ], {
      layer: { name: "kv", kind: "exec", meta: { plugin: { protocol: "memsnap-plugin/1", command, cwd, timeout_ms: 60000 }, entries: 1, bytes: 2 } },
      encrypt,
    });
  };
  const nodeE = ["node", "-e", `require('fs').writeFileSync('${EXEC_PWNED}', '')`];
  both("exec-node-e", (enc) => execBundle(nodeE, enc), {
    exit: 9, code: "MEMSNAP_PLUGIN_UNTRUSTED", env: { MEMSNAP_ALLOW_PLUGINS: "node" },
    note: "exec layer whose command is `node -e <code>`, with node allowed by its first word (docs/PLUGINS.md's old example)",
  });
  cases.push({
    file: "exec-node-e-allow-all.memsnap", bytes: execBundle(nodeE, false),
    exit: 9, code: "MEMSNAP_PLUGIN_UNTRUSTED", env: { MEMSNAP_ALLOW_PLUGINS: "1" },
    note: "exec layer whose command is `node -e <code>`, with MEMSNAP_ALLOW_PLUGINS=1 (which no longer allows any command)",
  });
  const allowedSh = ["/bin/sh", "-c", "true", "sh"];
  both("exec-argv-differs", (enc) => execBundle(["/bin/sh", "-c", `touch ${EXEC_PWNED}`, "sh"], enc), {
    exit: 9, code: "MEMSNAP_PLUGIN_UNTRUSTED", env: { MEMSNAP_ALLOW_PLUGINS: JSON.stringify([allowedSh]) },
    note: "exec layer whose command differs from the one allowed in one argument (same first word)",
  });
  cases.push({
    file: "exec-argv-longer.memsnap", bytes: execBundle([...allowedSh, `touch ${EXEC_PWNED}`], false),
    exit: 9, code: "MEMSNAP_PLUGIN_UNTRUSTED", env: { MEMSNAP_ALLOW_PLUGINS: JSON.stringify([allowedSh]) },
    note: "exec layer whose command is the allowed one plus an argument",
  });
  const cwdCmd = ["/bin/sh", "-c", `touch ${EXEC_CWD_MARK}`, "sh"];
  both("exec-cwd-outside", (enc) => execBundle(cwdCmd, enc, "/tmp"), {
    exit: 0, code: "none", check: "custom", env: { MEMSNAP_ALLOW_PLUGINS: JSON.stringify([cwdCmd]) },
    note: "exec layer recording cwd /tmp for an allowed command that writes into its cwd: restore runs it in the layer directory (exit 0), nothing in /tmp",
  });

  // ---- pfimg: blobs that decompress past the layer's declared raw size ---------------------
  const blobName = (hex) => `pf/blobs/sha256/${hex.slice(0, 2)}/${hex}.zst`;
  const pfBundle = (entries, rawBytes, encrypt) => bundle(entries, {
    layer: { name: "pf", kind: "pfimg", ...(rawBytes === undefined ? {} : { meta: { raw_bytes: rawBytes, blobs: entries.length, stored_bytes: entries.reduce((n, e) => n + e.data.length, 0) } }) },
    encrypt,
  });
  const zeroFrame = compress(Buffer.alloc(128 * 1024 * 1024)); // ~4 KB
  const bomb = Buffer.concat(Array.from({ length: 73 }, () => zeroFrame)); // ~0.3 MB -> ~9 GiB
  both("pfimg-zero-frames", (enc) => pfBundle([{ name: blobName(sha("anything")), data: bomb, kind: "pfimg-blob" }], 1024 * 1024, enc), {
    exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE",
    note: "pfimg blob of 73 concatenated zstd frames of 128 MiB of zeros (0.3 MB, ~9 GiB out), the layer declaring 1 MiB raw",
  });
  const x8k = Buffer.from("x".repeat(8192));
  cases.push({
    file: "pfimg-raw-bytes-lie.memsnap", bytes: pfBundle([{ name: blobName(sha(x8k)), data: compress(x8k), kind: "pfimg-blob" }], 100, false),
    exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE", note: "pfimg blob that matches its name but decompresses to 8192 bytes, the layer declaring 100",
  });
  cases.push({
    file: "pfimg-no-raw-bytes.memsnap", bytes: pfBundle([{ name: blobName(sha(x8k)), data: compress(x8k), kind: "pfimg-blob" }], undefined, false),
    exit: 9, code: "MEMSNAP_UNSAFE_BUNDLE", note: "pfimg layer without meta.raw_bytes: nothing bounds its decompression",
  });
  both("pfimg-name-mismatch", (enc) => pfBundle([{ name: blobName(sha("named")), data: compress(Buffer.from("other content")), kind: "pfimg-blob" }], 1000, enc), {
    exit: 3, code: "MEMSNAP_ARTIFACT_HASH_MISMATCH", note: "pfimg blob whose content does not hash to its name",
  });
  // A frame whose header declares fewer bytes than its blocks hold.
  {
    const content = Buffer.from("y".repeat(4096));
    const frame = Buffer.from(compress(content));
    const fhd = frame[4];
    const fcsFlag = fhd >> 6;
    const single = (fhd >> 5) & 1;
    const at = 5 + (single ? 0 : 1) + [0, 1, 2, 4][fhd & 3];
    const fcsSize = fcsFlag === 0 ? (single ? 1 : 0) : [0, 2, 4, 8][fcsFlag];
    if (fcsSize === 2) frame.writeUInt16LE(300 - 256, at);
    else if (fcsSize === 4) frame.writeUInt32LE(300, at);
    else throw new Error(`unexpected zstd frame header (FCS field of ${fcsSize} bytes)`);
    cases.push({
      file: "pfimg-frame-size-lie.memsnap", bytes: pfBundle([{ name: blobName(sha(content)), data: frame, kind: "pfimg-blob" }], 1 << 20, false),
      exit: 3, code: "MEMSNAP_ARTIFACT_HASH_MISMATCH", note: "pfimg blob whose zstd frame header declares 300 bytes and holds 4096",
    });
  }

  // ---- trace: records whose check would cost unbounded memory, or that break the chain -----
  // Restore writes traces as they are; `verify --deep` checks them: these are custom cases
  // (verify --deep must report them, exit 3, with bounded memory).
  const traceBundle = (text, encrypt) => bundle([{ name: "t/run.agentlog", data: text, kind: "agentlog" }], {
    layer: { name: "t", kind: "trace", meta: { root: "/agent/traces", root_is_file: false, files: 1, skipped: 0, records: 2 } },
    encrypt,
  });
  const line = (kind, payloadText, parent, id) => `{"version":"0.1","id":"${id ?? agentlogId(parseLossless(payloadText))}","kind":"${kind}","ts":1,"parent":${parent === null ? "null" : `"${parent}"`},"payload":${payloadText}}`;
  const fakeId = `sha256:${"0".repeat(64)}`;
  const trace = { exit: 3, code: "MEMSNAP_DEEP_VERIFY_FAILED", check: "custom" };
  both("trace-huge-array", (enc) => traceBundle(`${line("metadata", `{"a":[${"0,".repeat(10_000_000)}0]}`, null, fakeId)}\n`, enc), {
    ...trace, note: "trace record of 20 MB holding a ten-million-element array (verify --deep: over the memory budget)",
  });
  cases.push({
    file: "trace-huge-numbers.memsnap", bytes: traceBundle(`${line("metadata", `{"a":[${"1e4000,".repeat(120_000)}0]}`, null, fakeId)}\n`, false),
    ...trace, note: "trace record of 120,000 numbers like 1e4000 in 0.8 MB (verify --deep: canonical form too long)",
  });
  cases.push({
    file: "trace-deep-nesting.memsnap", bytes: traceBundle(`${line("metadata", `${"[".repeat(100_000)}${"]".repeat(100_000)}`, null, fakeId)}\n`, false),
    ...trace, note: "trace record nested 100,000 levels deep (verify --deep: nesting too deep, no stack overflow)",
  });
  {
    const first = line("metadata", '{"agent":"victim"}', null);
    const orphan = line("chat_request", '{"messages":[]}', `sha256:${sha("nothing")}`);
    both("trace-dangling-parent", (enc) => traceBundle(`${first}\n${orphan}\n`, enc), {
      ...trace, note: "trace record whose parent is no earlier record (verify --deep: broken chain)",
    });
  }
  return cases;
}
