#!/usr/bin/env python3
"""The summary of scripts/bench/affinity_bench.sh's logs: medians over rounds and ratios.

  affinity_summary.py OUT_DIR

Reads OUT_DIR/PART_PLACEMENT_LOAD_rROUND.log (PART: loader, train1, coll, train4; PLACEMENT:
auto, none, mpirun; LOAD: quiet, load) and prints, per measured figure, each placement's median
over rounds with its range and count, and auto's ratio to the others (auto / other of the same
figure: above 1 means auto delivered more tokens/s, or took longer for a time). Runs whose log holds
no result are listed at the end.
"""
import json
import pathlib
import re
import statistics
import sys

NAME = re.compile(r"^(loader|train1|coll|train4)_(auto|none|mpirun)_(quiet|load)_r(\d+)\.log$")


def json_lines(path):
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                pass


def figures(part, path):
    """{figure name: value} from one log."""
    out = {}
    for j in json_lines(path):
        if part == "loader" and "tokens_per_s" in j and "mode" in j:
            t = j["threads"]
            key = "naive read" if j["mode"] == "naive" else f"loader, {t} thread{'s' * (t != 1)}"
            out[f"{key}, tokens/s"] = j["tokens_per_s"]
        elif part in ("train1", "train4") and j.get("summary"):
            out["trainer step, median ms"] = j["median_ms"]
        elif part == "coll" and "time_us" in j and j.get("correct") is True:
            out[f"{j['op']} {j['bytes'] >> 10} KiB, us"] = j["time_us"]
    return out


def cell(values):
    if not values:
        return "-"
    m = statistics.median(values)
    return f"{m:.4g} ({min(values):.4g}-{max(values):.4g}, n={len(values)})"


def ratio(a, b):
    if not a or not b:
        return "-"
    return f"{statistics.median(a) / statistics.median(b):.3f}"


def main():
    root = pathlib.Path(sys.argv[1])
    data = {}  # (part, load, figure) -> placement -> [values]
    empty = []
    for path in sorted(root.glob("*.log")):
        m = NAME.match(path.name)
        if not m:
            continue
        part, placement, load, _ = m.groups()
        got = figures(part, path)
        if not got:
            empty.append(path.name)
        for name, value in got.items():
            data.setdefault((part, load, name), {}).setdefault(placement, []).append(value)
    setup = root / "setup.txt"
    if setup.exists():
        print(setup.read_text().rstrip())
    print("auto/X: the ratio of medians; tokens/s above 1 and times below 1 favour auto")
    titles = {
        "loader": "one rank: 03_loader_bench",
        "train1": "one rank: 04_gpt_train",
        "coll": "4 CPU ranks: 01_collective_bench (ours, time per operation)",
        "train4": "4 CPU ranks: 04_gpt_train --dp 4",
    }
    for part in ("loader", "train1"):
        rows = [(k, v) for k, v in data.items() if k[0] == part]
        if not rows:
            continue
        print(f"\n{titles[part]}: median (range, runs)\n")
        print("| figure | load | auto | none | auto/none |")
        print("|---|---|---|---|---|")
        for (_, load, name), by in sorted(rows, key=lambda kv: (kv[0][2], kv[0][1] != "quiet")):
            a, n = by.get("auto", []), by.get("none", [])
            print(f"| {name} | {load} | {cell(a)} | {cell(n)} | {ratio(a, n)} |")
    for part in ("coll", "train4"):
        rows = [(k, v) for k, v in data.items() if k[0] == part]
        if not rows:
            continue
        print(f"\n{titles[part]}: median (range, runs)\n")
        print("| figure | auto | mpirun | none | auto/mpirun | auto/none |")
        print("|---|---|---|---|---|---|")
        for (_, _, name), by in sorted(rows, key=lambda kv: (len(kv[0][2]), kv[0][2])):
            a, mp, n = by.get("auto", []), by.get("mpirun", []), by.get("none", [])
            print(f"| {name} | {cell(a)} | {cell(mp)} | {cell(n)} | {ratio(a, mp)} | "
                  f"{ratio(a, n)} |")
    if empty:
        print(f"\nno result in: {', '.join(empty)}")


if __name__ == "__main__":
    main()
