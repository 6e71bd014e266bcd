// Hostile chains of git bundles (issue 38: an incremental snapshot's git layer is a chain, see
// src/sources/git/chain.ts): a link whose prerequisites the bundles before it do not hold, a
// first bundle that needs commits, a cycle, two links after one bundle, a chain past the bound,
// a listed bundle the layer lacks. Each is refused with MEMSNAP_GIT_CHAIN_INVALID, nothing
// written outside staging.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const ENV = {
  PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: "/nonexistent", GIT_CONFIG_NOSYSTEM: "1", GIT_CONFIG_GLOBAL: "/dev/null",
  GIT_AUTHOR_NAME: "Mallory", GIT_AUTHOR_EMAIL: "mallory@example.com", GIT_COMMITTER_NAME: "Mallory", GIT_COMMITTER_EMAIL: "mallory@example.com",
  GIT_AUTHOR_DATE: "2026-01-01T00:00:00Z", GIT_COMMITTER_DATE: "2026-01-01T00:00:00Z",
};
/** The bound of src/sources/git/chain.ts (MAX_LINKS links after the full bundle). */
const MAX_LINKS = 16;

function git(cwd, args, input) {
  const r = spawnSync("git", ["-c", "core.hooksPath=/dev/null", "-c", "init.defaultBranch=main", ...args], { cwd, env: ENV, input, maxBuffer: 1 << 28 });
  if (r.status !== 0) throw new Error(`git ${args.join(" ")}: ${r.stderr}`);
  return r.stdout.toString("utf8").trim();
}

/**
 * A repository with commits `names` on main (each adding a file); returns the full bundle of the
 * first commit and, per later commit, a link of it alone (prerequisite: the commit before).
 */
function history(names) {
  const dir = mkdtempSync(join(tmpdir(), "memsnap-hostile-gitchain-"));
  try {
    git(dir, ["init", "-q", "r"]);
    const r = join(dir, "r");
    const bundles = [];
    const oids = [];
    for (const [i, n] of names.entries()) {
      spawnSync("sh", ["-c", `printf '%s\\n' "${n}" > "${n}.md"`], { cwd: r });
      git(r, ["add", "-A"]);
      git(r, ["commit", "-q", "-m", n]);
      oids.push(git(r, ["rev-parse", "HEAD"]));
      const out = join(dir, `${i}.bundle`);
      git(r, ["bundle", "create", "-q", out, ...(i === 0 ? ["--all"] : ["main", `^${oids[i - 1]}`])]);
      bundles.push(readFileSync(out));
    }
    return { bundles, oids };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const link = (artifact, bytes, after) => ({ artifact, fingerprint: `git-refs:${artifact}`, bytes: bytes.length, ...(after ? { after } : {}) });
const gitLayer = (head, chain) => ({
  name: "mem", kind: "git", schema_version: 2,
  meta: {
    impl: "git", object_format: "sha1", head: { oid: head, subject: "hostile", author: "Mallory", time: "2026-01-01T00:00:00.000Z" },
    branch: "main", detached: false, bundle_chain: chain,
  },
});

export default function ({ bundle }) {
  const cases = [];
  const ours = history(["a", "b", "c"]);
  const theirs = history(["x", "y"]);
  const refuse = (file, entries, head, chain, note, encrypted = false) => {
    for (const encrypt of encrypted ? [false, true] : [false]) {
      cases.push({
        file: encrypt ? file.replace(/\.memsnap$/, "-encrypted.memsnap") : file,
        bytes: bundle(entries.map(([name, data]) => ({ name: `mem/${name}`, data, kind: "git-bundle" })), { layer: gitLayer(head, chain), encrypt }),
        exit: 3, code: "MEMSNAP_GIT_CHAIN_INVALID", ...(encrypt ? { key: true } : {}), note,
      });
    }
  };
  const [a, b, c] = ours.bundles;
  const head = ours.oids[2];

  // The link needs y's parent x, which repo.bundle (a) does not hold.
  const y = theirs.bundles[1];
  refuse("git-chain-prerequisite-unmet.memsnap", [["repo.bundle", a], ["repo.1.bundle", y]], theirs.oids[1],
    [link("repo.bundle", a), link("repo.1.bundle", y, "repo.bundle")],
    "repo.1.bundle needs a commit its chain's repo.bundle does not hold (a link of another repository)", true);
  // The links in the wrong order: repo.1.bundle (c) needs b, which only repo.2.bundle brings.
  refuse("git-chain-out-of-order.memsnap", [["repo.bundle", a], ["repo.1.bundle", c], ["repo.2.bundle", b]], head,
    [link("repo.bundle", a), link("repo.1.bundle", c, "repo.bundle"), link("repo.2.bundle", b, "repo.1.bundle")],
    "the chain fetches c's link before b's, whose commit it needs");
  // The first bundle is itself a link.
  refuse("git-chain-first-needs-commits.memsnap", [["repo.bundle", b]], ours.oids[1], [link("repo.bundle", b)],
    "repo.bundle, the chain's first bundle, needs a commit");
  // A cycle: repo.1 after repo.2, repo.2 after repo.1; neither reaches repo.bundle.
  refuse("git-chain-cycle.memsnap", [["repo.bundle", a], ["repo.1.bundle", b], ["repo.2.bundle", c]], head,
    [link("repo.bundle", a), link("repo.1.bundle", b, "repo.2.bundle"), link("repo.2.bundle", c, "repo.1.bundle")],
    "repo.1.bundle builds on repo.2.bundle and repo.2.bundle on repo.1.bundle", true);
  // Two links after the same bundle.
  refuse("git-chain-fork.memsnap", [["repo.bundle", a], ["repo.1.bundle", b], ["repo.2.bundle", c]], head,
    [link("repo.bundle", a), link("repo.1.bundle", b, "repo.bundle"), link("repo.2.bundle", c, "repo.bundle")],
    "repo.1.bundle and repo.2.bundle both build on repo.bundle");
  // A link that builds on a bundle the chain does not list.
  refuse("git-chain-after-unknown.memsnap", [["repo.bundle", a], ["repo.1.bundle", b]], ours.oids[1],
    [link("repo.bundle", a), link("repo.1.bundle", b, "repo.7.bundle")], "repo.1.bundle builds on repo.7.bundle, not in the chain");
  // Deeper than the bound: MAX_LINKS + 1 links after the full bundle (empty links: the chain is refused before any is read).
  const deep = [link("repo.bundle", a)];
  for (let i = 1; i <= MAX_LINKS + 1; i++) deep.push(link(`repo.${i}.bundle`, Buffer.alloc(0), i === 1 ? "repo.bundle" : `repo.${i - 1}.bundle`));
  refuse("git-chain-too-deep.memsnap", [["repo.bundle", a]], ours.oids[0], deep, `a chain of ${MAX_LINKS + 2} bundles, over the bound of ${MAX_LINKS + 1}`);
  // The chain lists a link the layer does not hold.
  refuse("git-chain-link-missing.memsnap", [["repo.bundle", a]], ours.oids[1],
    [link("repo.bundle", a), link("repo.1.bundle", b, "repo.bundle")], "the chain lists repo.1.bundle, which the layer lacks");
  return cases;
}
