#!/usr/bin/env bash
# Runs every benchmark on a GPU machine after scripts/setup.sh, each bounded in time, writing
# one log per benchmark to $OUT (else build/bench/). The numbers in docs/PERFORMANCE.md come
# from this script. The collective benchmark needs 2 GPUs: with fewer visible (nvidia-smi -L) it
# is skipped, and says so. SKIP / ONLY: run names to leave out / the only ones to run
# (collectives_gpu ops ops_torch loader_gpu loader_torch), as in bench_common.sh.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck source=scripts/bench/bench_common.sh
source scripts/bench/bench_common.sh
ex=build/examples
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -ge 2 ]; then
  run collectives_gpu 200 mpirun -np 2 $ex/01_collective_bench/01_collective_bench --op all \
    --device cuda --iters 20 --warmup 5 --reps 3
else
  echo "=== collectives_gpu skipped: $gpus GPU(s) visible, it needs 2"
fi
run ops 150 $ex/09_op_bench/09_op_bench
run ops_torch 120 python3 scripts/bench/attention_torch.py
run loader_gpu 120 $ex/03_loader_bench/03_loader_bench --data-dir build/data/synthetic \
  --device cuda:0 --gpu-step-ms 10 --steps 300
run loader_torch 150 python3 scripts/bench/loader_torch.py --data 'build/data/synthetic/train_*.qts' \
  --seq-len 1024 --batch 8 --steps 2000 --device cuda:0 --workers 0,2,4 \
  --quintet-bench $ex/03_loader_bench/03_loader_bench
