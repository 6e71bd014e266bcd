/**
 * Materializing staged layers while the payload is still being extracted.
 *
 * A layer's entries are contiguous in the payload, so once extraction has moved past a layer
 * its staged artifacts are complete and its source can turn them into their live form (a git
 * repository from its bundle, KV dump files from their pages) while later layers are still
 * being decrypted and written. Measured on the bench mix: the git rebuild (a `git` process)
 * and the KV rebuild came after the whole extraction and cost ~1.5-2.5 s of a 6-8 s restore.
 *
 * Layers are materialized one after another, never side by side (two rebuilds at once were
 * measured 5× slower on 2 cores). Everything stays in staging: nothing is swapped or renamed
 * into place until the whole payload has matched the index and every layer is done, and a
 * failure waits for the rebuild in flight before the caller removes staging.
 */
import { EntryTable } from "../read/entry-table.js";
import { mallocTrim } from "../util/directio.js";
import { collectNow } from "../util/gc.js";

export class LayerMaterializer {
  readonly #run: (layer: string, verified: EntryTable) => Promise<void>;
  readonly #started = new Set<string>();
  /** The entries and what their bytes hashed to on extraction: pass as extractPayload's `entries`, which fills it. */
  readonly verified = new EntryTable();
  #chain: Promise<void> = Promise.resolve();
  #failed: { error: unknown } | null = null;

  /** `run` materializes one layer; it is never called twice for a layer nor for two at once. */
  constructor(run: (layer: string, verified: EntryTable) => Promise<void>) {
    this.#run = run;
  }

  /** Queue a layer whose entries are all extracted (pass as extractPayload's `onLayerDone`). */
  readonly layerDone = (layer: string): void => {
    if (this.#started.has(layer)) return;
    this.#started.add(layer);
    this.#chain = this.#chain.then(async () => {
      if (this.#failed) return;
      try {
        // What extraction left behind goes before the rebuild, which may start processes of
        // its own (git): the sum of both is what the machine holds.
        collectNow("major");
        mallocTrim();
        await this.#run(layer, this.verified);
      } catch (error) {
        this.#failed = { error };
      }
    });
  };

  /** Wait for the rebuild in flight, if any, without throwing (before removing staging). */
  settle(): Promise<void> {
    return this.#chain;
  }

  /** Materialize the layers not yet started (those without entries), wait, and throw the first failure. */
  async finish(layers: Iterable<string>): Promise<void> {
    for (const l of layers) this.layerDone(l);
    await this.#chain;
    if (this.#failed) throw this.#failed.error;
  }
}
