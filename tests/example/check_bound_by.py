#!/usr/bin/env python3
"""Checks the bound-by verdicts of a trainer's JSON lines (04_gpt_train, 05_moe_train --json).

Usage: check_bound_by.py RUN.jsonl [--bound PART] [--nonzero PART ...]

Every step record's "bound_by" has the nine parts, none negative, largest first, adding up to
its step_ms, which is the step's reported "ms" within 2%; the summary's verdict adds up to the
sum of the steps' "ms" within 2%. --bound: the summary's largest part must be PART (e.g. input);
--nonzero: those parts of the summary must be above 0 (e.g. "exposed tp").
"""
import argparse
import json
import sys

NAMES = {"compute", "exposed dp", "exposed tp", "exposed pp", "exposed cp", "exposed ep",
         "input", "host", "other"}


def check(verdict, step_ms, what):
    parts = verdict["parts"]
    names = [p["name"] for p in parts]
    if set(names) != NAMES or len(names) != len(NAMES):
        sys.exit(f"{what}: parts {names}, expected {sorted(NAMES)}")
    ms = [p["ms"] for p in parts]
    if min(ms) < 0 or ms != sorted(ms, reverse=True):
        sys.exit(f"{what}: parts not >= 0 and largest first: {parts}")
    if verdict["bound"] != names[0]:
        sys.exit(f"{what}: bound {verdict['bound']} is not the largest part {names[0]}")
    total = sum(ms)
    if abs(total - verdict["step_ms"]) > 1e-6 * max(1.0, verdict["step_ms"]):
        sys.exit(f"{what}: parts add up to {total} ms, its step_ms is {verdict['step_ms']}")
    if abs(total - step_ms) > 0.02 * step_ms:
        sys.exit(f"{what}: parts add up to {total} ms, the step took {step_ms} ms (> 2% apart)")
    return {p["name"]: p for p in parts}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--bound")
    ap.add_argument("--nonzero", nargs="*", default=[])
    a = ap.parse_args()
    records = [json.loads(l) for l in open(a.run) if l.startswith("{")]
    steps = [r for r in records if "step" in r]
    summary = [r for r in records if r.get("summary")]
    if not steps or len(summary) != 1:
        sys.exit(f"{a.run}: {len(steps)} step records and {len(summary)} summaries")
    for r in steps:
        check(r["bound_by"], r["ms"], f"{a.run} step {r['step']}")
    parts = check(summary[0]["bound_by"], sum(r["ms"] for r in steps), f"{a.run} summary")
    if a.bound and summary[0]["bound_by"]["bound"] != a.bound:
        sys.exit(f"{a.run}: bound by {summary[0]['bound_by']}, expected {a.bound}")
    for name in a.nonzero:
        if parts[name]["ms"] <= 0:
            sys.exit(f"{a.run}: {name} is 0 in {summary[0]['bound_by']}")
    verdict = ", ".join(f"{p['name']} {p['pct']:.0f}%" for p in summary[0]["bound_by"]["parts"])
    print(f"{a.run}: {len(steps)} steps, bound by: {verdict}")


if __name__ == "__main__":
    main()
