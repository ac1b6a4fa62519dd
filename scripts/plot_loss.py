#!/usr/bin/env python3
"""Draws the loss of a 04_gpt_train run against the step, with the dataset's entropy floor (the
lowest loss any model can reach on it), as a PNG.

    04_gpt_train ... --json > run.jsonl
    python3 scripts/plot_loss.py run.jsonl --out loss.png [--label "tp2 x dp2"] [more.jsonl ...]

Reads the trainer's per-step JSON objects (fields step, loss, entropy_floor); other lines are
skipped. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import sys


def read_run(path):
    steps, losses, floor = [], [], None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "step" not in rec or "loss" not in rec:
                continue
            steps.append(rec["step"])
            losses.append(rec["loss"])
            if rec.get("entropy_floor") is not None:
                floor = rec["entropy_floor"]
    return steps, losses, floor


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="files of the trainer's --json output")
    p.add_argument("--out", default="loss.png")
    p.add_argument("--label", action="append", help="one per run (default: the file name)")
    p.add_argument("--title", default="GPT training loss")
    args = p.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    floor = None
    for i, path in enumerate(args.runs):
        steps, losses, f = read_run(path)
        if not steps:
            print(f"plot_loss: no step records in {path}", file=sys.stderr)
            return 1
        label = args.label[i] if args.label and i < len(args.label) else path
        ax.plot(steps, losses, label=label)
        floor = f if f is not None else floor
    if floor is not None:
        ax.axhline(floor, color="black", linestyle="--", linewidth=1,
                   label=f"entropy floor {floor:.3f} nats/token")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(args.title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"plot_loss: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
