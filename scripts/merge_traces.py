#!/usr/bin/env python3
"""Merges the per-rank traces of `--trace DIR` (trace_rank<r>.json) into one Chrome/Perfetto
trace: one process row per rank, the ranks' clocks aligned at the barrier each read before the
first traced step (its clock_sync_us becomes time 0). Prints, per kind of communication, the
time in flight (union of the operations), exposed (in flight while the rank's compute waited on
that kind) and hidden (in flight while it did not), summed over ranks and traced steps.

  python3 scripts/merge_traces.py DIR [-o DIR/trace_merged.json]
"""
import argparse
import glob
import json
import os
import sys

COMM_KINDS = ("dp", "tp", "pp", "ep", "cp", "zero")


def union(intervals):
    """The sorted, disjoint union of (start, end) intervals."""
    out = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(intervals):
    return sum(e - s for s, e in intervals)


def intersect(a, b):
    """Length of the intersection of two disjoint sorted unions."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def exposure(events):
    """{kind: (in_flight_us, exposed_us, hidden_us)} of one rank's events."""
    out = {}
    for kind in COMM_KINDS:
        comm = union([(e["ts"], e["ts"] + e["dur"]) for e in events
                      if e.get("ph") == "X" and e.get("cat") == kind])
        wait = union([(e["ts"], e["ts"] + e["dur"]) for e in events
                      if e.get("ph") == "X" and e.get("cat") == kind + " wait"])
        total = length(comm)
        exposed = intersect(comm, wait)
        out[kind] = (total, exposed, total - exposed)
    return out


def load(paths):
    ranks = []
    for path in paths:
        with open(path) as f:
            ranks.append(json.load(f))
    ranks.sort(key=lambda t: t["rank"])
    return ranks


def merge(ranks):
    events = []
    for t in ranks:
        zero = t.get("clock_sync_us", 0.0)
        for e in t["traceEvents"]:
            e = dict(e)
            if "ts" in e:
                e["ts"] = e["ts"] - zero
            events.append(e)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "ranks": [t["rank"] for t in ranks],
        "steps": ranks[0].get("steps"),
        "groups": {str(t["rank"]): t.get("groups", {}) for t in ranks},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the --trace directory (or one trace file)")
    ap.add_argument("-o", "--output", help="merged trace (default DIR/trace_merged.json)")
    args = ap.parse_args()
    paths = ([args.dir] if os.path.isfile(args.dir)
             else sorted(glob.glob(os.path.join(args.dir, "trace_rank*.json"))))
    if not paths:
        sys.exit(f"merge_traces: no trace_rank*.json in {args.dir}")
    ranks = load(paths)
    merged = merge(ranks)
    out = args.output or os.path.join(os.path.dirname(paths[0]), "trace_merged.json")
    with open(out, "w") as f:
        json.dump(merged, f)
    print(f"merge_traces: {len(ranks)} ranks, {len(merged['traceEvents'])} events -> {out}")
    totals = {k: [0.0, 0.0, 0.0] for k in COMM_KINDS}
    for t in ranks:
        for kind, v in exposure(t["traceEvents"]).items():
            for i in range(3):
                totals[kind][i] += v[i]
    print(f"{'kind':<6} {'in flight ms':>13} {'exposed ms':>11} {'hidden ms':>10}  (all ranks)")
    for kind, (total, exposed, hidden) in totals.items():
        if total > 0:
            print(f"{kind:<6} {total / 1e3:>13.3f} {exposed / 1e3:>11.3f} {hidden / 1e3:>10.3f}")


if __name__ == "__main__":
    main()
