/**
 * Glob patterns for include/exclude lists, matched against POSIX relative paths.
 * `**` matches any number of path segments, `*` any characters but `/`, `?` one character
 * but `/`, `{a,b}` alternatives. A pattern with no `/` matches the base name at any depth
 * (like .gitignore); a leading `/` or `./` anchors it at the source root; a trailing `/`
 * matches a directory and everything below it.
 */
export type Matcher = (relPath: string) => boolean;

function escape(ch: string): string {
  return /[.+^$()|[\]\\]/.test(ch) ? `\\${ch}` : ch;
}

function toRegex(glob: string): RegExp {
  return new RegExp(`^${toSource(glob)}$`);
}

function toSource(glob: string): string {
  let src = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob[i]!;
    if (c === "*") {
      if (glob[i + 1] === "*") {
        const slash = glob[i + 2] === "/";
        src += slash ? "(?:.*/)?" : ".*";
        i += slash ? 2 : 1;
      } else {
        src += "[^/]*";
      }
    } else if (c === "?") {
      src += "[^/]";
    } else if (c === "{") {
      const close = glob.indexOf("}", i);
      if (close < 0) {
        src += "\\{";
        continue;
      }
      src += `(?:${glob
        .slice(i + 1, close)
        .split(",")
        .map(toSource)
        .join("|")})`;
      i = close;
    } else {
      src += escape(c);
    }
  }
  return src;
}

/** Compile a list of globs into one matcher (true when any pattern matches). */
export function compileGlobs(patterns: readonly string[]): Matcher {
  const tests = patterns.map((raw) => {
    const rooted = raw.startsWith("/") || raw.startsWith("./");
    let p = raw.startsWith("./") ? raw.slice(2) : raw.startsWith("/") ? raw.slice(1) : raw;
    const dirOnly = p.endsWith("/");
    if (dirOnly) p = p.slice(0, -1);
    const anchored = rooted || p.includes("/");
    const re = toRegex(p);
    return (rel: string): boolean => {
      const parts = rel.split("/");
      if (!anchored) {
        // Match any segment (a directory segment matches everything below it).
        return parts.some((seg, i) => (!dirOnly || i < parts.length - 1) && re.test(seg));
      }
      if (re.test(rel) && !dirOnly) return true;
      for (let i = 1; i < parts.length; i++) if (re.test(parts.slice(0, i).join("/"))) return true;
      return false;
    };
  });
  return (rel) => tests.some((t) => t(rel));
}
