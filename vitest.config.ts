import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: "forks",
    maxWorkers: 2,
    // A slot of the payload reader's shared memory is overwritten once given back
    // (src/util/slots.ts), so a chunk used after its slot was reused fails a content check.
    env: { MEMSNAP_POISON_SLOTS: "1" },
  },
});
