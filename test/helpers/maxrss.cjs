// Preloaded with `node --require` into a child process under test: at exit it writes the
// process's peak resident set size (getrusage ru_maxrss, KiB) to stderr, worker threads included.
process.on("exit", () => {
  try {
    require("node:fs").writeSync(2, `\nmemsnap-test-maxrss-kib=${process.resourceUsage().maxRSS}\n`);
  } catch {
    /* stderr closed */
  }
});
