#!/usr/bin/env python3
"""Draws the loss of a 04_gpt_train or 05_moe_train run against the step, with the dataset's
entropy floor (the lowest loss any model can reach on it), as a PNG; for an MoE run a second panel
shows the load of the experts (tokens per expert per step: minimum, mean and maximum over every
expert of every MoE block).

    04_gpt_train ... --json > run.jsonl
    python3 scripts/plot_loss.py run.jsonl --out loss.png [--label "tp2 x dp2"] [more.jsonl ...]

Reads the trainer's per-step JSON objects (fields step, loss, entropy_floor, and
tokens_per_expert_min/mean/max from 05_moe_train); other lines are skipped. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import sys


def read_run(path):
    steps, losses, floor, load = [], [], None, []
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
            if "tokens_per_expert_mean" in rec:
                load.append((rec["step"], rec["tokens_per_expert_min"],
                             rec["tokens_per_expert_mean"], rec["tokens_per_expert_max"]))
    return steps, losses, floor, load


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

    runs = [read_run(path) for path in args.runs]
    moe = any(r[3] for r in runs)
    if moe:
        fig, (ax, lax) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    else:
        fig, ax = plt.subplots(figsize=(8, 5))
    floor = None
    for i, path in enumerate(args.runs):
        steps, losses, f, load = runs[i]
        if not steps:
            print(f"plot_loss: no step records in {path}", file=sys.stderr)
            return 1
        label = args.label[i] if args.label and i < len(args.label) else path
        ax.plot(steps, losses, label=label)
        floor = f if f is not None else floor
        if load:
            s, lo, mean, hi = zip(*load)
            line, = lax.plot(s, mean, label=f"{label}: mean")
            lax.fill_between(s, lo, hi, alpha=0.25, color=line.get_color(),
                             label=f"{label}: min to max")
    if floor is not None:
        ax.axhline(floor, color="black", linestyle="--", linewidth=1,
                   label=f"entropy floor {floor:.3f} nats/token")
    if moe:
        lax.set_xlabel("step")
        lax.set_ylabel("tokens per expert per step")
        lax.set_title("expert load (every expert of every MoE block)")
        lax.grid(True, alpha=0.3)
        lax.legend()
    else:
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
