/**
 * Canonical JSON for the manifest seal: object keys sorted by code point, no whitespace,
 * JSON.stringify's escaping for strings and numbers. The manifest holds only strings,
 * safe integers, booleans, null, arrays and objects, so this is unambiguous.
 *
 * Nothing here recurses: a bundle's bytes choose how deeply a parsed value nests (V8's
 * JSON.parse itself is iterative and takes any depth), so a recursive walk would let a
 * hostile document overflow the stack. {@link jsonDepthOver} bounds the depth of JSON text
 * before it is parsed; {@link canonicalJson} and {@link valueDepthOver} walk a value with an
 * explicit stack.
 */

function scalar(value: unknown): string {
  if (typeof value === "number" && !Number.isFinite(value)) throw new TypeError("non-finite number in canonical JSON");
  const s = JSON.stringify(value);
  if (s === undefined) throw new TypeError(`cannot encode ${typeof value} in canonical JSON`);
  return s;
}

type Frame = { a: unknown[]; i: number } | { o: Record<string, unknown>; keys: string[]; i: number };

export function canonicalJson(value: unknown): string {
  const out: string[] = [];
  const stack: Frame[] = [];
  // The containers being written: a value that contains itself is refused, not looped over.
  const open = new Set<object>();
  let v = value;
  for (;;) {
    if (v === null || typeof v !== "object") {
      out.push(scalar(v));
    } else {
      if (open.has(v)) throw new TypeError("cyclic value in canonical JSON");
      open.add(v);
      if (Array.isArray(v)) {
        out.push("[");
        stack.push({ a: v, i: 0 });
      } else {
        const o = v as Record<string, unknown>;
        out.push("{");
        stack.push({
          o,
          keys: Object.keys(o)
            .filter((k) => o[k] !== undefined)
            .sort(),
          i: 0,
        });
      }
    }
    // The next value to write, closing every container that has none left.
    for (;;) {
      const f = stack[stack.length - 1];
      if (f === undefined) return out.join("");
      if ("a" in f) {
        if (f.i < f.a.length) {
          if (f.i > 0) out.push(",");
          v = f.a[f.i++];
          break;
        }
        out.push("]");
        open.delete(f.a);
      } else {
        if (f.i < f.keys.length) {
          const k = f.keys[f.i++]!;
          out.push(f.i > 1 ? `,${JSON.stringify(k)}:` : `${JSON.stringify(k)}:`);
          v = f.o[k];
          break;
        }
        out.push("}");
        open.delete(f.o);
      }
      stack.pop();
    }
  }
}

/**
 * True when the JSON text in `bytes` nests arrays and objects more than `max` levels deep
 * (a top-level object is level 1). One pass over the bytes, no recursion, nothing allocated;
 * brackets inside strings do not count. Meant to run before JSON.parse on untrusted text: for
 * text that is not valid JSON the answer is only an upper bound, and JSON.parse then refuses it.
 */
export function jsonDepthOver(bytes: Uint8Array, max: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < bytes.length; i++) {
    const c = bytes[i]!;
    if (inString) {
      if (c === 0x5c)
        i++; // a backslash: the next byte is escaped (UTF-8 multibyte never holds 0x22 or 0x5c)
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) {
      inString = true;
    } else if (c === 0x7b || c === 0x5b) {
      if (++depth > max) return true;
    } else if (c === 0x7d || c === 0x5d) {
      depth--;
    }
  }
  return false;
}

/** True when a value nests arrays and objects more than `max` levels deep (an explicit stack, no recursion). */
export function valueDepthOver(value: unknown, max: number): boolean {
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length) {
    const [v, d] = stack.pop()!;
    if (v === null || typeof v !== "object") continue;
    if (d + 1 > max) return true;
    for (const x of Array.isArray(v) ? v : Object.values(v as Record<string, unknown>)) {
      if (x !== null && typeof x === "object") stack.push([x, d + 1]);
    }
  }
  return false;
}
