#!/usr/bin/env bash
# The collective-consistency debug mode (--check-collectives, issue #21) on a whole trainer run:
# examples/04_gpt_train at tp 2 x dp 2 and pp 2 x dp 2 (4 ranks, CPU, 5 steps) gives the same
# losses bit for bit with the check on as with it off, and QUINTET_CHECK_COLLECTIVES=1 does too.
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
echo "check_collectives_trainer_test: PASS"
