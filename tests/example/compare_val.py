#!/usr/bin/env python3
"""compare_val.py A B TOL: the validation losses of runs A and B (the trainers' JSON records
{"val_step", "val_loss", "val_windows"} in A.jsonl, B.jsonl) agree within TOL (relative) at every
step B evaluated, which A must have evaluated too, over the same number of windows. Used by the
trainer tests' val cases (gpt_train_test.sh, moe_train_test.sh)."""
import json, math, sys
a, b, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
def records(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{") and '"val_loss"' in line:
            rec = json.loads(line)
            out[rec["val_step"]] = rec
    return out
ra, rb = records(a + ".jsonl"), records(b + ".jsonl")
if not rb:
    sys.exit(f"{b}: no validation record")
worst = 0.0
for step, r in sorted(rb.items()):
    if step not in ra:
        sys.exit(f"{b} evaluated after step {step}, {a} did not (it did after {sorted(ra)})")
    x, y = ra[step]["val_loss"], r["val_loss"]
    if not math.isfinite(x) or x <= 0:
        sys.exit(f"{a}: val_loss {x} after step {step}")
    if ra[step]["val_windows"] != r["val_windows"]:
        sys.exit(f"{b} evaluated {r['val_windows']} windows after step {step}, {a} {ra[step]['val_windows']}")
    rel = abs(x - y) / abs(x)
    worst = max(worst, rel)
    if rel > tol:
        sys.exit(f"{b} val_loss differs from {a} after step {step}: {y!r} vs {x!r} (relative {rel:.3g} > {tol})")
print(f"{b} val_loss == {a} after steps {sorted(rb)}: worst relative difference {worst:.3g} (tolerance {tol})")
