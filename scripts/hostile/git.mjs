// Hostile git layers (issue 35, item 7 and the git layer's artifacts): a repo.bundle built with
// the real git binary (in a temp dir) whose history holds symlinks to /etc, ../../x and /tmp,
// .git and .. tree entries, bad ref names; worktree/ files at odd paths; a worktree-deleted.json
// with ../, absolute and .git paths. Each is refused, or made harmless (the "custom" cases:
// restore succeeds and creates no link; test/restore/hostile-git.test.ts runs them, --to and in place).
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const ENV = {
  PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: "/nonexistent", GIT_CONFIG_NOSYSTEM: "1", GIT_CONFIG_GLOBAL: "/dev/null",
  GIT_AUTHOR_NAME: "Mallory", GIT_AUTHOR_EMAIL: "mallory@example.com", GIT_COMMITTER_NAME: "Mallory", GIT_COMMITTER_EMAIL: "mallory@example.com",
  GIT_AUTHOR_DATE: "2026-01-01T00:00:00Z", GIT_COMMITTER_DATE: "2026-01-01T00:00:00Z",
};

function git(cwd, args, input) {
  const r = spawnSync("git", ["-c", "core.hooksPath=/dev/null", "-c", "init.defaultBranch=main", ...args], { cwd, env: ENV, input, maxBuffer: 1 << 28 });
  if (r.status !== 0) throw new Error(`git ${args.join(" ")}: ${r.stderr}`);
  return r.stdout.toString("utf8").trim();
}

/**
 * A repository whose one commit on main has `tree` (entries `{path, link?, data?}`: nested
 * trees built with mktree, so names git itself would never write, `.git` or `..`, can be in
 * it), its bundle, and the HEAD oid. `editHeader` may rewrite the bundle's header lines.
 */
function repoBundle(tree, { editHeader } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "memsnap-hostile-git-"));
  try {
    git(dir, ["init", "-q", "--bare", "r.git"]);
    const r = join(dir, "r.git");
    const mk = (entries) => {
      const lines = [];
      const sub = new Map();
      for (const e of entries) {
        const [first, ...rest] = e.path.split("/");
        if (rest.length) {
          if (!sub.has(first)) sub.set(first, []);
          sub.get(first).push({ ...e, path: rest.join("/") });
          continue;
        }
        const oid = git(r, ["hash-object", "-w", "--stdin"], e.link ?? e.data ?? "");
        lines.push(`${e.link !== undefined ? "120000" : "100644"} blob ${oid}\t${first}`);
      }
      for (const [name, es] of sub) lines.push(`040000 tree ${mk(es)}\t${name}`);
      return git(r, ["mktree"], lines.join("\n") + "\n");
    };
    const treeOid = mk(tree);
    const commit = git(r, ["commit-tree", treeOid, "-m", "hostile"]);
    git(r, ["update-ref", "refs/heads/main", commit]);
    git(r, ["bundle", "create", "-q", join(dir, "repo.bundle"), "--all"]);
    let bytes = spawnSync("cat", [join(dir, "repo.bundle")], { maxBuffer: 1 << 28 }).stdout;
    if (editHeader) {
      const end = bytes.indexOf("\n\n") + 2;
      bytes = Buffer.concat([Buffer.from(editHeader(bytes.subarray(0, end).toString("utf8")), "utf8"), bytes.subarray(end)]);
    }
    return { bytes, head: commit };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const gitLayer = (head, meta = {}) => ({
  name: "mem", kind: "git", meta: { impl: "git", object_format: "sha1", head: { oid: head, subject: "hostile", author: "Mallory", time: "2026-01-01T00:00:00.000Z" }, branch: "main", detached: false, ...meta },
});
const doc = (o) => JSON.stringify({ format: "memsnap-git-worktree", version: 1, deleted: [], executable: [], ...o });

export default function ({ bundle }) {
  const cases = [];
  const plainTree = [{ path: "MEMORY.md", data: "# memory\n" }];
  const plain = repoBundle(plainTree);
  const withRepo = (repo, extra = []) => [{ name: "mem/repo.bundle", data: repo.bytes, kind: "git-bundle" }, ...extra];
  const refuse = (file, repo, extra, exit, code, note, opts = {}) => {
    for (const encrypt of [false, true]) {
      if (encrypt && !opts.encrypted) continue;
      cases.push({
        file: encrypt ? file.replace(/\.memsnap$/, "-encrypted.memsnap") : file,
        bytes: bundle(withRepo(repo, extra), { layer: gitLayer(repo.head, opts.meta), encrypt }),
        exit, code, ...(encrypt ? { key: true } : {}), ...(opts.env ? { env: opts.env } : {}), note,
      });
    }
  };

  // Made harmless: history with symlinks restores with no link created (plain files holding the target).
  const links = repoBundle([...plainTree, { path: "etc", link: "/etc" }, { path: "up", link: "../../x" }, { path: "deep/tmp", link: "/tmp" }]);
  for (const encrypt of [false, true]) {
    cases.push({
      file: encrypt ? "git-history-symlinks-encrypted.memsnap" : "git-history-symlinks.memsnap",
      bytes: bundle(withRepo(links), { layer: gitLayer(links.head), encrypt }), exit: 0, code: "", check: "custom", ...(encrypt ? { key: true } : {}),
      note: "HEAD's tree holds symlinks to /etc, ../../x and /tmp: restored as plain files holding the target, core.symlinks=false, no link created",
    });
  }
  // A deletion through a tracked link to a victim directory: the link is a plain file, so nothing outside is deleted.
  const victim = repoBundle([...plainTree, { path: "v", link: "/tmp/memsnap-hostile-git-victim" }]);
  cases.push({
    file: "git-deleted-through-link.memsnap",
    bytes: bundle(withRepo(victim, [{ name: "mem/worktree-deleted.json", data: doc({ deleted: ["v/victim.txt"] }) }]), { layer: gitLayer(victim.head) }),
    exit: 0, code: "", check: "custom", note: "worktree-deleted.json deletes v/victim.txt where v is a tracked link to /tmp/memsnap-hostile-git-victim: v is a plain file, nothing outside is deleted",
  });

  // A file under a tracked link: the link is a plain file, the work-tree file conflicts with it.
  const dlink = repoBundle([...plainTree, { path: "d", link: "/tmp" }]);
  refuse("git-worktree-file-under-link.memsnap", dlink, [{ name: "mem/worktree/d/memsnap-hostile-git-evil", data: "pwned\n" }],
    9, "MEMSNAP_UNSAFE_PATH", "worktree/d/… where d is a tracked symlink to /tmp", { encrypted: true });
  refuse("git-worktree-file-under-link-iso.memsnap", dlink, [{ name: "mem/worktree/d/memsnap-hostile-git-evil", data: "pwned\n" }],
    9, "MEMSNAP_UNSAFE_PATH", "the same with isomorphic-git", { env: { MEMSNAP_GIT_IMPL: "isomorphic" } });

  // worktree/ files at paths git would never check out.
  const odd = [
    ["git-worktree-dotgit-hook.memsnap", "mem/worktree/.git/hooks/post-checkout", "a work-tree file in .git/hooks"],
    ["git-worktree-dotgit-config.memsnap", "mem/worktree/.git/config", "a work-tree file that is .git/config"],
    ["git-worktree-dotgit-upper.memsnap", "mem/worktree/sub/.GIT/config", ".GIT (case-folded .git) in a subdirectory"],
    ["git-worktree-git-tilde.memsnap", "mem/worktree/git~1/config", "git~1 (the 8.3 name of .git)"],
    ["git-worktree-dotgit-trailing-dot.memsnap", "mem/worktree/.git./config", ".git. (folded to .git on Windows)"],
    ["git-worktree-backslash.memsnap", "mem/worktree/a\\..\\..\\evil", "a backslash path"],
  ];
  for (const [file, name, note] of odd) refuse(file, plain, [{ name, data: "pwned\n" }], 9, "MEMSNAP_UNSAFE_PATH", note, { encrypted: file === "git-worktree-dotgit-hook.memsnap" });
  refuse("git-stray-dotgit-config.memsnap", plain, [{ name: "mem/.git/config", data: "[core]\n\thooksPath = /tmp\n" }], 9, "MEMSNAP_UNSAFE_PATH",
    "a .git/config at the layer's top, not an artifact of a git layer", { encrypted: true });

  // worktree-deleted.json naming paths outside the work tree or inside .git.
  const docs = [
    ["git-deleted-dotdot.memsnap", { deleted: ["../../outside"] }, "deleted: ../../outside"],
    ["git-deleted-absolute.memsnap", { deleted: ["/etc/passwd"] }, "deleted: an absolute path"],
    ["git-deleted-dotgit-config.memsnap", { deleted: [".git/config"] }, "deleted: .git/config"],
    ["git-deleted-dotgit-hooks.memsnap", { deleted: ["sub/../.git/hooks/pre-commit"] }, "deleted: a .. then .git path"],
    ["git-executable-dotdot.memsnap", { executable: ["../run.sh"] }, "executable: ../run.sh"],
  ];
  for (const [file, d, note] of docs) {
    refuse(file, plain, [{ name: "mem/worktree-deleted.json", data: doc(d) }], 9, "MEMSNAP_UNSAFE_PATH", note, { encrypted: file === "git-deleted-dotdot.memsnap" });
  }

  // Trees git itself refuses to check out: restore stops (the bundle is damaged), nothing written.
  const dotgitTree = repoBundle([...plainTree, { path: ".git/hooks/post-checkout", data: "#!/bin/sh\ntouch /tmp/memsnap-hostile-git-pwned\n" }]);
  refuse("git-tree-dotgit-hook.memsnap", dotgitTree, [], 3, "MEMSNAP_DEEP_VERIFY_FAILED", "HEAD's tree holds .git/hooks/post-checkout", { encrypted: true });
  refuse("git-tree-dotgit-hook-iso.memsnap", dotgitTree, [], 3, "MEMSNAP_DEEP_VERIFY_FAILED", "the same with isomorphic-git", { env: { MEMSNAP_GIT_IMPL: "isomorphic" } });
  const dotdotTree = repoBundle([...plainTree, { path: "../memsnap-hostile-git-dotdot", data: "pwned\n" }]);
  refuse("git-tree-dotdot.memsnap", dotdotTree, [], 3, "MEMSNAP_DEEP_VERIFY_FAILED", "HEAD's tree holds an entry named ..");

  // Ref names and HEAD that would leave refs/.
  refuse("git-branch-dotdot.memsnap", plain, [], 3, "MEMSNAP_MANIFEST_CORRUPT", "meta.branch is ../../config", { meta: { branch: "../../config" } });
  refuse("git-branch-refs-dotdot.memsnap", plain, [], 3, "MEMSNAP_MANIFEST_CORRUPT", "meta.branch is refs/../config", { meta: { branch: "refs/../config" } });
  const badRef = repoBundle(plainTree, { editHeader: (h) => h.replace(" refs/heads/main\n", " refs/heads/../../config\n") });
  refuse("git-bundle-ref-dotdot.memsnap", badRef, [], 3, "MEMSNAP_DEEP_VERIFY_FAILED", "the bundle lists a ref refs/heads/../../config");
  return cases;
}
