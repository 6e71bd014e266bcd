// memsnap as a library: snapshot an agent, verify the bundle without the key, restore it elsewhere.
// Run after `npm run build`: node examples/library.mjs [WORKDIR]. It imports the package by its name.
import { mkdir, mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  generateIdentity, listSnapshots, parseConfig, restoreToDir, snapshot, verifyBundle,
} from "memsnap";

const work = process.argv[2] ?? await mkdtemp(join(tmpdir(), "memsnap-example-"));
const home = join(work, "agent");
await mkdir(join(home, "notes"), { recursive: true });
await writeFile(join(home, "notes", "today.md"), "# Today\nThe user prefers short answers.\n");
await writeFile(join(home, "cursor.json"), JSON.stringify({ offset: 42 }));

// The config a memsnap.json would hold; paths are relative to the agent's home.
const config = parseConfig({
  tenant: "acme", agent: "helper",
  sources: [
    { name: "notes", kind: "files", path: "notes" },
    { name: "cursor", kind: "state", path: "cursor.json" },
  ],
}, null, home);

const { identity, recipient } = await generateIdentity();
const store = join(work, "store");
const snap = await snapshot({ config, store, recipients: [recipient], label: "example" });

// Keyless: the plaintext manifest's seal, the payload's size and SHA-256.
const keyless = await verifyBundle(snap.path);
// With the key: every artifact against the sealed index.
const keyed = await verifyBundle(snap.path, { keys: { identities: [identity] } });

const listed = await listSnapshots(store, { tenant: "acme", agent: "helper" });
const out = join(work, "restored");
const restored = await restoreToDir(snap.path, out, { keys: { identities: [identity] } });
// Without a layout option, layers land where the config puts them (`notes/` here).
const notesDir = restored.placed.find((p) => p.layer === "notes").path;
const notes = await readFile(join(out, notesDir, "today.md"), "utf8");

console.log(JSON.stringify({
  id: snap.id, encrypted: snap.manifest.payload.encryption !== null, layers: snap.manifest.layers.map((l) => l.name),
  keyless_ok: keyless.ok, keyed_ok: keyed.ok, listed: listed.map((s) => s.id), restored_artifacts: restored.artifacts,
  notes_restored: notes === "# Today\nThe user prefers short answers.\n",
}));
