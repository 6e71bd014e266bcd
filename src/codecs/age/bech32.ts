// bech32 (BIP 173), just enough to validate and encode age X25519 keys.

const BECH32_CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l";
const BECH32_GEN = [0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3] as const;

function bech32Polymod(values: readonly number[]): number {
  let chk = 1;
  for (const v of values) {
    const b = chk >>> 25;
    chk = (((chk & 0x1ffffff) << 5) ^ v) >>> 0;
    for (let i = 0; i < 5; i++) {
      if ((b >>> i) & 1) chk = (chk ^ BECH32_GEN[i]!) >>> 0;
    }
  }
  return chk;
}

function bech32HrpExpand(hrp: string): number[] {
  const out: number[] = [];
  for (let i = 0; i < hrp.length; i++) out.push(hrp.charCodeAt(i) >> 5);
  out.push(0);
  for (let i = 0; i < hrp.length; i++) out.push(hrp.charCodeAt(i) & 31);
  return out;
}

function convertBits(data: readonly number[] | Uint8Array, from: number, to: number, pad: boolean): number[] | null {
  let acc = 0;
  let bits = 0;
  const out: number[] = [];
  const maxv = (1 << to) - 1;
  for (const value of data) {
    if (value < 0 || value >> from !== 0) return null;
    acc = (acc << from) | value;
    bits += from;
    while (bits >= to) {
      bits -= to;
      out.push((acc >> bits) & maxv);
    }
    acc &= (1 << bits) - 1;
  }
  if (pad) {
    if (bits > 0) out.push((acc << (to - bits)) & maxv);
  } else if (bits >= from || ((acc << (to - bits)) & maxv) !== 0) {
    return null;
  }
  return out;
}

/** Decode a bech32 string; null when it is not valid bech32 (case, charset, checksum). */
function bech32Decode(s: string): { hrp: string; bytes: Uint8Array } | null {
  if (s !== s.toLowerCase() && s !== s.toUpperCase()) return null;
  const lower = s.toLowerCase();
  const sep = lower.lastIndexOf("1");
  if (sep < 1 || sep + 7 > lower.length) return null;
  const hrp = lower.slice(0, sep);
  for (let i = 0; i < hrp.length; i++) {
    const c = hrp.charCodeAt(i);
    if (c < 33 || c > 126) return null;
  }
  const words: number[] = [];
  for (const ch of lower.slice(sep + 1)) {
    const w = BECH32_CHARSET.indexOf(ch);
    if (w < 0) return null;
    words.push(w);
  }
  if (bech32Polymod([...bech32HrpExpand(hrp), ...words]) !== 1) return null;
  const bytes = convertBits(words.slice(0, -6), 5, 8, false);
  if (bytes === null) return null;
  return { hrp, bytes: Uint8Array.from(bytes) };
}

export function bech32Encode(hrp: string, bytes: Uint8Array): string {
  const words = convertBits(bytes, 8, 5, true) ?? [];
  const mod = bech32Polymod([...bech32HrpExpand(hrp), ...words, 0, 0, 0, 0, 0, 0]) ^ 1;
  let out = hrp + "1";
  for (const w of words) out += BECH32_CHARSET[w];
  for (let i = 0; i < 6; i++) out += BECH32_CHARSET[(mod >>> (5 * (5 - i))) & 31];
  return out;
}

/** The 32 public-key bytes of an `age1…` X25519 recipient, or null when it is not one. */
export function decodeRecipient(s: string): Uint8Array | null {
  if (!/^age1[qpzry9x8gf2tvdw0s3jn54khce6mua7l]{58}$/.test(s)) return null;
  const d = bech32Decode(s);
  if (d === null || d.hrp !== "age" || d.bytes.length !== 32) return null;
  return d.bytes;
}

/** The 32 scalar bytes of an `AGE-SECRET-KEY-1…` X25519 identity, or null when it is not one. */
export function decodeIdentity(s: string): Uint8Array | null {
  if (!/^AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}$/.test(s)) return null;
  const d = bech32Decode(s);
  if (d === null || d.hrp !== "age-secret-key-" || d.bytes.length !== 32) return null;
  return d.bytes;
}
