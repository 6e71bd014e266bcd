import { describe, expect, it } from "vitest";
import { decideRetention, type StoredSnapshot } from "../../src/index.js";
import { ulid } from "../../src/util/ulid.js";

function snaps(times: string[], labels: (string | null)[] = []): StoredSnapshot[] {
  return times.map((t, i) => ({
    id: ulid(Date.parse(t)), path: `/x/${i}`, tenant: "t", agent: "a", created_at: new Date(t).toISOString(), created_by: "cli",
    label: labels[i] ?? null, size: 1, encrypted: false, signed: false, manifest: {} as never,
  }));
}

const kept = (d: ReturnType<typeof decideRetention>) => d.filter((x) => x.keep).map((x) => x.snapshot.created_at.slice(0, 16));

describe("retention", () => {
  const hourly = snaps(Array.from({ length: 72 }, (_, i) => new Date(Date.UTC(2026, 0, 1, 0, 30) + i * 3_600_000).toISOString()));

  it("keep-last keeps the n newest, and the newest is always kept", () => {
    const d = decideRetention(hourly, { last: 3 });
    expect(kept(d)).toEqual(["2026-01-03T23:30", "2026-01-03T22:30", "2026-01-03T21:30"]);
    expect(d[0]!.reasons).toEqual(["newest", "last 1/3"]);
  });

  it("keep-daily keeps the newest snapshot of each of the last n days", () => {
    expect(kept(decideRetention(hourly, { daily: 2 }))).toEqual(["2026-01-03T23:30", "2026-01-02T23:30"]);
  });

  it("keep-hourly/weekly/monthly/yearly bucket by period", () => {
    expect(kept(decideRetention(hourly, { hourly: 5 }))).toHaveLength(5);
    const s = snaps(["2024-06-01T00:00Z", "2025-01-15T00:00Z", "2025-03-02T00:00Z", "2025-03-20T00:00Z", "2026-02-01T00:00Z"]);
    expect(kept(decideRetention(s, { yearly: 2 }))).toEqual(["2026-02-01T00:00", "2025-03-20T00:00"]);
    expect(kept(decideRetention(s, { monthly: 3 }))).toEqual(["2026-02-01T00:00", "2025-03-20T00:00", "2025-01-15T00:00"]);
    expect(kept(decideRetention(s, { weekly: 10 }))).toHaveLength(5);
  });

  it("keep-within keeps everything within the duration of the newest", () => {
    expect(kept(decideRetention(hourly, { within: 2 * 3_600_000 }))).toEqual(["2026-01-03T23:30", "2026-01-03T22:30", "2026-01-03T21:30"]);
  });

  it("keep-label keeps matching labels and says why", () => {
    const s = snaps(["2026-01-01T00:00Z", "2026-01-02T00:00Z", "2026-01-03T00:00Z"], ["release-1", null, null]);
    const d = decideRetention(s, { last: 1, labels: ["release-*"] });
    expect(kept(d)).toEqual(["2026-01-03T00:00", "2026-01-01T00:00"]);
    expect(d.find((x) => x.snapshot.label === "release-1")!.reasons).toEqual(["label release-1"]);
  });

  it("an empty policy is a usage error, not 'delete everything'", () => {
    expect(() => decideRetention(hourly, {})).toThrow(expect.objectContaining({ code: "MEMSNAP_USAGE" }));
  });
});
