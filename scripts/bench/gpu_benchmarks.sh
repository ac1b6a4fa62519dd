#!/usr/bin/env bash
# Runs every benchmark on a GPU machine after scripts/setup.sh, each bounded in time, writing
# one log per benchmark to $OUT (else build/bench/). The numbers in docs/PERFORMANCE.md come
# from this script. Needs 2 GPUs for the collective benchmark.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/bench}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ex=build/examples
run() {  # run NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "=== $name exit $?"
  tail -n 60 "$out/$name.log"
}
run collectives_gpu 200 mpirun -np 2 $ex/01_collective_bench/01_collective_bench --op all \
  --device cuda --iters 20 --warmup 5 --reps 3
run ops 150 $ex/09_op_bench/09_op_bench
run ops_torch 120 python3 scripts/bench/attention_torch.py
run loader_gpu 120 $ex/03_loader_bench/03_loader_bench --data-dir build/data/synthetic \
  --device cuda:0 --gpu-step-ms 10 --steps 300
run loader_torch 150 python3 scripts/bench/loader_torch.py --data 'build/data/synthetic/train_*.qts' \
  --seq-len 1024 --batch 8 --steps 2000 --device cuda:0 --workers 0,2,4 \
  --quintet-bench $ex/03_loader_bench/03_loader_bench
