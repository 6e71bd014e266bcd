/** Unit tests for src/util/glob.ts: `**`, `*`, `?`, `{a,b}`, unanchored names, dir patterns. */
import { describe, expect, it } from "vitest";
import { compileGlobs } from "../../src/util/glob.js";

/** Assert which of `paths` the patterns match. */
function expectMatches(patterns: string[], yes: string[], no: string[]): void {
  const m = compileGlobs(patterns);
  for (const p of yes) expect(m(p), `${JSON.stringify(patterns)} should match ${p}`).toBe(true);
  for (const p of no) expect(m(p), `${JSON.stringify(patterns)} should not match ${p}`).toBe(false);
}

describe("glob", () => {
  it("* matches within one segment only", () => {
    expectMatches(["notes/*.md"], ["notes/a.md", "notes/.md", "notes/x.y.md"], ["notes/a/b.md", "notes/a.mdx", "other/a.md", "x/notes/a.md"]);
  });

  it("? matches exactly one character, never /", () => {
    expectMatches(["a?c"], ["abc", "a.c", "aéc", "x/abc"], ["ac", "abbc", "a/c"]);
  });

  it("** matches any number of segments, including none", () => {
    expectMatches(["**/*.md"], ["a.md", "x/a.md", "x/y/z/a.md"], ["a.txt", "x/a.mdx"]);
    expectMatches(["a/**/b"], ["a/b", "a/x/b", "a/x/y/b", "a/b/c/d" /* below a matching dir */], ["b", "x/a/b", "a/c"]);
    expectMatches(["logs/**"], ["logs/a", "logs/a/b/c"], ["logs2/a", "x/logs/a"]);
    expectMatches(["**"], ["a", "a/b/c"], []);
  });

  it("{a,b} alternatives", () => {
    expectMatches(["*.{md,txt}"], ["a.md", "a.txt", "d/a.md"], ["a.json", "a.mdtxt", "a.{md,txt}"]);
    expectMatches(["{notes,journal}/*.md"], ["notes/a.md", "journal/b.md"], ["other/a.md", "notes,journal/a.md"]);
  });

  it("an unclosed { is a literal", () => {
    expectMatches(["a{b"], ["a{b", "x/a{b"], ["ab"]);
  });

  it("a pattern without / matches the base name at any depth (unanchored), and a directory segment matches everything below it", () => {
    expectMatches(["*.tmp"], ["a.tmp", "x/y/a.tmp", "cache.tmp/inner.md"], ["a.tmp.md"]);
    expectMatches(["node_modules"], ["node_modules", "node_modules/x/y.js", "a/node_modules/b"], ["node_modules2/a", "my_node_modules"]);
  });

  it("a pattern with / is anchored at the root, and matches a directory prefix", () => {
    expectMatches(["build/out"], ["build/out", "build/out/a", "build/out/a/b"], ["x/build/out", "build/output", "build"]);
  });

  it("a trailing / matches directories only (and everything below)", () => {
    expectMatches(["cache/"], ["cache/a", "x/cache/a", "x/cache/a/b"], ["cache", "x/cache", "cachex/a"]);
    expectMatches(["build/out/"], ["build/out/a", "build/out/a/b"], ["build/out", "x/build/out/a"]);
    expectMatches(["**/tmp/"], ["tmp/x", "a/b/tmp/x"], ["a/tmp"]);
  });

  it("a leading / or ./ anchors a pattern at the source root", () => {
    expectMatches(["./MEMORY.md"], ["MEMORY.md"], ["sub/MEMORY.md", "MEMORY.mdx"]);
    expectMatches(["/MEMORY.md"], ["MEMORY.md"], ["sub/MEMORY.md"]);
    expectMatches(["./notes/*.md"], ["notes/a.md"], ["x/notes/a.md"]);
    expectMatches(["/cache/"], ["cache/a"], ["x/cache/a", "cache"]);
  });

  it("regex metacharacters are literal", () => {
    expectMatches(["a+b.(x)|[y]^$.md"], ["a+b.(x)|[y]^$.md"], ["aab.(x)|[y]^$.md", "a+bX(x)|[y]^$.md"]);
    expectMatches(["c\\d"], ["c\\d"], ["cd", "c\\\\d"]);
  });

  it("several patterns: any one matching is enough; none compiled → nothing matches", () => {
    expectMatches(["*.md", "state/**"], ["a.md", "state/x.json"], ["a.json", "x/state/y"]);
    expectMatches([], [], ["a", "a/b"]);
  });

  // BUG (src/util/glob.ts toRegex, the `{` branch): alternatives are only regex-escaped, so a
  // `*` inside braces reaches the RegExp as a bare quantifier ("Nothing to repeat": compileGlobs
  // throws a SyntaxError, which a snapshot reports as MEMSNAP_INTERNAL), and `?` becomes "optional".
  it("wildcards inside {…} work like outside", () => {
    expectMatches(["{*.md,*.txt}"], ["a.md", "b.txt"], ["a.json"]);
  });

  it("? inside {…} is one character", () => {
    expectMatches(["{a?,b}"], ["ax", "b"], ["a", "axx"]);
  });
});
