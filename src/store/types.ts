/** A snapshot as a store lists it. */
import type { Manifest } from "../format/manifest.js";

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
