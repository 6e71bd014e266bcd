/** Types for gen-criu.mjs (synthetic CRIU images directories). */
export declare const PAGE_SIZE: 4096;
export declare const MAGIC: Readonly<{
  COMMON: number; SERVICE: number; INVENTORY: number; PSTREE: number; CORE: number; MM: number;
  PAGEMAP: number; FDINFO: number; IDS: number; FILES: number; FS: number; STATS: number;
}>;
export declare const PE_PARENT: 1;
export declare const PE_LAZY: 2;
export declare const PE_PRESENT: 4;
export declare function varint(n: number | bigint): Buffer;
export declare function fVarint(no: number, v: number | bigint): Buffer;
export declare function fBytes(no: number, v: Buffer | string): Buffer;
export declare function frame(msg: Buffer): Buffer;
export declare function imageBytes(typeMagic: number, msgs: Buffer[], opts?: { service?: boolean }): Buffer;
export declare function inventoryBytes(msgs: Buffer[]): Buffer;
export declare function pstreeEntry(e: { pid: number; ppid?: number; pgid?: number; sid?: number; threads?: number[] }): Buffer;
export declare function pagemapHead(pagesId: number): Buffer;
export declare function pagemapEntry(e: { vaddr: number | bigint; nrPages: number; inParent?: boolean; flags?: number }): Buffer;
export interface GenCriuOptions {
  pids?: number[];
  pagesPerProcess?: number;
  parentPages?: number;
  parent?: string;
  randomRatio?: number;
  seed?: number;
  legacyFlags?: boolean;
}
export interface GenCriuResult {
  dir: string;
  pids: number[];
  files: string[];
  bytes: number;
  pagesBytes: number;
}
export declare function genCriuDump(dir: string, options?: GenCriuOptions): GenCriuResult;
