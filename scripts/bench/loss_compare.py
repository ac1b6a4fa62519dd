#!/usr/bin/env python3
"""Compares the loss curves of two runs of the same model, data and seed (issue 45: bf16 against
FP8), from the trainer's per-step JSON (04_gpt_train --json; other lines are skipped):

    python3 scripts/bench/loss_compare.py bf16.log fp8.log --name gpt406m --labels bf16 fp8 \
        [--tolerance 0.01] [--window 20] [--skip 50] [--plot loss.png]

Prints one JSON line ("loss_compare": NAME) and one human line ("loss NAME: ..."):
- the final loss of each run: the mean of its last WINDOW steps (of the steps both runs have);
- their relative difference, (second - first) / first, and whether its size is within TOLERANCE;
- the largest relative gap of the two curves after smoothing, each a running mean of WINDOW steps
  (the step and the WINDOW - 1 before it), over the steps after the first SKIP (none when the runs
  are shorter).
The exit status: 0 within the tolerance, 1 outside it (a non-finite loss is outside), 2 when a log
cannot be read or holds no step. With --plot, scripts/plot_loss.py then draws both runs on one
figure when matplotlib imports (otherwise it says the plot was skipped); the plot does not change
the exit status.
"""
import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PLOT_LOSS = os.path.join(HERE, "..", "plot_loss.py")
sys.path.insert(0, os.path.join(HERE, ".."))
from plot_loss import read_run  # noqa: E402


def read_losses(path):
    """{step: loss} of a log (None, JSON's null for NaN, becomes NaN); None when unreadable."""
    try:
        steps, losses, _, _ = read_run(path)
    except (OSError, UnicodeDecodeError):
        return None
    curve = {}
    for step, loss in zip(steps, losses):
        curve[step] = float("nan") if loss is None else float(loss)
    return curve or None


def running_mean(values, window):
    """The mean of each value and the window - 1 before it (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def rel(a, b):
    return (b - a) / abs(a) if a != 0 else float("inf") if b != a else 0.0


def compare(first, second, window=20, skip=50, tolerance=0.01):
    """The comparison of two {step: loss} curves over the steps both have (a dict, JSON-ready)."""
    steps = sorted(set(first) & set(second))
    a = [first[s] for s in steps]
    b = [second[s] for s in steps]
    n = min(window, len(steps))
    final_a = sum(a[-n:]) / n if n else float("nan")
    final_b = sum(b[-n:]) / n if n else float("nan")
    diff = rel(final_a, final_b)
    gap, gap_step = None, None
    if len(steps) > skip:
        sa, sb = running_mean(a, window), running_mean(b, window)
        for i in range(skip, len(steps)):
            g = abs(rel(sa[i], sb[i]))
            # the first NaN gap is the largest
            if gap is None or (not math.isnan(gap) and not g <= gap):
                gap, gap_step = g, steps[i]
    return {"steps_first": len(first), "steps_second": len(second), "common_steps": len(steps),
            "last_step": steps[-1] if steps else None, "final_window": n,
            "final_first": final_a, "final_second": final_b, "rel_diff": diff,
            "tolerance": tolerance, "within": math.isfinite(diff) and abs(diff) <= tolerance,
            "smooth_window": window, "gap_after_step": skip, "max_smoothed_gap": gap,
            "max_gap_step": gap_step}


def finite_or_none(x):
    return x if not isinstance(x, float) or math.isfinite(x) else None


def human(name, labels, r):
    la, lb = labels
    line = (f"loss {name}: final (mean of the last {r['final_window']} of {r['common_steps']} "
            f"common steps) {la} {r['final_first']:.4f}, {lb} {r['final_second']:.4f}: "
            f"{lb} {100 * r['rel_diff']:+.2f}% of {la}, "
            f"{'within' if r['within'] else 'OUTSIDE'} {100 * r['tolerance']:g}%")
    if r["max_smoothed_gap"] is None:
        line += (f"; no steps after the first {r['gap_after_step']} for the curves' gap")
    else:
        line += (f"; largest gap of the {r['smooth_window']}-step running means after step "
                 f"{r['gap_after_step']}: {100 * r['max_smoothed_gap']:.2f}% at step "
                 f"{r['max_gap_step']}")
    if r["steps_first"] != r["steps_second"]:
        line += f" (steps: {la} {r['steps_first']}, {lb} {r['steps_second']})"
    return line


def plot(paths, labels, out, name):
    if importlib.util.find_spec("matplotlib") is None:
        print(f"loss {name}: plot skipped (matplotlib does not import)")
        return
    cmd = [sys.executable, PLOT_LOSS, *paths, "--out", out, "--title", f"{name}: training loss"]
    for label in labels:
        cmd += ["--label", label]
    done = subprocess.run(cmd, capture_output=True, text=True)
    print((done.stdout + done.stderr).strip() or f"plot_loss exit {done.returncode}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("first", help="the reference run's log (e.g. bf16)")
    p.add_argument("second", help="the run compared with it (e.g. FP8)")
    p.add_argument("--name", default="run", help="what the runs train (the lines' name)")
    p.add_argument("--labels", nargs=2, default=["first", "second"], metavar=("FIRST", "SECOND"))
    p.add_argument("--tolerance", type=float, default=0.01,
                   help="largest relative difference of the final losses (default 0.01)")
    p.add_argument("--window", type=int, default=20,
                   help="steps of the final mean and of the running mean (default 20)")
    p.add_argument("--skip", type=int, default=50,
                   help="steps at the start left out of the curves' gap (default 50)")
    p.add_argument("--plot", metavar="PNG", help="draw both runs here (scripts/plot_loss.py)")
    args = p.parse_args(argv)
    if args.window < 1 or args.skip < 0 or not args.tolerance >= 0:
        p.error("--window must be >= 1, --skip >= 0, --tolerance >= 0")
    curves = []
    for path in (args.first, args.second):
        curve = read_losses(path)
        if curve is None:
            print(f"loss {args.name}: no step records in {path} (missing or unreadable)")
            return 2
        curves.append(curve)
    r = compare(*curves, window=args.window, skip=args.skip, tolerance=args.tolerance)
    if r["common_steps"] == 0:
        print(f"loss {args.name}: {args.first} and {args.second} share no step")
        return 2
    record = {"loss_compare": args.name, "first": args.labels[0], "second": args.labels[1]}
    record.update({k: finite_or_none(v) for k, v in r.items()})
    print(json.dumps(record))
    print(human(args.name, args.labels, r))
    if args.plot:
        plot([args.first, args.second], args.labels, args.plot, args.name)
    return 0 if r["within"] else 1


if __name__ == "__main__":
    sys.exit(main())
