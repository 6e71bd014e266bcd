// In-place restore (issue #35 items 2 and 3): bundles whose content is harmless for `restore --to`
// but that, restored in place, would write what the configured source does not own, replace the
// config the restore runs with, plant files in memsnap's control dir, or write through a live
// symlink. All "custom": test/restore/in-place-hostile.test.ts restores each in place into a
// victim agent (tenant default, agent victim) and checks the answer and the live tree.
export default function ({ bundle }) {
  const ok = { name: "memory/ok.md", data: "harmless\n" };
  const cases = [];
  const both = (file, entries, opts, c) => {
    for (const encrypt of [false, true]) {
      cases.push({
        ...c, file: encrypt ? file.replace(/\.memsnap$/, "-enc.memsnap") : file,
        bytes: bundle(entries, { ...opts, encrypt }), check: "custom", ...(encrypt ? { key: true } : {}),
      });
    }
  };
  // A files source with include ["**/*.md"]: an executable script is not its to write.
  both("in-place-not-owned-exec.memsnap", [ok, { name: "memory/run.sh", data: "#!/bin/sh\necho pwned > /tmp/memsnap-pwned\n", indexMode: 0o755 }], {}, {
    exit: 9, code: "MEMSNAP_UNSAFE_PATH", note: "in place, files source include **/*.md: run.sh (0755) is not the source's; refused before anything live changes",
  });
  // A state source at "." captures memsnap.json: the bundle's copy carries a hook that runs a command on the next snapshot.
  const evilConfig = JSON.stringify({
    agent: "victim", redaction: { enabled: false },
    hooks: { on_created: ["/bin/sh", "-c", "echo pwned > /tmp/memsnap-pwned-hook"] },
    sources: [{ kind: "state", name: "state", path: "." }],
  });
  both("in-place-replace-config.memsnap", [{ name: "state/memsnap.json", data: evilConfig }, { name: "state/cursor.json", data: '{"c":"bundle"}' }],
    { layer: { name: "state", kind: "state" } }, {
      exit: 0, code: null, note: "in place, state source at '.': the bundle's memsnap.json (with a hook) is never written; the live config stays byte-identical, cursor.json is restored",
    });
  // The same layer without memsnap.json: the config is owned by the state globs, yet never removed.
  cases.push({
    file: "in-place-config-absent.memsnap", check: "custom", exit: 0, code: null,
    bytes: bundle([{ name: "state/cursor.json", data: '{"c":"bundle"}' }], { layer: { name: "state", kind: "state" } }),
    note: "in place, state source at '.': a bundle without memsnap.json does not remove the live config",
  });
  // A state source at "." with include ["**/*.json"]: the bundle plants a restore journal in .memsnap.
  const journal = JSON.stringify({
    version: 1, op: "restore", snapshot_id: "x", bundle: "x", pid: 1, host: "x", started_at: "x", phase: "staging",
    staging: ["/tmp/memsnap-hostile-victim-home"], backups: [], swaps: [],
  });
  both("in-place-plant-journal.memsnap", [{ name: "state/.memsnap/journal.json", data: journal }, { name: "state/cursor.json", data: '{"c":"bundle"}' }],
    { layer: { name: "state", kind: "state" } }, {
      exit: 9, code: "MEMSNAP_UNSAFE_PATH", note: "in place, state source at '.' with **/*.json: a file under .memsnap (a planted journal) is owned by no layer; refused",
    });
  // A trace source (default include *.agentlog): a shell script is not a trace.
  cases.push({
    file: "in-place-trace-not-owned.memsnap", check: "custom", exit: 9, code: "MEMSNAP_UNSAFE_PATH",
    bytes: bundle([{ name: "traces/run.sh", data: "#!/bin/sh\n", indexMode: 0o755 }], { layer: { name: "traces", kind: "trace" } }),
    note: "in place, trace source: a file outside *.agentlog is refused",
  });
  // Live memory/sub is a symlink to a directory outside: the bundle's memory/sub/x.md would be written through it.
  both("in-place-through-live-symlink.memsnap", [ok, { name: "memory/sub/x.md", data: "through the link\n" }], {}, {
    exit: 9, code: "MEMSNAP_UNSAFE_PATH", note: "in place over a live memory/sub -> elsewhere symlink: refused, elsewhere byte-identical",
  });
  // Live memory/notes.md is a directory (holding a file the source does not own): the bundle has a file there.
  cases.push({
    file: "in-place-file-over-live-dir.memsnap", check: "custom", exit: 9, code: "MEMSNAP_UNSAFE_PATH",
    bytes: bundle([ok, { name: "memory/notes.md", data: "a file\n" }]),
    note: "in place over a live directory memory/notes.md: refused (its files would be moved away with it)",
  });
  // Live memory/box is a file: the bundle has memory/box/x.md.
  cases.push({
    file: "in-place-dir-over-live-file.memsnap", check: "custom", exit: 9, code: "MEMSNAP_UNSAFE_PATH",
    bytes: bundle([ok, { name: "memory/box/x.md", data: "under a file\n" }]),
    note: "in place where a live file memory/box stands in the bundle's directory: refused before anything changes",
  });
  return cases;
}
