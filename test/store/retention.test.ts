import { describe, expect, it } from "vitest";
import { type StoredSnapshot } from "../../src/index.js";
import { decide as decideRetention } from "../../src/store/prune.js";
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

  describe("protections (issue #39: retention that protects the undo)", () => {
    const now = Date.parse("2026-01-10T00:00:00Z");
    const mk = (t: string, created_by: string, label: string | null, bases: string[] = []): StoredSnapshot => ({
      id: ulid(Date.parse(t)), path: `/x/${t}`, tenant: "t", agent: "a", created_at: new Date(t).toISOString(), created_by, label,
      size: 1, encrypted: false, signed: false,
      manifest: { manifest_version: 2, bases: bases.map((b) => ({ snapshot_id: b, seal: "x" })) } as never,
    });
    const byLabel = (d: ReturnType<typeof decideRetention>, label: string | null, by?: string) =>
      d.find((x) => x.snapshot.label === label && (by === undefined || x.snapshot.created_by === by))!;

    it("a safety snapshot is kept for --keep-safety (default 7 days), then the rules decide", () => {
      const s = [
        mk("2026-01-05T00:00Z", "pre-restore", "auto:pre-restore-x"), mk("2026-01-01T00:00Z", "pre-restore", "auto:pre-restore-y"),
        mk("2026-01-09T00:00Z", "cli", null),
      ];
      const d = decideRetention(s, { last: 1 }, now);
      expect(byLabel(d, "auto:pre-restore-x").keep).toBe(true);
      expect(byLabel(d, "auto:pre-restore-x").reasons[0]).toMatch(/^safety snapshot, kept until 2026-01-12T00:00:00.000Z/);
      expect(byLabel(d, "auto:pre-restore-y").keep).toBe(false); // 9 days old
      expect(byLabel(decideRetention(s, { last: 1, safetyMs: 10 * 86_400_000 }, now), "auto:pre-restore-y").keep).toBe(true);
      expect(byLabel(decideRetention(s, { last: 1, safetyMs: 0 }, now), "auto:pre-restore-x").keep).toBe(false);
    });

    it("a user's label protects until a rule names it; auto: labels and a schedule's own label do not", () => {
      const s = [mk("2026-01-01T00:00Z", "cli", "before-upgrade"), mk("2026-01-02T00:00Z", "schedule", "scheduled"), mk("2026-01-03T00:00Z", "cli", "auto:other"), mk("2026-01-04T00:00Z", "cli", null)];
      const d = decideRetention(s, { last: 1 }, now);
      expect(byLabel(d, "before-upgrade").reasons).toEqual(['labelled "before-upgrade": no rule names it (--keep-label/--prune-label)']);
      expect(byLabel(d, "scheduled").keep).toBe(false);
      expect(byLabel(d, "auto:other").keep).toBe(false);
      expect(byLabel(decideRetention(s, { last: 1, pruneLabels: ["before-*"] }, now), "before-upgrade").keep).toBe(false);
    });

    it("createdBy: a schedule decides only over its own snapshots and expired safety snapshots", () => {
      const s = [
        mk("2026-01-01T00:00Z", "cli", null), mk("2026-01-01T01:00Z", "pre-restore", "auto:pre-restore-z"),
        mk("2026-01-08T00:00Z", "schedule", "scheduled"), mk("2026-01-09T00:00Z", "schedule", "scheduled"),
      ];
      const d = decideRetention(s, { last: 1, createdBy: ["schedule", "pre-restore"] }, now);
      expect(byLabel(d, null, "cli").reasons).toEqual(["made by cli, not decided here (--prune-all)"]);
      expect(byLabel(d, "auto:pre-restore-z").keep).toBe(false);
      expect(d.filter((x) => x.snapshot.created_by === "schedule").map((x) => x.keep)).toEqual([true, false]);
    });

    it("the bases of a protected incremental snapshot are kept", () => {
      const base = mk("2026-01-01T00:00Z", "schedule", "scheduled");
      const inc = mk("2026-01-02T00:00Z", "cli", "mine", [base.id]);
      const d = decideRetention([base, inc, mk("2026-01-03T00:00Z", "schedule", "scheduled")], { last: 1 }, now);
      expect(d.find((x) => x.snapshot.id === base.id)!.reasons).toEqual([`base of ${inc.id}`]);
    });
  });
});
