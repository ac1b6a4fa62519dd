#!/usr/bin/env python3
"""compare_losses.py A B FIRST LAST TOL: the trainers' JSON losses of runs A and B (files A.jsonl,
B.jsonl) agree at steps FIRST..LAST within TOL (relative); both runs must have all of those steps,
and a run from step 1 of 20 steps or more must have lowered its loss. Used by the trainer tests
(gpt_train_test.sh, moe_train_test.sh)."""
import json, sys
a, b, first, last, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
def losses(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{") and '"step"' in line:
            rec = json.loads(line)
            out[rec["step"]] = rec["loss"]
    return out
la, lb = losses(a + ".jsonl"), losses(b + ".jsonl")
worst = 0.0
for s in range(first, last + 1):
    if s not in la or s not in lb:
        sys.exit(f"step {s} missing: {a} has {sorted(la)[:3]}..., {b} has {sorted(lb)[:3]}...")
    rel = abs(la[s] - lb[s]) / abs(la[s])
    worst = max(worst, rel)
    if rel > tol:
        sys.exit(f"{b} differs from {a} at step {s}: {lb[s]!r} vs {la[s]!r} (relative {rel:.3g} > {tol})")
print(f"{b} == {a} at steps {first}..{last}: worst relative difference {worst:.3g} (tolerance {tol})")
if first == 1 and last >= 20 and not la[last] < la[1]:
    sys.exit(f"{a}: the loss did not go down ({la[1]} -> {la[last]})")
