// Example group (manifest fields that become paths). Helpers add cases here and in sibling files.
export default function ({ bundle }) {
  const ok = { name: "memory/ok.md", data: "harmless\n" };
  return [
    {
      file: "snapshot-id-not-ulid.memsnap",
      bytes: bundle([ok], { id: "01JHXST1E0000000000/../../p" }),
      exit: 3, code: "MEMSNAP_MANIFEST_CORRUPT", note: "snapshot_id is not a ULID (it feeds the staging tag)",
    },
  ];
}
