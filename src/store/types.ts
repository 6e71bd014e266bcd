/** A snapshot as a store lists it. */
import type { Manifest } from "../format/manifest.js";
import type { BundleLayout } from "../format/container.js";

export interface StoredSnapshot {
  id: string;
  path: string;
  tenant: string;
  agent: string;
  created_at: string;
  created_by: string;
  label: string | null;
  size: number;
  encrypted: boolean;
  signed: boolean;
  manifest: Manifest;
}

/** The listing entry of the bundle at `path`, from its layout and parsed manifest. */
export function storedSnapshot(path: string, layout: BundleLayout, m: Manifest): StoredSnapshot {
  return {
    id: m.snapshot_id,
    path,
    tenant: m.tenant,
    agent: m.agent,
    created_at: m.created_at,
    created_by: m.created_by,
    label: m.label,
    size: layout.fileSize,
    encrypted: m.payload.encryption !== null,
    signed: m.signature !== undefined,
    manifest: m,
  };
}
