#!/usr/bin/env python3
"""compare_first_norm.py A B TOL [F32]: step 1's gradient norm of run B (file B.jsonl, the
trainers' JSON records) is run A's within TOL (relative to A's), and, given the run F32 (the same
model without FP8), A's is not F32's: they differ by more than 1e-3 relative, so the runs compared
did use FP8. Used by the trainer tests' fp8 cases (gpt_train_test.sh, moe_train_test.sh)."""
import json, sys

def norm(name):
    for line in open(name + ".jsonl"):
        record = json.loads(line) if line.startswith("{") else {}
        if record.get("step") == 1:
            return record["grad_norm"]
    sys.exit(f"{name}: no step 1")

if len(sys.argv) not in (4, 5):
    sys.exit(__doc__)
a_name, b_name, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
a, b = norm(a_name), norm(b_name)
if abs(a - b) > tol * abs(a):
    sys.exit(f"step 1 gradient norm: {b_name} {b!r} vs {a_name} {a!r}")
if len(sys.argv) > 4 and abs(a - norm(sys.argv[4])) < 1e-3 * abs(a):
    sys.exit(f"step 1 gradient norm of {a_name} {a!r} is f32's ({sys.argv[4]}): no FP8?")
