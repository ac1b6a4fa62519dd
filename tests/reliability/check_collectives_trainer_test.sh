#!/usr/bin/env bash
# The collective-consistency debug mode (--check-collectives, issue #21) on a whole trainer run:
# examples/04_gpt_train at tp 2 x dp 2 and pp 2 x dp 2 (4 ranks, CPU, 5 steps) gives the same
# losses bit for bit with the check on as with it off, and QUINTET_CHECK_COLLECTIVES=1 does too;
# and the check ran: the checked runs report how many operations rank 0 compared and found
# matching (at least one per step; the same count with the flag as with the variable), the
# unchecked runs report none.
# Usage: check_collectives_trainer_test.sh TRAINER MPIEXEC WORKDIR [mpirun flags...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
trainer=$1 mpiexec=$2 work=$3
shift 3
mpi_flags=("$@")
if [[ -z $trainer ]]; then echo "check_collectives_trainer_test: SKIP (no 04_gpt_train)"; exit 0; fi
rm -rf "$work/check" && mkdir -p "$work/check"
cd "$work/check"
model=(--device cpu --hidden 64 --heads 4 --vocab 256 --seq-len 32 --micro-batch 2
       --global-batch 12 --lr 3e-3 --warmup 5 --data-dir "$work/data" --json --no-progress
       --steps 5)
run() {  # run NAME FLAGS...: the trainer's JSON lines into NAME.jsonl, bounded
  local name=$1
  shift
  echo "--- $name: $*"
  timeout 120 "$mpiexec" "${mpi_flags[@]}" -np 4 "$trainer" "${model[@]}" "$@" >"$name.jsonl"
}
run tp2_dp2 --layers 2 --tp 2 --dp 2
run tp2_dp2_checked --layers 2 --tp 2 --dp 2 --check-collectives
QUINTET_CHECK_COLLECTIVES=1 run tp2_dp2_checked_env --layers 2 --tp 2 --dp 2
run pp2_dp2 --layers 4 --pp 2 --dp 2
run pp2_dp2_checked --layers 4 --pp 2 --dp 2 --check-collectives
python3 "$here/../example/compare_losses.py" tp2_dp2 tp2_dp2_checked 1 5 0
python3 "$here/../example/compare_losses.py" tp2_dp2 tp2_dp2_checked_env 1 5 0
python3 "$here/../example/compare_losses.py" pp2_dp2 pp2_dp2_checked 1 5 0
python3 - <<'PY'
import json, sys

def checked(name):  # the run's "checked_operations" records
    return [json.loads(l)["checked_operations"] for l in open(f"{name}.jsonl")
            if l.startswith("{") and "checked_operations" in l]

steps = 5
for name in ("tp2_dp2", "pp2_dp2"):
    if checked(name):
        sys.exit(f"{name}: the check is off, yet the run reports {checked(name)} checked operations")
counts = {}
for name in ("tp2_dp2_checked", "tp2_dp2_checked_env", "pp2_dp2_checked"):
    c = checked(name)
    if len(c) != 1 or c[0] < steps:
        sys.exit(f"{name}: checked operations {c}: expected one count of at least {steps} "
                 "(one per step): was the check on?")
    counts[name] = c[0]
if counts["tp2_dp2_checked"] != counts["tp2_dp2_checked_env"]:
    sys.exit(f"the flag and the variable checked different numbers of operations: {counts}")
print(f"checked operations (rank 0): {counts}")
PY
echo "check_collectives_trainer_test: PASS"
