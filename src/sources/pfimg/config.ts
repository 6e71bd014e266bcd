/** The pfimg source's config. */
import {
  configInvalid,
  optBool,
  optString,
  optStringArray,
  rejectUnknownKeys,
  reqString,
} from "../../util/config-check.js";
import { digestHex } from "./format.js";

export interface PfimgConfig {
  kind: "pfimg";
  name: string;
  store?: string;
  /** Image ids (`sha256:…`) or `all` (the default). */
  images?: string[];
  with_parents?: boolean;
}

export function parsePfimgConfig(raw: Record<string, unknown>, where: string): PfimgConfig {
  rejectUnknownKeys(raw, ["kind", "name", "store", "images", "with_parents"], where);
  const images = optStringArray(raw, "images", where);
  if (images) {
    if (images.length === 0) throw configInvalid(where, '"images" must list image ids (sha256:…) or "all"');
    for (const i of images) {
      if (i !== "all" && !digestHex(i)) {
        throw configInvalid(where, `"images" entries must be "all" or sha256:<64 hex>, got ${JSON.stringify(i)}`);
      }
    }
    if (images.includes("all") && images.length > 1) {
      throw configInvalid(where, '"images": "all" cannot be combined with image ids');
    }
  }
  const store = optString(raw, "store", where);
  const wp = optBool(raw, "with_parents", where);
  return {
    kind: "pfimg",
    name: reqString(raw, "name", where),
    ...(store !== undefined ? { store } : {}),
    ...(images !== undefined ? { images } : {}),
    ...(wp !== undefined ? { with_parents: wp } : {}),
  };
}
