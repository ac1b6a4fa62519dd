#!/usr/bin/env python3
"""Ours against PyTorch from the benchmark logs: tokens/s, MFU and peak memory of our trainer's
run beside PyTorch's eager and torch.compile runs, then their ratios (tokens/s and MFU > 1: ours
faster; peak memory < 1: ours smaller). Used by llama_benchmarks.sh and gpt_benchmarks.sh:

    ours_vs_torch.py DIR OURS TORCH [TORCH ...]

DIR is the log folder; OURS names our run's log (DIR/OURS.log: its last "summary" JSON line, as
04_gpt_train --bench --json prints it); each TORCH names a PyTorch run's log (gpt_torch.py's
"impl" JSON lines, one per mode; one log may hold both modes, a later line of a mode replacing an
earlier one; lines with an "error" are left out). A missing log or line leaves its row out.
Prints the parameter counts (flagging DIFFERENT MODELS), the table, and the lines
"ours / compiled ..." and "ours / eager ..." where both sides have figures.
"""
import json
import os
import sys

MODES = ("eager", "compiled")


def json_lines(path, key):
    """The JSON lines of a log that contain `key`, in order ([] when the log is missing)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        if line.startswith("{") and key in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    return found


def report(out, ours, torch_logs):
    """The printed lines."""
    rows, counts = {}, {}
    summaries = json_lines(os.path.join(out, ours + ".log"), '"summary"')
    if summaries:
        s = summaries[-1]
        rows["ours"] = (s["median_tokens_per_s"], s["median_mfu"], s["peak_mem_bytes"])
        counts["ours"] = (s.get("params"), s.get("non_embedding_params"))
    torch = {}
    for name in torch_logs:
        for t in json_lines(os.path.join(out, name + ".log"), '"impl"'):
            if "error" not in t and t.get("mode") in MODES:
                torch[t["mode"]] = t
    for mode in MODES:
        if mode in torch:
            t = torch[mode]
            rows[mode] = (t["tokens_per_s"], t["mfu"], t["peak_mem_bytes"])
            counts["pytorch"] = (t["params"], t["non_embedding_params"])
    lines = []
    if counts:
        same = len(set(counts.values())) == 1
        lines.append("params (non-embedding): " +
                     ", ".join("%s %s (%s)" % (k, *v) for k, v in counts.items()) +
                     ("" if same or len(counts) < 2 else "  DIFFERENT MODELS"))
    lines.append("%-9s %12s %8s %12s" % ("run", "tokens/s", "MFU", "peak GiB"))
    for k, (tps, mfu, mem) in rows.items():
        lines.append("%-9s %12.0f %8s %12.2f" %
                     (k, tps, "-" if mfu is None else "%.3f" % mfu, mem / 2**30))
    if "ours" in rows:
        o = rows["ours"]
        for k in ("compiled", "eager"):
            if k in rows:
                t = rows[k]
                mfu = "-" if o[1] is None or not t[1] else "%.3f" % (o[1] / t[1])
                lines.append("ours / %-8s tokens/s %.3f  MFU %s  peak memory %.3f" %
                             (k, o[0] / t[0], mfu, o[2] / t[2] if t[2] else float("nan")))
    return lines


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: ours_vs_torch.py DIR OURS TORCH [TORCH ...]")
    print("\n".join(report(argv[0], argv[1], argv[2:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
